package bbolt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// benchInput is a 1 KiB execution input.
var benchInput = json.RawMessage(`{"task":"` + strings.Repeat("x", 1024-12) + `"}`)

// benchExec is an execution as the kernel keeps a running one: acked,
// holding a lease, with a 1 KiB input and a couple of labels.
func benchExec(id string) *kernel.Execution {
	now := time.Now().UTC()
	return &kernel.Execution{ID: id, Tenant: kernel.DefaultTenant, AgentID: "agent-1", Status: kernel.ExecRunning,
		Input: benchInput, Labels: map[string]string{"team": "search", "env": "prod"},
		Limits: kernel.Limits{MaxSteps: 1000}, CreatedAt: now, UpdatedAt: now, LastSeq: 3,
		Lease:    kernel.Lease{DispatchID: "0196a000-0000-7000-8000-00000000d001", Attempt: 1},
		Dispatch: kernel.DispatchState{ID: "0196a000-0000-7000-8000-00000000d001", Attempt: 1, State: kernel.DispatchAcked, LeaseUntil: now.Add(90 * time.Second)}}
}

// BenchmarkStepPath runs the store operations of one step as the kernel
// does them (kernel/steps.go): SubmitStep's View (execution, occurrence,
// step not found) and Update (execution re-read, occurrence read and
// write, step, three events, execution), then endStep's Update (execution,
// step, step, one event, execution). No fsync: the CPU cost.
func BenchmarkStepPath(b *testing.B) {
	s := openStore(b, Options{NoSync: true}, false)
	ctx := context.Background()
	e := benchExec("0196a000-0000-7000-8000-000000000001")
	if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutExecution(e) }); err != nil {
		b.Fatal(err)
	}
	args := json.RawMessage(`{"query":"durable execution kernels for AI agents","max_results":10}`)
	payload := json.RawMessage(`{"step_id":"s","kind":"tool_call","target":"web.search","dispatch_id":"0196a000-0000-7000-8000-00000000d001","dispatch_attempt":1}`)
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		stepID := fmt.Sprintf("%064x", n)
		occKey := "tool_call\x00" + stepID + "\x00web.search"
		err := s.View(ctx, func(tx kernel.ReadTx) error {
			ex, err := tx.Execution(e.Tenant, e.ID)
			if err != nil {
				return err
			}
			if _, err := tx.Occurrence(ex.Tenant, ex.ID, occKey); err != nil {
				return err
			}
			if _, err := tx.Step(ex.Tenant, ex.ID, stepID); !errors.Is(err, kernel.ErrNotFound) {
				return fmt.Errorf("step: %v", err)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		err = s.Update(ctx, func(tx kernel.Tx) error {
			ex, err := tx.Execution(e.Tenant, e.ID)
			if err != nil {
				return err
			}
			o, err := tx.Occurrence(ex.Tenant, ex.ID, occKey)
			if err != nil {
				return err
			}
			if err := tx.PutOccurrence(ex.Tenant, ex.ID, occKey, kernel.Occurrence{Lease: ex.Lease, Count: o.Count + 1}); err != nil {
				return err
			}
			now := time.Now().UTC()
			st := &kernel.Step{ID: stepID, ExecutionID: ex.ID, Tenant: ex.Tenant, Kind: "tool_call", Target: "web.search",
				Args: args, ArgsHash: stepID, Idempotency: kernel.SafeToRetry, Status: kernel.StepExecuting, Lease: ex.Lease,
				Verdict: &kernel.StepVerdict{Action: "allow", RuleID: "allow-search", EvalTime: time.Microsecond},
				Seq:     ex.LastSeq + 1, CreatedAt: now}
			if err := tx.PutStep(st); err != nil {
				return err
			}
			for _, typ := range []kernel.EventType{kernel.EvStepProposed, kernel.EvStepAllowed, kernel.EvStepExecuting} {
				ex.LastSeq++
				if err := tx.AppendEvent(ex.Tenant, kernel.Event{ExecutionID: ex.ID, Seq: ex.LastSeq, Type: typ, Time: now, Payload: payload}); err != nil {
					return err
				}
			}
			ex.Totals.Steps++
			ex.UpdatedAt, ex.Dispatch.LeaseUntil = now, now.Add(90*time.Second)
			return tx.PutExecution(ex)
		})
		if err != nil {
			b.Fatal(err)
		}
		err = s.Update(ctx, func(tx kernel.Tx) error {
			ex, err := tx.Execution(e.Tenant, e.ID)
			if err != nil {
				return err
			}
			st, err := tx.Step(ex.Tenant, ex.ID, stepID)
			if err != nil {
				return err
			}
			now := time.Now().UTC()
			st.Status, st.Result, st.CompletedAt = kernel.StepSucceeded, json.RawMessage(`{"hits":["a","b","c"]}`), &now
			if err := tx.PutStep(st); err != nil {
				return err
			}
			ex.LastSeq++
			if err := tx.AppendEvent(ex.Tenant, kernel.Event{ExecutionID: ex.ID, Seq: ex.LastSeq, Type: kernel.EvStepSucceeded, Time: now, Payload: payload}); err != nil {
				return err
			}
			ex.UpdatedAt, ex.Dispatch.LeaseUntil = now, now.Add(90*time.Second)
			return tx.PutExecution(ex)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadExecution is one View reading an execution with a 1 KiB
// input (GetExecution), and without it (/head: ExecutionHead, SubmitStep's
// preread).
func BenchmarkReadExecution(b *testing.B) {
	b.Run("full", func(b *testing.B) { benchReadExecution(b, false) })
	b.Run("head", func(b *testing.B) { benchReadExecution(b, true) })
}

func benchReadExecution(b *testing.B, head bool) {
	s := openStore(b, Options{NoSync: true}, false)
	ctx := context.Background()
	e := benchExec("0196a000-0000-7000-8000-000000000001")
	if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutExecution(e) }); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		err := s.View(ctx, func(tx kernel.ReadTx) error {
			var err error
			if head {
				_, err = tx.(kernel.ExecutionHeadReader).ExecutionHead(e.Tenant, e.ID)
			} else {
				_, err = tx.Execution(e.Tenant, e.ID)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadPolicyRecords is what SubmitStep's preread reads for
// policy, in one View: the agent (for its bundle) and its tenant's record
// (for its guards), of a tenant configured with guards and a bundle key.
func BenchmarkReadPolicyRecords(b *testing.B) {
	s := openStore(b, Options{NoSync: true}, false)
	ctx := context.Background()
	ten := &kernel.Tenant{ID: "acme", Guards: []string{"pii-guard", "spend-guard"}, Retention: "720h",
		BundleKeys: []kernel.BundleKey{{ID: "ci", Algorithm: "HS256", Key: "0123456789abcdef0123456789abcdef"}}, CreatedAt: time.Now().UTC()}
	a := &kernel.Agent{Tenant: "acme", ID: "agent-1", WebhookURL: "http://127.0.0.1:1/webhook", Bundle: "search-policy", CreatedAt: time.Now().UTC()}
	if err := s.Update(ctx, func(tx kernel.Tx) error {
		if err := tx.PutTenant(ten); err != nil {
			return err
		}
		return tx.PutAgent(a)
	}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		err := s.View(ctx, func(tx kernel.ReadTx) error {
			if _, err := tx.Agent("acme", "agent-1"); err != nil {
				return err
			}
			t, err := tx.Tenant("acme")
			if err == nil && len(t.Guards) != 2 {
				b.Fatalf("tenant %+v", t)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
