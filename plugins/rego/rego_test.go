package rego

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// mkBundle builds a rego bundle from file contents, as the loader would.
func mkBundle(files map[string]string, data string) *bundle.Bundle {
	b := &bundle.Bundle{
		Manifest: bundle.Manifest{Name: "test", Revision: "1", Engine: bundle.EngineRego, Entrypoint: DefaultEntrypoint},
		Files:    make(map[string][]byte, len(files)),
	}
	for name, src := range files {
		b.Files[name] = []byte(src)
	}
	if data != "" {
		b.Data = json.RawMessage(data)
		b.Files["data.json"] = []byte(data)
	}
	return b
}

// mustCompile compiles b and closes the evaluator when the test ends.
func mustCompile(t testing.TB, b *bundle.Bundle) policy.Evaluator {
	t.Helper()
	ev, err := testEngine().Compile(context.Background(), b)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	t.Cleanup(func() { _ = ev.Close() })
	return ev
}

// wantErr fails unless err is non-nil and contains every fragment.
func wantErr(t *testing.T, err error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", fragments)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Fatalf("error %q\ndoes not contain %q", err, f)
		}
	}
}

// step returns an input for a tool call to target with the given JSON args.
func step(target, args, effect string) *policy.Input {
	return &policy.Input{
		Tenant:      "acme",
		AgentID:     "agent-1",
		ExecutionID: "exec-1",
		Step: policy.Step{
			Kind:       policy.KindToolCall,
			Target:     target,
			Args:       json.RawMessage(args),
			ArgsHash:   "sha256:00",
			Effect:     effect,
			Occurrence: 1,
		},
		Execution: policy.Execution{
			Status:    "running",
			Labels:    map[string]string{"env": "prod"},
			Totals:    policy.Totals{Steps: 3, LLMCalls: 1, Tokens: 1200, CostUSD: 0.25},
			CreatedAt: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
		},
	}
}

// mainPolicy exercises every kind of answer; the else chain gives priority.
const mainPolicy = `package wicket

decision := {"decision": "abort", "reason": "destructive effects are not allowed", "rule_id": "no-destructive"} if {
	input.step.effect == "destructive"
} else := {"decision": "deny", "reason": "dangerous shell command", "rule_id": "shell-deny"} if {
	input.step.target == "shell.exec"
	regex.match(` + "`" + `\brm\s+-rf\b` + "`" + `, input.step.args.command)
} else := {
	"decision": "require_approval",
	"reason": "payments need a human",
	"rule_id": "payments",
	"approval": {"approvers": {"bob", "alice"}, "timeout": "15m", "message": sprintf("pay %v", [input.step.args.amount])},
} if {
	input.step.target == "payments.send"
} else := {
	"decision": "allow",
	"rule_id": "search-limited",
	"rate_limit": {"max_calls": 10, "window": "1m", "per": "agent", "on_limiter_error": "fail_open"},
} if {
	input.step.target == "search.web"
} else := {"decision": "deny"} if {
	input.step.target == "admin.reset"
} else := {"decision": "allow", "rule_id": "allow-list", "reason": sprintf("%s is allow-listed", [input.step.target])} if {
	input.step.target in data.tools.allowed
	input.execution.labels.env == "prod"
	input.execution.totals.cost_usd < 1.5
	time.parse_rfc3339_ns(input.execution.created_at) > time.parse_rfc3339_ns("2026-01-01T00:00:00Z")
}
`

const mainData = `{"tools": {"allowed": ["fs.read", "shell.exec", "http.get"]}}`

func TestEvaluate(t *testing.T) {
	ev := mustCompile(t, mkBundle(map[string]string{"policy.rego": mainPolicy}, mainData))

	tests := []struct {
		name string
		in   *policy.Input
		want *policy.Answer
	}{
		{
			name: "allow from data allow-list",
			in:   step("fs.read", `{"path": "/tmp/x"}`, policy.EffectReadOnly),
			want: &policy.Answer{Action: policy.Allow, RuleID: "allow-list", Reason: "fs.read is allow-listed"},
		},
		{
			name: "allow shell when regex does not match",
			in:   step("shell.exec", `{"command": "ls -la"}`, policy.EffectLocalMutation),
			want: &policy.Answer{Action: policy.Allow, RuleID: "allow-list", Reason: "shell.exec is allow-listed"},
		},
		{
			name: "deny by regex on args.command",
			in:   step("shell.exec", `{"command": "sudo rm -rf /"}`, policy.EffectLocalMutation),
			want: &policy.Answer{Action: policy.Deny, Reason: "dangerous shell command", RuleID: "shell-deny"},
		},
		{
			name: "require_approval with approval config",
			in:   step("payments.send", `{"amount": 12.5}`, policy.EffectRemoteMutation),
			want: &policy.Answer{
				Action: policy.RequireApproval, Reason: "payments need a human", RuleID: "payments",
				Approval: &policy.Approval{Approvers: []string{"alice", "bob"}, Timeout: "15m", Message: "pay 12.5"},
			},
		},
		{
			name: "abort on destructive effect",
			in:   step("fs.delete", `{}`, policy.EffectDestructive),
			want: &policy.Answer{Action: policy.Abort, Reason: "destructive effects are not allowed", RuleID: "no-destructive"},
		},
		{
			name: "rate_limit passthrough",
			in:   step("search.web", `{"q": "wicket"}`, policy.EffectReadOnly),
			want: &policy.Answer{
				Action: policy.Allow, RuleID: "search-limited",
				RateLimit: &policy.RateLimit{MaxCalls: 10, Window: "1m", Per: policy.PerAgent, OnLimiterError: "fail_open"},
			},
		},
		{
			name: "decision field only",
			in:   step("admin.reset", `null`, ""),
			want: &policy.Answer{Action: policy.Deny},
		},
		{
			name: "undefined is no match",
			in:   step("unknown.tool", `{}`, policy.EffectReadOnly),
			want: nil,
		},
		{
			name: "allow-listed but wrong label is no match",
			in: func() *policy.Input {
				in := step("fs.read", `{}`, policy.EffectReadOnly)
				in.Execution.Labels = nil
				return in
			}(),
			want: nil,
		},
		{
			name: "allow-listed but over budget is no match",
			in: func() *policy.Input {
				in := step("fs.read", `{}`, policy.EffectReadOnly)
				in.Execution.Totals.CostUSD = 2
				return in
			}(),
			want: nil,
		},
		{
			name: "empty args are null",
			in:   step("http.get", ``, policy.EffectReadOnly),
			want: &policy.Answer{Action: policy.Allow, RuleID: "allow-list", Reason: "http.get is allow-listed"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ev.Evaluate(context.Background(), tc.in)
			if err != nil {
				t.Fatalf("Evaluate: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %s\nwant %s", show(got), show(tc.want))
			}
		})
	}
}

func show(d *policy.Answer) string {
	b, _ := json.Marshal(d)
	return string(b)
}

// TestEvaluateErrors covers answers that are not valid decisions and
// failures during evaluation: each is an error that says what was wrong.
func TestEvaluateErrors(t *testing.T) {
	tests := []struct {
		name   string
		policy string
		want   []string
	}{
		{
			name:   "string result",
			policy: `decision := "allow"`,
			want:   []string{"rego: entrypoint data.wicket.decision returned a string, want an object with a decision field"},
		},
		{
			name:   "set result",
			policy: `decision contains "allow"`,
			want:   []string{"returned a set, want an object"},
		},
		{
			name:   "array result",
			policy: `decision := ["allow"]`,
			want:   []string{"returned an array, want an object"},
		},
		{
			name:   "boolean result",
			policy: `decision := true`,
			want:   []string{"returned a boolean, want an object"},
		},
		{
			name:   "object without decision",
			policy: `decision := {"reason": "x"}`,
			want:   []string{`returned an object without a decision field (keys: "reason")`},
		},
		{
			name:   "null decision",
			policy: `decision := {"decision": null}`,
			want:   []string{"without a decision field"},
		},
		{
			name:   "bad decision value",
			policy: `decision := {"decision": "maybe"}`,
			want:   []string{`returned an invalid decision: unknown decision "maybe"`},
		},
		{
			name:   "decision not a string",
			policy: `decision := {"decision": 1}`,
			want:   []string{"field decision is a number, want a string"},
		},
		{
			name:   "reason not a string",
			policy: `decision := {"decision": "deny", "reason": 5}`,
			want:   []string{"returned an invalid decision: field reason is a number, want a string"},
		},
		{
			name:   "approval not an object",
			policy: `decision := {"decision": "require_approval", "approval": "alice"}`,
			want:   []string{"field approval is a string, want an object"},
		},
		{
			name:   "approver not a string",
			policy: `decision := {"decision": "require_approval", "approval": {"approvers": ["alice", 7]}}`,
			want:   []string{"field approval.approvers[1] is a number, want a string"},
		},
		{
			name:   "bad approval timeout",
			policy: `decision := {"decision": "require_approval", "approval": {"timeout": "soon"}}`,
			want:   []string{"returned an invalid decision: approval.timeout"},
		},
		{
			name:   "max_calls not an integer",
			policy: `decision := {"decision": "allow", "rate_limit": {"max_calls": 1.5, "window": "1m"}}`,
			want:   []string{"field rate_limit.max_calls is 1.5, want an integer"},
		},
		{
			name:   "max_calls a string",
			policy: `decision := {"decision": "allow", "rate_limit": {"max_calls": "10", "window": "1m"}}`,
			want:   []string{"field rate_limit.max_calls is a string, want an integer"},
		},
		{
			name:   "rate limit refused by Validate",
			policy: `decision := {"decision": "allow", "rate_limit": {"max_calls": 0, "window": "1m"}}`,
			want:   []string{"returned an invalid decision: rate_limit.max_calls must be > 0"},
		},
		{
			name:   "unknown field",
			policy: `decision := {"decision": "require_approval", "approval_config": {}}`,
			want:   []string{`unknown field "approval_config" (want decision, reason, rule_id, approval, rate_limit)`},
		},
		{
			name:   "unknown nested field",
			policy: `decision := {"decision": "allow", "rate_limit": {"max_calls": 1, "window": "1m", "scope": "agent"}}`,
			want:   []string{`unknown field "rate_limit.scope"`},
		},
		{
			name: "conflicting results",
			policy: `decision := {"decision": "allow"} if input.step.target == "t"
decision := {"decision": "deny"} if input.step.kind == "tool_call"`,
			want: []string{"rego: evaluate data.wicket.decision:", "eval_conflict_error"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := mustCompile(t, mkBundle(map[string]string{"policy.rego": "package wicket\n\n" + tc.policy + "\n"}, ""))
			d, err := ev.Evaluate(context.Background(), step("t", `{"pattern": "(["}`, ""))
			if d != nil {
				t.Fatalf("got decision %s with error %v, want nil decision", show(d), err)
			}
			wantErr(t, err, tc.want...)
		})
	}
}

func TestEvaluateNullOptionalFields(t *testing.T) {
	ev := mustCompile(t, mkBundle(map[string]string{"policy.rego": `package wicket

decision := {"decision": "deny", "reason": null, "approval": null, "rate_limit": null}
`}, ""))
	got, err := ev.Evaluate(context.Background(), step("t", `{}`, ""))
	if err != nil {
		t.Fatal(err)
	}
	if want := (&policy.Answer{Action: policy.Deny}); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %s, want %s", show(got), show(want))
	}
}

// TestCompileErrors covers bundles that are refused whole.
func TestCompileErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		data  string
		edit  func(*bundle.Bundle)
		want  []string
	}{
		{
			name:  "parse error with file:line",
			files: map[string]string{"policy.rego": "package wicket\n\ndecision := {\"decision\": \"allow\"} if {\n\tinput.step.target ==\n}\n"},
			want:  []string{`rego: compile bundle "test" rev 1: policy.rego:5: rego_parse_error:`},
		},
		{
			name: "parse errors in two files",
			files: map[string]string{
				"a.rego":     "package wicket\n\ndecision := {\"decision\": \"allow\"} if {\n",
				"lib/b.rego": "package wicket.lib\n\nx := [\n",
			},
			want: []string{": a.rego:4: rego_parse_error", "\nlib/b.rego:4: rego_parse_error"},
		},
		{
			name: "type error with file:line",
			files: map[string]string{"policy.rego": `package wicket

decision := {"decision": "allow"} if {
	count(input.step.args) > 0
	x := upper(3)
	x == "3"
}
`},
			want: []string{"policy.rego:5: rego_type_error: upper: invalid argument(s)", "have: (number", "want: (x: string"},
		},
		{
			name: "unsafe variable with file:line",
			files: map[string]string{"policy.rego": `package wicket

decision := {"decision": y} if {
	input.step.target == "x"
}
`},
			want: []string{"policy.rego:3: rego_unsafe_var_error: var y is unsafe"},
		},
		{
			name:  "rego v0 syntax is refused",
			files: map[string]string{"policy.rego": "package wicket\n\ndecision = {\"decision\": \"allow\"} { true }\n"},
			want:  []string{"policy.rego:3: rego_parse_error"},
		},
		{
			name:  "missing entrypoint",
			files: map[string]string{"policy.rego": "package wicket\n\nallow if true\n"},
			want:  []string{`rego: compile bundle "test" rev 1: entrypoint data.wicket.decision is not defined by any rule (packages: data.wicket; rules: data.wicket.allow): name the one`},
		},
		{
			name:  "entrypoint in another package",
			files: map[string]string{"policy.rego": "package other\n\ndecision := {\"decision\": \"allow\"}\n"},
			want:  []string{"entrypoint data.wicket.decision is not defined by any rule (packages: data.other; rules: data.other.decision)"},
		},
		{
			// opa build -t rego -e authz/allow does not record the
			// entrypoint in the bundle, and --optimize drops annotations:
			// the refusal says how to name it.
			name:  "an OPA bundle without an entrypoint",
			files: map[string]string{"authz/policy.rego": "package authz\n\ndefault allow := false\n\nallow if input.step.target == \"fs.read\"\n\nis_read if allow\n"},
			want: []string{"entrypoint data.wicket.decision is not defined by any rule (packages: data.authz; rules: data.authz.allow, data.authz.is_read): " +
				"name the one to evaluate with entrypoint: in bundle.yaml or a # METADATA entrypoint: true annotation"},
		},
		{
			name:  "custom missing entrypoint",
			files: map[string]string{"policy.rego": mainPolicy},
			edit:  func(b *bundle.Bundle) { b.Manifest.Entrypoint = "data.wicket.verdict" },
			want:  []string{"entrypoint data.wicket.verdict is not defined by any rule"},
		},
		{
			name:  "entrypoint is a function",
			files: map[string]string{"policy.rego": "package wicket\n\ndecision(x) := {\"decision\": \"deny\"} if x\n"},
			want:  []string{"policy.rego:3: entrypoint data.wicket.decision is a function, want a rule that takes no arguments"},
		},
		{
			name:  "entrypoint not into data",
			files: map[string]string{"policy.rego": mainPolicy},
			edit:  func(b *bundle.Bundle) { b.Manifest.Entrypoint = "input.step" },
			want:  []string{`entrypoint "input.step" must be a reference into data like data.wicket.decision`},
		},
		{
			name:  "entrypoint is a package",
			files: map[string]string{"policy.rego": mainPolicy},
			edit:  func(b *bundle.Bundle) { b.Manifest.Entrypoint = "data.wicket" },
			want:  []string{`entrypoint "data.wicket" must be a reference into data`},
		},
		{
			name:  "entrypoint with a variable",
			files: map[string]string{"policy.rego": mainPolicy},
			edit:  func(b *bundle.Bundle) { b.Manifest.Entrypoint = "data.wicket[x]" },
			want:  []string{`entrypoint "data.wicket[x]" must be a constant path`},
		},
		{
			name:  "entrypoint not a reference",
			files: map[string]string{"policy.rego": mainPolicy},
			edit:  func(b *bundle.Bundle) { b.Manifest.Entrypoint = "allow if true" },
			want:  []string{`entrypoint "allow if true" is not a reference`},
		},
		{
			name: "forbidden builtin http.send",
			files: map[string]string{"policy.rego": `package wicket

decision := {"decision": "allow"} if {
	resp := http.send({"method": "GET", "url": "https://example.com"})
	resp.status_code == 200
}
`},
			want: []string{"policy.rego:4: rego_type_error: builtin http.send is not allowed in wicket policies: it reaches the network"},
		},
		{
			name:  "forbidden builtin net.lookup_ip_addr",
			files: map[string]string{"policy.rego": "package wicket\n\ndecision := {\"decision\": \"deny\"} if \"10.0.0.1\" in net.lookup_ip_addr(input.step.target)\n"},
			want:  []string{"policy.rego:3:", "builtin net.lookup_ip_addr is not allowed"},
		},
		{
			name:  "forbidden builtin opa.runtime",
			files: map[string]string{"policy.rego": "package wicket\n\ndecision := {\"decision\": \"deny\", \"reason\": opa.runtime().env.HOME}\n"},
			want:  []string{"policy.rego:3:", "builtin opa.runtime is not allowed", "environment"},
		},
		{
			name:  "forbidden builtin time.now_ns",
			files: map[string]string{"policy.rego": "package wicket\n\ndecision := {\"decision\": \"deny\"} if time.now_ns() > 0\n"},
			want:  []string{"policy.rego:3:", "builtin time.now_ns is not allowed", "input.execution.created_at"},
		},
		{
			name:  "forbidden builtin rand.intn",
			files: map[string]string{"policy.rego": "package wicket\n\ndecision := {\"decision\": \"deny\"} if rand.intn(\"x\", 10) == 0\n"},
			want:  []string{"builtin rand.intn is not allowed", "random"},
		},
		{
			name: "forbidden builtin mocked with with",
			files: map[string]string{"policy.rego": `package wicket

f(x) := x
decision := {"decision": "deny"} if f(1) with f as http.send
`},
			want: []string{"policy.rego:4: rego_unsafe_var_error: var http is unsafe"},
		},
		{
			name: "a test mocking a forbidden builtin",
			files: map[string]string{"policy.rego": mainPolicy, "policy_test.rego": `package wicket

test_late if decision with time.now_ns as 5
`},
			want: []string{"policy_test.rego:3: rego_type_error: with time.now_ns: builtin time.now_ns is not allowed in wicket policies, so there is nothing to mock", "input.execution.created_at"},
		},
		{
			name:  "data.json not an object",
			files: map[string]string{"policy.rego": mainPolicy},
			data:  `["fs.read"]`,
			want:  []string{"data.json: want a JSON object, got array"},
		},
		{
			name:  "data.json invalid",
			files: map[string]string{"policy.rego": mainPolicy},
			data:  `{"tools": `,
			want:  []string{"data.json:"},
		},
		{
			name:  "data.json collides with a rule",
			files: map[string]string{"policy.rego": mainPolicy},
			data:  `{"wicket": {"decision": {"decision": "allow"}}}`,
			want:  []string{"policy.rego:3: data.json also defines data.wicket.decision"},
		},
		{
			name:  "no rego files",
			files: map[string]string{"rules.yaml": "rules: []", "tests/x.rego": "package wicket\n"},
			want:  []string{"no .rego files outside tests/"},
		},
		{
			name:  "empty module",
			files: map[string]string{"policy.rego": "# nothing here\n"},
			want:  []string{"rego: compile bundle \"test\" rev 1: policy.rego: rego_parse_error: empty module"},
		},
		{
			name:  "wrong engine",
			files: map[string]string{"policy.rego": mainPolicy},
			edit:  func(b *bundle.Bundle) { b.Manifest.Engine = bundle.EngineWasm },
			want:  []string{`bundle engine is "wasm", not "rego"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := mkBundle(tc.files, tc.data)
			if tc.edit != nil {
				tc.edit(b)
			}
			ev, err := New().Compile(context.Background(), b)
			if ev != nil {
				_ = ev.Close()
				t.Fatalf("Compile accepted the bundle (err %v)", err)
			}
			wantErr(t, err, tc.want...)
		})
	}
}

func TestCompileNilBundle(t *testing.T) {
	_, err := New().Compile(context.Background(), nil)
	wantErr(t, err, "rego: compile: nil bundle")
}

func TestCompileCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := New().Compile(ctx, mkBundle(map[string]string{"policy.rego": mainPolicy}, mainData))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

// TestCompileBundleShapes covers what Compile accepts besides the basics.
func TestCompileBundleShapes(t *testing.T) {
	t.Run("default entrypoint and engine", func(t *testing.T) {
		b := mkBundle(map[string]string{"policy.rego": "package wicket\n\ndecision := {\"decision\": \"deny\"}\n"}, "")
		b.Manifest.Entrypoint = ""
		b.Manifest.Engine = ""
		d, err := mustCompile(t, b).Evaluate(context.Background(), step("x", `{}`, ""))
		if err != nil || d == nil || d.Action != policy.Deny {
			t.Fatalf("got %s, %v; want deny", show(d), err)
		}
	})
	t.Run("files under tests are ignored", func(t *testing.T) {
		b := mkBundle(map[string]string{
			"policy.rego":      mainPolicy,
			"tests/bad.rego":   "this is not rego",
			"tests/cases.yaml": "- name: x",
		}, mainData)
		mustCompile(t, b)
	})
	t.Run("several packages and a custom entrypoint", func(t *testing.T) {
		b := mkBundle(map[string]string{
			"main.rego": `package acme.policy

import data.acme.lib

verdict := {"decision": "deny", "reason": lib.why} if lib.blocked
`,
			"lib/lib.rego": `package acme.lib

blocked if input.step.target in data.acme.blocked
why := sprintf("%s is blocked", [input.step.target])
`,
		}, `{"acme": {"blocked": ["db.drop"]}}`)
		b.Manifest.Entrypoint = "data.acme.policy.verdict"
		ev := mustCompile(t, b)
		d, err := ev.Evaluate(context.Background(), step("db.drop", `{}`, ""))
		if err != nil || d == nil || d.Reason != "db.drop is blocked" {
			t.Fatalf("got %s, %v; want deny with reason", show(d), err)
		}
		if d, err := ev.Evaluate(context.Background(), step("db.read", `{}`, "")); d != nil || err != nil {
			t.Fatalf("got %s, %v; want no match", show(d), err)
		}
	})
	t.Run("entrypoint defined by ref-head rules", func(t *testing.T) {
		b := mkBundle(map[string]string{"policy.rego": `package wicket

decision.decision := "deny" if input.step.target == "x"
decision.reason := "ref head" if input.step.target == "x"
`}, "")
		ev := mustCompile(t, b)
		d, err := ev.Evaluate(context.Background(), step("x", `{}`, ""))
		if err != nil || d == nil || d.Reason != "ref head" {
			t.Fatalf("got %s, %v; want deny", show(d), err)
		}
		// None holds: the entrypoint is an empty object, which is no match.
		if d, err := ev.Evaluate(context.Background(), step("y", `{}`, "")); d != nil || err != nil {
			t.Fatalf("got %s, %v; want no match", show(d), err)
		}
	})
	t.Run("data at a nested path, merged by the loader", func(t *testing.T) {
		b, err := bundle.Options{Name: "nested"}.LoadFiles(map[string][]byte{
			"policy.rego":      []byte(mainPolicy),
			"tools/data.json":  []byte(`{"allowed": ["shell.exec"]}`),
			"tools/data.yaml":  []byte("allowed_too: [x]\n"),
			"other/data.json":  []byte(`{"unused": true}`),
			"tools/notes.json": []byte(`{"allowed": ["not data"]}`),
		})
		if err != nil {
			t.Fatal(err)
		}
		ev := mustCompile(t, b)
		d, err := ev.Evaluate(context.Background(), step("shell.exec", `{"command": "ls"}`, ""))
		if err != nil || d == nil || d.RuleID != "allow-list" {
			t.Fatalf("shell.exec: got %s, %v; want allow-list (from tools/data.json)", show(d), err)
		}
		d, err = ev.Evaluate(context.Background(), step("fs.read", `{}`, ""))
		if err != nil || d != nil {
			t.Fatalf("fs.read: got %s, %v; want no match (not in tools/data.json)", show(d), err)
		}
	})
	t.Run("pure net.cidr helpers stay available", func(t *testing.T) {
		b := mkBundle(map[string]string{"policy.rego": `package wicket

decision := {"decision": "deny"} if net.cidr_contains("10.0.0.0/8", input.step.args.ip)
`}, "")
		d, err := mustCompile(t, b).Evaluate(context.Background(), step("x", `{"ip": "10.1.2.3"}`, ""))
		if err != nil || d == nil {
			t.Fatalf("got %s, %v; want deny", show(d), err)
		}
	})
	t.Run("print statements are compiled out", func(t *testing.T) {
		b := mkBundle(map[string]string{"policy.rego": `package wicket

decision := {"decision": "allow"} if print("evaluating", input.step.target)
`}, "")
		d, err := mustCompile(t, b).Evaluate(context.Background(), step("x", `{}`, ""))
		if err != nil || d == nil {
			t.Fatalf("got %s, %v; want allow", show(d), err)
		}
	})
}

// slowPolicy loops long enough (~10^8 iterations) that only cancellation
// ends it in test time.
const slowPolicy = `package wicket

decision := {"decision": "deny"} if {
	some i in numbers.range(1, 10000)
	some j in numbers.range(1, 10000)
	i * j == -1
}
`

func TestEvaluateContext(t *testing.T) {
	ev := mustCompile(t, mkBundle(map[string]string{"policy.rego": slowPolicy}, ""))
	in := step("x", `{}`, "")

	t.Run("already cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := ev.Evaluate(ctx, in)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	})
	t.Run("deadline during evaluation", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := ev.Evaluate(ctx, in)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want context.DeadlineExceeded", err)
		}
		wantErr(t, err, "rego: evaluate data.wicket.decision: context deadline exceeded")
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("evaluation took %v after a 20ms deadline", el)
		}
	})
	t.Run("cancel during evaluation", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel)
		_, err := ev.Evaluate(ctx, in)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	})
}

func TestEvaluateAfterClose(t *testing.T) {
	ev, err := testEngine().Compile(context.Background(), mkBundle(map[string]string{"policy.rego": mainPolicy}, mainData))
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ev.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err = ev.Evaluate(context.Background(), step("fs.read", `{}`, ""))
	wantErr(t, err, "rego: evaluate data.wicket.decision: evaluator closed")
}

func TestEvaluateBadInput(t *testing.T) {
	ev := mustCompile(t, mkBundle(map[string]string{"policy.rego": mainPolicy}, mainData))
	_, err := ev.Evaluate(context.Background(), nil)
	wantErr(t, err, "nil input")
	_, err = ev.Evaluate(context.Background(), step("fs.read", `{"a": `, ""))
	wantErr(t, err, "rego: evaluate data.wicket.decision: input: step.args:")
	_, err = ev.Evaluate(context.Background(), step("fs.read", `{} {}`, ""))
	wantErr(t, err, "step.args: invalid JSON")
}

// TestEvaluateConcurrent hammers one evaluator from many goroutines (run it
// under -race) and checks every answer.
func TestEvaluateConcurrent(t *testing.T) {
	ev := mustCompile(t, mkBundle(map[string]string{"policy.rego": mainPolicy}, mainData))
	cases := []struct {
		in   *policy.Input
		want policy.Action
	}{
		{step("fs.read", `{}`, policy.EffectReadOnly), policy.Allow},
		{step("shell.exec", `{"command": "rm -rf /"}`, ""), policy.Deny},
		{step("payments.send", `{"amount": 1}`, ""), policy.RequireApproval},
		{step("x", `{}`, policy.EffectDestructive), policy.Abort},
		{step("nope", `{}`, ""), ""},
	}
	const goroutines, iterations = 32, 100
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range iterations {
				c := cases[(g+i)%len(cases)]
				d, err := ev.Evaluate(context.Background(), c.in)
				if err != nil {
					errs <- err
					return
				}
				var got policy.Action
				if d != nil {
					got = d.Action
				}
				if got != c.want {
					errs <- fmt.Errorf("goroutine %d iteration %d: %s: got %q, want %q", g, i, c.in.Step.Target, got, c.want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestName(t *testing.T) {
	if got := New().Name(); got != "rego" {
		t.Fatalf("Name() = %q, want rego", got)
	}
}

// TestCompileConcurrent compiles with one Engine from several goroutines
// (run it under -race): the engine's capabilities are shared read-only.
func TestCompileConcurrent(t *testing.T) {
	eng := New()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev, err := eng.Compile(context.Background(), benchBundle())
			if err != nil {
				errs <- err
				return
			}
			defer ev.Close()
			if _, err := ev.Evaluate(context.Background(), step("fs.read", `{}`, policy.EffectReadOnly)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestCloseDuringEvaluate closes an evaluator while goroutines use it (run it
// under -race): each call either answers correctly or reports the close.
func TestCloseDuringEvaluate(t *testing.T) {
	ev, err := testEngine().Compile(context.Background(), mkBundle(map[string]string{"policy.rego": mainPolicy}, mainData))
	if err != nil {
		t.Fatal(err)
	}
	in := step("fs.read", `{}`, policy.EffectReadOnly)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	start := make(chan struct{})
	var evaluated atomic.Int64
	running := make(chan struct{}) // closed once every goroutine has evaluated once
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for first := true; ; first = false {
				if first && evaluated.Add(1) == 8 {
					close(running)
				}
				d, err := ev.Evaluate(context.Background(), in)
				if err != nil {
					if !strings.Contains(err.Error(), "evaluator closed") {
						errs <- err
					}
					return
				}
				if d == nil || d.Action != policy.Allow {
					errs <- fmt.Errorf("got %s, want allow", show(d))
					return
				}
			}
		}()
	}
	close(start)
	<-running // every goroutine is in its loop: Close lands among evaluations
	if err := ev.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
