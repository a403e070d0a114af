// Package e2e holds end-to-end tests: a real kernel on a real bbolt file,
// real HTTP on loopback, and real agents speaking the protocol.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

const secret = "agent-secret-0123456789"

func fast() kernel.Config {
	return kernel.Config{LeaseTimeout: 400 * time.Millisecond, DispatchTimeout: 200 * time.Millisecond,
		DispatchBackoff: 10 * time.Millisecond, DispatchBackoffMax: 50 * time.Millisecond, ReapInterval: 20 * time.Millisecond}
}

func mustCheckLog(t *testing.T, env *testkit.Env, id string) []kernel.Event {
	t.Helper()
	evs := env.Events(id)
	if err := testkit.CheckLog(evs); err != nil {
		t.Fatalf("execution %s: %v\nlog: %v", id, err, testkit.Types(evs))
	}
	return evs
}

// TestEndToEnd runs one execution through a real agent: the same call twice
// gets occurrences 0 and 1 (two steps), every kind of step is recorded, and
// the log holds docs/durability.md's invariants. Its agent does not beat,
// and it wants one claim: the kernel's default lease and dispatch timeout,
// not fast()'s, so a machine that stalls the run for 400 ms does not lapse
// the lease (the tests that mean a lapse use fast()).
func TestEndToEnd(t *testing.T) {
	env := testkit.Start(t, testkit.Options{})
	var calls atomic.Int64
	agent := testkit.NewAgent("researcher", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		var in struct{ Query string }
		if err := json.Unmarshal(r.Input, &in); err != nil {
			return nil, err
		}
		search := func() (any, error) { calls.Add(1); return map[string]any{"hits": []string{in.Query + "-1"}}, nil }
		if _, err := r.Step(ctx, "tool_call", "search", map[string]any{"q": in.Query}, testkit.StepOpts{Effect: "read_only"}, search); err != nil {
			return nil, err
		}
		if _, err := r.Step(ctx, "tool_call", "search", map[string]any{"q": in.Query}, testkit.StepOpts{Effect: "read_only"}, search); err != nil {
			return nil, err
		}
		now, err := r.Step(ctx, "local", "now", nil, testkit.StepOpts{}, func() (any, error) { return "2026-11-29T00:00:00Z", nil })
		if err != nil {
			return nil, err
		}
		ans, err := r.Step(ctx, "llm_call", "gpt-x", map[string]any{"messages": []any{map[string]any{"role": "user", "content": in.Query}}}, testkit.StepOpts{},
			func() (any, error) { return map[string]any{"content": "answer"}, nil })
		if err != nil {
			return nil, err
		}
		return map[string]any{"answer": json.RawMessage(ans), "at": json.RawMessage(now)}, nil
	})
	defer agent.Close()
	env.RegisterAgent(agent, "")

	id := env.CreateExecution("researcher", map[string]any{"query": "wicket"})
	x := env.WaitTerminal(id, 10*time.Second)
	if x.Status != kernel.ExecCompleted {
		t.Fatalf("status %s (%s), agent errors %v", x.Status, x.Error, agent.Errors())
	}
	if got := string(x.Output); got != `{"answer":{"content":"answer"},"at":"2026-11-29T00:00:00Z"}` {
		t.Errorf("output %s", got)
	}
	if calls.Load() != 2 {
		t.Errorf("search ran %d times, want 2 (same call twice = two steps)", calls.Load())
	}
	run := agent.Runs[0]
	if len(run.Decisions) != 4 {
		t.Fatalf("decisions %+v", run.Decisions)
	}
	d0, d1 := run.Decisions[0], run.Decisions[1]
	if d0.Occurrence != 0 || d1.Occurrence != 1 || d0.StepID == d1.StepID || d0.Decision != "proceed" || d1.Decision != "proceed" {
		t.Errorf("same call twice: %+v / %+v", d0, d1)
	}
	evs := mustCheckLog(t, env, id)
	for typ, want := range map[kernel.EventType]int{kernel.EvStepProposed: 4, kernel.EvStepAllowed: 4, kernel.EvStepExecuting: 4, kernel.EvStepSucceeded: 4,
		kernel.EvExecutionStarted: 1, kernel.EvDispatchClaimed: 1, kernel.EvExecutionCompleted: 1} {
		if got := testkit.Count(evs, typ); got != want {
			t.Errorf("%s: %d events, want %d", typ, got, want)
		}
	}
	// Decision events say which policy decided (the kernel default here).
	for _, ev := range evs {
		if ev.Type == kernel.EvStepAllowed {
			var p struct {
				Bundle struct{ Name, Engine string }
				RuleID string `json:"rule_id"`
			}
			_ = json.Unmarshal(ev.Payload, &p)
			if p.Bundle.Name != "kernel-default" || p.RuleID == "" {
				t.Errorf("decision event does not name its policy: %s", ev.Payload)
			}
		}
	}
	var steps struct{ Steps []kernel.Step }
	if _, err := env.Admin("GET", "/v0/executions/"+id+"/steps?status=terminal", nil, &steps); err != nil {
		t.Fatal(err)
	}
	if len(steps.Steps) != 4 {
		t.Errorf("%d terminal steps, want 4", len(steps.Steps))
	}
}

// TestReplayAfterRedelivery: an agent that dies mid-run (no heartbeat, no
// completion) is re-delivered; the new attempt replays recorded steps
// without running them again and finishes.
func TestReplayAfterRedelivery(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast()})
	var runs sync.Map // step target -> count
	count := func(name string) func() (any, error) {
		return func() (any, error) {
			v, _ := runs.LoadOrStore(name, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
			return name + "-done", nil
		}
	}
	var attempt atomic.Int64
	agent := testkit.NewAgent("worker", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		n := attempt.Add(1)
		if _, err := r.Step(ctx, "tool_call", "a", map[string]int{"x": 1}, testkit.StepOpts{}, count("a")); err != nil {
			return nil, err
		}
		if _, err := r.Step(ctx, "tool_call", "b", map[string]int{"x": 2}, testkit.StepOpts{}, count("b")); err != nil {
			return nil, err
		}
		if n == 1 {
			<-ctx.Done() // "crash": never heartbeat, never finish
			return nil, ctx.Err()
		}
		if _, err := r.Step(ctx, "tool_call", "c", map[string]int{"x": 3}, testkit.StepOpts{}, count("c")); err != nil {
			return nil, err
		}
		return "ok", nil
	})
	defer agent.Close()
	env.RegisterAgent(agent, "")
	id := env.CreateExecution("worker", nil)
	x := env.WaitTerminal(id, 10*time.Second)
	if x.Status != kernel.ExecCompleted {
		t.Fatalf("status %s, errors %v", x.Status, agent.Errors())
	}
	for _, name := range []string{"a", "b", "c"} {
		v, ok := runs.Load(name)
		if !ok || v.(*atomic.Int64).Load() != 1 {
			t.Errorf("step %s ran %v times, want exactly 1", name, v)
		}
	}
	second := agent.Runs[len(agent.Runs)-1]
	if second.Lease.Attempt < 2 {
		t.Fatalf("last run is attempt %d", second.Lease.Attempt)
	}
	if second.Decisions[0].Decision != "replay" || second.Decisions[1].Decision != "replay" || second.Decisions[2].Decision != "proceed" {
		t.Errorf("second attempt decisions: %+v", second.Decisions)
	}
	if string(second.Decisions[0].Result) != `"a-done"` {
		t.Errorf("replayed result %s", second.Decisions[0].Result)
	}
	evs := mustCheckLog(t, env, id)
	if testkit.Count(evs, kernel.EvDispatchSuperseded) < 1 {
		t.Errorf("no dispatch.superseded in %v", testkit.Types(evs))
	}
}

// TestLeaseSuperseded: an agent that stops heartbeating is superseded; its
// later mutations get 409 lease_superseded and change nothing.
func TestLeaseSuperseded(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast()})
	release := make(chan struct{})
	stale := make(chan *testkit.Run, 1)
	fresh := make(chan struct{}, 1)
	var stepID atomic.Value
	agent := testkit.NewAgent("slow", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		if r.Lease.Attempt == 1 {
			// Record one step, then leave a second in flight and stall.
			if _, err := r.Step(ctx, "tool_call", "first", nil, testkit.StepOpts{}, func() (any, error) { return 1, nil }); err != nil {
				return nil, err
			}
			var d kernel.StepDecision
			if err := r.Client().Do(ctx, "POST", "/v0/executions/"+r.ExecutionID+"/steps", &r.Lease, map[string]any{"kind": "tool_call", "target": "second", "idempotency": "safe_to_retry"}, &d); err != nil {
				return nil, err
			}
			stepID.Store(d.StepID)
			stale <- r
			<-release
			return nil, errors.New("stale run ends")
		}
		if _, err := r.Step(ctx, "tool_call", "first", nil, testkit.StepOpts{}, func() (any, error) { t.Error("recorded step ran again"); return nil, nil }); err != nil {
			return nil, err
		}
		fresh <- struct{}{}
		<-release
		if _, err := r.Step(ctx, "tool_call", "second", nil, testkit.StepOpts{Idempotency: "safe_to_retry"}, func() (any, error) { return 2, nil }); err != nil {
			return nil, err
		}
		return "done", nil
	})
	defer agent.Close()
	env.RegisterAgent(agent, "")
	id := env.CreateExecution("slow", nil)
	old := <-stale
	// Wait for the re-delivery (attempt 2) to hold the lease and replay.
	select {
	case <-fresh:
	case <-time.After(5 * time.Second):
		t.Fatal("no re-delivery")
	}
	env.WaitStatus(id, 5*time.Second, func(kernel.ExecStatus) bool {
		evs := env.Events(id)
		return evs[len(evs)-1].Type == kernel.EvDispatchAcked
	})
	before := env.Events(id)
	sid := stepID.Load().(string)
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"complete step": func() error {
			return old.Client().Do(ctx, "POST", "/v0/executions/"+id+"/steps/"+sid+"/complete", &old.Lease, map[string]any{"result": "late"}, nil)
		},
		"submit step": func() error {
			return old.Client().Do(ctx, "POST", "/v0/executions/"+id+"/steps", &old.Lease, map[string]any{"kind": "tool_call", "target": "third"}, nil)
		},
		"heartbeat": func() error {
			return old.Client().Do(ctx, "POST", "/v0/executions/"+id+"/heartbeat", &old.Lease, []byte("{}"), nil)
		},
		"complete execution": func() error {
			return old.Client().Do(ctx, "POST", "/v0/executions/"+id+"/complete", &old.Lease, map[string]any{"output": "stale"}, nil)
		},
	} {
		err := call()
		var ae *testkit.APIError
		if !errors.As(err, &ae) || ae.Status != 409 || ae.Code != kernel.CodeLeaseSuperseded {
			t.Errorf("%s with a superseded lease: %v, want 409 lease_superseded", name, err)
		}
	}
	after := env.Events(id)
	if len(after) != len(before) {
		t.Errorf("superseded mutations changed the log: %d -> %d events", len(before), len(after))
	}
	close(release)
	x := env.WaitTerminal(id, 10*time.Second)
	if x.Status != kernel.ExecCompleted {
		t.Fatalf("status %s", x.Status)
	}
	st, err := env.Kernel.GetStep(ctx, "default", id, sid)
	if err != nil || string(st.Result) != "2" {
		t.Errorf("second step: %+v %v (the stale result must not stand)", st, err)
	}
	mustCheckLog(t, env, id)
}

// TestManyConcurrentExecutions: the invariants hold under load.
func TestManyConcurrentExecutions(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: kernel.Config{ReapInterval: 50 * time.Millisecond}})
	agent := testkit.NewAgent("busy", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		for i := range 8 {
			if _, err := r.Step(ctx, "tool_call", "t", map[string]int{"i": i % 4}, testkit.StepOpts{}, func() (any, error) { return i, nil }); err != nil {
				return nil, err
			}
		}
		return "ok", nil
	})
	defer agent.Close()
	env.RegisterAgent(agent, "")
	const n = 40
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); ids[i] = env.CreateExecution("busy", i) }()
	}
	wg.Wait()
	for _, id := range ids {
		x := env.WaitTerminal(id, 30*time.Second)
		if x.Status != kernel.ExecCompleted {
			t.Fatalf("%s: %s %s", id, x.Status, x.Error)
		}
		evs := mustCheckLog(t, env, id)
		if got := testkit.Count(evs, kernel.EvStepSucceeded); got != 8 {
			t.Errorf("%s: %d steps succeeded, want 8", id, got)
		}
	}
	if errs := agent.Errors(); len(errs) > 0 {
		t.Errorf("agent errors: %v", errs)
	}
}

// TestOrphans: a step in flight when its attempt ends is re-proceeded when
// safe_to_retry and failed indeterminate when at_most_once.
func TestOrphans(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast()})
	type seen struct{ safe, once kernel.StepDecision }
	got := make(chan seen, 1)
	agent := testkit.NewAgent("orphaner", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		submit := func(target, mode string) kernel.StepDecision {
			var d kernel.StepDecision
			if err := r.Client().Do(ctx, "POST", "/v0/executions/"+r.ExecutionID+"/steps", &r.Lease, map[string]any{"kind": "tool_call", "target": target, "idempotency": mode}, &d); err != nil {
				t.Errorf("submit: %v", err)
			}
			return d
		}
		s, o := submit("charge", "safe_to_retry"), submit("email", "at_most_once")
		if r.Lease.Attempt == 1 {
			<-ctx.Done() // die with both steps in flight
			return nil, ctx.Err()
		}
		got <- seen{s, o}
		return "ok", nil
	})
	defer agent.Close()
	env.RegisterAgent(agent, "")
	id := env.CreateExecution("orphaner", nil)
	var s seen
	select {
	case s = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no second attempt")
	}
	if s.safe.Decision != "proceed" {
		t.Errorf("safe_to_retry orphan: %+v, want proceed", s.safe)
	}
	if s.once.Decision != "replay" || !jsonHas(s.once.Error, "code", "indeterminate") {
		t.Errorf("at_most_once orphan: %+v, want replay of indeterminate", s.once)
	}
	env.WaitTerminal(id, 5*time.Second)
	mustCheckLog(t, env, id)
}

func jsonHas(raw json.RawMessage, key, want string) bool {
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return m[key] == want
}

// TestDispatchRetryAndExhaustion: failed deliveries back off and retry with
// attempt+1; past the maximum the execution fails dispatch_exhausted.
func TestDispatchRetryAndExhaustion(t *testing.T) {
	cfg := fast()
	cfg.DispatchMaxAttempts = 3
	env := testkit.Start(t, testkit.Options{Config: cfg})
	var flaky atomic.Int64
	agent := testkit.NewAgent("flaky", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) { return r.Lease.Attempt, nil })
	defer agent.Close()
	agent.Fail = func(p wire.WebhookPayload) int {
		if flaky.Add(1) <= 2 {
			return 503
		}
		return 0
	}
	env.RegisterAgent(agent, "")
	id := env.CreateExecution("flaky", nil)
	x := env.WaitTerminal(id, 10*time.Second)
	if x.Status != kernel.ExecCompleted || string(x.Output) != "3" {
		t.Fatalf("flaky agent: %s output %s", x.Status, x.Output)
	}
	evs := mustCheckLog(t, env, id)
	if testkit.Count(evs, kernel.EvDispatchFailed) != 2 || testkit.Count(evs, kernel.EvDispatchClaimed) != 3 {
		t.Errorf("log %v", testkit.Types(evs))
	}

	down := testkit.NewAgent("down", secret, env.URL, nil)
	defer down.Close()
	down.Fail = func(wire.WebhookPayload) int { return 500 }
	env.RegisterAgent(down, "")
	id2 := env.CreateExecution("down", nil)
	x2 := env.WaitTerminal(id2, 10*time.Second)
	if x2.Status != kernel.ExecFailed || x2.Reason != "dispatch_exhausted" {
		t.Fatalf("down agent: %s %s", x2.Status, x2.Reason)
	}
	if down.Webhooks.Load() != 3 {
		t.Errorf("down agent got %d webhooks, want 3", down.Webhooks.Load())
	}
	mustCheckLog(t, env, id2)
}

// TestCancel: cancelling a running execution cancels its open steps, ends
// the lease, and leaves the cancellation as the last event.
func TestCancel(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast()})
	inflight := make(chan *testkit.Run, 1)
	done := make(chan error, 1)
	agent := testkit.NewAgent("c", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		var d kernel.StepDecision
		if err := r.Client().Do(ctx, "POST", "/v0/executions/"+r.ExecutionID+"/steps", &r.Lease, map[string]any{"kind": "tool_call", "target": "long"}, &d); err != nil {
			return nil, err
		}
		inflight <- r
		<-ctx.Done()
		done <- r.Client().Do(context.Background(), "POST", "/v0/executions/"+r.ExecutionID+"/steps/"+d.StepID+"/complete", &r.Lease, map[string]any{"result": 1}, nil)
		return nil, ctx.Err()
	})
	agent.HeartbeatEvery = 50 * time.Millisecond
	env.RegisterAgent(agent, "")
	id := env.CreateExecution("c", nil)
	<-inflight
	if st, err := env.Admin("POST", "/v0/executions/"+id+"/cancel", nil, nil); err != nil || st != 204 {
		t.Fatalf("cancel: %d %v", st, err)
	}
	if st, _ := env.Admin("POST", "/v0/executions/"+id+"/cancel", nil, nil); st != 409 {
		t.Errorf("second cancel: %d, want 409", st)
	}
	agent.Close()
	var ae *testkit.APIError
	if err := <-done; !errors.As(err, &ae) || ae.Status != 409 {
		t.Errorf("completing a step of a cancelled execution: %v, want 409", err)
	}
	evs := mustCheckLog(t, env, id)
	if evs[len(evs)-1].Type != kernel.EvExecutionCancelled || testkit.Count(evs, kernel.EvStepCancelled) != 1 {
		t.Errorf("log %v", testkit.Types(evs))
	}
}

// TestIdempotentCreate: a retried create with the same key returns the
// first execution; a different request under the same key is refused.
func TestIdempotentCreate(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast()})
	agent := testkit.NewAgent("idem", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) { return nil, nil })
	defer agent.Close()
	env.RegisterAgent(agent, "")
	create := func(input any) (int, kernel.Execution, error) {
		var x kernel.Execution
		st, err := testkit.BearerWithHeaders(env.URL, testkit.AdminKey, "POST", "/v0/executions",
			map[string]string{"Idempotency-Key": "order-42"}, map[string]any{"agent_id": "idem", "input": input}, &x)
		return st, x, err
	}
	st1, x1, err := create(map[string]int{"n": 1})
	if err != nil || st1 != 201 {
		t.Fatalf("first create: %d %v", st1, err)
	}
	st2, x2, err := create(map[string]int{"n": 1})
	if err != nil || x2.ID != x1.ID || st2 != 200 {
		t.Fatalf("retried create: %d %s vs %s %v", st2, x2.ID, x1.ID, err)
	}
	if st3, _, err := create(map[string]int{"n": 2}); st3 != 409 {
		t.Fatalf("different request, same key: %d %v", st3, err)
	}
	var list struct {
		Executions []kernel.Execution `json:"executions"`
	}
	if _, err := env.Admin("GET", "/v0/executions?agent_id=idem", nil, &list); err != nil || len(list.Executions) != 1 {
		t.Fatalf("list: %d %v", len(list.Executions), err)
	}
	env.WaitTerminal(x1.ID, 5*time.Second)
}

// TestListPaging: keyset paging returns every execution once, newest first.
func TestListPaging(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast()})
	agent := testkit.NewAgent("pager", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) { return nil, nil })
	defer agent.Close()
	env.RegisterAgent(agent, "")
	var want []string
	for i := range 7 {
		want = append([]string{env.CreateExecution("pager", i)}, want...)
	}
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		var list struct {
			Executions []kernel.Execution `json:"executions"`
			Next       string             `json:"next_cursor"`
		}
		if _, err := env.Admin("GET", "/v0/executions?limit=3&cursor="+cursor, nil, &list); err != nil {
			t.Fatal(err)
		}
		for _, x := range list.Executions {
			got = append(got, x.ID)
		}
		if list.Next == "" {
			break
		}
		cursor = list.Next
		if page > 5 {
			t.Fatal("paging does not end")
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("paged ids\n got %v\nwant %v", got, want)
	}
}

// TestLostAcknowledgement: the webhook's response times out, but the agent
// already acted under the attempt; its lease stands and the execution
// finishes under attempt 1 instead of being re-delivered.
func TestLostAcknowledgement(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast()})
	var agent *testkit.Agent
	agent = testkit.NewAgent("late", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		if _, err := r.Step(ctx, "tool_call", "work", nil, testkit.StepOpts{}, func() (any, error) { return 1, nil }); err != nil {
			return nil, err
		}
		// Gate: the late acknowledgement has been sent, long after the
		// kernel's dispatch timeout gave up waiting for it.
		for agent.Acks.Load() == 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		return r.Lease.Attempt, nil
	})
	agent.SlowAck = 400 * time.Millisecond // longer than the 200ms dispatch timeout
	agent.HeartbeatEvery = 50 * time.Millisecond
	defer agent.Close()
	env.RegisterAgent(agent, "")
	id := env.CreateExecution("late", nil)
	x := env.WaitTerminal(id, 10*time.Second)
	if x.Status != kernel.ExecCompleted || string(x.Output) != "1" {
		t.Fatalf("%s output %s, errors %v", x.Status, x.Output, agent.Errors())
	}
	evs := mustCheckLog(t, env, id)
	if n := testkit.Count(evs, kernel.EvDispatchSuperseded); n != 0 {
		t.Errorf("the acting attempt was superseded: %v", testkit.Types(evs))
	}
	if agent.Webhooks.Load() != 1 {
		t.Errorf("%d webhooks, want 1", agent.Webhooks.Load())
	}
}
