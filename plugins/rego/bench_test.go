package rego

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/wicket-run/wicket/internal/cpubench"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// benchPolicy is a realistic agent policy: effect-class rules, a regex
// deny-list on shell commands, approvals for remote mutations outside a
// trusted list, budget and rate limits, and an allow-list from data.json.
const benchPolicy = `package wicket

# 1. Destructive effects in production abort the execution.
decision := {"decision": "abort", "reason": "destructive effect in production", "rule_id": "no-destructive-prod"} if {
	input.step.effect == "destructive"
	input.execution.labels.env == "prod"
}

# 2. Shell commands matching a dangerous pattern are denied.
else := {"decision": "deny", "reason": sprintf("command matches %q", [p]), "rule_id": "shell-deny"} if {
	input.step.target == "shell.exec"
	some p in data.shell.denied_patterns
	regex.match(p, input.step.args.command)
}

# 3. Over budget: deny everything but local steps.
else := {"decision": "deny", "reason": "execution over budget", "rule_id": "budget"} if {
	input.step.kind != "local"
	input.execution.totals.cost_usd > data.limits.max_cost_usd
}

# 4. Too many steps.
else := {"decision": "deny", "reason": "too many steps", "rule_id": "step-cap"} if {
	input.execution.totals.steps > data.limits.max_steps
}

# 5. Destructive outside production needs approval.
else := {
	"decision": "require_approval", "rule_id": "destructive-approval",
	"approval": {"approvers": data.approvers.ops, "timeout": "30m", "message": sprintf("%s wants %s", [input.agent_id, input.step.target])},
} if {
	input.step.effect == "destructive"
}

# 6. Remote mutations outside the trusted list need approval.
else := {
	"decision": "require_approval", "rule_id": "remote-approval",
	"approval": {"approvers": data.approvers.owners, "timeout": "15m"},
} if {
	input.step.effect == "remote_mutation"
	not data.tools.trusted_remote[input.step.target]
}

# 7. LLM calls are allowed under a rate limit.
else := {"decision": "allow", "rule_id": "llm", "rate_limit": {"max_calls": 60, "window": "1m", "per": "agent"}} if {
	input.step.kind == "llm_call"
}

# 8. Local steps are always fine.
else := {"decision": "allow", "rule_id": "local"} if {
	input.step.kind == "local"
}

# 9. Allow-listed tools.
else := {"decision": "allow", "rule_id": "allow-list", "reason": sprintf("%s is allow-listed", [input.step.target])} if {
	input.step.target in data.tools.allowed
}

# 10. Read-only tools under a trusted prefix.
else := {"decision": "allow", "rule_id": "read-only-prefix"} if {
	input.step.effect == "read_only"
	some prefix in data.tools.read_only_prefixes
	startswith(input.step.target, prefix)
}
`

// benchData builds data.json: 50 allow-listed tools, 12 shell patterns.
func benchData() string {
	allowed := make([]string, 0, 50)
	for i := range 48 {
		allowed = append(allowed, fmt.Sprintf("tool.n%02d", i))
	}
	allowed = append(allowed, "shell.exec", "fs.read")
	trusted := map[string]bool{"github.comment": true, "slack.post": true, "jira.update": true}
	d := map[string]any{
		"tools": map[string]any{
			"allowed":            allowed,
			"trusted_remote":     trusted,
			"read_only_prefixes": []string{"search.", "docs.", "metrics."},
		},
		"shell": map[string]any{"denied_patterns": []string{
			`\brm\s+-(rf|fr)\b`, `\bmkfs(\.\w+)?\b`, `\bdd\s+if=`, `>\s*/dev/sd[a-z]`, `\bshutdown\b`, `\breboot\b`,
			`\bcurl\b.*\|\s*(ba)?sh`, `\bwget\b.*\|\s*(ba)?sh`, `\bchmod\s+-R\s+777\b`, `:\(\)\s*\{`, `\bkill\s+-9\s+1\b`, `\biptables\s+-F\b`,
		}},
		"limits":    map[string]any{"max_cost_usd": 5.0, "max_steps": 500},
		"approvers": map[string]any{"ops": []string{"alice", "bob"}, "owners": []string{"carol"}},
	}
	b, err := json.Marshal(d)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func benchBundle() *bundle.Bundle {
	return mkBundle(map[string]string{"policy.rego": benchPolicy}, benchData())
}

// benchInputs are the paths through benchPolicy worth timing.
func benchInputs() []struct {
	name string
	in   *policy.Input
	want policy.Action
} {
	destructive := step("db.drop", `{"table": "users"}`, policy.EffectDestructive)
	destructive.Execution.Labels["env"] = "staging"
	return []struct {
		name string
		in   *policy.Input
		want policy.Action
	}{
		{"allow-list", step("fs.read", `{"path": "/srv/app/config.yaml"}`, policy.EffectReadOnly), policy.Allow},
		{"shell-allow", step("shell.exec", `{"command": "git status --porcelain && ls -la /srv/app", "cwd": "/srv/app", "timeout_s": 30}`, policy.EffectLocalMutation), policy.Allow},
		{"shell-deny", step("shell.exec", `{"command": "sudo rm -rf /var/lib/postgres", "cwd": "/"}`, policy.EffectLocalMutation), policy.Deny},
		{"approval", destructive, policy.RequireApproval},
		{"no-match", step("unknown.tool", `{"q": "x"}`, policy.EffectRemoteMutation), policy.RequireApproval},
		{"undefined", step("weird.tool", `{}`, policy.EffectLocalMutation), ""},
	}
}

func TestBenchPolicy(t *testing.T) {
	ev := mustCompile(t, benchBundle())
	for _, c := range benchInputs() {
		d, err := ev.Evaluate(context.Background(), c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var got policy.Action
		if d != nil {
			got = d.Action
		}
		if got != c.want {
			t.Fatalf("%s: got %s, want %s", c.name, show(d), c.want)
		}
	}
}

// BenchmarkRegoEvaluate times one evaluation of a prepared realistic policy
// per path, with the kind of ctx the kernel passes (a deadline).
func BenchmarkRegoEvaluate(b *testing.B) {
	ev := mustCompile(b, benchBundle())
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, c := range benchInputs() {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			cpubench.Report(b)
			for b.Loop() {
				d, err := ev.Evaluate(ctx, c.in)
				if err != nil || (d == nil) != (c.want == "") {
					b.Fatalf("got %v, %v", d, err)
				}
			}
		})
	}
}

// BenchmarkRegoEvaluateParallel measures throughput of one evaluator shared
// by GOMAXPROCS goroutines.
func BenchmarkRegoEvaluateParallel(b *testing.B) {
	ev := mustCompile(b, benchBundle())
	in := benchInputs()[1].in // shell-allow: regexes plus the allow-list
	b.ReportAllocs()
	cpubench.Report(b)
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, err := ev.Evaluate(ctx, in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRegoCompile times parsing, compiling, loading data.json and
// preparing the entrypoint of the realistic policy.
func BenchmarkRegoCompile(b *testing.B) {
	eng := New()
	bn := benchBundle()
	ctx := context.Background()
	b.ReportAllocs()
	cpubench.Report(b)
	for b.Loop() {
		ev, err := eng.Compile(ctx, bn)
		if err != nil {
			b.Fatal(err)
		}
		_ = ev.Close()
	}
}

// BenchmarkInputConversion compares ways of turning a policy.Input into the
// OPA input value: the direct build used by Evaluate, and a JSON round trip
// (what rego.EvalInput does with a struct).
func BenchmarkInputConversion(b *testing.B) {
	in := benchInputs()[1].in
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		cpubench.Report(b)
		for b.Loop() {
			if _, err := inputValue(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json-roundtrip", func(b *testing.B) {
		b.ReportAllocs()
		cpubench.Report(b)
		for b.Loop() {
			raw, err := json.Marshal(in)
			if err != nil {
				b.Fatal(err)
			}
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.UseNumber()
			var x any
			if err := dec.Decode(&x); err != nil {
				b.Fatal(err)
			}
			if _, err := ast.InterfaceToValue(x); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("opa-interface-to-value", func(b *testing.B) {
		b.ReportAllocs()
		cpubench.Report(b)
		for b.Loop() {
			if _, err := ast.InterfaceToValue(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// bigArgs is an LLM-call-like argument document of about 25 KB.
func bigArgs() []byte {
	msgs := make([]map[string]any, 0, 20)
	for i := range 20 {
		msgs = append(msgs, map[string]any{"role": "user", "content": strings.Repeat(fmt.Sprintf("message %d says hello world. ", i), 40)})
	}
	b, err := json.Marshal(map[string]any{"model": "some-model", "max_tokens": 1024, "temperature": 0.2, "messages": msgs})
	if err != nil {
		panic(err)
	}
	return b
}

// BenchmarkArgsConversion compares the direct JSON-to-OPA decoder used for
// step args with encoding/json followed by ast.InterfaceToValue.
func BenchmarkArgsConversion(b *testing.B) {
	for _, c := range []struct {
		name string
		raw  []byte
	}{
		{"small", benchInputs()[1].in.Step.Args},
		{"large", bigArgs()},
	} {
		for _, f := range []struct {
			name string
			fn   func([]byte) (ast.Value, error)
		}{
			{"direct", jsonValue},
			{"encoding-json", jsonValueStd},
		} {
			b.Run(c.name+"/"+f.name, func(b *testing.B) {
				b.SetBytes(int64(len(c.raw)))
				b.ReportAllocs()
				cpubench.Report(b)
				for b.Loop() {
					if _, err := f.fn(c.raw); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
