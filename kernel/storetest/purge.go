package storetest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// testDeleteExecution: DeleteExecution removes an execution and everything
// stored under it — indexes, events, steps, occurrence counters, the
// approvals its steps asked for, its counters — and nothing of any other
// execution or tenant; it reports what it deleted.
func testDeleteExecution(t *testing.T, s kernel.Store) {
	doomed, kept, other := newExecution("t", execID(1)), newExecution("t", execID(2)), newExecution("u", execID(3))
	doomed.IdempotencyKey, kept.IdempotencyKey = "idem-1", "idem-2"
	mustCreate(t, s, doomed, kept, other)
	step := func(e *kernel.Execution, id, approvalID string) *kernel.Step {
		return &kernel.Step{ID: id, ExecutionID: e.ID, Tenant: e.Tenant, Kind: "tool_call", Target: "db.drop",
			Args: json.RawMessage(`{}`), ArgsHash: strings.Repeat("a", 64), Idempotency: kernel.SafeToRetry,
			Status: kernel.StepSucceeded, ApprovalID: approvalID, Seq: 1, CreatedAt: at(time.Second)}
	}
	update(t, s, func(tx kernel.Tx) error {
		for _, e := range []*kernel.Execution{doomed, kept, other} {
			if err := appendEvents(tx, e.Tenant, e.ID, "s1", kernel.EvStepProposed, kernel.EvStepAllowed, kernel.EvStepSucceeded); err != nil {
				return err
			}
			if err := mutate(tx, e.Tenant, e.ID, func(x *kernel.Execution) {
				x.Status = kernel.ExecCompleted
				x.Dispatch = kernel.DispatchState{State: kernel.DispatchQueued, DueAt: at(time.Hour)}
			}); err != nil {
				return err
			}
			a := approval(e.Tenant, "ap-"+e.ID, 0, kernel.ApprovalPending, time.Hour)
			a.ExecutionID = e.ID
			for _, err := range []error{
				tx.PutStep(step(e, "s1", a.ID)),
				tx.PutStep(step(e, "s2", "")),
				tx.PutApproval(a),
				tx.PutOccurrence(e.Tenant, e.ID, "k", kernel.Occurrence{Count: 1}),
				tx.PutCounter(e.Tenant, kernel.ExecCounterPrefix(e.ID)+"rl\x00r1", []byte("1")),
				tx.PutCounter(e.Tenant, "rl\x00r1\x00agent:agent-1", []byte("2")),
			} {
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
	var st kernel.PurgeStats
	update(t, s, func(tx kernel.Tx) error {
		var err error
		var done bool
		st, done, err = tx.DeleteExecution("t", doomed.ID, 0)
		if err == nil && !done {
			t.Error("DeleteExecution without a limit left the execution")
		}
		return err
	})
	if want := (kernel.PurgeStats{Executions: 1, Events: 4, Steps: 2, Approvals: 1, Counters: 2}); st != want {
		t.Errorf("DeleteExecution reported %+v, want %+v", st, want)
	}
	view(t, s, func(tx kernel.ReadTx) error {
		_, err := tx.Execution("t", doomed.ID)
		wantNotFound(t, "the deleted execution", err)
		_, err = tx.ExecutionTenant(doomed.ID)
		wantNotFound(t, "its tenant index", err)
		_, err = tx.ExecutionByIdempotencyKey("t", "idem-1")
		wantNotFound(t, "its idempotency key", err)
		_, err = tx.Step("t", doomed.ID, "s1")
		wantNotFound(t, "its step", err)
		_, err = tx.Approval("t", "ap-"+doomed.ID)
		wantNotFound(t, "its approval", err)
		if evs, err := tx.Events("t", doomed.ID, 0, 0); err != nil || len(evs) != 0 {
			t.Errorf("its events: %d, %v", len(evs), err)
		}
		if o, err := tx.Occurrence("t", doomed.ID, "k"); err != nil || o.Count != 0 {
			t.Errorf("its occurrence counter: %+v %v", o, err)
		}
		if c, err := tx.Counter("t", kernel.ExecCounterPrefix(doomed.ID)+"rl\x00r1"); err != nil || c != nil {
			t.Errorf("its counter: %q %v", c, err)
		}
		if due, err := tx.DueDispatches(at(2*time.Hour), 0); err != nil || strings.Contains(strings.Join(refs(due), " "), doomed.ID) {
			t.Errorf("due index still names it: %v %v", refs(due), err)
		}
		if exp, err := tx.ExpiredApprovals(at(2*time.Hour), 0); err != nil || len(exp) != 2 {
			t.Errorf("approval expiry index: %v %v", approvalRefs(exp), err)
		}
		// The others are whole.
		for _, e := range []*kernel.Execution{kept, other} {
			if _, err := tx.Execution(e.Tenant, e.ID); err != nil {
				t.Errorf("execution %s: %v", e.ID, err)
			}
			if evs, err := tx.Events(e.Tenant, e.ID, 0, 0); err != nil || len(evs) != 4 {
				t.Errorf("events of %s: %d %v", e.ID, len(evs), err)
			}
			if ss, err := tx.ListSteps(e.Tenant, e.ID); err != nil || len(ss) != 2 {
				t.Errorf("steps of %s: %d %v", e.ID, len(ss), err)
			}
			if _, err := tx.Approval(e.Tenant, "ap-"+e.ID); err != nil {
				t.Errorf("approval of %s: %v", e.ID, err)
			}
			if c, err := tx.Counter(e.Tenant, kernel.ExecCounterPrefix(e.ID)+"rl\x00r1"); err != nil || string(c) != "1" {
				t.Errorf("counter of %s: %q %v", e.ID, c, err)
			}
		}
		if c, err := tx.Counter("t", "rl\x00r1\x00agent:agent-1"); err != nil || string(c) != "2" {
			t.Errorf("an agent-scoped counter was touched: %q %v", c, err)
		}
		if id, err := tx.ExecutionByIdempotencyKey("t", "idem-2"); err != nil || id != kept.ID {
			t.Errorf("another idempotency key: %q %v", id, err)
		}
		return nil
	})
	update(t, s, func(tx kernel.Tx) error {
		_, _, err := tx.DeleteExecution("t", doomed.ID, 0)
		wantNotFound(t, "a second delete", err)
		_, _, err = tx.DeleteExecution("u", kept.ID, 0)
		wantNotFound(t, "a delete naming another tenant", err)
		return nil
	})
	// The idempotency key is free again.
	again := newExecution("t", execID(4))
	again.IdempotencyKey = "idem-1"
	mustCreate(t, s, again)
}

// testDeleteExecutionApprovalsOverLimit: a limit that the steps use up
// while their approvals still go with them (more records than the limit)
// leaves the execution for the next call, which finishes it.
func testDeleteExecutionApprovalsOverLimit(t *testing.T, s kernel.Store) {
	e := newExecution("t", execID(1))
	e.Status = kernel.ExecCompleted
	mustCreate(t, s, e)
	update(t, s, func(tx kernel.Tx) error {
		for i := range 4 {
			id := fmt.Sprintf("s%d", i)
			if err := appendEvents(tx, "t", e.ID, id, kernel.EvStepProposed, kernel.EvStepSucceeded); err != nil {
				return err
			}
			a := approval("t", "ap-"+id, 0, kernel.ApprovalGranted, time.Hour)
			a.ExecutionID, a.StepID = e.ID, id
			if err := tx.PutApproval(a); err != nil {
				return err
			}
			if err := tx.PutStep(&kernel.Step{ID: id, ExecutionID: e.ID, Tenant: "t", Kind: "tool_call", Target: "x", Args: json.RawMessage(`{}`),
				ArgsHash: strings.Repeat("a", 64), Idempotency: kernel.SafeToRetry, Status: kernel.StepSucceeded, ApprovalID: a.ID,
				Seq: uint64(2 + 2*i), CreatedAt: at(0)}); err != nil {
				return err
			}
		}
		return nil
	})
	var total kernel.PurgeStats
	for done, round := false, 0; !done; round++ {
		if round > 20 {
			t.Fatal("DeleteExecution with limit 2 never finished")
		}
		update(t, s, func(tx kernel.Tx) error {
			st, d, err := tx.DeleteExecution("t", e.ID, 2)
			if err == nil {
				total.Add(st)
				done = d
			}
			return err
		})
	}
	if want := (kernel.PurgeStats{Executions: 1, Events: 9, Steps: 4, Approvals: 4}); total != want {
		t.Errorf("deleted %+v in all, want %+v", total, want)
	}
	view(t, s, func(tx kernel.ReadTx) error {
		_, err := tx.Execution("t", e.ID)
		wantNotFound(t, "the execution", err)
		if list, err := tx.ListApprovals("t", ""); err != nil || len(list) != 0 {
			t.Errorf("%d approvals left: %v", len(list), err)
		}
		return nil
	})
}

// testDeleteExecutionInChunks: with a limit, DeleteExecution deletes large
// executions over several transactions, several in each (as retention
// does); between them each execution is still a valid one (its log is
// 1..LastSeq from execution.created), the totals add up, and nothing of
// them is left.
func testDeleteExecutionInChunks(t *testing.T, s kernel.Store) {
	var execs []*kernel.Execution
	for n := range 3 {
		e := newExecution("t", execID(n+1))
		e.Status = kernel.ExecCompleted
		mustCreate(t, s, e)
		execs = append(execs, e)
	}
	pad := strings.Repeat("p", 300) // events the size of real ones: many pages
	update(t, s, func(tx kernel.Tx) error {
		for _, e := range execs {
			x, err := tx.Execution("t", e.ID)
			if err != nil {
				return err
			}
			for i := range 300 {
				id := fmt.Sprintf("s%d", i)
				for _, typ := range []kernel.EventType{kernel.EvStepProposed, kernel.EvStepSucceeded} {
					x.LastSeq++
					if err := tx.AppendEvent("t", kernel.Event{ExecutionID: e.ID, Seq: x.LastSeq, Type: typ, Time: at(0),
						Payload: json.RawMessage(`{"step_id":"` + id + `","pad":"` + pad + `"}`)}); err != nil {
						return err
					}
				}
				if err := tx.PutStep(&kernel.Step{ID: id, ExecutionID: e.ID, Tenant: "t", Kind: "local", Target: "x", Args: json.RawMessage(`{}`),
					ArgsHash: strings.Repeat("a", 64), Idempotency: kernel.SafeToRetry, Status: kernel.StepSucceeded, Seq: uint64(i + 1), CreatedAt: at(0)}); err != nil {
					return err
				}
			}
			if err := tx.PutExecution(x); err != nil {
				return err
			}
		}
		return nil
	})
	var total kernel.PurgeStats
	left := execs
	for round := 0; len(left) > 0; round++ {
		if round > 200 {
			t.Fatal("DeleteExecution with limit 37 never finished")
		}
		var still []*kernel.Execution
		update(t, s, func(tx kernel.Tx) error {
			still = still[:0]
			for _, e := range left {
				st, done, err := tx.DeleteExecution("t", e.ID, 37)
				if err != nil {
					return err
				}
				if st == (kernel.PurgeStats{}) && !done {
					t.Fatal("a call deleted nothing")
				}
				total.Add(st)
				if !done {
					still = append(still, e)
				}
			}
			return nil
		})
		left = still
		view(t, s, func(tx kernel.ReadTx) error {
			for _, e := range left {
				x, err := tx.Execution("t", e.ID)
				if err != nil {
					t.Fatalf("round %d: %s is gone before DeleteExecution said so: %v", round, e.ID, err)
				}
				evs, err := tx.Events("t", e.ID, 0, 0)
				if err != nil {
					return err
				}
				if uint64(len(evs)) != x.LastSeq || (len(evs) > 0 && evs[0].Type != kernel.EvExecutionCreated) {
					t.Fatalf("round %d: %d events left, LastSeq %d", round, len(evs), x.LastSeq)
				}
				for i, ev := range evs {
					if ev.Seq != uint64(i+1) {
						t.Fatalf("round %d: event %d has seq %d", round, i, ev.Seq)
					}
				}
			}
			return nil
		})
	}
	if want := (kernel.PurgeStats{Executions: 3, Events: 3 * 601, Steps: 3 * 300}); total != want {
		t.Errorf("deleted %+v in all, want %+v", total, want)
	}
	view(t, s, func(tx kernel.ReadTx) error {
		for _, e := range execs {
			_, err := tx.Execution("t", e.ID)
			wantNotFound(t, "the execution", err)
			if evs, err := tx.Events("t", e.ID, 0, 0); err != nil || len(evs) != 0 {
				t.Errorf("%d events of %s left: %v", len(evs), e.ID, err)
			}
		}
		return nil
	})
}
