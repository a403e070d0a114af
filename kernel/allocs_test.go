package kernel_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/store/bbolt"
)

// Allocation ceilings of a step's two requests in the kernel, store
// included (its writer goroutine, the bbolt transaction, the codec): a
// regression that adds allocations to the hot path fails here. They sit a
// little above what the code does today (see the test's log), so that a
// change of the Go runtime does not trip them.
const (
	maxSubmitAllocs   = 236
	maxCompleteAllocs = 173
)

// TestAllocsStepPath counts the allocations of SubmitStep (a new step,
// allowed: step.proposed, step.allowed, step.executing in one commit) and
// CompleteStep (step.succeeded) against a real bbolt store without fsync.
// It runs without -race (.ci/run reruns TestAllocs* so).
func TestAllocsStepPath(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector are not the program's")
	}
	k, call, _ := stepPathKernel(t, false)
	ctx := context.Background()
	const runs = 200
	args := make([]json.RawMessage, runs+1)
	results := make([]json.RawMessage, runs+1)
	for i := range args {
		args[i] = json.RawMessage(`{"n":` + strconv.Itoa(i) + `,"q":"allocs"}`)
		results[i] = json.RawMessage(`{"hits":` + strconv.Itoa(i) + `}`)
	}
	ids := make([]string, 0, runs+1)
	i := 0
	submit := testing.AllocsPerRun(runs, func() {
		d, err := k.SubmitStep(ctx, kernel.StepRequest{AgentCall: call, Kind: "tool_call", Target: "search", Args: args[i]})
		if err != nil || d.Decision != kernel.DecisionProceed {
			t.Fatalf("submit %d: %v %+v", i, err, d)
		}
		ids = append(ids, d.StepID)
		i++
	})
	i = 0
	complete := testing.AllocsPerRun(runs, func() {
		if _, err := k.CompleteStep(ctx, kernel.StepOutcome{AgentCall: call, StepID: ids[i], Result: results[i]}); err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
		i++
	})
	t.Logf("allocations per call: SubmitStep %.0f (ceiling %d), CompleteStep %.0f (ceiling %d)", submit, maxSubmitAllocs, complete, maxCompleteAllocs)
	if submit > maxSubmitAllocs {
		t.Errorf("SubmitStep allocates %.0f times, ceiling %d", submit, maxSubmitAllocs)
	}
	if complete > maxCompleteAllocs {
		t.Errorf("CompleteStep allocates %.0f times, ceiling %d", complete, maxCompleteAllocs)
	}
}

// BenchmarkStepPath measures a step's two calls (SubmitStep of a new
// allowed step, CompleteStep) on a bbolt store without fsync, one at a
// time (each its own commit). Besides ns/op it reports the store writer's
// time in the Update functions per function (fn-µs/update), and their CPU
// time (fn-cpu-µs/update, on Linux).
func BenchmarkStepPath(b *testing.B) {
	k, call, st := stepPathKernel(b, true)
	ctx := context.Background()
	b.ReportAllocs()
	s0, ns0, runs0 := st.Stats(), st.ns.Load(), st.runs.Load()
	n := 0
	for b.Loop() {
		n++
		d, err := k.SubmitStep(ctx, kernel.StepRequest{AgentCall: call, Kind: "tool_call", Target: "search",
			Args: json.RawMessage(`{"n":` + strconv.Itoa(n) + `,"q":"bench"}`)})
		if err != nil || d.Decision != kernel.DecisionProceed {
			b.Fatalf("submit %d: %v %+v", n, err, d)
		}
		if _, err := k.CompleteStep(ctx, kernel.StepOutcome{AgentCall: call, StepID: d.StepID, Result: json.RawMessage(`{"hits":1}`)}); err != nil {
			b.Fatalf("complete %d: %v", n, err)
		}
	}
	s1 := st.Stats()
	b.ReportMetric((s1.Functions-s0.Functions).Seconds()*1e6/float64(s1.Updates-s0.Updates), "fn-µs/update")
	st.report(b, ns0, runs0)
}

// stepPathKernel starts a kernel on a bbolt store without fsync, with an
// Observer as wicket serve runs it, and returns the call of an
// execution's first dispatch. The kernel stops when tb ends.
// With cpu set, the kernel's store is wrapped in a cpuStore.
func stepPathKernel(tb testing.TB, cpu bool) (*kernel.Kernel, kernel.AgentCall, *cpuStore) {
	bst, err := bbolt.Open(filepath.Join(tb.TempDir(), "wicket.db"), bbolt.Options{NoSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	st := &cpuStore{Store: bst}
	var ks kernel.Store = bst
	if cpu {
		ks = st
	}
	k, calls := runningKernel(tb, bst, ks, 1, nil)
	return k, calls[0], st
}

// runningKernel starts a kernel on ks (st, or a store wrapping it), with
// an Observer as wicket serve runs it, and logger (nil: the default),
// creates n executions of an agent and returns the calls of their first
// dispatches. The kernel and st close when tb ends.
func runningKernel(tb testing.TB, st *bbolt.Store, ks kernel.Store, n int, logger *slog.Logger) (*kernel.Kernel, []kernel.AgentCall) {
	t := tb
	deliv := &deliverer{got: make(chan kernel.Delivery, n)}
	// With an Observer, as wicket serve runs the kernel (its metrics).
	cfg := kernel.Config{ReapInterval: time.Hour, Observer: nopObserver{}, Logger: logger}
	k, err := kernel.New(ks, deliv, &script{}, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close(ctx); _ = st.Close() })
	if _, err := k.PutAgent(ctx, kernel.Agent{ID: agentID, WebhookURL: "http://127.0.0.1:1/webhook", Secret: agentSecret}); err != nil {
		t.Fatal(err)
	}
	created := make(map[string]bool, n)
	for i := range n {
		e, _, err := k.CreateExecution(ctx, kernel.CreateExecution{AgentID: agentID, Input: json.RawMessage(`{"task":` + strconv.Itoa(i) + `}`)})
		if err != nil {
			t.Fatal(err)
		}
		created[e.ID] = true
	}
	calls := make([]kernel.AgentCall, 0, n)
	for range n {
		select {
		case d := <-deliv.got:
			if !created[d.ExecutionID] {
				t.Fatalf("delivered %s, not one of the executions created", d.ExecutionID)
			}
			calls = append(calls, kernel.AgentCall{Tenant: d.Tenant, ExecutionID: d.ExecutionID, AgentID: d.AgentID,
				Lease: kernel.Lease{DispatchID: d.DispatchID, Attempt: d.Attempt}})
		case <-time.After(20 * time.Second):
			t.Fatal("no delivery")
		}
	}
	return k, calls
}

// nopObserver observes nothing: the kernel's own bookkeeping for an
// Observer is what the allocation guard counts.
type nopObserver struct{}

func (nopObserver) ExecutionsAtStart(map[kernel.ExecStatus]int)           {}
func (nopObserver) ExecutionStatus(_, _ kernel.ExecStatus)                {}
func (nopObserver) StepDecided(string, policy.Action, time.Duration)      {}
func (nopObserver) Delivery(error)                                        {}
func (nopObserver) ApprovalResolved(kernel.ApprovalStatus, time.Duration) {}
func (nopObserver) Purged(kernel.PurgeStats)                              {}
