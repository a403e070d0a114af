package enginetest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// Engine is what [RunBundle] needs from a policy engine: the plugins host's
// engines (rules.New(), rego.New(), wasm.New(cfg)) all have this shape.
type Engine interface {
	Name() string
	Compile(ctx context.Context, b *bundle.Bundle) (policy.Evaluator, error)
}

// LoadCases returns the bundle's test cases: every tests/*.yaml file (see
// bundle.IsTestFile) in path order, cases in file order.
func LoadCases(b *bundle.Bundle) ([]bundle.TestCase, error) {
	cases, err := b.TestCases()
	if err != nil {
		return nil, fmt.Errorf("bundle %q: test cases: %w", b.Manifest.Name, err)
	}
	return cases, nil
}

// RunBundle compiles b with eng and runs the bundle's test cases through it
// with [RunCases], under the bundle's default action. A bundle without test
// cases fails the test. The evaluator is closed when the test ends.
func RunBundle(t *testing.T, eng Engine, b *bundle.Bundle, exceptions map[string]string) {
	t.Helper()
	ev, err := eng.Compile(t.Context(), b)
	if err != nil {
		t.Fatalf("%s: compile bundle %q: %v", eng.Name(), b.Manifest.Name, err)
	}
	t.Cleanup(func() {
		if err := ev.Close(); err != nil {
			t.Errorf("%s: close evaluator: %v", eng.Name(), err)
		}
	})
	cases, err := LoadCases(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatalf("bundle %q has no test cases (tests/*.yaml)", b.Manifest.Name)
	}
	RunCases(t, ev, b.DefaultAction(), cases, exceptions)
}

// RunCases runs each case as a subtest named by the case: it builds the
// case's input ([bundle.TestCase.Input]), evaluates it, applies
// policy.ApplyDefault with defaultAction, and checks the expected decision and,
// when the case gives one, the rule_id (see [CheckCase]).
//
// exceptions maps a case name to the reason the engine under test is known
// to get it wrong. Such a case must fail: it is logged and passes, and if it
// succeeds the subtest fails as a stale exception. An exception naming no
// case fails the test. nil means no exceptions.
func RunCases(t *testing.T, ev policy.Evaluator, defaultAction policy.Action, cases []bundle.TestCase, exceptions map[string]string) {
	t.Helper()
	known := make(map[string]bool, len(cases))
	for _, tc := range cases {
		known[tc.Name] = true
	}
	var unknown []string
	for name := range exceptions {
		if !known[name] {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	for _, name := range unknown {
		t.Errorf("exception for unknown case %q (%s): remove it", name, exceptions[name])
	}
	for _, tc := range cases {
		reason, expectFail := exceptions[tc.Name]
		t.Run(tc.Name, func(t *testing.T) {
			err := CheckCase(t.Context(), ev, defaultAction, tc)
			switch {
			case expectFail && err == nil:
				t.Errorf("stale exception: case passes but is listed as an expected failure (%s); remove the exception", reason)
			case expectFail:
				t.Logf("expected failure (%s): %v", reason, err)
			case err != nil:
				t.Error(err)
			}
		})
	}
}

// CheckCase evaluates one case and returns nil when the answer, after
// policy.ApplyDefault with defaultAction, is what the case expects, and an
// error describing the difference otherwise. An evaluation error, or an
// answer that fails policy.Answer.Validate, is a failure too.
func CheckCase(ctx context.Context, ev policy.Evaluator, defaultAction policy.Action, tc bundle.TestCase) error {
	in, err := tc.Input()
	if err != nil {
		return fmt.Errorf("%s: %w", tc.SourceFile, err)
	}
	d, err := ev.Evaluate(ctx, in)
	if err != nil {
		return fmt.Errorf("%s: case %q: evaluate: %w", tc.SourceFile, tc.Name, err)
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%s: case %q: invalid answer: %w", tc.SourceFile, tc.Name, err)
	}
	d = policy.ApplyDefault(d, defaultAction, in.Step.Kind)
	if d.Action != tc.Expect.Decision {
		return fmt.Errorf("%s: case %q: got %s (rule_id %q, reason %q), want %s",
			tc.SourceFile, tc.Name, d.Action, d.RuleID, d.Reason, tc.Expect.Decision)
	}
	if tc.Expect.RuleID != "" && d.RuleID != tc.Expect.RuleID {
		return fmt.Errorf("%s: case %q: got %s from rule_id %q, want rule_id %q",
			tc.SourceFile, tc.Name, d.Action, d.RuleID, tc.Expect.RuleID)
	}
	return nil
}
