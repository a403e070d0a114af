// Package policytest runs the tests of a repository of policy bundles: it
// is `wicket policy test` (docs/policy.md, "Testing bundles").
//
// # Basics
//
//	found, err := policytest.Discover("policies/") // every bundle below
//	r, err := policytest.NewRunner(wasmEngine, policytest.Options{Target: policytest.TargetBoth})
//	var rep policytest.Report
//	for _, f := range found {
//		b := r.Run(ctx, f)
//		rep.Add(b)
//		policytest.WriteText(os.Stdout, b, false) // go test style
//	}
//	rep.WriteJUnit(w) // or WriteJSON
//	fmt.Println(rep.Summary()) // "N passed, N failed[, N skipped]"
//
// # What a run checks
//
// [Runner.Run] loads a bundle with the kernel's loader and compiles it with
// [plugins.Host.Prepare], the check every upload goes through, so a bundle
// that passes here is one the kernel accepts; a refused bundle fails with
// every problem found, each naming its file and line. Then each
// tests/*.yaml case (bundle.TestCase) is decided as the kernel decides a
// step of an agent bound to the bundle ([plugins.Prepared.Decide]: engine
// answer, default_action, rate limits) and compared with its expectation
// (bundle.TestExpect.Check); an engine error fails the case unless it
// expects rule_id engine_error. The bundle's Rego unit tests run on OPA's
// evaluator with opa test's rules (rego.Engine.RunTests).
//
// A Rego bundle's cases run on OPA's evaluator, on the module OPA's
// compiler builds from the same Rego (rego.Engine.BuildWasm, run by the
// wasm engine with abi opa), or on both; with both, any difference between
// the two answers fails the case and the report shows the input.
//
// Coverage is the rules that decided a case (rules engine) or the Rego
// lines evaluations reached, as OPA's cover package computes them (Rego
// unit tests count). A bundle with no test fails unless
// [Options.AllowEmpty]. Bundle-level failures ([load], [no tests],
// [wasm build], [coverage]) count as failed tests, so every report
// format has the same counts.
package policytest
