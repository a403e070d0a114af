package kernel_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// plainReadStore is a bbolt store whose read transactions offer only
// kernel.ReadTx, as a store without kernel.ExecutionHeadReader does.
type plainReadStore struct{ *bbolt.Store }

// plainReadTx hides every method of the store's read transaction that
// kernel.ReadTx does not name.
type plainReadTx struct{ kernel.ReadTx }

func (s plainReadStore) View(ctx context.Context, fn func(kernel.ReadTx) error) error {
	return s.Store.View(ctx, func(tx kernel.ReadTx) error { return fn(plainReadTx{tx}) })
}

// TestSubmitStepReadsWithAndWithoutExecutionHead: SubmitStep decides the
// same on a store whose read transactions read an execution without its
// input (ExecutionHead) and on one that only has Execution: a new step,
// the same call again (its next occurrence), a lease that is not the
// execution's; and the execution's input is still there after them.
func TestSubmitStepReadsWithAndWithoutExecutionHead(t *testing.T) {
	for _, head := range []bool{true, false} {
		t.Run(map[bool]string{true: "head", false: "plain"}[head], func(t *testing.T) {
			bst, err := bbolt.Open(filepath.Join(t.TempDir(), "wicket.db"), bbolt.Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			var ks kernel.Store = bst
			if !head {
				ks = plainReadStore{bst}
			}
			if _, ok := any(plainReadTx{}).(kernel.ExecutionHeadReader); ok {
				t.Fatal("plainReadTx offers ExecutionHead")
			}
			k, calls := runningKernel(t, bst, ks, 1, nil)
			call, ctx := calls[0], context.Background()
			req := kernel.StepRequest{AgentCall: call, Kind: "tool_call", Target: "search", Args: json.RawMessage(`{"q":"x"}`)}
			d, err := k.SubmitStep(ctx, req)
			if err != nil || d.Decision != kernel.DecisionProceed {
				t.Fatalf("new step: %+v, %v", d, err)
			}
			if _, err := k.CompleteStep(ctx, kernel.StepOutcome{AgentCall: call, StepID: d.StepID, Result: json.RawMessage(`{"hits":1}`)}); err != nil {
				t.Fatal(err)
			}
			// The same call again in the same attempt is its next occurrence.
			r, err := k.SubmitStep(ctx, req)
			if err != nil || r.Decision != kernel.DecisionProceed || r.Occurrence != 1 || r.StepID == d.StepID {
				t.Fatalf("the call again: %+v, %v", r, err)
			}
			if _, err := k.CompleteStep(ctx, kernel.StepOutcome{AgentCall: call, StepID: r.StepID, Result: json.RawMessage(`{"hits":2}`)}); err != nil {
				t.Fatal(err)
			}
			stale := req
			stale.Lease.Attempt++
			if _, err := k.SubmitStep(ctx, stale); kernel.CodeOf(err) != kernel.CodeLeaseSuperseded {
				t.Fatalf("another lease: %v, want %s", err, kernel.CodeLeaseSuperseded)
			}
			e, err := k.GetExecution(ctx, call.Tenant, call.ExecutionID)
			if err != nil || string(e.Input) != `{"task":0}` {
				t.Fatalf("the execution after its steps: %+v, %v", e, err)
			}
		})
	}
}
