package bundle

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/kernel/policy"
)

func TestTestCaseInput(t *testing.T) {
	src := `cases:
  - name: full
    tenant: acme
    agent_id: researcher
    execution_id: 0190f0a2-0000-7000-8000-000000000001
    step:
      kind: tool_call
      target: github.create_issue
      args: {title: "a <b> & c", n: 1.50, big: 123456789012345678901234567890, hex: 0x1f, under: 1_000, list: [true, null, x], nested: {z: 1, a: 2}}
      idempotency: at_most_once
      effect: remote_mutation
      occurrence: 2
    execution:
      status: blocked
      labels: {team: web}
      totals: {steps: 3, llm_calls: 1, tokens: 900, cost_usd: 0.25}
      created_at: 2026-11-29T07:46:00Z
    expect: {decision: require_approval, rule_id: r1}
  - name: minimal
    step: {kind: local, target: now}
    expect: {decision: allow}
`
	cases, err := ParseTestFile("tests/x.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) != 2 || cases[0].SourceFile != "tests/x.yaml" {
		t.Fatalf("cases = %+v", cases)
	}
	in, err := cases[0].Input()
	if err != nil {
		t.Fatal(err)
	}
	wantArgs := `{"big":123456789012345678901234567890,"hex":31,"list":[true,null,"x"],"n":1.50,"nested":{"a":2,"z":1},"title":"a \u003cb\u003e \u0026 c","under":1000}`
	if string(in.Step.Args) != wantArgs {
		t.Errorf("args = %s\nwant   %s", in.Step.Args, wantArgs)
	}
	if want := canon.Hash([]byte(wantArgs)); in.Step.ArgsHash != want {
		t.Errorf("args_hash = %s, want %s", in.Step.ArgsHash, want)
	}
	want := policy.Input{
		Tenant: "acme", AgentID: "researcher", ExecutionID: "0190f0a2-0000-7000-8000-000000000001",
		Step: policy.Step{Kind: "tool_call", Target: "github.create_issue", Idempotency: "at_most_once", Effect: "remote_mutation", Occurrence: 2},
		Execution: policy.Execution{Status: "blocked", Labels: map[string]string{"team": "web"},
			Totals: policy.Totals{Steps: 3, LLMCalls: 1, Tokens: 900, CostUSD: 0.25}, CreatedAt: time.Date(2026, 11, 29, 7, 46, 0, 0, time.UTC)},
	}
	in.Step.Args, in.Step.ArgsHash = nil, ""
	if g, w := mustJSON(t, in), mustJSON(t, want); g != w {
		t.Errorf("input = %s\nwant    %s", g, w)
	}

	in, err = cases[1].Input()
	if err != nil {
		t.Fatal(err)
	}
	// A step without args and idempotency, as the kernel records it: args
	// null, the kind's default idempotency (a local step: safe_to_retry).
	if string(in.Step.Args) != "null" || in.Step.Idempotency != policy.SafeToRetry || in.Tenant != DefaultTestTenant || in.ExecutionID != DefaultTestExecutionID ||
		in.Execution.Status != DefaultTestStatus || in.Execution.Labels == nil {
		t.Errorf("defaults: %s", mustJSON(t, in))
	}
	if !strings.Contains(mustJSON(t, in), `"labels":{}`) {
		t.Errorf("labels should encode as {}: %s", mustJSON(t, in))
	}
}

func TestTestCaseInputGoValues(t *testing.T) {
	// Cases built in Go or decoded by yaml.v3 directly (map[any]any keys).
	var args any
	if err := yaml.Unmarshal([]byte("{1: one, b: [x, {c: 2}]}"), &args); err != nil {
		t.Fatal(err)
	}
	tc := TestCase{Name: "go", Step: TestStep{Kind: "tool_call", Target: "t", Args: args}}
	in, err := tc.Input()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"1":"one","b":["x",{"c":2}]}`; string(in.Step.Args) != want {
		t.Errorf("args = %s, want %s", in.Step.Args, want)
	}
	tc.Step.Args = json.RawMessage(`{"b": 1, "a": [1.0]}`)
	if in, err = tc.Input(); err != nil || string(in.Step.Args) != `{"a":[1.0],"b":1}` {
		t.Errorf("raw args: %s, %v", in.Step.Args, err)
	}
	tc.Step.Args = json.RawMessage(`{"a": 1, "a": 2}`)
	if _, err := tc.Input(); err == nil {
		t.Error("duplicate keys accepted")
	}
	tc.Step.Kind = "nope"
	if _, err := tc.Input(); err == nil {
		t.Error("bad kind accepted")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseTestFileEdges(t *testing.T) {
	if cs, err := ParseTestFile("tests/e.yaml", []byte("cases:\n")); err != nil || len(cs) != 0 {
		t.Errorf("empty cases: %v, %v", cs, err)
	}
	for src, want := range map[string]string{
		"":                          "empty test file",
		"cases: []\n---\ncases: []": "more than one",
		"cases: {a: 1}":             "want a list",
		"other: 1":                  "unknown field",
		"{}":                        "cases: required",
		"cases: [\n":                "tests/e.yaml:",
		"cases:\n  - {name: a, step: {kind: local, target: t}, expect: {decision: allow}}\n  - {name: a, step: {kind: local, target: t}, expect: {decision: allow}}\n": "duplicate name (also cases[0])",
		"cases:\n  - {name: a, step: {kind: local, target: t, occurrence: -1}, expect: {decision: allow}}":                                                             "step.occurrence",
		"cases:\n  - {name: a, step: {kind: local, target: t}, expect: {decision: allow}, execution: {created_at: yesterday}}":                                         `case`,
	} {
		_, err := ParseTestFile("tests/e.yaml", []byte(src))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "tests/e.yaml") {
			t.Errorf("ParseTestFile(%q) = %v, want an error containing %q", src, err, want)
		}
	}
}

func TestJSONFromYAML(t *testing.T) {
	tests := []struct{ yaml, json string }{
		{"a", `"a"`},
		{"'1'", `"1"`},
		{"1", `1`},
		{"-0", `-0`},
		{"1.50", `1.50`},
		{"1e3", `1e3`},
		{"0x1F", `31`},
		{"0o17", `15`},
		{"+7", `7`},
		{".5", `0.5`},
		{"1_000", `1000`},
		{"18446744073709551615", `18446744073709551615`},
		{"true", `true`},
		{"~", `null`},
		{"null", `null`},
		{"", `null`},
		{"2026-01-02T15:04:05Z", `"2026-01-02T15:04:05Z"`},
		{"[a, 1, {b: c}]", `["a",1,{"b":"c"}]`},
		{"{1: a, true: b, null: c}", `{"1":"a","true":"b","null":"c"}`},
		{"{z: 1, a: 2}", `{"z":1,"a":2}`}, // order kept; canonicalisation sorts later
		{`"<&>\u2028"`, `"\u003c\u0026\u003e\u2028"`},
		{"|\n  two\n  lines\n", `"two\nlines\n"`},
	}
	for _, tt := range tests {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(tt.yaml), &n); err != nil {
			t.Fatalf("%q: %v", tt.yaml, err)
		}
		got, err := JSONFromYAML(&n)
		if err != nil {
			t.Errorf("JSONFromYAML(%q): %v", tt.yaml, err)
			continue
		}
		if string(got) != tt.json {
			t.Errorf("JSONFromYAML(%q) = %s, want %s", tt.yaml, got, tt.json)
		}
		if !json.Valid(got) {
			t.Errorf("JSONFromYAML(%q) = %s is not valid JSON", tt.yaml, got)
		}
	}
	for src, want := range map[string]string{
		"{a: &x 1, b: *x}":  "aliases",
		"{<<: {a: 1}}":      "merge keys",
		".nan":              "no JSON form",
		"-.inf":             "no JSON form",
		"!!binary aGVsbG8=": "unsupported YAML tag",
		"!custom x":         "unsupported YAML tag",
		"{a: 1, a: 2}":      "already defined",
		"{[a]: 1}":          "keys must be scalars",
		strings.Repeat("[", 300) + strings.Repeat("]", 300): "nesting deeper",
	} {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(src), &n); err != nil {
			if !strings.Contains(err.Error(), "already defined") {
				t.Logf("%q: yaml refused it itself: %v", src, err)
			}
			continue
		}
		_, err := JSONFromYAML(&n)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("JSONFromYAML(%q) = %v, want an error containing %q", src, err, want)
		}
	}
}
