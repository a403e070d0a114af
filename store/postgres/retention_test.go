package postgres_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/postgres"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
)

// idAt makes a UUIDv7 id of the millisecond of t with n as its low bits
// (retention reads only the executions whose ids sort before its cutoff).
func idAt(t time.Time, n int) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[0:8], uint64(t.UnixMilli())<<16)
	b[6] = 0x70
	b[8] = 0x80
	binary.BigEndian.PutUint32(b[12:], uint32(n))
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// seedExecution writes an execution with four events, a step that asked
// for an approval, the approval, an occurrence counter and a counter kept
// per execution.
func seedExecution(t *testing.T, st kernel.Store, id string, status kernel.ExecStatus, created, updated time.Time) {
	t.Helper()
	err := st.Update(context.Background(), func(tx kernel.Tx) error {
		e := &kernel.Execution{ID: id, Tenant: kernel.DefaultTenant, AgentID: "a", Status: status, Input: json.RawMessage(`{}`),
			IdempotencyKey: "idem-" + id, LastSeq: 4, CreatedAt: created, UpdatedAt: updated}
		if err := tx.PutExecution(e); err != nil {
			return err
		}
		for i, typ := range []kernel.EventType{kernel.EvExecutionCreated, kernel.EvStepProposed, kernel.EvStepAllowed, kernel.EvStepSucceeded} {
			p := `{"step_id":"s1"}`
			if i == 0 {
				p = `{}`
			}
			if err := tx.AppendEvent(e.Tenant, kernel.Event{ExecutionID: id, Seq: uint64(i + 1), Type: typ, Time: created, Payload: json.RawMessage(p)}); err != nil {
				return err
			}
		}
		ap := &kernel.Approval{ID: "ap-" + id, Tenant: e.Tenant, ExecutionID: id, StepID: "s1", Status: kernel.ApprovalGranted, CreatedAt: created}
		if err := tx.PutApproval(ap); err != nil {
			return err
		}
		if err := tx.PutStep(&kernel.Step{ID: "s1", ExecutionID: id, Tenant: e.Tenant, Kind: "tool_call", Target: "x", Args: json.RawMessage(`{}`),
			ArgsHash: strings.Repeat("a", 64), Idempotency: kernel.SafeToRetry, Status: kernel.StepSucceeded, ApprovalID: ap.ID, Seq: 1, CreatedAt: created}); err != nil {
			return err
		}
		if err := tx.PutOccurrence(e.Tenant, id, "k", kernel.Occurrence{Count: 1}); err != nil {
			return err
		}
		return tx.PutCounter(e.Tenant, kernel.ExecCounterPrefix(id)+"rl\x00r", []byte("{}"))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRetentionAcrossReplicas: two kernels on one database run retention
// passes at the same time, in small transactions. Every ended execution
// older than the retention goes with everything under it, exactly once in
// the totals of both (a transaction that lost a race to the other replica
// is run again and finds the execution gone); running and recent ones
// stay whole; the database passes its checker; a deleted execution's
// idempotency key is free again.
func TestRetentionAcrossReplicas(t *testing.T) {
	_, dsn := pgtest.Schema(t)
	stores := []*postgres.Store{open(t, dsn, postgres.Options{}), open(t, dsn, postgres.Options{})}
	ctx := context.Background()
	var kernels []*kernel.Kernel
	for _, st := range stores {
		k, err := kernel.New(st, nil, nil, nil, kernel.Config{Retention: time.Hour, RetentionBatch: 7, RetentionPause: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		kernels = append(kernels, k)
	}
	now := time.Now().UTC()
	old := now.Add(-3 * time.Hour)
	const doomed = 40
	var gone, kept []string
	for i := range doomed {
		id := idAt(old, i)
		seedExecution(t, stores[i%2], id, []kernel.ExecStatus{kernel.ExecCompleted, kernel.ExecFailed, kernel.ExecCancelled}[i%3], old, old.Add(time.Minute))
		gone = append(gone, id)
	}
	for i, c := range []struct {
		status           kernel.ExecStatus
		created, updated time.Time
	}{
		{kernel.ExecRunning, old, old},
		{kernel.ExecBlocked, old, old},
		{kernel.ExecFailed, old, now.Add(-time.Minute)},
		{kernel.ExecCompleted, now, now},
	} {
		id := idAt(c.created, 100+i)
		seedExecution(t, stores[0], id, c.status, c.created, c.updated)
		kept = append(kept, id)
	}

	var wg sync.WaitGroup
	got := make([]kernel.PurgeStats, len(kernels))
	errs := make([]error, len(kernels))
	start := make(chan struct{})
	for i, k := range kernels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i], errs[i] = k.Purge(ctx)
		}()
	}
	close(start)
	wg.Wait()
	var total kernel.PurgeStats
	for i := range kernels {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		total.Add(got[i])
	}
	want := kernel.PurgeStats{Executions: doomed, Events: doomed * 4, Steps: doomed, Approvals: doomed, Counters: doomed * 2}
	if total != want {
		t.Errorf("the replicas purged %+v and %+v, %+v in all; want %+v", got[0], got[1], total, want)
	}
	err := stores[1].View(ctx, func(tx kernel.ReadTx) error {
		for _, id := range gone {
			if _, err := tx.Execution(kernel.DefaultTenant, id); err == nil {
				t.Errorf("%s survived", id)
			}
			if _, err := tx.Approval(kernel.DefaultTenant, "ap-"+id); err == nil {
				t.Errorf("the approval of %s survived", id)
			}
		}
		for _, id := range kept {
			if _, err := tx.Execution(kernel.DefaultTenant, id); err != nil {
				t.Errorf("%s was deleted: %v", id, err)
			}
			if evs, err := tx.Events(kernel.DefaultTenant, id, 0, 0); err != nil || len(evs) != 4 {
				t.Errorf("events of %s: %d %v", id, len(evs), err)
			}
			if c, err := tx.Counter(kernel.DefaultTenant, kernel.ExecCounterPrefix(id)+"rl\x00r"); err != nil || c == nil {
				t.Errorf("counter of %s: %q %v", id, c, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := stores[0].Check(ctx); err != nil {
		t.Fatal(err)
	}
	for i, k := range kernels {
		if again, err := k.Purge(ctx); err != nil || again != (kernel.PurgeStats{}) {
			t.Errorf("replica %d, second pass: %+v %v", i, again, err)
		}
	}
	// The idempotency key of a deleted execution may be used again.
	seedExecution(t, stores[1], gone[0], kernel.ExecRunning, now, now)
	t.Logf("replica 0 purged %+v, replica 1 %+v; conflicts retried: %d + %d", got[0], got[1], stores[0].Stats().Conflicts, stores[1].Stats().Conflicts)
}
