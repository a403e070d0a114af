package rules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/enginetest"
)

func mustParse(t testing.TB, src string) *RuleSet {
	t.Helper()
	rs, err := Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// input builds an input whose args are the canonical form of argsJSON.
func input(t testing.TB, kind, target, argsJSON string) *policy.Input {
	t.Helper()
	c, h, err := canon.ArgsHash([]byte(argsJSON))
	if err != nil {
		t.Fatalf("args %s: %v", argsJSON, err)
	}
	return &policy.Input{Tenant: "default", AgentID: "researcher", Step: policy.Step{Kind: kind, Target: target, Args: c, ArgsHash: h}}
}

func ruleID(d *policy.Answer) string {
	if d == nil {
		return "<none>"
	}
	return d.RuleID
}

func TestGuardBundle(t *testing.T) {
	b, err := bundle.LoadDir("testdata/guard")
	if err != nil {
		t.Fatal(err)
	}
	if got := b.DefaultAction(); got != policy.Deny {
		t.Errorf("DefaultAction = %s, want deny (from rules.yaml)", got)
	}
	enginetest.RunBundle(t, New(), b, nil)
}

// TestPredicates checks each operator against a set of argument documents.
func TestPredicates(t *testing.T) {
	args := `{
		"command": "ls -la",
		"quoted": "say \"hi\" > out",
		"repo": "acme/web",
		"labels": ["bug", "urgent", 3, {"k": "v"}],
		"n": 2,
		"big": 12345678901234567890123,
		"f": 0.1,
		"ok": true,
		"none": null,
		"nested": {"a": {"b": [10, {"c": "deep"}]}},
		"obj": {"x": 1, "y": [1, 2]},
		"keys": {"0": "zero", "a.b": "dotted"},
		"uni": "caf\u00e9 \u2028",
		"ctl": "tab\there"
	}`
	tests := []struct {
		pred string
		want bool
	}{
		// equals
		{`repo: {equals: acme/web}`, true},
		{`repo: {equals: acme/api}`, false},
		{`n: {equals: 2}`, true},
		{`n: {equals: 2.0}`, true},
		{`n: {equals: 20e-1}`, true},
		{`n: {equals: "2"}`, false},
		{`n: {equals: 3}`, false},
		{`big: {equals: 12345678901234567890123}`, true},
		{`big: {equals: 12345678901234567890124}`, false},
		{`f: {equals: 0.1}`, true},
		{`f: {equals: 1e-1}`, true},
		{`ok: {equals: true}`, true},
		{`ok: {equals: "true"}`, false},
		{`none: {equals: null}`, true},
		{`missing: {equals: null}`, false},
		{`quoted: {equals: 'say "hi" > out'}`, true},
		{`uni: {equals: "café \u2028"}`, true},
		{`ctl: {equals: "tab\there"}`, true},
		{`obj: {equals: {y: [1, 2], x: 1}}`, true},
		{`obj: {equals: {x: 1}}`, false},
		{`obj: {equals: {x: 1, y: [1, 2], z: 0}}`, false},
		{`obj: {equals: {x: 1, y: [2, 1]}}`, false},
		{`labels: {equals: [bug, urgent, 3, {k: v}]}`, true},
		{`labels: {equals: [bug, urgent, 3]}`, false},
		// contains
		{`command: {contains: "-la"}`, true},
		{`command: {contains: "-lah"}`, false},
		{`quoted: {contains: '"hi" >'}`, true},
		{`labels: {contains: urgent}`, true},
		{`labels: {contains: urg}`, false},
		{`labels: {contains: 3}`, true},
		{`labels: {contains: {k: v}}`, true},
		{`n: {contains: 2}`, false},
		{`repo: {contains: 2}`, false},
		// one_of
		{`repo: {one_of: [acme/api, acme/web]}`, true},
		{`repo: {one_of: [acme/api]}`, false},
		{`n: {one_of: [1, 2.00]}`, true},
		{`none: {one_of: [x, null]}`, true},
		// regex
		{`command: {regex: "^(ls|cat) "}`, true},
		{`command: {regex: "^cat"}`, false},
		{`command: {regex: "la"}`, true},
		{`quoted: {regex: "^say \"hi\" > out$"}`, true},
		{`uni: {regex: "^café"}`, true},
		{`n: {regex: "2"}`, false},
		{`labels: {regex: "bug"}`, false},
		// paths
		{`nested.a.b.0: {equals: 10}`, true},
		{`nested.a.b.1.c: {equals: deep}`, true},
		{`nested.a.b.2: {equals: 10}`, false},
		{`nested.a.x: {equals: 10}`, false},
		{`nested.a.b.c: {equals: deep}`, false},
		{`keys.0: {equals: zero}`, true},
		{`labels.1: {equals: urgent}`, true},
		{`labels.01: {equals: urgent}`, false},
		{`command.0: {equals: l}`, false},
		// several operators: all must hold
		{`command: {regex: "^ls", contains: "-la"}`, true},
		{`command: {regex: "^ls", contains: "-x"}`, false},
	}
	in := input(t, "tool_call", "t", args)
	for _, tt := range tests {
		src := "rules:\n  - id: r\n    when:\n      arguments:\n        " + tt.pred + "\n    then: {decision: allow}\n"
		rs, err := Parse([]byte(src))
		if err != nil {
			t.Errorf("%s: %v", tt.pred, err)
			continue
		}
		got := rs.Evaluate(in) != nil
		if got != tt.want {
			t.Errorf("%s: matched = %v, want %v", tt.pred, got, tt.want)
		}
	}
}

// TestArgsPredicateNonCanonical: raw args with whitespace and escapes the
// canonicaliser would rewrite are read the same way.
func TestArgsPredicateNonCanonical(t *testing.T) {
	rs := mustParse(t, `rules:
  - id: r
    when:
      arguments:
        "a": {equals: "é/x"}
        b.k: {one_of: [1]}
    then: {decision: deny}
`)
	in := &policy.Input{Step: policy.Step{Kind: "tool_call", Target: "t", Args: json.RawMessage(" { \"\\u0061\" : \"\\u00e9\\/x\" ,\n \"b\":{ \"k\" : 1.0 } } ")}}
	if d := rs.Evaluate(in); ruleID(d) != "r" {
		t.Errorf("got %s, want r", ruleID(d))
	}
	for _, bad := range []string{``, `null`, `[`, `{"a":`, `{"a" "x"}`, `{"a":"é/x","b":{"k":1.0}`, `"str"`, `{"a":"é/x","b":{"k":1,}}`} {
		in.Step.Args = json.RawMessage(bad)
		_ = rs.Evaluate(in) // must not panic; the result does not matter
	}
}

func TestWhenConditions(t *testing.T) {
	rs := mustParse(t, `rules:
  - id: kinds
    when: {step_kinds: [llm_call, local], target: "m*"}
    then: {decision: deny}
  - id: agents
    when: {agent_ids: [alice, bob], target: x}
    then: {decision: deny}
  - id: effects
    when: {effects: [destructive, remote_mutation]}
    then: {decision: abort}
  - id: targets
    when: {targets: [a, "b*"], step_kind: tool_call}
    then: {decision: allow}
  - id: all-of
    when: {target: "y", agent_id: carol, step_kind: tool_call, effect: read_only}
    then: {decision: allow}
`)
	tests := []struct {
		kind, target, agent, effect string
		want                        string
	}{
		{"llm_call", "model-1", "", "", "kinds"},
		{"local", "mx", "", "", "kinds"},
		{"tool_call", "mx", "", "", "<none>"},
		{"tool_call", "x", "bob", "", "agents"},
		{"tool_call", "x", "bobby", "", "<none>"},
		{"tool_call", "z", "", "destructive", "effects"},
		{"tool_call", "z", "", "remote_mutation", "effects"},
		{"tool_call", "z", "", "read_only", "<none>"},
		{"tool_call", "a", "", "", "targets"},
		{"tool_call", "b.c", "", "", "targets"},
		{"llm_call", "a", "", "", "<none>"},
		{"tool_call", "y", "carol", "read_only", "all-of"},
		{"tool_call", "y", "carol", "", "<none>"},
		{"tool_call", "y", "dave", "read_only", "<none>"},
		{"bogus", "a", "", "", "<none>"},
	}
	for _, tt := range tests {
		in := &policy.Input{AgentID: tt.agent, Step: policy.Step{Kind: tt.kind, Target: tt.target, Effect: tt.effect, Args: json.RawMessage(`{}`)}}
		if got := ruleID(rs.Evaluate(in)); got != tt.want {
			t.Errorf("%+v: got %s, want %s", tt, got, tt.want)
		}
	}
}

func TestPriorityAndFirstMatch(t *testing.T) {
	rs := mustParse(t, `rules:
  - id: late
    priority: 100
    then: {decision: allow}
  - id: tie-first
    priority: 5
    when: {target: "fs.*"}
    then: {decision: require_approval}
  - id: tie-second
    priority: 5
    when: {target: "fs.*"}
    then: {decision: deny}
  - id: default-priority
    when: {target: "fs.rm"}
    then: {decision: abort}
  - id: negative
    priority: -1
    when: {target: "fs.rm", effect: destructive}
    then: {decision: deny, reason: destructive}
`)
	if got, want := strings.Join(rs.RuleIDs(), ","), "negative,default-priority,tie-first,tie-second,late"; got != want {
		t.Errorf("order %s, want %s", got, want)
	}
	for target, want := range map[string]string{"fs.read": "tie-first", "fs.rm": "default-priority", "net.get": "late"} {
		if got := ruleID(rs.Evaluate(input(t, "tool_call", target, `{}`))); got != want {
			t.Errorf("%s: got %s, want %s", target, got, want)
		}
	}
	in := input(t, "tool_call", "fs.rm", `{}`)
	in.Step.Effect = "destructive"
	d := rs.Evaluate(in)
	if d == nil || d.RuleID != "negative" || d.Action != policy.Deny || d.Reason != "destructive" {
		t.Errorf("got %+v", d)
	}
}

func TestDecisionShape(t *testing.T) {
	rs := mustParse(t, `rules:
  - id: gh
    then:
      decision: require_approval
      reason: needs a human
      approval_config: {approvers: [alice], timeout: 30m, message: please}
      rate_limit: {max_calls: 10, window: 1m, per: agent, algorithm: fixed, on_limiter_error: fail_open}
`)
	ev := rs.Evaluator()
	defer ev.Close()
	d, err := ev.Evaluate(context.Background(), input(t, "tool_call", "x", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"decision":"require_approval","reason":"needs a human","rule_id":"gh","approval":{"approvers":["alice"],"timeout":"30m","message":"please"},"rate_limit":{"max_calls":10,"window":"1m","per":"agent","algorithm":"fixed","on_limiter_error":"fail_open"}}`
	if got, _ := json.Marshal(d); string(got) != want {
		t.Errorf("decision %s\nwant     %s", got, want)
	}
	if err := d.Validate(); err != nil {
		t.Error(err)
	}
	// Each answer is a fresh copy.
	d.Action = policy.Allow
	d2, _ := ev.Evaluate(context.Background(), input(t, "tool_call", "x", `{}`))
	if d2.Action != policy.RequireApproval {
		t.Error("modifying an answer changed the rule")
	}
}

// TestDefaultAction: no match is nil; the host applies default_action, and
// an unmatched local step is allowed whatever it says.
func TestDefaultAction(t *testing.T) {
	for _, tt := range []struct {
		src  string
		want policy.Action
	}{
		{"default_action: allow\nrules: []\n", policy.Allow},
		{"default_action: deny\n", policy.Deny},
		{"rules: []\n", policy.Deny},
	} {
		rs := mustParse(t, tt.src)
		if rs.DefaultAction() != tt.want {
			t.Errorf("%q: DefaultAction = %s, want %s", tt.src, rs.DefaultAction(), tt.want)
		}
	}

	rs := mustParse(t, "default_action: deny\nrules:\n  - id: only-fs\n    when: {target: 'fs.*'}\n    then: {decision: require_approval}\n")
	ev := rs.Evaluator()
	for _, tt := range []struct {
		kind, target string
		want         policy.Action
		rule         string
	}{
		{"tool_call", "fs.read", policy.RequireApproval, "only-fs"},
		{"tool_call", "net.get", policy.Deny, "default_action"},
		{"llm_call", "gpt", policy.Deny, "default_action"},
		{"local", "now", policy.Allow, "default_action"},
		{"local", "fs.x", policy.RequireApproval, "only-fs"}, // a matched local step keeps its answer
	} {
		in := input(t, tt.kind, tt.target, `{}`)
		d, err := ev.Evaluate(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		if tt.rule == "default_action" && d != nil {
			t.Errorf("%s %s: got %+v, want no match", tt.kind, tt.target, d)
		}
		d = policy.ApplyDefault(d, rs.DefaultAction(), tt.kind)
		if d.Action != tt.want || d.RuleID != tt.rule {
			t.Errorf("%s %s: got %s/%s, want %s/%s", tt.kind, tt.target, d.Action, d.RuleID, tt.want, tt.rule)
		}
	}
}

func TestEmptyWhenMatchesEverything(t *testing.T) {
	rs := mustParse(t, "rules:\n  - id: all\n    when: {}\n    then: {decision: deny}\n")
	for _, k := range []string{"tool_call", "llm_call", "local", ""} {
		if got := ruleID(rs.Evaluate(&policy.Input{Step: policy.Step{Kind: k}})); got != "all" {
			t.Errorf("kind %q: got %s", k, got)
		}
	}
}

func TestEngine(t *testing.T) {
	e := New()
	if e.Name() != "rules" {
		t.Errorf("Name = %q", e.Name())
	}
	b, err := bundle.LoadDir("testdata/guard")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := e.Compile(ctx, nil); err == nil {
		t.Error("nil bundle compiled")
	}
	other := *b
	other.Manifest.Engine = "rego"
	if _, err := e.Compile(ctx, &other); err == nil || !strings.Contains(err.Error(), `engine is "rego"`) {
		t.Errorf("rego bundle: %v", err)
	}
	broken := *b
	broken.Files = map[string][]byte{"rules.yaml": []byte("rules:\n  - id: x\n    then: {decision: maybe}\n")}
	_, err = e.Compile(ctx, &broken)
	var be *bundle.Error
	if !errors.As(err, &be) || be.Item != `rule "x"` || be.Field != "then.decision" {
		t.Errorf("broken rules.yaml: %v", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.Compile(canceled, b); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled compile: %v", err)
	}
	ev, err := e.Compile(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ev.Evaluate(canceled, input(t, "tool_call", "x", `{}`)); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled evaluate: %v", err)
	}
	if _, err := ev.Evaluate(ctx, nil); err == nil {
		t.Error("nil input evaluated")
	}
	if err := ev.Close(); err != nil {
		t.Error(err)
	}
}

func TestEvaluateAllocations(t *testing.T) {
	rs := benchRuleSet(t)
	in := benchInput(t, "github.create_issue")
	if n := testing.AllocsPerRun(200, func() { rs.Evaluate(in) }); n > 1 {
		t.Errorf("Evaluate (match) allocates %v times, want at most 1 (the answer)", n)
	}
	in = benchInput(t, "nothing.matches")
	if n := testing.AllocsPerRun(200, func() { rs.Evaluate(in) }); n != 0 {
		t.Errorf("Evaluate (no match) allocates %v times, want 0", n)
	}
}

func TestLookup(t *testing.T) {
	doc := []byte(` {"a": {"b": [1, "two", {"c": null}], "e\"q": "x"}, "s": "\ud83d\ude00", "n": -1.5e3, "t": true} `)
	tests := map[string]string{
		"a.b.0":   `1`,
		"a.b.1":   `"two"`,
		"a.b.2.c": `null`,
		"a.b.2":   `{"c": null}`,
		`a.e"q`:   `"x"`,
		"s":       `"\ud83d\ude00"`,
		"n":       `-1.5e3`,
		"t":       `true`,
		"a.b.3":   "<missing>",
		"a.c":     "<missing>",
		"s.0":     "<missing>",
		"t.x":     "<missing>",
	}
	for path, want := range tests {
		p, err := parsePath(path)
		if err != nil {
			t.Fatal(err)
		}
		s, e, ok := lookup(doc, p)
		got := doc[s:e]
		if !ok {
			got = []byte("<missing>")
		}
		if string(got) != want {
			t.Errorf("lookup(%s) = %s, want %s", path, got, want)
		}
	}
	if s, e, ok := lookup(doc, nil); !ok || doc[s] != '{' || doc[e-1] != '}' {
		t.Errorf("empty path: %s", doc[s:e])
	}
}

func TestUnescape(t *testing.T) {
	for raw, want := range map[string]string{
		`plain`:              "plain",
		`a\"b\\c\/d`:         `a"b\c/d`,
		`\b\f\n\r\t`:         "\b\f\n\r\t",
		`\u00e9\u2028`:       "é\u2028",
		`\ud83d\ude00`:       "😀",
		`\ud83d`:             "\ufffd",
		`\ude00x`:            "\ufffdx",
		`\u003c\u003e\u0026`: "<>&",
	} {
		if got := string(unescape([]byte(raw))); got != want {
			t.Errorf("unescape(%s) = %q, want %q", raw, got, want)
		}
		if !unescapedEqual([]byte(raw), want) {
			t.Errorf("unescapedEqual(%s, %q) = false", raw, want)
		}
		if unescapedEqual([]byte(raw), want+"x") {
			t.Errorf("unescapedEqual(%s, %q+x) = true", raw, want)
		}
	}
	for _, bad := range []string{`\`, `\x`, `\u12`, `\u12zz`} {
		_ = unescape([]byte(bad))
		if unescapedEqual([]byte(bad), bad) {
			t.Errorf("malformed escape %s compared equal", bad)
		}
	}
}

func TestNumEqual(t *testing.T) {
	eq := [][2]string{
		{"1", "1"}, {"1", "1.0"}, {"1", "1e0"}, {"10", "1e1"}, {"10", "1E+1"}, {"0.1", "1e-1"}, {"100", "100.000"},
		{"0", "-0"}, {"0", "0.0e5"}, {"-2.5", "-25e-1"}, {"123456789012345678901234567890", "1.23456789012345678901234567890e29"},
		{"0.001", "1e-3"}, {"1200", "12e2"},
	}
	ne := [][2]string{
		{"1", "2"}, {"1", "-1"}, {"1", "10"}, {"0.1", "0.01"}, {"12", "21"}, {"1", "1.0000000000000000001"},
		{"9007199254740993", "9007199254740992"}, {"1e999999999999", "1e999999999998"},
	}
	for _, p := range eq {
		if !numEqual([]byte(p[0]), []byte(p[1])) || !numEqual([]byte(p[1]), []byte(p[0])) {
			t.Errorf("%s != %s, want equal", p[0], p[1])
		}
	}
	for _, p := range ne {
		if numEqual([]byte(p[0]), []byte(p[1])) {
			t.Errorf("%s == %s, want different", p[0], p[1])
		}
	}
}

func ExampleParse() {
	rs, err := Parse([]byte(`
default_action: deny
rules:
  - id: allow-reads
    when: {target: "fs.read*", effect: read_only}
    then: {decision: allow}
`))
	if err != nil {
		panic(err)
	}
	in := &policy.Input{Step: policy.Step{Kind: "tool_call", Target: "fs.read_file", Effect: "read_only", Args: []byte(`{}`)}}
	d, _ := rs.Evaluator().Evaluate(context.Background(), in)
	fmt.Println(d.Action, d.RuleID)

	in.Step.Target = "fs.write"
	d, _ = rs.Evaluator().Evaluate(context.Background(), in)
	d = policy.ApplyDefault(d, rs.DefaultAction(), in.Step.Kind)
	fmt.Println(d.Action, d.RuleID)
	// Output:
	// allow allow-reads
	// deny default_action
}

// TestConcurrentEvaluate hammers one evaluator from several goroutines; run
// under -race it checks that evaluation shares no mutable state.
func TestConcurrentEvaluate(t *testing.T) {
	rs := benchRuleSet(t)
	ev := rs.Evaluator()
	targets := map[string]string{"github.create_issue": "last", "email.send": "<none>", "github.delete_repo": "<none>"}
	inputs := make(map[string]*policy.Input)
	for target := range targets {
		inputs[target] = benchInput(t, target)
	}
	const goroutines, iterations = 8, 500
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		go func() {
			for i := 0; i < iterations; i++ {
				for target, want := range targets {
					d, err := ev.Evaluate(context.Background(), inputs[target])
					if err != nil || ruleID(d) != want {
						errs <- fmt.Errorf("%s: got %s, %v; want %s", target, ruleID(d), err, want)
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for g := 0; g < goroutines; g++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
