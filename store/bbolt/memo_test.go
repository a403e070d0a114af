package bbolt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// checkMemo returns an error unless everything w remembers of the hot
// buckets is what the buckets hold: every remembered lookup gives the
// value stored now, and no key is stored in the events bucket's known gap.
func checkMemo(w *writeTx, after string) error {
	if m := w.memo; m != nil {
		for i := range m.e {
			for _, e := range m.e[i] {
				if e.k == nil {
					continue
				}
				got := w.tx.Bucket(hotBuckets[i]).Get(e.k)
				if !bytes.Equal(got, e.v) || (got == nil) != (e.v == nil) {
					return fmt.Errorf("after %s: bucket %s key %q: remembered %q, stored %q", after, hotBuckets[i], e.k, e.v, got)
				}
			}
		}
	}
	if w.gapFrom != nil {
		c := w.tx.Bucket(bEvents).Cursor()
		k, _ := c.Seek(w.gapFrom)
		if w.gapAfter && bytes.Equal(k, w.gapFrom) {
			k, _ = c.Next()
		}
		if k != nil && (w.gapTo == nil || bytes.Compare(k, w.gapTo) < 0) {
			return fmt.Errorf("after %s: key %q is stored in the events gap from %q (after: %v) to %q", after, k, w.gapFrom, w.gapAfter, w.gapTo)
		}
	}
	return nil
}

// unremembered runs f with w remembering nothing: its lookups walk the
// tree. What w remembered is back after.
func unremembered(w *writeTx, f func()) {
	memo, from, to, after := w.memo, w.gapFrom, w.gapTo, w.gapAfter
	w.memo, w.gapFrom, w.gapTo, w.gapAfter = new(lookupMemo), nil, nil, false
	f()
	w.memo, w.gapFrom, w.gapTo, w.gapAfter = memo, from, to, after
}

// sameAnswer returns an error unless a read gives the same record and
// error with and without what the transaction remembers.
func sameAnswer[T any](what string, w *writeTx, read func() (T, error)) error {
	got, err := read()
	var want T
	var wantErr error
	unremembered(w, func() { want, wantErr = read() })
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if fmt.Sprint(err) != fmt.Sprint(wantErr) || !bytes.Equal(gj, wj) {
		return fmt.Errorf("%s: got %s (%v), read afresh %s (%v)", what, gj, err, wj, wantErr)
	}
	return nil
}

// TestWriteTxMemo (which fails from the writer's goroutine by returning an
// error, never t.Fatal) runs random reads and writes of the step path (and
// purges) in write transactions and checks, after each, that what the
// transaction remembers to save lookups (lookup's memo, AppendEvent's
// gap) is what the buckets hold, and that the answers are the stored
// records: a remembered lookup never hides a write of the transaction.
func TestWriteTxMemo(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, false)
	rng := rand.New(rand.NewPCG(7, 12))
	tenants := []string{"t", "u"}
	ids := []string{"0196a000-0000-7000-8000-000000000001", "0196a000-0000-7000-8000-000000000002"}
	stepIDs := []string{"s1", "s2", "s3"}
	inputs := []json.RawMessage{nil, json.RawMessage(`{"task":1}`), json.RawMessage(`"other"`)}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for round := range 40 {
		err := s.Update(t.Context(), func(tx kernel.Tx) error {
			w := tx.(*writeTx)
			for op := range 60 {
				tenant, id := tenants[rng.IntN(len(tenants))], ids[rng.IntN(len(ids))]
				what := ""
				switch rng.IntN(9) {
				case 0, 1: // read, then write back changed, as the kernel does
					what = "PutExecution"
					e, err := tx.Execution(tenant, id)
					switch {
					case errors.Is(err, kernel.ErrNotFound):
						e = benchExec(id)
						e.Tenant, e.LastSeq = tenant, 0
					case err != nil:
						return err
					}
					e.Input = inputs[rng.IntN(len(inputs))]
					e.LastSeq += uint64(rng.IntN(2))
					if err := tx.PutExecution(e); err != nil && !errors.Is(err, kernel.ErrConflict) {
						return err
					}
				case 2:
					what = "Execution"
					if err := sameAnswer(what, w, func() (*kernel.Execution, error) { return tx.Execution(tenant, id) }); err != nil {
						return err
					}
					if err := sameAnswer("ExecutionTenant", w, func() (string, error) { return tx.ExecutionTenant(id) }); err != nil {
						return err
					}
				case 3, 4:
					what = "AppendEvent"
					seq := uint64(1 + rng.IntN(12))
					had := w.tx.Bucket(bEvents).Get(eventKey(tenant, id, seq)) != nil
					err := tx.AppendEvent(tenant, kernel.Event{ExecutionID: id, Seq: seq, Type: kernel.EvStepProposed, Time: now, Payload: json.RawMessage(`{}`)})
					if had != errors.Is(err, kernel.ErrConflict) || err != nil && !had {
						return fmt.Errorf("AppendEvent %s/%s seq %d (stored: %v): %v", tenant, id, seq, had, err)
					}
				case 5:
					what = "PutStep"
					st := &kernel.Step{ID: stepIDs[rng.IntN(len(stepIDs))], ExecutionID: id, Tenant: tenant, Kind: "tool_call",
						Target: "x", Args: json.RawMessage(`1`), Seq: uint64(1 + rng.IntN(12)), Status: kernel.StepExecuting, CreatedAt: now}
					if err := tx.PutStep(st); err != nil {
						return err
					}
				case 6:
					what = "Step"
					sid := stepIDs[rng.IntN(len(stepIDs))]
					if err := sameAnswer(what, w, func() (*kernel.Step, error) { return tx.Step(tenant, id, sid) }); err != nil {
						return err
					}
				case 7:
					what = "PutOccurrence"
					k := stepIDs[rng.IntN(len(stepIDs))]
					o, err := tx.Occurrence(tenant, id, k)
					if err != nil {
						return err
					}
					o.Count++
					if err := tx.PutOccurrence(tenant, id, k, o); err != nil {
						return err
					}
					if err := sameAnswer("Occurrence", w, func() (kernel.Occurrence, error) { return tx.Occurrence(tenant, id, k) }); err != nil {
						return err
					}
				default:
					what = "DeleteExecution"
					if _, _, err := tx.DeleteExecution(tenant, id, 1+rng.IntN(6)); err != nil && !errors.Is(err, kernel.ErrNotFound) {
						return err
					}
				}
				if err := checkMemo(w, fmt.Sprintf("op %d (%s %s/%s)", op, what, tenant, id)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}
