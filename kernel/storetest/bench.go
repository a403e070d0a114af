package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// benchArgs are the arguments of the benchmark's step: a typical tool call.
var benchArgs = json.RawMessage(`{"query":"durable execution kernels for AI agents","max_results":10,"filters":{"lang":"en","after":"2024-01-01"},"safe_search":true}`)

// submit is the transaction of one step submission as the kernel runs it
// (docs/durability.md: proposed + decision + executing in one commit): read the
// execution, write the step and its occurrence counter, append three
// events, and write the execution back with its new LastSeq and totals.
func submit(tx kernel.Tx, tenant, execID string, n int) error {
	e, err := tx.Execution(tenant, execID)
	if err != nil {
		return err
	}
	stepID := fmt.Sprintf("%064x", n)
	now := time.Now().UTC()
	seq := e.LastSeq
	st := &kernel.Step{
		ID: stepID, ExecutionID: execID, Tenant: tenant, Kind: "tool_call", Target: "web.search",
		Args: benchArgs, ArgsHash: fmt.Sprintf("%064x", n*31+7), Idempotency: kernel.SafeToRetry,
		Effect: "read_only", Status: kernel.StepExecuting, Lease: e.Lease,
		Verdict: &kernel.StepVerdict{Action: "allow", RuleID: "allow-search", EvalTime: 42 * time.Microsecond},
		Seq:     seq + 1, CreatedAt: now,
	}
	st.Verdict.Bundle.Name, st.Verdict.Bundle.Revision, st.Verdict.Bundle.Engine = "research", "3", "rules"
	if err := tx.PutStep(st); err != nil {
		return err
	}
	occKey := "tool_call|web.search|" + st.ArgsHash
	o, err := tx.Occurrence(tenant, execID, occKey)
	if err != nil {
		return err
	}
	o.Lease, o.Count = e.Lease, o.Count+1
	if err := tx.PutOccurrence(tenant, execID, occKey, o); err != nil {
		return err
	}
	payload := json.RawMessage(`{"step_id":"` + stepID + `","kind":"tool_call","target":"web.search","bundle":{"name":"research","revision":"3","sha256":"` + st.ArgsHash + `"},"engine":"rules","rule_id":"allow-search","eval_ns":42000}`)
	for i, typ := range []kernel.EventType{kernel.EvStepProposed, kernel.EvStepAllowed, kernel.EvStepExecuting} {
		if err := tx.AppendEvent(tenant, kernel.Event{ExecutionID: execID, Seq: seq + 1 + uint64(i), Type: typ, Time: now, Payload: payload}); err != nil {
			return err
		}
	}
	e.LastSeq = seq + 3
	e.Totals.Steps++
	e.UpdatedAt = now
	e.Dispatch.LeaseUntil = now.Add(90 * time.Second)
	return tx.PutExecution(e)
}

// benchExecution creates the execution the n-th benchmark goroutine submits
// steps to, running and holding a lease as it would be.
func benchExecution(s kernel.Store, n int) (string, error) {
	e := newExecution(kernel.DefaultTenant, execID(n))
	e.Status = kernel.ExecRunning
	e.Input = benchArgs
	e.Lease = kernel.Lease{DispatchID: "dispatch-1", Attempt: 1}
	e.Dispatch = kernel.DispatchState{ID: "dispatch-1", Attempt: 1, State: kernel.DispatchAcked, LeaseUntil: time.Now().Add(90 * time.Second)}
	return e.ID, s.Update(context.Background(), func(tx kernel.Tx) error { return create(tx, e) })
}

// BenchUpdate measures the step-submission transaction (put execution, put
// step, put occurrence, three events) run by b.RunParallel goroutines, each
// on its own execution: the group-commit case. Call b.SetParallelism first
// for more writers than GOMAXPROCS.
func BenchUpdate(b *testing.B, open func(b *testing.B) kernel.Store) {
	s := open(b)
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id, err := benchExecution(s, int(next.Add(1)))
		if err != nil {
			b.Error(err)
			return
		}
		for n := 0; pb.Next(); n++ {
			if err := s.Update(context.Background(), func(tx kernel.Tx) error {
				return submit(tx, kernel.DefaultTenant, id, n)
			}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchUpdateSerial measures the same transaction from one goroutine: the
// latency of a lone writer, one commit per transaction.
func BenchUpdateSerial(b *testing.B, open func(b *testing.B) kernel.Store) {
	s := open(b)
	id, err := benchExecution(s, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		if err := s.Update(context.Background(), func(tx kernel.Tx) error {
			return submit(tx, kernel.DefaultTenant, id, n)
		}); err != nil {
			b.Fatal(err)
		}
	}
}
