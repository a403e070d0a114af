package wasm_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/wasm"
)

// The engine plugs into the policy host.
var _ plugins.Engine = (*wasm.Engine)(nil)

// Example compiles the C SDK example and decides two steps.
func Example() {
	mod, err := os.ReadFile("../../policy-sdk/c/examples/deny_destructive.wasm")
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(mod)
	b := &bundle.Bundle{
		Manifest: bundle.Manifest{Name: "example", Revision: "1", Engine: bundle.EngineWasm},
		Files:    map[string][]byte{wasm.PolicyFile: mod},
		Digest:   hex.EncodeToString(sum[:]),
	}

	eng := wasm.New(wasm.Config{}) // the kernel sets CacheDir: <data dir>/wasm-cache
	defer eng.Close()
	ev, err := eng.Compile(context.Background(), b)
	if err != nil {
		panic(err)
	}
	defer ev.Close()

	for _, step := range []policy.Step{
		{Kind: policy.KindToolCall, Target: "fs.delete", Effect: policy.EffectDestructive, Args: json.RawMessage(`{}`)},
		{Kind: policy.KindToolCall, Target: "shell.exec", Args: json.RawMessage(`{"cmd":"rm -rf /tmp/x"}`)},
		{Kind: policy.KindToolCall, Target: "http.get", Args: json.RawMessage(`{}`)},
	} {
		d, err := ev.Evaluate(context.Background(), &policy.Input{Tenant: "default", AgentID: "bot", Step: step})
		switch {
		case err != nil:
			fmt.Println(step.Target, "error:", err)
		case d == nil:
			fmt.Println(step.Target, "no match")
		default:
			fmt.Println(step.Target, d.Action, d.RuleID)
		}
	}
	// Output:
	// fs.delete deny no-destructive
	// shell.exec require_approval shell-rm
	// http.get no match
}
