package bbolt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestSpace: the report counts every record by type with its exact key
// and value bytes, accounts for every page of the file, and refuses a
// file a store holds open.
func TestSpace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	const n = 300
	var evBytes, stBytes int64
	err = s.Update(t.Context(), func(tx kernel.Tx) error {
		e := &kernel.Execution{ID: "e1", Tenant: "t", AgentID: "a", Status: kernel.ExecRunning, Input: json.RawMessage(`{"x":1}`),
			CreatedAt: t0, UpdatedAt: t0, LastSeq: 2 * n}
		for i := range n {
			id := fmt.Sprintf("%064x", i)
			ev := kernel.Event{ExecutionID: "e1", Seq: uint64(2*i + 1), Type: kernel.EvStepProposed, Time: t0,
				Payload: json.RawMessage(`{"step_id":"` + id + `","kind":"tool_call","target":"x"}`)}
			if err := tx.AppendEvent("t", ev); err != nil {
				return err
			}
			evBytes += int64(len(eventKey("t", "e1", ev.Seq)) + len(encodeEvent(&ev)))
			ev.Seq++
			ev.Type = kernel.EvStepSucceeded
			if err := tx.AppendEvent("t", ev); err != nil {
				return err
			}
			evBytes += int64(len(eventKey("t", "e1", ev.Seq)) + len(encodeEvent(&ev)))
			st := &kernel.Step{ID: id, ExecutionID: "e1", Tenant: "t", Kind: "tool_call", Target: "x", Status: kernel.StepSucceeded,
				Args: json.RawMessage(`{"i":1}`), Seq: uint64(2*i + 1), CreatedAt: t0}
			if err := tx.PutStep(st); err != nil {
				return err
			}
			stBytes += int64(len(stepLogKey("t", "e1", st.Seq, id)) + len(encodeStep(st)))
		}
		return tx.PutExecution(e)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Space(path, 50*time.Millisecond); !errors.Is(err, ErrLocked) {
		t.Fatalf("Space on a file a store holds: %v, want ErrLocked", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Space(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rec := map[string]RecordSpace{}
	for _, r := range rep.Records {
		rec[r.Bucket+" "+r.Type] = r
	}
	got := func(k string) RecordSpace {
		r, ok := rec[k]
		if !ok {
			t.Fatalf("no %q in the report: %+v", k, rep.Records)
		}
		return r
	}
	p, sc, st := got("events event step.proposed"), got("events event step.succeeded"), got("events step record (succeeded)")
	if p.N != n || sc.N != n || st.N != n {
		t.Errorf("counts: %d proposed, %d succeeded, %d step records; want %d each", p.N, sc.N, st.N, n)
	}
	if sum := p.KeyBytes + p.ValueBytes + sc.KeyBytes + sc.ValueBytes; sum != evBytes {
		t.Errorf("event bytes: %d in the report, %d written", sum, evBytes)
	}
	if sum := st.KeyBytes + st.ValueBytes; sum != stBytes {
		t.Errorf("step record bytes: %d in the report, %d written", sum, stBytes)
	}
	if r := got("steps slot: seq"); r.N != n {
		t.Errorf("%d slots, want %d", r.N, n)
	}
	if r := got("executions input"); r.N != 1 || r.ValueBytes != int64(len(`{"x":1}`)) {
		t.Errorf("input: %+v", r)
	}
	pages := 2 + rep.FreePages + rep.PendingPages + rep.FreelistPages
	for _, b := range rep.Buckets {
		pages += b.LeafPages + b.BranchPages
		if b.Name == "events" {
			if b.Keys != 3*n || b.LeafInuse < int(evBytes+stBytes) || b.LeafInuse > b.LeafAlloc {
				t.Errorf("events bucket: %+v (%d bytes of records)", b, evBytes+stBytes)
			}
		}
	}
	// The root bucket's page (the buckets' directory) is the one page no
	// bucket counts.
	if pages+1 != rep.Pages {
		t.Errorf("pages: %d accounted for (+1 root), the file has %d: %+v", pages, rep.Pages, rep)
	}
	var out bytes.Buffer
	if _, err := rep.WriteTo(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"event step.proposed", "step record (succeeded)", "slot: seq", "leaf inuse"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, out.String())
		}
	}
}
