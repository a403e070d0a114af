package bbolt

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
)

// openV1File copies testdata/v1.db.gz, a schema 1 file written by the
// schema 1 code (JSON records), into a temporary directory.
func openV1File(t *testing.T) string {
	t.Helper()
	f, err := os.Open("testdata/v1.db.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "wicket.db")
	if err := os.WriteFile(path, raw, FileMode); err != nil {
		t.Fatal(err)
	}
	return path
}

func fileSchema(t *testing.T, s *Store) uint64 {
	t.Helper()
	var v uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		v, err = schemaVersion(tx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMigrateV1File opens a file written by the schema 1 code and expects
// every record to read back as the schema 1 code read it
// (testdata/v1.json), the hot records rewritten in binary, the indexes
// intact and maintained by later writes.
func TestMigrateV1File(t *testing.T) {
	path := openV1File(t)
	db, err := bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		v, err := schemaVersion(tx)
		if v != 1 || err != nil {
			t.Fatalf("testdata/v1.db.gz has schema %d (%v), want 1", v, err)
		}
		if raw := tx.Bucket(bExecutions).Get(key("t", v1Exec1)); len(raw) == 0 || raw[0] != '{' {
			t.Fatalf("testdata/v1.db.gz: execution is not JSON: %q", raw)
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v := fileSchema(t, s); v != SchemaVersion {
		t.Fatalf("schema %d after Open, want %d", v, SchemaVersion)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	// Every hot record is binary now; the steps bucket (schema 6) holds
	// slots (step seqs, occurrence counters), the step records are in the
	// events bucket.
	err = s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bOcc) != nil {
			return fmt.Errorf("bucket %s left after migration 6", bOcc)
		}
		for _, b := range [][]byte{bExecutions, bSteps, bEvents} {
			n := 0
			err := tx.Bucket(b).ForEach(func(k, v []byte) error {
				n++
				if bytes.Equal(b, bExecutions) && isInputKey(k) {
					return nil // an input (JSON)
				}
				if bytes.Equal(b, bSteps) {
					sl, err := decodeSlot(v)
					if err != nil {
						return fmt.Errorf("bucket %s: key %q: %w", b, k, err)
					}
					if sl.occ == nil {
						return nil
					}
					v = sl.occ
				}
				if len(v) < 2 || (v[0] != formatBinary1 && v[0] != formatBinary2 && v[0] != formatBinary3) {
					return fmt.Errorf("bucket %s: key %q not binary: %q", b, k, v)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("bucket %s: empty", b)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var got v1Golden
	if err := s.View(t.Context(), func(tx kernel.ReadTx) error { return readGolden(tx, &got) }); err != nil {
		t.Fatal(err)
	}
	// Migration 3 marks the agents of older files "signing": "body"; the
	// rest of each record is what schema 1 read.
	for _, a := range got.Agents {
		if a.Signing != kernel.SigningBody {
			t.Errorf("agent %s: signing %q after migration, want body", a.ID, a.Signing)
		}
		a.Signing = ""
	}
	// Migration 4 gave the one bundle, which is no guard, to its tenant.
	for _, b := range got.Bundles {
		if b.Owner != kernel.BundleOwnerTenant {
			t.Errorf("bundle %s/%s: owner %q after migration, want %q", b.Tenant, b.Name, b.Owner, kernel.BundleOwnerTenant)
		}
		b.Owner = ""
	}
	js, err := json.MarshalIndent(got, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("testdata/v1.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(append(js, '\n'), want) {
		t.Errorf("records after migration differ from what schema 1 read:\n got  %s\n want %s", js, want)
	}

	// Writes keep the indexes of migrated records right: the queued
	// execution is claimed, the acked one finishes.
	err = s.Update(t.Context(), func(tx kernel.Tx) error {
		e2, err := tx.Execution("u", v1Exec2)
		if err != nil {
			return err
		}
		e2.Dispatch.State, e2.Dispatch.DueAt, e2.Dispatch.LeaseUntil = kernel.DispatchDelivering, time.Time{}, time.Now()
		e2.IdempotencyKey = "idem-2b"
		if err := tx.PutExecution(e2); err != nil {
			return err
		}
		e1, err := tx.Execution("t", v1Exec1)
		if err != nil {
			return err
		}
		e1.Dispatch = kernel.DispatchState{ID: e1.Dispatch.ID}
		e1.Status = kernel.ExecCompleted
		return tx.PutExecution(e1)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	err = s.View(t.Context(), func(tx kernel.ReadTx) error {
		far := time.Now().Add(time.Hour)
		due, _ := tx.DueDispatches(far, 0)
		leases, _ := tx.ExpiredLeases(far, 0)
		if len(due) != 0 || len(leases) != 1 || leases[0].ExecutionID != v1Exec2 {
			t.Errorf("after writes: due %v, leases %v; want none, %s", due, leases, v1Exec2)
		}
		if _, err := tx.ExecutionByIdempotencyKey("u", "idem-2"); err == nil {
			t.Error("the replaced idempotency key still resolves")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMigrateManyRecords migrates a schema 1 file with more records than
// one rewrite batch holds.
func TestMigrateManyRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	db, err := bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2500
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	e := &kernel.Execution{ID: "e1", Tenant: "t", AgentID: "a", Status: kernel.ExecRunning, Input: json.RawMessage(`{"x":1}`),
		CreatedAt: t0, UpdatedAt: t0, LastSeq: n}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := migrateCreateBuckets(tx); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bMeta)
		if err != nil {
			return err
		}
		if err := meta.Put(keySchemaVersion, []byte{0, 0, 0, 0, 0, 0, 0, 1}); err != nil {
			return err
		}
		put1 := func(b, k []byte, v any) error {
			raw, err := encodeJSON(v) // the schema 1 encoding
			if err != nil {
				return err
			}
			return tx.Bucket(b).Put(k, raw)
		}
		if err := put1(bExecutions, key("t", "e1"), e); err != nil {
			return err
		}
		if err := tx.Bucket(bExecTenant).Put([]byte("e1"), []byte("t")); err != nil {
			return err
		}
		for i := uint64(1); i <= n; i++ {
			typ := kernel.EvStepProposed
			if i == 1 {
				typ = kernel.EvExecutionCreated
			}
			ev := kernel.Event{ExecutionID: "e1", Seq: i, Type: typ, Time: t0, Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
			if err := put1(bEvents, eventKey("t", "e1", i), ev); err != nil {
				return err
			}
			st := kernel.Step{ID: fmt.Sprintf("s%05d", i), ExecutionID: "e1", Tenant: "t", Kind: "local", Target: "x", Seq: i, CreatedAt: t0}
			if err := put1(bSteps, key("t", "e1", st.ID), st); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	err = s.View(t.Context(), func(tx kernel.ReadTx) error {
		evs, err := tx.Events("t", "e1", 0, 0)
		if err != nil {
			return err
		}
		steps, err := tx.ListSteps("t", "e1")
		if err != nil {
			return err
		}
		if len(evs) != n || len(steps) != n {
			return fmt.Errorf("%d events, %d steps; want %d", len(evs), len(steps), n)
		}
		for i, ev := range evs {
			if ev.Seq != uint64(i+1) || string(ev.Payload) != fmt.Sprintf(`{"i":%d}`, i+1) || !ev.Time.Equal(t0) {
				return fmt.Errorf("event %d: %+v", i+1, ev)
			}
			if s := steps[i]; s.Seq != uint64(i+1) || string(s.Args) != "null" {
				return fmt.Errorf("step %d: %+v", i+1, s)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMigrateRefusesBadRecord: an undecodable schema 1 record fails the
// migration, which leaves the file untouched.
func TestMigrateRefusesBadRecord(t *testing.T) {
	path := openV1File(t)
	db, err := bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bSteps).Put(key("t", v1Exec1, "bad"), []byte("{nope")) })
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s, err := Open(path, Options{NoSync: true}); err == nil {
		s.Close()
		t.Fatal("Open migrated a file with an undecodable step")
	}
	db, err = bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if v, _ := schemaVersion(tx); v != 1 {
			t.Errorf("schema %d after a failed migration, want 1", v)
		}
		if raw := tx.Bucket(bExecutions).Get(key("t", v1Exec1)); len(raw) == 0 || raw[0] != '{' {
			t.Errorf("a failed migration rewrote records")
		}
		return nil
	})
}

// TestMigrateAgentSigning: a schema 2 file's agents, registered before
// signing schemes existed, read back "signing": "body"; an agent that
// already names a scheme keeps it; the rest of the record is unchanged.
func TestMigrateAgentSigning(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	db, err := bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	err = db.Update(func(tx *bolt.Tx) error {
		if err := migrateCreateBuckets(tx); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bMeta)
		if err != nil {
			return err
		}
		if err := meta.Put(keySchemaVersion, []byte{0, 0, 0, 0, 0, 0, 0, 2}); err != nil {
			return err
		}
		b := tx.Bucket(bAgents)
		old := `{"id":"old","tenant":"t","webhook_url":"http://127.0.0.1:5001/hook","secret":"old-secret-0123456789","bundle":"b","created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`
		if err := b.Put(key("t", "old"), []byte(old)); err != nil {
			return err
		}
		explicit := `{"id":"new","tenant":"t","webhook_url":"http://127.0.0.1:5002/hook","secret":"new-secret-0123456789","signing":"v1","created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z"}`
		return b.Put(key("t", "new"), []byte(explicit))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v := fileSchema(t, s); v != SchemaVersion {
		t.Fatalf("schema %d, want %d", v, SchemaVersion)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	err = s.View(t.Context(), func(tx kernel.ReadTx) error {
		old, err := tx.Agent("t", "old")
		if err != nil {
			return err
		}
		want := kernel.Agent{ID: "old", Tenant: "t", WebhookURL: "http://127.0.0.1:5001/hook", Secret: "old-secret-0123456789",
			Bundle: "b", Signing: kernel.SigningBody, CreatedAt: t0, UpdatedAt: t0}
		if *old != want {
			t.Errorf("old agent after migration: %+v, want %+v", *old, want)
		}
		nw, err := tx.Agent("t", "new")
		if err != nil {
			return err
		}
		if nw.Signing != kernel.SigningV1 {
			t.Errorf("an agent with signing v1 now has %q", nw.Signing)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMigrateBundleOwners: migration 3 → 4 gives the bundles a tenant names
// as guards to the admin and every other bundle to its tenant, in a file
// written at schema 3.
func TestMigrateBundleOwners(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	db, err := bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	err = db.Update(func(tx *bolt.Tx) error {
		if err := migrateCreateBuckets(tx); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bMeta)
		if err != nil {
			return err
		}
		if err := meta.Put(keySchemaVersion, []byte{0, 0, 0, 0, 0, 0, 0, 3}); err != nil {
			return err
		}
		put := func(b, k []byte, v any) error {
			raw, err := encodeJSON(v)
			if err != nil {
				return err
			}
			return tx.Bucket(b).Put(k, raw)
		}
		for _, tn := range []kernel.Tenant{{ID: "acme", Guards: []string{"guard"}, CreatedAt: t0}, {ID: "other", CreatedAt: t0}} {
			if err := put(bTenants, []byte(tn.ID), tn); err != nil {
				return err
			}
		}
		// "guard" is acme's guard; other's bundle of the same name is not.
		for _, b := range []kernel.BundleRecord{{Tenant: "acme", Name: "guard"}, {Tenant: "acme", Name: "own"}, {Tenant: "other", Name: "guard"}} {
			b.Revision, b.Engine, b.UpdatedAt = "1", "rules", t0
			if err := put(bBundles, key(b.Tenant, b.Name), b); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v := fileSchema(t, s); v != SchemaVersion {
		t.Fatalf("schema %d after Open, want %d", v, SchemaVersion)
	}
	want := map[string]kernel.BundleOwner{"acme/guard": kernel.BundleOwnerAdmin, "acme/own": kernel.BundleOwnerTenant, "other/guard": kernel.BundleOwnerTenant}
	err = s.View(t.Context(), func(tx kernel.ReadTx) error {
		all, err := tx.ListBundles("")
		if err != nil {
			return err
		}
		if len(all) != len(want) {
			return fmt.Errorf("%d bundles after migration, want %d", len(all), len(want))
		}
		for _, b := range all {
			if w := want[b.Tenant+"/"+b.Name]; b.Owner != w || b.Revision != "1" || !b.UpdatedAt.Equal(t0) {
				t.Errorf("bundle %s/%s: %+v, want owner %q and the rest unchanged", b.Tenant, b.Name, b, w)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMigrateStepLog migrates a schema 5 file (step records in the steps
// bucket, counters in the occ bucket): the step records move beside their
// first events, the counters into the steps bucket's slots, one of them
// under a step's id, and everything reads back as before, passes Check,
// is written to and is purged whole.
func TestMigrateStepLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	db, err := bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	const n = 300
	e := &kernel.Execution{ID: "e1", Tenant: "t", AgentID: "a", Status: kernel.ExecCompleted, Input: json.RawMessage(`{"x":1}`),
		CreatedAt: t0, UpdatedAt: t0, LastSeq: 1 + 2*n}
	other := &kernel.Execution{ID: "e2", Tenant: "t", AgentID: "a", Status: kernel.ExecRunning, Input: json.RawMessage(`{}`),
		CreatedAt: t0, UpdatedAt: t0, LastSeq: 1}
	steps := map[string]*kernel.Step{}
	occ := map[string]kernel.Occurrence{}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := migrateCreateBuckets(tx); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bMeta)
		if err != nil {
			return err
		}
		if err := meta.Put(keySchemaVersion, []byte{0, 0, 0, 0, 0, 0, 0, 5}); err != nil {
			return err
		}
		for _, x := range []*kernel.Execution{e, other} {
			if err := tx.Bucket(bExecutions).Put(key(x.Tenant, x.ID), encodeExecution(x)); err != nil {
				return err
			}
			if err := tx.Bucket(bExecTenant).Put([]byte(x.ID), []byte(x.Tenant)); err != nil {
				return err
			}
			ev := kernel.Event{ExecutionID: x.ID, Seq: 1, Type: kernel.EvExecutionCreated, Time: t0, Payload: json.RawMessage(`{}`)}
			if err := tx.Bucket(bEvents).Put(eventKey(x.Tenant, x.ID, 1), encodeEventV1(&ev)); err != nil {
				return err
			}
		}
		for i := range n {
			seq := uint64(2 + 2*i)
			st := &kernel.Step{ID: fmt.Sprintf("%064x", i), ExecutionID: "e1", Tenant: "t", Kind: "tool_call", Target: "x",
				Args: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), Status: kernel.StepSucceeded, Result: json.RawMessage(`1`),
				Seq: seq, CreatedAt: t0}
			steps[st.ID] = st
			for j, typ := range []kernel.EventType{kernel.EvStepProposed, kernel.EvStepSucceeded} {
				ev := kernel.Event{ExecutionID: "e1", Seq: seq + uint64(j), Type: typ, Time: t0,
					Payload: json.RawMessage(`{"step_id":"` + st.ID + `"}`)}
				if err := tx.Bucket(bEvents).Put(eventKey("t", "e1", ev.Seq), encodeEventV1(&ev)); err != nil {
					return err
				}
			}
			if err := tx.Bucket(bSteps).Put(key("t", "e1", st.ID), encodeStepV2(st)); err != nil {
				return err
			}
			// A counter under the first step's id (as the kernel keys
			// them now) and one under a key of before.
			k := st.ID
			if i%2 == 1 {
				k = "tool_call\x00" + st.ID + "\x00x"
			}
			occ[k] = kernel.Occurrence{Lease: kernel.Lease{DispatchID: "d", Attempt: 1}, Count: i + 1}
			if err := tx.Bucket(bOcc).Put(key("t", "e1", k), encodeOccurrenceV1(occ[k])); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v := fileSchema(t, s); v != SchemaVersion {
		t.Fatalf("schema %d after Open, want %d", v, SchemaVersion)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bOcc) != nil {
			return fmt.Errorf("bucket %s left", bOcc)
		}
		// The input moved out of the record, into the inputs bucket; an
		// input of null has no entry.
		rec, err := decodeExecution(tx.Bucket(bExecutions).Get(key("t", "e1")))
		if err != nil || string(rec.Input) != "null" {
			return fmt.Errorf("execution record after migration: input %q (%v), want null", rec.Input, err)
		}
		if in := tx.Bucket(bExecutions).Get(inputKey(key("t", "e1"))); string(in) != `{"x":1}` {
			return fmt.Errorf("inputs: %q, want the execution's", in)
		}
		if in := tx.Bucket(bExecutions).Get(inputKey(key("t", "e2"))); string(in) != `{}` {
			return fmt.Errorf("inputs: %q, want {}", in)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.View(t.Context(), func(tx kernel.ReadTx) error {
		for id, want := range steps {
			got, err := tx.Step("t", "e1", id)
			if err != nil {
				return err
			}
			if g, w := mustJSON(t, got), mustJSON(t, want); g != w {
				return fmt.Errorf("step %s:\n got  %s\n want %s", id, g, w)
			}
		}
		for k, want := range occ {
			if got, err := tx.Occurrence("t", "e1", k); err != nil || got != want {
				return fmt.Errorf("occurrence %q: %+v %v, want %+v", k, got, err, want)
			}
		}
		for _, x := range []*kernel.Execution{e, other} {
			got, err := tx.Execution("t", x.ID)
			if err != nil || string(got.Input) != string(x.Input) || got.LastSeq != x.LastSeq {
				return fmt.Errorf("execution %s: %+v %v, want input %s", x.ID, got, err, x.Input)
			}
		}
		all, err := tx.ListExecutions("t", kernel.ExecutionFilter{})
		if err != nil || len(all) != 2 || string(all[0].Input) != `{}` || string(all[1].Input) != `{"x":1}` {
			return fmt.Errorf("ListExecutions: %+v %v", all, err)
		}
		list, err := tx.ListSteps("t", "e1")
		if err != nil || len(list) != n {
			return fmt.Errorf("ListSteps: %d %v, want %d", len(list), err, n)
		}
		for i := 1; i < n; i++ {
			if list[i].Seq <= list[i-1].Seq {
				return fmt.Errorf("ListSteps out of order at %d", i)
			}
		}
		evs, err := tx.Events("t", "e1", 0, 0)
		if err != nil || len(evs) != 1+2*n {
			return fmt.Errorf("Events: %d %v, want %d", len(evs), err, 1+2*n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A write after the migration: a step of the other execution, its
	// counter under its id.
	err = s.Update(t.Context(), func(tx kernel.Tx) error {
		st := &kernel.Step{ID: "s", ExecutionID: "e2", Tenant: "t", Kind: "local", Target: "y", Status: kernel.StepExecuting, Seq: 2, CreatedAt: t0}
		if err := tx.AppendEvent("t", kernel.Event{ExecutionID: "e2", Seq: 2, Type: kernel.EvStepProposed, Time: t0, Payload: json.RawMessage(`{"step_id":"s"}`)}); err != nil {
			return err
		}
		if err := tx.PutStep(st); err != nil {
			return err
		}
		if err := tx.PutOccurrence("t", "e2", "s", kernel.Occurrence{Count: 1}); err != nil {
			return err
		}
		other.LastSeq = 2
		return tx.PutExecution(other)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	// Purged in small batches, everything of e1 goes, nothing of e2.
	for done := false; !done; {
		err := s.Update(t.Context(), func(tx kernel.Tx) error {
			var err error
			_, done, err = tx.DeleteExecution("t", "e1", 64)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Check(); err != nil {
			t.Fatal(err)
		}
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bSteps, bEvents} {
			c := tx.Bucket(b).Cursor()
			if k, _ := c.Seek(prefix("t", "e1")); k != nil && bytes.HasPrefix(k, prefix("t", "e1")) {
				return fmt.Errorf("bucket %s: %q left after the purge", b, k)
			}
		}
		if tx.Bucket(bExecutions).Get(inputKey(key("t", "e1"))) != nil {
			return fmt.Errorf("the input of e1 left after the purge")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.View(t.Context(), func(tx kernel.ReadTx) error {
		if st, err := tx.Step("t", "e2", "s"); err != nil || st.Status != kernel.StepExecuting {
			return fmt.Errorf("step of e2: %+v %v", st, err)
		}
		if o, err := tx.Occurrence("t", "e2", "s"); err != nil || o.Count != 1 {
			return fmt.Errorf("counter of e2: %+v %v", o, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMigrateStepLogRefusesBadRecord: migration 5 → 6 meets an occurrence
// counter it cannot read after it has moved the inputs and the step
// records; Open fails and the file is left at schema 5 as it was (input
// in the record, step record in the steps bucket, the occ bucket there).
func TestMigrateStepLogRefusesBadRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	db, err := bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &kernel.Execution{ID: "e1", Tenant: "t", AgentID: "a", Input: json.RawMessage(`{"x":1}`), LastSeq: 2}
	st := &kernel.Step{ID: "s1", ExecutionID: "e1", Tenant: "t", Seq: 2}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := migrateCreateBuckets(tx); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bMeta)
		if err != nil {
			return err
		}
		if err := meta.Put(keySchemaVersion, []byte{0, 0, 0, 0, 0, 0, 0, 5}); err != nil {
			return err
		}
		if err := tx.Bucket(bExecutions).Put(key("t", "e1"), encodeExecution(e)); err != nil {
			return err
		}
		if err := tx.Bucket(bSteps).Put(key("t", "e1", "s1"), encodeStepV2(st)); err != nil {
			return err
		}
		return tx.Bucket(bOcc).Put(key("t", "e1", "s1"), []byte{0xff})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s, err := Open(path, Options{NoSync: true}); err == nil {
		s.Close()
		t.Fatal("Open migrated a file with an undecodable occurrence counter")
	}
	db, err = bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if v, _ := schemaVersion(tx); v != 5 {
			t.Errorf("schema %d after a failed migration, want 5", v)
		}
		if tx.Bucket(bOcc) == nil {
			t.Error("the occ bucket is gone after a failed migration")
		}
		if got, err := decodeExecution(tx.Bucket(bExecutions).Get(key("t", "e1"))); err != nil || string(got.Input) != `{"x":1}` {
			t.Errorf("the execution after a failed migration: %+v, %v", got, err)
		}
		if tx.Bucket(bExecutions).Get(inputKey(key("t", "e1"))) != nil {
			t.Error("an input was moved by a failed migration")
		}
		if _, err := decodeStep(tx.Bucket(bSteps).Get(key("t", "e1", "s1"))); err != nil {
			t.Errorf("the step record after a failed migration: %v", err)
		}
		if tx.Bucket(bEvents).Get(stepLogKey("t", "e1", 2, "s1")) != nil {
			t.Error("a step record was moved by a failed migration")
		}
		return nil
	})
}
