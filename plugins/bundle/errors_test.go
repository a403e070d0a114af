package bundle

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
)

func TestJoin(t *testing.T) {
	if Join() != nil || Join(nil, nil) != nil {
		t.Fatal("Join of nothing is not nil")
	}
	one := &Error{File: "a.yaml", Line: 3, Err: errors.New("x")}
	if got := Join(nil, one); got != one {
		t.Fatalf("Join of one = %v, want the *Error itself", got)
	}
	b := &Error{File: "b.yaml", Line: 1, Err: ErrMissingFile}
	a9 := &Error{File: "a.yaml", Line: 9, Err: errors.New("y")}
	plain := errors.New("plain")
	err := Join(Errors{b, a9}, one, plain)
	es, ok := err.(Errors)
	if !ok || len(es) != 4 {
		t.Fatalf("Join = %#v", err)
	}
	// Sorted by file then line, stable; a problem without a file first.
	if es[0].Err != plain || es[1] != one || es[2] != a9 || es[3] != b {
		t.Errorf("order: %v", es)
	}
	if !errors.Is(err, ErrMissingFile) {
		t.Error("errors.Is does not see into Errors")
	}
	var first *Error
	if !errors.As(err, &first) || first != es[0] {
		t.Errorf("errors.As found %v", first)
	}
	if want := "plain\na.yaml:3: x\na.yaml:9: y\nb.yaml:1: missing file"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err, want)
	}
	// A wrapped list keeps its context as one problem.
	wrapped := fmt.Errorf("context: %w", Errors{one, a9})
	if l := List(wrapped); len(l) != 1 || !strings.HasPrefix(l[0].Error(), "context: a.yaml:3") {
		t.Errorf("List(wrapped) = %v", l)
	}
}

func TestParseManifestEveryProblem(t *testing.T) {
	src := `name: Bad Name
engine: rules
abi: opa
default_action: maybe
unknown_field: 1
rate_limits:
  - {id: a, max_calls: 0, window: 1m}
  - {id: a, max_calls: 1, window: 1m}
  - {id: b, max_calls: 1, window: soon}
sandbox:
  grants: [clock]
`
	_, err := ParseManifest([]byte(src))
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("ParseManifest = %v, want several problems", err)
	}
	want := []string{
		`bundle.yaml:1: name: "Bad Name" does not match`,
		`bundle.yaml:3: abi: only wasm bundles have an ABI`,
		`bundle.yaml:4: default_action: must be allow or deny, got "maybe"`,
		`bundle.yaml:5: unknown field "unknown_field"`,
		`bundle.yaml:7: rate_limits[0].max_calls: must be > 0`,
		`bundle.yaml:8: rate_limits[1].id: duplicate id "a" (also rate_limits[0])`,
		`bundle.yaml:9: rate_limits[2].window: must be a positive Go duration`,
		`bundle.yaml:11: sandbox.grants[0]: only wasm bundles take grants`,
	}
	if len(es) != len(want) {
		t.Fatalf("%d problems, want %d:\n%v", len(es), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(es[i].Error(), w) {
			t.Errorf("problem %d = %q, want prefix %q", i, es[i], w)
		}
	}
}

func TestParseTestFileEveryProblem(t *testing.T) {
	src := `cases:
  - name: ok
    step: {kind: local, target: t}
    expect: {decision: allow}
  - name: no target
    step: {kind: tool_call}
    expect: {decision: allow}
  - name: ok
    step: {kind: local, target: t}
    expect: {decision: allow}
  - step: {kind: local, target: t}
    expect: {decision: allow}
  - name: bad regex
    step: {kind: local, target: t}
    expect: {decision: allow, reason_matches: "("}
  - name: approval on allow
    step: {kind: local, target: t}
    expect: {decision: allow, approval: {timeout: 1h}}
  - name: unknown field
    step: {kind: local, target: t, colour: red}
    expect: {decision: allow}
`
	_, err := ParseTestFile("tests/x.yaml", []byte(src))
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("ParseTestFile = %v, want several problems", err)
	}
	want := []string{
		`tests/x.yaml:6: case "no target": step.target: required`,
		`tests/x.yaml:8: case "ok": name: duplicate name (also cases[0])`,
		`tests/x.yaml:11: cases[3]: name: required`,
		`tests/x.yaml:15: case "bad regex": expect.reason_matches: error parsing regexp`,
		`tests/x.yaml:18: case "approval on allow": expect.approval: only a require_approval answer`,
		`tests/x.yaml:19: cases[6]: unknown field "colour"`,
	}
	if len(es) != len(want) {
		t.Fatalf("%d problems, want %d:\n%v", len(es), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(es[i].Error(), w) {
			t.Errorf("problem %d = %q, want prefix %q", i, es[i], w)
		}
	}
}

func TestParseTestFileTables(t *testing.T) {
	src := `cases:
  - table: reads
    template:
      agent_id: a1
      step: {kind: tool_call, effect: read_only, args: {path: /tmp}}
      expect: {decision: allow}
    columns: [name, step.target, step.args.path, expect.rule_id, execution.labels.team]
    rows:
      - [search, search, /x, r1, web]
      - [fs, fs.read, {nested: [1, 2]}, r2, ops]
      - {name: override, step: {target: rm, effect: destructive}, expect: {decision: deny}}
  - table: numbered
    template: {step: {kind: local, target: t}, expect: {decision: allow}}
    rows: [{}, {step: {occurrence: 2}}]
`
	cases, err := ParseTestFile("tests/t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) != 5 {
		t.Fatalf("%d cases: %+v", len(cases), cases)
	}
	c0, c1, c2 := cases[0], cases[1], cases[2]
	if c0.Name != "reads/search" || c0.AgentID != "a1" || c0.Step.Target != "search" || c0.Step.Effect != "read_only" || c0.Expect.RuleID != "r1" ||
		c0.Execution == nil || c0.Execution.Labels["team"] != "web" || c0.SourceLine != 9 || c0.SourceFile != "tests/t.yaml" {
		t.Errorf("row 0: %+v", c0)
	}
	in, err := c1.Input()
	if err != nil || string(in.Step.Args) != `{"path":{"nested":[1,2]}}` || c1.Execution.Labels["team"] != "ops" {
		t.Errorf("row 1: %+v %s %v", c1, in.Step.Args, err)
	}
	in, _ = c2.Input()
	if c2.Name != "reads/override" || c2.Step.Target != "rm" || c2.Step.Effect != "destructive" || c2.Expect.Decision != policy.Deny || string(in.Step.Args) != `{"path":"/tmp"}` {
		t.Errorf("mapping row: %+v %s", c2, in.Step.Args)
	}
	if cases[3].Name != "numbered[0]" || cases[4].Name != "numbered[1]" || cases[4].Step.Occurrence != 2 || cases[0].Step.Occurrence != 0 {
		t.Errorf("unnamed rows: %+v %+v", cases[3], cases[4])
	}

	for bad, want := range map[string]string{
		"cases:\n  - {table: t, rows: [[a]]}":                                              `tests/t.yaml:2: table "t" rows[0]: a row given as a list needs the table's columns`,
		"cases:\n  - {table: t, columns: [step.target], rows: [[a, b]]}":                   `table "t" rows[0]: 2 values for 1 columns`,
		"cases:\n  - {table: t, columns: [\"step target\"], rows: [[a]]}":                  `columns[0]: "step target" is not a field path`,
		"cases:\n  - {table: t, columns: [step], rows: []}":                                `rows: want a non-empty list`,
		"cases:\n  - {table: t, columns: [step.target], rows: [[a]], colour: red}":         `colour: unknown field`,
		"cases:\n  - {table: t, template: {step: x}, columns: [step.target], rows: [[a]]}": `step is not a mapping in the template`,
		"cases:\n  - {table: '', rows: [{}]}":                                              `table: want the table's name`,
		"cases:\n  - {table: t, template: {step: {kind: local}}, columns: [name, step.target, expect.decision], rows: [[a, x, allow], [a, y, allow]]}": `case "t/a": name: duplicate name`,
	} {
		_, err := ParseTestFile("tests/t.yaml", []byte(bad))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", bad, err, want)
		}
	}
}

func TestExpectCheck(t *testing.T) {
	lims := []string{"b", "a"}
	d := &policy.Answer{Action: policy.RequireApproval, RuleID: "r", Reason: "needs a human",
		Approval:  &policy.Approval{Approvers: []string{"ops", "sre"}, Timeout: "30m", Message: "m"},
		RateLimit: &policy.RateLimit{MaxCalls: 5, Window: "1h"}}
	ok := TestExpect{Decision: policy.RequireApproval, RuleID: "r", Reason: "needs a human", ReasonMatches: "human$",
		Approval: &policy.Approval{Approvers: []string{"sre", "ops", "ops"}, Timeout: "0.5h"}, RateLimit: &policy.RateLimit{Window: "60m", Per: "execution", Algorithm: "sliding", OnLimiterError: "fail_closed"},
		RateLimits: &[]string{"a", "b"}}
	if m := ok.Check(d, lims); m != nil {
		t.Errorf("mismatches %v", m)
	}
	none := []string{}
	bad := TestExpect{Decision: policy.Deny, RuleID: "x", Reason: "no", ReasonMatches: "^x", Approval: &policy.Approval{Message: "n"},
		RateLimit: &policy.RateLimit{MaxCalls: 6, Per: "agent"}, RateLimits: &none}
	var fields []string
	for _, m := range bad.Check(d, lims) {
		fields = append(fields, m.Field)
	}
	if got := strings.Join(fields, " "); got != "decision rule_id reason reason_matches approval.message rate_limit.max_calls rate_limit.per rate_limits" {
		t.Errorf("fields %q", got)
	}
	if m := (TestExpect{Decision: policy.Allow, Approval: &policy.Approval{}, RateLimit: &policy.RateLimit{}}).Check(&policy.Answer{Action: policy.Allow}, nil); len(m) != 2 || m[0].Got != "none" {
		t.Errorf("absent approval and limit: %v", m)
	}
}
