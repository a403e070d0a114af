package storecopy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
	"github.com/wicket-run/wicket/store/postgres"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
	"github.com/wicket-run/wicket/store/storecopy"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.UTC)

// fill writes records of every kind, with awkward bytes where keys are
// free-form, as the kernel would.
func fill(t *testing.T, s kernel.Store) {
	t.Helper()
	err := s.Update(context.Background(), func(tx kernel.Tx) error {
		for _, ten := range []string{"acme", "beta"} {
			if err := tx.PutTenant(&kernel.Tenant{ID: ten, Guards: []string{"g"}, CreatedAt: t0}); err != nil {
				return err
			}
			if err := tx.PutAPIKey(&kernel.APIKey{ID: "k-" + ten, Tenant: ten, Role: kernel.RoleClient, Principal: "ci", Hash: "h-" + ten, CreatedAt: t0}); err != nil {
				return err
			}
			if err := tx.PutAgent(&kernel.Agent{ID: "a", Tenant: ten, WebhookURL: "http://127.0.0.1:1/" + ten, Secret: "s3cret-" + ten, CreatedAt: t0, UpdatedAt: t0}); err != nil {
				return err
			}
			if err := tx.PutBundle(&kernel.BundleRecord{Tenant: ten, Name: "b", Revision: "2", Digest: "d", Engine: "rules", Archive: []byte{0x1f, 0x8b, 0, 255}, UpdatedAt: t0}); err != nil {
				return err
			}
			if err := tx.PutCounter(ten, "rl\x00r1\x00exec:\xff", []byte(`{"start":1,"count":2}`)); err != nil {
				return err
			}
			for i := range 3 {
				id := fmt.Sprintf("01960000-0000-7000-8000-%s%07d", ten[:1], i)
				e := &kernel.Execution{ID: id, Tenant: ten, AgentID: "a", Status: kernel.ExecRunning,
					Input: json.RawMessage(`{"q":"<b>&</b>"}`), Labels: map[string]string{"team": ten}, IdempotencyKey: "idem\x00" + id,
					CreatedAt: t0, UpdatedAt: t0, LastSeq: 3, Lease: kernel.Lease{DispatchID: "d", Attempt: 1},
					Dispatch: kernel.DispatchState{ID: "d", Attempt: 1, State: kernel.DispatchAcked, LeaseUntil: t0.Add(time.Minute)}}
				if err := tx.PutExecution(e); err != nil {
					return err
				}
				for seq, typ := range []kernel.EventType{kernel.EvExecutionCreated, kernel.EvStepProposed, kernel.EvStepSucceeded} {
					if err := tx.AppendEvent(ten, kernel.Event{ExecutionID: id, Seq: uint64(seq + 1), Type: typ, Time: t0,
						Payload: json.RawMessage(`{"step_id":"s1","kind":"tool_call","target":"x"}`)}); err != nil {
						return err
					}
				}
				done := t0.Add(time.Second)
				if err := tx.PutStep(&kernel.Step{ID: "s1", ExecutionID: id, Tenant: ten, Kind: "tool_call", Target: "x",
					Args: json.RawMessage(`{}`), Status: kernel.StepSucceeded, Result: json.RawMessage(`{"r":1}`), Seq: 2, CreatedAt: t0, CompletedAt: &done}); err != nil {
					return err
				}
				if err := tx.PutOccurrence(ten, id, "tool_call|x|\x00abc", kernel.Occurrence{Lease: kernel.Lease{DispatchID: "d", Attempt: 1}, Count: 1}); err != nil {
					return err
				}
			}
			if err := tx.PutApproval(&kernel.Approval{ID: "ap", Tenant: ten, ExecutionID: "x", StepID: "s", Status: kernel.ApprovalPending,
				Args: json.RawMessage(`{}`), ExpiresAt: t0.Add(time.Hour), CreatedAt: t0}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

type store interface {
	kernel.Store
	storecopy.Source
}

func openBolt(t *testing.T) *bbolt.Store {
	t.Helper()
	s, err := bbolt.Open(filepath.Join(t.TempDir(), "wicket.db"), bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// copyAndCompare copies src into dst and compares their digests.
func copyAndCompare(t *testing.T, src, dst store) storecopy.Summary {
	t.Helper()
	ctx := context.Background()
	want, err := storecopy.Digest(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	counts, err := storecopy.Copy(ctx, src, dst, dst)
	if err != nil {
		t.Fatal(err)
	}
	got, err := storecopy.Digest(ctx, dst)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != want.Digest || counts.String() != want.Counts.String() {
		t.Fatalf("copy differs: source %s (%s), copied %s, read back %s (%s)", want.Digest, want.Counts, counts, got.Digest, got.Counts)
	}
	return got
}

func TestCopyBoltToBolt(t *testing.T) {
	src, dst := openBolt(t), openBolt(t)
	fill(t, src)
	sum := copyAndCompare(t, src, dst)
	want := "agent 2, api_key 2, approval 2, bundle 2, counter 2, event 18, execution 6, occurrence 6, step 6, tenant 2"
	if sum.Counts.String() != want {
		t.Errorf("counts %s, want %s", sum.Counts, want)
	}
	if err := dst.Check(); err != nil {
		t.Error(err)
	}
	// A second copy into the now full destination is refused.
	if _, err := storecopy.Copy(context.Background(), src, dst, dst); !errors.Is(err, storecopy.ErrNotEmpty) {
		t.Errorf("copy into a full store: %v", err)
	}
	// The digest sees a changed record.
	if err := dst.Update(context.Background(), func(tx kernel.Tx) error { return tx.PutCounter("acme", "new", []byte("1")) }); err != nil {
		t.Fatal(err)
	}
	changed, err := storecopy.Digest(context.Background(), dst)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Digest == sum.Digest {
		t.Error("the digest did not change with a new record")
	}
}

// TestCopyThroughPostgres: bbolt → PostgreSQL → bbolt keeps every record.
func TestCopyThroughPostgres(t *testing.T) {
	src := openBolt(t)
	fill(t, src)
	pg := pgtest.Open(t, postgres.Options{})
	first := copyAndCompare(t, src, pg)
	if err := pg.Check(context.Background()); err != nil {
		t.Error(err)
	}
	back := openBolt(t)
	if sum := copyAndCompare(t, pg, back); sum.Digest != first.Digest {
		t.Errorf("round trip changed the records")
	}
	if err := back.Check(); err != nil {
		t.Error(err)
	}
}

// failingSource is a Source whose Export stops with an error after n
// records, as a copy killed or cut off mid-way.
type failingSource struct {
	storecopy.Source
	n int
}

var errCut = errors.New("cut off")

func (f failingSource) Export(ctx context.Context, fn func(storecopy.Record) error) error {
	i := 0
	return f.Source.Export(ctx, func(r storecopy.Record) error {
		if i == f.n {
			return errCut
		}
		i++
		return fn(r)
	})
}

// TestCopyMark: a copy marks its destination incomplete before the first
// record, so that a copy stopped anywhere leaves a store the kernel refuses
// (kernel.Start); Finish replaces the mark with its note. The mark is never
// copied on nor digested. (Before, a store half filled by a killed copy
// was served as if whole.)
func TestCopyMark(t *testing.T) {
	ctx := context.Background()
	src := openBolt(t)
	fill(t, src)
	mark := func(s kernel.Store) string {
		var v []byte
		if err := s.View(ctx, func(tx kernel.ReadTx) error {
			var err error
			v, err = tx.Counter(kernel.DefaultTenant, kernel.CopyMarkKey)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return string(v)
	}
	start := func(s kernel.Store) error {
		k, err := kernel.New(s, nopDeliverer{}, nil, nil, kernel.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close(ctx)
		return k.Start(ctx)
	}

	for _, n := range []int{0, 7} {
		cut := openBolt(t)
		if _, err := storecopy.Copy(ctx, failingSource{src, n}, cut, cut); !errors.Is(err, errCut) {
			t.Fatalf("copy cut after %d records: %v", n, err)
		}
		if got := mark(cut); got != kernel.CopyMarkIncomplete {
			t.Fatalf("a copy cut after %d records left the mark %q, want %q", n, got, kernel.CopyMarkIncomplete)
		}
		if err := start(cut); err == nil || !strings.Contains(err.Error(), "store copy") {
			t.Fatalf("a kernel started on a copy cut after %d records: %v, want refused naming the copy", n, err)
		}
		if _, err := storecopy.Copy(ctx, src, cut, cut); !errors.Is(err, storecopy.ErrNotEmpty) {
			t.Fatalf("a second copy into the cut one: %v, want ErrNotEmpty", err)
		}
	}

	dst := openBolt(t)
	sum := copyAndCompare(t, src, dst)
	if err := storecopy.Finish(ctx, dst, "copied from a test"); err != nil {
		t.Fatal(err)
	}
	if got := mark(dst); got != "copied from a test" {
		t.Fatalf("mark after Finish %q", got)
	}
	if err := start(dst); err != nil {
		t.Fatalf("a kernel on a finished copy: %v", err)
	}
	// A copy of the copy carries records, not the first copy's mark, and
	// digests the same.
	again := openBolt(t)
	if got := copyAndCompare(t, dst, again); got.Digest != sum.Digest {
		t.Fatalf("the copy of a copy digests %s, want %s", got.Digest, sum.Digest)
	}
	if got := mark(again); got != kernel.CopyMarkIncomplete {
		t.Fatalf("a copy of a copy, not finished, is marked %q", got)
	}
}

type nopDeliverer struct{}

func (nopDeliverer) Deliver(context.Context, kernel.Delivery) error { return nil }
