package wasm

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	opa "github.com/open-policy-agent/opa/v1/rego"

	"github.com/wicket-run/wicket/internal/cpubench"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/rules"
)

// The decisions of policy-sdk/c/examples/deny_destructive.c, written for
// every engine: BenchmarkEngines times them side by side.
const (
	denyDestructiveRego = `package wicket

decision := {"decision": "abort", "reason": "agent root-bot may not run", "rule_id": "no-root-bot"} if {
	input.agent_id == "root-bot"
} else := {"decision": "deny", "reason": "destructive steps are not allowed", "rule_id": "no-destructive"} if {
	input.step.effect == "destructive"
} else := {"decision": "require_approval", "reason": "shell command removes files", "rule_id": "shell-rm"} if {
	input.step.kind == "tool_call"
	input.step.target == "shell.exec"
	contains(input.step.args.cmd, "rm ")
} else := {"decision": "allow", "reason": "shell command", "rule_id": "shell"} if {
	input.step.kind == "tool_call"
	input.step.target == "shell.exec"
} else := {"decision": "allow", "reason": "read-only step", "rule_id": "read-only"} if {
	input.step.effect == "read_only"
}
`
	denyDestructiveRules = `rules:
  - id: no-root-bot
    priority: 1
    when: {agent_id: root-bot}
    then: {decision: abort, reason: agent root-bot may not run}
  - id: no-destructive
    priority: 2
    when: {effect: destructive}
    then: {decision: deny, reason: destructive steps are not allowed}
  - id: shell-rm
    priority: 3
    when: {step_kind: tool_call, target: shell.exec, arguments: {cmd: {contains: "rm "}}}
    then: {decision: require_approval, reason: shell command removes files}
  - id: shell
    priority: 4
    when: {step_kind: tool_call, target: shell.exec}
    then: {decision: allow, reason: shell command}
  - id: read-only
    priority: 5
    when: {effect: read_only}
    then: {decision: allow, reason: read-only step}
`
)

// engineInputs reach every rule of deny_destructive and no rule.
func engineInputs() []*policy.Input {
	root := input("tool_call", "fs.read", "read_only", nil)
	root.AgentID = "root-bot"
	return []*policy.Input{
		root,
		input("tool_call", "db.drop", "destructive", map[string]any{"table": "users"}),
		input("tool_call", "shell.exec", "local_mutation", map[string]any{"cmd": "sudo rm -rf /tmp/build", "cwd": "/srv"}),
		input("tool_call", "shell.exec", "read_only", map[string]any{"cmd": "ls -la /srv/app", "cwd": "/srv"}),
		input("tool_call", "fs.read", "read_only", map[string]any{"path": "/srv/app/config.yaml"}),
		input("tool_call", "http.post", "remote_mutation", map[string]any{"url": "https://example.com/hook", "body": "{}"}),
	}
}

// BenchmarkEngines times one evaluation of the same decisions (those of
// policy-sdk/c/examples/deny_destructive.c) in every engine, over the same
// six inputs, after checking that all engines decide them alike: the rules
// engine, the Rego engine, OPA's compiled wasm on the OPA ABI, the C and Go
// SDK modules on the Wicket ABI, and OPA's own evaluator (topdown, whose
// answer is the raw value):
//
//	go test -run '^$' -bench BenchmarkEngines ./plugins/wasm/
func BenchmarkEngines(b *testing.B) {
	ctx := context.Background()
	e := newEngine(b, Config{})
	inputs := engineInputs()

	goWasm := filepath.Join(b.TempDir(), "benchgo.wasm")
	if err := buildGo("testdata/benchgo", goWasm); err != nil {
		b.Fatal(err)
	}
	goMod, err := os.ReadFile(goWasm)
	if err != nil {
		b.Fatal(err)
	}
	opaMod, err := buildRego(denyDestructiveRego, "wicket/decision")
	if err != nil {
		b.Fatal(err)
	}
	regoEv, err := rego.New().Compile(ctx, &bundle.Bundle{
		Manifest: bundle.Manifest{Name: "dd", Revision: "1", Engine: bundle.EngineRego},
		Files:    map[string][]byte{"policy.rego": []byte(denyDestructiveRego)},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer regoEv.Close()
	rulesEv, err := rules.New().Compile(ctx, &bundle.Bundle{
		Manifest: bundle.Manifest{Name: "dd", Revision: "1", Engine: bundle.EngineRules},
		Files:    map[string][]byte{"rules.yaml": []byte(denyDestructiveRules)},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer rulesEv.Close()
	engines := []struct {
		name string
		ev   policy.Evaluator
	}{
		{"rules", rulesEv},
		{"rego", regoEv},
		{"wasm-opa", compile(b, e, opaBundle(opaMod, "wicket/decision", ""))},
		{"wasm-c", compile(b, e, newBundle("c", cPolicy(b), relaxed))},
		{"wasm-go", compile(b, e, newBundle("go", goMod, relaxed))},
	}
	for i, in := range inputs {
		var want *policy.Answer
		for j, eng := range engines {
			d, err := eng.ev.Evaluate(ctx, in)
			if err != nil {
				b.Fatalf("%s, input %d: %v", eng.name, i, err)
			}
			if j == 0 {
				want = d
			} else if !reflect.DeepEqual(d, want) {
				b.Fatalf("input %d: %s decides %+v, rules %+v", i, eng.name, d, want)
			}
		}
	}

	for _, eng := range engines {
		b.Run(eng.name, func(b *testing.B) { benchEvaluator(b, eng.ev, inputs) })
	}
	b.Run("opa-topdown", func(b *testing.B) {
		pq, err := opa.New(opa.Module("policy.rego", denyDestructiveRego), opa.Query("data.wicket.decision")).PrepareForEval(ctx)
		if err != nil {
			b.Fatal(err)
		}
		docs := make([]any, len(inputs))
		for i, in := range inputs {
			raw, _ := json.Marshal(in)
			if err := json.Unmarshal(raw, &docs[i]); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		cpubench.Report(b)
		i := 0
		for b.Loop() {
			if _, err := pq.Eval(ctx, opa.EvalInput(docs[i%len(docs)])); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
