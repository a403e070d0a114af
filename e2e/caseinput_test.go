package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
)

// TestCaseInputIsTheKernels: the input document a tests/*.yaml case is
// decided on is the one the kernel evaluates for the same step submitted
// by an agent, field for field — so a case asserts the decision the kernel
// makes. A Rego bundle answers each step with its own input as the reason;
// the steps leave out what agents often leave out (args, idempotency,
// effect, the execution's labels). The fields a case cannot know
// (execution_id, created_at, totals) are copied from the kernel's.
func TestCaseInputIsTheKernels(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast(), Engines: []plugins.Engine{rego.New()}})
	files := map[string]string{
		"bundle.yaml": "name: echo\nengine: rego\n",
		"policy.rego": "package wicket\n\ndecision := {\"decision\": \"deny\", \"reason\": json.marshal(input)}\n",
	}
	raw, err := json.Marshal(map[string]any{"files": files})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testkit.BearerWithHeaders(env.URL, testkit.AdminKey, "PUT", "/v0/bundles/echo", map[string]string{"Content-Type": "application/json"}, raw, nil); err != nil {
		t.Fatal(err)
	}
	steps := []bundle.TestStep{
		{Kind: policy.KindToolCall, Target: "fs.read"},
		{Kind: policy.KindLLMCall, Target: "gpt", Args: map[string]any{"prompt": "hi"}},
		{Kind: policy.KindLocal, Target: "now", Effect: policy.EffectReadOnly, Idempotency: "at_most_once"},
	}
	var mu sync.Mutex
	var reasons []string
	a := testkit.NewAgent("probe", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		reasons = reasons[:0]
		for _, s := range steps {
			_, err := r.Step(ctx, s.Kind, s.Target, s.Args, testkit.StepOpts{Effect: s.Effect, Idempotency: s.Idempotency}, func() (any, error) { return "ok", nil })
			var de *testkit.DecisionError
			if !errors.As(err, &de) {
				return nil, err
			}
			reasons = append(reasons, de.Decision.Reason)
		}
		return "done", nil
	})
	env.RegisterAgent(a, "echo")
	t.Cleanup(a.Close)
	exec := env.CreateExecution("probe", map[string]any{})
	if e := env.WaitTerminal(exec, 20*time.Second); e.Status != kernel.ExecCompleted {
		t.Fatalf("execution %s: %v", e.Status, a.Errors())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reasons) != len(steps) {
		t.Fatalf("%d decisions, want %d", len(reasons), len(steps))
	}
	for i, s := range steps {
		var got policy.Input
		if err := json.Unmarshal([]byte(reasons[i]), &got); err != nil {
			t.Fatalf("step %d: %v: %s", i, err, reasons[i])
		}
		tc := bundle.TestCase{Name: s.Target, AgentID: "probe", Step: s}
		want, err := tc.Input()
		if err != nil {
			t.Fatal(err)
		}
		want.ExecutionID, want.Execution.CreatedAt, want.Execution.Totals = got.ExecutionID, got.Execution.CreatedAt, got.Execution.Totals
		if g, w := mustMarshal(t, got), mustMarshal(t, want); g != w {
			t.Errorf("%s %s:\nkernel %s\ncase   %s", s.Kind, s.Target, g, w)
		}
	}
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
