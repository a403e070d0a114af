package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
)

// TestExecutionLimits: limits given at create deny the steps past them with
// a limit_* reason (docs/policy.md, step 2), before any policy runs.
func TestExecutionLimits(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast()})
	sa := &scriptAgent{decisions: map[string][]string{}}
	a := testkit.NewAgent("limited", secret, env.URL, sa.handler("a", "b", "c"))
	defer a.Close()
	env.RegisterAgent(a, "")
	var x kernel.Execution
	if _, err := env.Admin("POST", "/v0/executions", map[string]any{"agent_id": "limited", "limits": map[string]any{"max_steps": 2}}, &x); err != nil {
		t.Fatal(err)
	}
	env.WaitTerminal(x.ID, 10*time.Second)
	if got := sa.got(x.ID); got != "a=proceed b=proceed c=denied" {
		t.Errorf("max_steps 2: %s", got)
	}
	found := false
	for _, ev := range env.Events(x.ID) {
		if ev.Type == kernel.EvStepDenied && strings.Contains(string(ev.Payload), `"rule_id":"limit_steps"`) {
			found = true
		}
	}
	if !found {
		t.Error("no step.denied with rule_id limit_steps")
	}
	// The same call over and over is a loop.
	sa2 := &scriptAgent{decisions: map[string][]string{}}
	loop := testkit.NewAgent("looper", secret, env.URL, sa2.handler("poll", "poll", "poll", "other"))
	defer loop.Close()
	env.RegisterAgent(loop, "")
	var y kernel.Execution
	if _, err := env.Admin("POST", "/v0/executions", map[string]any{"agent_id": "looper", "limits": map[string]any{"max_loop_repetitions": 2}}, &y); err != nil {
		t.Fatal(err)
	}
	env.WaitTerminal(y.ID, 10*time.Second)
	if got := sa2.got(y.ID); got != "poll=proceed poll=proceed poll=denied other=proceed" {
		t.Errorf("max_loop_repetitions 2: %s", got)
	}
	// Two failed steps in a row stop further steps; a success resets the count.
	flaky := testkit.NewAgent("flaky-steps", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		var got []string
		for i, fail := range []bool{true, false, true, true, false} {
			_, err := r.Step(ctx, "tool_call", "t", map[string]int{"i": i}, testkit.StepOpts{}, func() (any, error) {
				if fail {
					return nil, errors.New("boom")
				}
				return "ok", nil
			})
			var de *testkit.DecisionError
			var se *testkit.StepError
			switch {
			case err == nil:
				got = append(got, "ok")
			case errors.As(err, &se):
				got = append(got, "failed")
			case errors.As(err, &de):
				got = append(got, string(de.Decision.Decision)+":"+de.Decision.RuleID)
			default:
				return nil, err
			}
		}
		return strings.Join(got, " "), nil
	})
	defer flaky.Close()
	env.RegisterAgent(flaky, "")
	var z kernel.Execution
	if _, err := env.Admin("POST", "/v0/executions", map[string]any{"agent_id": "flaky-steps", "limits": map[string]any{"max_consecutive_failures": 2}}, &z); err != nil {
		t.Fatal(err)
	}
	if out := env.WaitTerminal(z.ID, 10*time.Second).Output; string(out) != `"failed ok failed failed denied:limit_consecutive_failures"` {
		t.Errorf("max_consecutive_failures 2: %s", out)
	}

	// An LLM call asking for more output tokens than a call may have.
	sa3 := &scriptAgent{decisions: map[string][]string{}}
	llm := testkit.NewAgent("llm", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		for _, n := range []int{100, 5000} {
			_, err := r.Step(ctx, "llm_call", "model", map[string]any{"max_tokens": n}, testkit.StepOpts{}, func() (any, error) { return "text", nil })
			var de *testkit.DecisionError
			dec := "proceed"
			if errors.As(err, &de) {
				dec = string(de.Decision.Decision) + ":" + de.Decision.RuleID
			} else if err != nil {
				return nil, err
			}
			sa3.mu.Lock()
			sa3.decisions[r.ExecutionID] = append(sa3.decisions[r.ExecutionID], dec)
			sa3.mu.Unlock()
		}
		return nil, nil
	})
	defer llm.Close()
	env.RegisterAgent(llm, "")
	var w kernel.Execution
	if _, err := env.Admin("POST", "/v0/executions", map[string]any{"agent_id": "llm", "limits": map[string]any{"max_output_tokens_per_call": 1000}}, &w); err != nil {
		t.Fatal(err)
	}
	env.WaitTerminal(w.ID, 10*time.Second)
	if got := sa3.got(w.ID); got != "proceed denied:limit_output_tokens" {
		t.Errorf("max_output_tokens_per_call 1000: %s", got)
	}

	for _, bad := range []map[string]any{{"max_steps": -1}, {"max_duration": "soon"}} {
		if st, _ := env.Admin("POST", "/v0/executions", map[string]any{"agent_id": "limited", "limits": bad}, nil); st != 400 {
			t.Errorf("limits %v: %d, want 400", bad, st)
		}
	}
}

// TestRateLimitScopes: a per-agent limit is shared by the agent's
// executions, a per-execution one is not, and the counts are durable.
func TestRateLimitScopes(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast(), Engines: []plugins.Engine{rules.New()}})
	policy := `default_action: allow
rules:
  - id: per-agent
    priority: 1
    when: {target: shared}
    then: {decision: allow, rate_limit: {max_calls: 3, window: 1h, per: agent, algorithm: fixed}}
  - id: per-exec
    priority: 2
    when: {target: own}
    then: {decision: allow, rate_limit: {max_calls: 1, window: 1h, per: execution}}
`
	sa := &scriptAgent{decisions: map[string][]string{}}
	a := testkit.NewAgent("scoped", secret, env.URL, sa.handler("shared", "shared", "own", "own"))
	defer a.Close()
	env.RegisterAgent(a, "")
	if _, err := env.Admin("POST", "/v0/policies/scoped", map[string]any{"bundle": policy}, nil); err != nil {
		t.Fatal(err)
	}
	id1 := env.CreateExecution("scoped", 1)
	env.WaitTerminal(id1, 10*time.Second)
	id2 := env.CreateExecution("scoped", 2)
	env.WaitTerminal(id2, 10*time.Second)
	if got := sa.got(id1); got != "shared=proceed shared=proceed own=proceed own=rate_limited" {
		t.Errorf("first execution: %s", got)
	}
	// The agent-wide limit of 3 is used up by the third call overall; the
	// per-execution limit starts afresh.
	if got := sa.got(id2); got != "shared=proceed shared=rate_limited own=proceed own=rate_limited" {
		t.Errorf("second execution: %s", got)
	}
}
