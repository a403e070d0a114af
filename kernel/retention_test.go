package kernel_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/store/bbolt"
)

// idAt makes a UUIDv7 id of the millisecond of t with n as its low bits.
func idAt(t time.Time, n int) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[0:8], uint64(t.UnixMilli())<<16)
	b[6] = 0x70
	b[8] = 0x80
	binary.BigEndian.PutUint32(b[12:], uint32(n))
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// purgeCounter is an Observer that adds up what retention reports.
type purgeCounter struct {
	mu      sync.Mutex
	purged  kernel.PurgeStats
	deleted map[kernel.ExecStatus]int
}

func (p *purgeCounter) ExecutionsAtStart(map[kernel.ExecStatus]int) {}
func (p *purgeCounter) ExecutionStatus(from, to kernel.ExecStatus) {
	if to == "" {
		p.mu.Lock()
		p.deleted[from]++
		p.mu.Unlock()
	}
}
func (p *purgeCounter) StepDecided(string, policy.Action, time.Duration)      {}
func (p *purgeCounter) Delivery(error)                                        {}
func (p *purgeCounter) ApprovalResolved(kernel.ApprovalStatus, time.Duration) {}
func (p *purgeCounter) Purged(s kernel.PurgeStats) {
	p.mu.Lock()
	p.purged.Add(s)
	p.mu.Unlock()
}

// seed writes an execution created at created and last updated at updated,
// with four events, a step, an occurrence counter and a per-execution
// counter, straight into the store.
func seed(t *testing.T, st kernel.Store, tenant, id string, status kernel.ExecStatus, created, updated time.Time) {
	t.Helper()
	err := st.Update(context.Background(), func(tx kernel.Tx) error {
		e := &kernel.Execution{ID: id, Tenant: tenant, AgentID: "a", Status: status, Input: json.RawMessage(`{}`),
			LastSeq: 4, CreatedAt: created, UpdatedAt: updated}
		if err := tx.PutExecution(e); err != nil {
			return err
		}
		for i, typ := range []kernel.EventType{kernel.EvExecutionCreated, kernel.EvStepProposed, kernel.EvStepAllowed, kernel.EvStepSucceeded} {
			p := `{"step_id":"s1"}`
			if i == 0 {
				p = `{}`
			}
			if err := tx.AppendEvent(tenant, kernel.Event{ExecutionID: id, Seq: uint64(i + 1), Type: typ, Time: created, Payload: json.RawMessage(p)}); err != nil {
				return err
			}
		}
		if err := tx.PutStep(&kernel.Step{ID: "s1", ExecutionID: id, Tenant: tenant, Kind: "tool_call", Target: "x", Args: json.RawMessage(`{}`),
			ArgsHash: strings.Repeat("a", 64), Idempotency: kernel.SafeToRetry, Status: kernel.StepSucceeded, Seq: 1, CreatedAt: created}); err != nil {
			return err
		}
		if err := tx.PutOccurrence(tenant, id, "k", kernel.Occurrence{Count: 1}); err != nil {
			return err
		}
		return tx.PutCounter(tenant, kernel.ExecCounterPrefix(id)+"rl\x00r", []byte("{}"))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRetention runs a pass over a real store: terminal executions that
// ended before the cutoff go, with everything under them, in small
// transactions; running, recent and forever-kept ones stay.
func TestRetention(t *testing.T) {
	st, err := bbolt.Open(filepath.Join(t.TempDir(), "wicket.db"), bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	obs := &purgeCounter{deleted: map[kernel.ExecStatus]int{}}
	k, err := kernel.New(st, nil, nil, nil, kernel.Config{Retention: time.Hour, RetentionBatch: 10, RetentionPause: time.Millisecond, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tn := range []kernel.Tenant{{ID: "forever", Retention: "0s"}, {ID: "short", Retention: "10m"}} {
		if _, err := k.CreateTenant(ctx, tn); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	old := now.Add(-3 * time.Hour)
	var doomed, kept []string
	for i := range 30 {
		id := idAt(old, i)
		seed(t, st, kernel.DefaultTenant, id, []kernel.ExecStatus{kernel.ExecCompleted, kernel.ExecFailed, kernel.ExecCancelled}[i%3], old, old.Add(time.Minute))
		doomed = append(doomed, kernel.DefaultTenant+"/"+id)
	}
	keep := func(tenant, id string, s kernel.ExecStatus, created, updated time.Time) {
		seed(t, st, tenant, id, s, created, updated)
		kept = append(kept, tenant+"/"+id)
	}
	keep(kernel.DefaultTenant, idAt(old, 100), kernel.ExecRunning, old, old)                  // old but running
	keep(kernel.DefaultTenant, idAt(old, 101), kernel.ExecBlocked, old, old)                  // old but blocked
	keep(kernel.DefaultTenant, idAt(old, 102), kernel.ExecFailed, old, now.Add(-time.Minute)) // ended recently
	keep(kernel.DefaultTenant, idAt(now, 103), kernel.ExecCompleted, now, now)                // new
	keep("forever", idAt(old, 104), kernel.ExecCompleted, old, old)                           // tenant keeps forever
	keep("short", idAt(now.Add(-5*time.Minute), 105), kernel.ExecCompleted, now.Add(-5*time.Minute), now.Add(-5*time.Minute))
	id := idAt(now.Add(-30*time.Minute), 106) // the tenant's own 10m retention takes it
	seed(t, st, "short", id, kernel.ExecCompleted, now.Add(-30*time.Minute), now.Add(-20*time.Minute))
	doomed = append(doomed, "short/"+id)

	commits := st.Stats().Commits
	got, err := k.Purge(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := kernel.PurgeStats{Executions: 31, Events: 31 * 4, Steps: 31, Counters: 31 * 2}
	if got != want {
		t.Fatalf("purged %+v, want %+v", got, want)
	}
	// 8 records an execution (step, occurrence, counter, 4 events, itself):
	// with RetentionBatch 10, at least 248/10 transactions.
	if n := st.Stats().Commits - commits; n < 25 {
		t.Errorf("%d commits for 248 records with RetentionBatch 10: batches are not small", n)
	}
	if obs.purged != want || obs.deleted[kernel.ExecCompleted]+obs.deleted[kernel.ExecFailed]+obs.deleted[kernel.ExecCancelled] != 31 {
		t.Errorf("observer: %+v %v", obs.purged, obs.deleted)
	}
	err = st.View(ctx, func(tx kernel.ReadTx) error {
		for _, ref := range doomed {
			tenant, id, _ := strings.Cut(ref, "/")
			if _, err := tx.Execution(tenant, id); err == nil {
				return fmt.Errorf("%s survived", ref)
			}
		}
		for _, ref := range kept {
			tenant, id, _ := strings.Cut(ref, "/")
			if _, err := tx.Execution(tenant, id); err != nil {
				return fmt.Errorf("%s was deleted: %w", ref, err)
			}
			if evs, err := tx.Events(tenant, id, 0, 0); err != nil || len(evs) != 4 {
				return fmt.Errorf("events of %s: %d %v", ref, len(evs), err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(); err != nil {
		t.Fatal(err)
	}
	if again, err := k.Purge(ctx); err != nil || again != (kernel.PurgeStats{}) {
		t.Fatalf("second pass: %+v %v", again, err)
	}
}

func TestRetentionSettings(t *testing.T) {
	for _, c := range []struct {
		s  string
		ok bool
	}{{"", true}, {"0s", true}, {"720h", true}, {"1m", true}, {"30s", false}, {"-1h", false}, {"soon", false}} {
		if err := kernel.ValidRetention(c.s); (err == nil) != c.ok {
			t.Errorf("ValidRetention(%q) = %v", c.s, err)
		}
	}
	if _, err := kernel.New(nil, nil, nil, nil, kernel.Config{Retention: time.Second}); err == nil {
		t.Error("a retention of 1s was accepted")
	}
}
