package worker_test

import (
	"context"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/worker"
)

// BenchmarkEvaluate compares one evaluation of the stock safe-shell Rego
// bundle in the kernel's process with the same in a tenant's worker: the
// price of the memory bound is the round trip over the worker's pipes.
func BenchmarkEvaluate(b *testing.B) {
	bun, err := bundle.LoadDir("../../bundles/safe-shell/rego")
	if err != nil {
		b.Fatal(err)
	}
	in := &policy.Input{Tenant: "acme", AgentID: "a", ExecutionID: "x",
		Step: policy.Step{Kind: "tool_call", Target: "shell.exec", Args: []byte(`{"command": "ls -la /tmp"}`)}}
	run := func(b *testing.B, ev policy.Evaluator) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ev.Evaluate(context.Background(), in); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("in-process", func(b *testing.B) {
		ev, err := rego.New().Compile(context.Background(), bun)
		if err != nil {
			b.Fatal(err)
		}
		defer ev.Close()
		run(b, ev)
	})
	b.Run("worker", func(b *testing.B) {
		e := newEngine(b, worker.Config{})
		ev, err := e.Compile(plugins.WithTenant(context.Background(), "acme"), bun)
		if err != nil {
			b.Fatal(err)
		}
		defer ev.Close()
		run(b, ev)
	})
}
