package enginetest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// fakeEval answers by target; "boom" fails.
type fakeEval map[string]*policy.Answer

func (f fakeEval) Evaluate(_ context.Context, in *policy.Input) (*policy.Answer, error) {
	if in.Step.Target == "boom" {
		return nil, errors.New("trap")
	}
	return f[in.Step.Target], nil
}

func (f fakeEval) Close() error { return nil }

var ev = fakeEval{
	"fs.read":  {Action: policy.Allow, RuleID: "reads"},
	"gh.write": {Action: policy.RequireApproval, RuleID: "writes"},
	"weird":    {Action: "maybe"},
}

func tc(name, kind, target string, want policy.Action, rule string) bundle.TestCase {
	return bundle.TestCase{Name: name, SourceFile: "tests/t.yaml", Step: bundle.TestStep{Kind: kind, Target: target},
		Expect: bundle.TestExpect{Decision: want, RuleID: rule}}
}

func TestCheckCase(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		c    bundle.TestCase
		want string // "" = pass
	}{
		{tc("read", "tool_call", "fs.read", policy.Allow, "reads"), ""},
		{tc("read any rule", "tool_call", "fs.read", policy.Allow, ""), ""},
		{tc("default", "tool_call", "net.get", policy.Deny, "default_action"), ""},
		{tc("local", "local", "now", policy.Allow, "default_action"), ""},
		{tc("wrong decision", "tool_call", "gh.write", policy.Allow, ""), `got require_approval (rule_id "writes", reason ""), want allow`},
		{tc("wrong rule", "tool_call", "fs.read", policy.Allow, "other"), `want rule_id "other"`},
		{tc("eval error", "tool_call", "boom", policy.Deny, ""), "evaluate: trap"},
		{tc("invalid answer", "tool_call", "weird", policy.Deny, ""), `invalid answer: unknown decision "maybe"`},
		{tc("bad kind", "tool", "x", policy.Deny, ""), "unknown step kind"},
	}
	for _, tt := range tests {
		err := CheckCase(ctx, ev, policy.Deny, tt.c)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.c.Name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: got %v, want an error containing %q", tt.c.Name, err, tt.want)
		case err != nil && !strings.HasPrefix(err.Error(), "tests/t.yaml: "):
			t.Errorf("%s: error does not name the file: %v", tt.c.Name, err)
		}
	}
}

func TestRunCases(t *testing.T) {
	cases := []bundle.TestCase{
		tc("read", "tool_call", "fs.read", policy.Allow, "reads"),
		tc("write", "tool_call", "gh.write", policy.RequireApproval, "writes"),
		tc("allow by default", "tool_call", "net.get", policy.Allow, "default_action"),
		tc("known gap", "tool_call", "gh.write", policy.Allow, ""),
	}
	RunCases(t, ev, policy.Allow, cases, map[string]string{"known gap": "engine cannot tell writes apart"})
}

func TestLoadCases(t *testing.T) {
	b, err := bundle.LoadFiles(map[string][]byte{
		"bundle.yaml":    []byte("name: x\nengine: rules\n"),
		"rules.yaml":     []byte("rules: []\n"),
		"tests/b.yaml":   []byte("cases:\n  - {name: second, step: {kind: local, target: t}, expect: {decision: allow}}\n"),
		"tests/a.yml":    []byte("cases:\n  - {name: first, step: {kind: local, target: t}, expect: {decision: allow}}\n"),
		"tests/notes.md": []byte("not a test file"),
	})
	if err != nil {
		t.Fatal(err)
	}
	cases, err := LoadCases(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) != 2 || cases[0].Name != "first" || cases[1].SourceFile != "tests/b.yaml" {
		t.Errorf("cases = %+v", cases)
	}
	b.Files["tests/c.yaml"] = []byte("cases: 3")
	if _, err := LoadCases(b); err == nil || !strings.Contains(err.Error(), `bundle "x": test cases: tests/c.yaml`) {
		t.Errorf("bad test file: %v", err)
	}
}

type fakeEngine struct{ ev policy.Evaluator }

func (fakeEngine) Name() string { return "fake" }
func (e fakeEngine) Compile(context.Context, *bundle.Bundle) (policy.Evaluator, error) {
	return e.ev, nil
}

func TestRunBundle(t *testing.T) {
	b, err := bundle.LoadFiles(map[string][]byte{
		"bundle.yaml": []byte("name: x\nengine: rules\ndefault_action: allow\n"),
		"rules.yaml":  []byte("rules: []\n"),
		"tests/a.yaml": []byte(`cases:
  - {name: read, step: {kind: tool_call, target: fs.read}, expect: {decision: allow, rule_id: reads}}
  - {name: other, step: {kind: tool_call, target: x}, expect: {decision: allow, rule_id: default_action}}
`),
	})
	if err != nil {
		t.Fatal(err)
	}
	RunBundle(t, fakeEngine{ev}, b, nil)
}

// The failure modes of RunCases fail the test that calls them, so they run
// in a child process: TestHelperRunCases does the failing call when
// ENGINETEST_HELPER names a scenario, and the parent checks the outcome.
func TestHelperRunCases(t *testing.T) {
	cases := []bundle.TestCase{
		tc("read", "tool_call", "fs.read", policy.Allow, "reads"),
		tc("write", "tool_call", "gh.write", policy.Allow, ""),
	}
	switch os.Getenv("ENGINETEST_HELPER") {
	case "":
		t.Skip("helper for TestRunCasesFailures")
	case "stale":
		RunCases(t, ev, policy.Deny, cases, map[string]string{"read": "thought to be broken"})
	case "unknown":
		RunCases(t, ev, policy.Deny, cases[:1], map[string]string{"gone": "case was renamed"})
	case "mismatch":
		RunCases(t, ev, policy.Deny, cases, nil)
	}
}

func TestRunCasesFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the test binary")
	}
	for scenario, want := range map[string]string{
		"stale":    "stale exception: case passes but is listed as an expected failure (thought to be broken)",
		"unknown":  `exception for unknown case "gone" (case was renamed)`,
		"mismatch": `case "write": got require_approval`,
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRunCases$", "-test.v")
		cmd.Env = append(os.Environ(), "ENGINETEST_HELPER="+scenario)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Errorf("%s: helper did not fail (err %v):\n%s", scenario, err, out)
			continue
		}
		if !strings.Contains(string(out), want) {
			t.Errorf("%s: output lacks %q:\n%s", scenario, want, out)
		}
	}
}
