package wasm

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
)

// regoBundle is src as a Rego bundle with the given entrypoint.
func regoBundle(src, entrypoint string) *bundle.Bundle {
	return &bundle.Bundle{
		Manifest: bundle.Manifest{Name: "p", Revision: "1", Engine: bundle.EngineRego, Entrypoint: entrypoint},
		Files:    map[string][]byte{"policy.rego": []byte(src)},
	}
}

// TestOneSemantics runs each policy in the Rego engine and, built by OPA's
// compiler, in the OPA-ABI wasm engine: both must give the same answer —
// decision, reason and rule_id, no match, or an error — on each input.
// It covers the rules of docs/policy.md: a failing builtin is undefined
// (in the module, on the host, and in Rego), null and {} are no match, and
// boolean and deny-set entrypoints map to decisions.
func TestOneSemantics(t *testing.T) {
	type want struct {
		action policy.Action // "" with err "": no match
		reason string
		err    string // the error contains it (both engines)
	}
	cases := []struct {
		name, src, entry string
		in               *policy.Input
		want             want
	}{
		{
			name:  "failing builtin in the module is undefined",
			src:   "package p\n\ndecision := {\"decision\": \"deny\", \"reason\": \"bad pattern\"} if regex.match(input.step.args.pattern, \"x\")\n",
			entry: "data.p.decision", in: input("tool_call", "t", "", map[string]any{"pattern": "(["}),
		},
		{
			name:  "failing builtin on the host is undefined",
			src:   "package p\n\ndecision := {\"decision\": \"deny\", \"reason\": \"big\"} if units.parse_bytes(input.step.target) > 1000\n",
			entry: "data.p.decision", in: input("tool_call", "t", "", nil),
		},
		{
			name:  "failing time builtin skips only its rule",
			src:   "package p\n\ndefault allow := false\n\nallow if time.parse_rfc3339_ns(input.step.args.at) > 0\n",
			entry: "data.p.allow", in: input("tool_call", "t", "", map[string]any{"at": "yesterday"}),
			want: want{action: policy.Deny, reason: "data.p.allow is false"},
		},
		{
			name:  "to_number of a word is undefined",
			src:   "package p\n\ndeny contains \"big\" if to_number(input.step.target) > 10\n",
			entry: "data.p.deny", in: input("tool_call", "seven", "", nil),
		},
		{
			name:  "null is no match",
			src:   "package p\n\ndecision := null\n",
			entry: "data.p.decision", in: smallInput(),
		},
		{
			name:  "empty object from ref-head rules is no match",
			src:   "package p\n\ndecision.decision := \"deny\" if input.step.target == \"rm\"\n\ndecision.reason := \"no rm\" if input.step.target == \"rm\"\n",
			entry: "data.p.decision", in: input("tool_call", "ls", "", nil),
		},
		{
			name:  "ref-head rules that hold decide",
			src:   "package p\n\ndecision.decision := \"deny\" if input.step.target == \"rm\"\n\ndecision.reason := \"no rm\" if input.step.target == \"rm\"\n",
			entry: "data.p.decision", in: input("tool_call", "rm", "", nil),
			want: want{action: policy.Deny, reason: "no rm"},
		},
		{
			name:  "allow true",
			src:   "package authz\n\ndefault allow := false\n\nallow if input.step.target == \"fs.read\"\n",
			entry: "data.authz.allow", in: input("tool_call", "fs.read", "", nil),
			want: want{action: policy.Allow, reason: "data.authz.allow is true"},
		},
		{
			name:  "allow false denies",
			src:   "package authz\n\ndefault allow := false\n\nallow if input.step.target == \"fs.read\"\n",
			entry: "data.authz.allow", in: input("tool_call", "fs.write", "", nil),
			want: want{action: policy.Deny, reason: "data.authz.allow is false"},
		},
		{
			name:  "allow undefined is no match",
			src:   "package authz\n\nallow if input.step.target == \"fs.read\"\n",
			entry: "authz/allow", in: input("tool_call", "fs.write", "", nil),
		},
		{
			name:  "deny messages",
			src:   "package authz\n\ndeny contains sprintf(\"%s is destructive\", [input.step.target]) if input.step.effect == \"destructive\"\n\ndeny contains \"no shell\" if startswith(input.step.target, \"shell\")\n",
			entry: "data.authz.deny", in: input("tool_call", "shell.rm", "destructive", nil),
			want: want{action: policy.Deny, reason: "no shell; shell.rm is destructive"},
		},
		{
			name:  "no deny message is no match",
			src:   "package authz\n\ndeny contains \"no shell\" if startswith(input.step.target, \"shell\")\n",
			entry: "data.authz.deny", in: input("tool_call", "fs.read", "", nil),
		},
		{
			name:  "deny true",
			src:   "package authz\n\ndefault deny := false\n\ndeny if input.step.target == \"rm\"\n",
			entry: "data.authz.deny", in: input("tool_call", "rm", "", nil),
			want: want{action: policy.Deny, reason: "data.authz.deny is true"},
		},
		{
			name:  "deny false is no match",
			src:   "package authz\n\ndefault deny := false\n\ndeny if input.step.target == \"rm\"\n",
			entry: "data.authz.deny", in: input("tool_call", "ls", "", nil),
		},
		{
			name:  "violation objects with msg",
			src:   "package k8s\n\nviolation contains {\"msg\": \"no rm\", \"details\": {}} if input.step.target == \"rm\"\n\nviolation contains {\"code\": 7} if input.step.target == \"rm\"\n",
			entry: "data.k8s.violation", in: input("tool_call", "rm", "", nil),
			want: want{action: policy.Deny, reason: `no rm; {"code":7}`},
		},
		{
			name:  "null among deny messages stands as its JSON",
			src:   "package authz\n\ndeny contains null if input.step.target == \"rm\"\n\ndeny contains \"no rm\" if input.step.target == \"rm\"\n",
			entry: "data.authz.deny", in: input("tool_call", "rm", "", nil),
			want: want{action: policy.Deny, reason: "no rm; null"},
		},
		{
			name:  "an integral max_calls however written",
			src:   "package p\n\ndecision := {\"decision\": \"allow\", \"reason\": \"ok\", \"rate_limit\": {\"max_calls\": input.step.args.n, \"window\": \"1m\"}}\n",
			entry: "data.p.decision", in: input("tool_call", "t", "", map[string]any{"n": json.Number("1e1")}),
			want: want{action: policy.Allow, reason: "ok"},
		},
		{
			name:  "an integral max_calls written with a fraction",
			src:   "package p\n\ndecision := {\"decision\": \"allow\", \"reason\": \"ok\", \"rate_limit\": {\"max_calls\": 20.0 / 2, \"window\": \"1m\"}}\n",
			entry: "data.p.decision", in: smallInput(),
			want: want{action: policy.Allow, reason: "ok"},
		},
		{
			name:  "a fractional max_calls is an error",
			src:   "package p\n\ndecision := {\"decision\": \"allow\", \"rate_limit\": {\"max_calls\": 10.5, \"window\": \"1m\"}}\n",
			entry: "data.p.decision", in: smallInput(),
			want: want{err: "max_calls"},
		},
		{
			name:  "a boolean at a decision entrypoint is an error",
			src:   "package p\n\ndecision := true\n",
			entry: "data.p.decision", in: smallInput(),
			want: want{err: "want"},
		},
		{
			name:  "an unknown decision is an error",
			src:   "package p\n\nanswer := {\"decision\": \"maybe\"}\n",
			entry: "data.p.answer", in: smallInput(),
			want: want{err: `unknown decision "maybe"`},
		},
		{
			name:  "a number is an error",
			src:   "package p\n\nanswer := 3\n",
			entry: "data.p.answer", in: smallInput(),
			want: want{err: "want"},
		},
		{
			name:  "conflicting rules are an error",
			src:   "package p\n\nanswer := true if input.step.kind == \"tool_call\"\n\nanswer := false if input.step.target == \"t\"\n",
			entry: "data.p.answer", in: input("tool_call", "t", "", nil),
			want: want{err: "conflict"},
		},
	}
	e := newEngine(t, Config{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rev, err := rego.New().Compile(context.Background(), regoBundle(c.src, c.entry))
			if err != nil {
				t.Fatalf("rego: %v", err)
			}
			defer rev.Close()
			mod, err := buildRego(c.src, normaliseEntrypoint(c.entry))
			if err != nil {
				t.Fatalf("build: %v", err)
			}
			wev := compile(t, e, opaBundle(mod, c.entry, ""))
			for _, eng := range []struct {
				name string
				ev   policy.Evaluator
			}{{"rego", rev}, {"wasm", wev}} {
				d, err := eng.ev.Evaluate(context.Background(), c.in)
				switch {
				case c.want.err != "":
					if err == nil || !strings.Contains(err.Error(), c.want.err) {
						t.Errorf("%s: got %+v, %v; want an error containing %q", eng.name, d, err, c.want.err)
					}
				case err != nil:
					t.Errorf("%s: %v", eng.name, err)
				case c.want.action == "":
					if d != nil {
						t.Errorf("%s: got %+v, want no match", eng.name, d)
					}
				case d == nil || d.Action != c.want.action || d.Reason != c.want.reason:
					t.Errorf("%s: got %+v, want %s %q", eng.name, d, c.want.action, c.want.reason)
				case d.RuleID == "" && policy.AcceptsShapes(c.entry) && strings.HasSuffix(c.entry, "allow"):
					t.Errorf("%s: no rule_id in %+v", eng.name, d)
				}
			}
		})
	}
}
