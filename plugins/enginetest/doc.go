// Package enginetest runs a bundle's test cases (tests/*.yaml) through a
// policy engine, so that one decision corpus checks every engine (rules,
// rego, wasm).
//
// # Basics
//
//	func TestGuardBundle(t *testing.T) {
//		b, err := bundle.LoadDir("testdata/guard")
//		if err != nil {
//			t.Fatal(err)
//		}
//		enginetest.RunBundle(t, rules.New(), b, nil)
//	}
//
// or, with an evaluator at hand:
//
//	cases, err := enginetest.LoadCases(b)
//	enginetest.RunCases(t, ev, b.DefaultAction(), cases, map[string]string{
//		"llm budget": "wasm: totals not exposed yet", // must fail, or the test fails
//	})
//
// # Exceptions
//
// An exception names a case an engine is known to get wrong, with the
// reason. It is an expected failure, not a skip: the case still runs, and if
// it passes the exception is reported as stale and the test fails, so the
// list can only shrink. An exception for a case that does not exist fails
// too.
package enginetest
