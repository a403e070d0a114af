package bbolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/storetest"
)

// openStore opens a store in a fresh directory of tb. Its cleanup runs
// Check (when check is set) and closes the store.
func openStore(tb testing.TB, opts Options, check bool) *Store {
	tb.Helper()
	s, err := Open(filepath.Join(tb.TempDir(), "wicket.db"), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if check {
			if err := s.Check(); err != nil {
				tb.Error(err)
			}
		}
		if err := s.Close(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// openTest opens a store (fsync on, as in production) whose cleanup checks
// the invariants and closes it.
func openTest(t *testing.T) kernel.Store { return openStore(t, Options{}, true) }

func TestConformance(t *testing.T) {
	storetest.Run(t, openTest)
}

func TestConformanceNoGroupCommit(t *testing.T) {
	storetest.Run(t, func(t *testing.T) kernel.Store { return openStore(t, Options{MaxBatch: 1, NoSync: true}, true) })
}

func TestFileMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "nested")
	path := filepath.Join(dir, "wicket.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct {
		path string
		want os.FileMode
	}{{path, FileMode}, {dir, DirMode}, {filepath.Dir(dir), DirMode}} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != c.want {
			t.Errorf("%s: mode %04o, want %04o", c.path, got, c.want)
		}
	}
}

func TestOpenRefusesWritableFile(t *testing.T) {
	cases := []struct {
		mode   os.FileMode
		refuse bool
	}{
		{0o600, false},
		{0o400, false},
		{0o640, false},
		{0o620, true},
		{0o602, true},
		{0o660, true},
		{0o666, true},
	}
	for _, c := range cases {
		t.Run(c.mode.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "wicket.db")
			// A valid store file, then loosened.
			s, err := Open(path, Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, c.mode); err != nil {
				t.Fatal(err)
			}
			s, err = Open(path, Options{NoSync: true, Timeout: 100 * time.Millisecond})
			if !c.refuse {
				if err != nil {
					t.Fatalf("Open of a %04o file: %v", c.mode, err)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("Open accepted a %04o file", c.mode)
			}
			if !errors.Is(err, ErrInsecureFile) {
				t.Errorf("error %v does not match ErrInsecureFile", err)
			}
			if msg, mode := err.Error(), fmt.Sprintf("%04o", c.mode); !strings.Contains(msg, path) || !strings.Contains(msg, mode) {
				t.Errorf("error %q does not name the path and the mode %s", msg, mode)
			}
		})
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	setSchema(t, path, SchemaVersion+1)
	s, err = Open(path, Options{NoSync: true})
	if err == nil {
		s.Close()
		t.Fatal("Open accepted a newer schema")
	}
	if !errors.Is(err, ErrNewerSchema) || !strings.Contains(err.Error(), path) {
		t.Errorf("error %v: want ErrNewerSchema naming %s", err, path)
	}
}

// setSchema writes schema_version v into the file at path with bbolt directly.
func setSchema(t *testing.T, path string, v uint64) {
	t.Helper()
	db, err := bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bMeta).Put(keySchemaVersion, binary.BigEndian.AppendUint64(nil, v))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestMigrations(t *testing.T) {
	if len(migrations) != SchemaVersion {
		t.Fatalf("SchemaVersion = %d but there are %d migrations", SchemaVersion, len(migrations))
	}
	// A bare bbolt file (schema 0) is migrated to SchemaVersion, and opening
	// it again changes nothing.
	path := filepath.Join(t.TempDir(), "wicket.db")
	db, err := bolt.Open(path, FileMode, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	for range 2 {
		s, err := Open(path, Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		var v uint64
		if err := s.db.View(func(tx *bolt.Tx) error { v, err = schemaVersion(tx); return err }); err != nil {
			t.Fatal(err)
		}
		if v != SchemaVersion {
			t.Errorf("schema version %d after Open, want %d", v, SchemaVersion)
		}
		if err := s.Check(); err != nil {
			t.Error(err)
		}
		s.Close()
	}
}

func TestReopenKeepsData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &kernel.Execution{ID: "01960000-0000-7000-8000-000000000001", Tenant: "t", AgentID: "a", Status: kernel.ExecRunning,
		LastSeq: 1, Dispatch: kernel.DispatchState{State: kernel.DispatchQueued, DueAt: time.Unix(100, 0)}}
	err = s.Update(t.Context(), func(tx kernel.Tx) error {
		if err := tx.PutExecution(e); err != nil {
			return err
		}
		return tx.AppendEvent("t", kernel.Event{ExecutionID: e.ID, Seq: 1, Type: kernel.EvExecutionCreated})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.View(t.Context(), func(tx kernel.ReadTx) error {
		got, err := tx.Execution("t", e.ID)
		if err != nil {
			return err
		}
		due, err := tx.DueDispatches(time.Unix(100, 0), 0)
		if err != nil {
			return err
		}
		if got.Status != kernel.ExecRunning || len(due) != 1 || due[0].ExecutionID != e.ID {
			t.Errorf("after reopen: status %q, due %v", got.Status, due)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); err != nil {
		t.Error(err)
	}
}

func TestSecondOpenIsLocked(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, true)
	const timeout = 150 * time.Millisecond
	start := time.Now()
	s2, err := Open(s.Path(), Options{Timeout: timeout})
	elapsed := time.Since(start)
	if err == nil {
		s2.Close()
		t.Fatal("second Open of a locked file succeeded")
	}
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), s.Path()) || !strings.Contains(err.Error(), "locked by another process") {
		t.Errorf("error %q: want ErrLocked naming the path", err)
	}
	// bbolt polls the lock every 50 ms and gives up one poll early.
	if elapsed < timeout/2 || elapsed > timeout+2*time.Second {
		t.Errorf("second Open gave up after %s, timeout %s", elapsed, timeout)
	}
	// The first store is unharmed.
	if err := s.Update(t.Context(), func(tx kernel.Tx) error { return tx.PutCounter("t", "c", []byte("1")) }); err != nil {
		t.Fatal(err)
	}
}

func TestClosed(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "wicket.db"), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	ran := false
	err = s.Update(t.Context(), func(tx kernel.Tx) error { ran = true; return nil })
	if !errors.Is(err, kernel.ErrUnavailable) || ran {
		t.Errorf("Update after Close: %v (fn ran: %v), want ErrUnavailable", err, ran)
	}
	err = s.View(t.Context(), func(tx kernel.ReadTx) error { ran = true; return nil })
	if !errors.Is(err, kernel.ErrUnavailable) || ran {
		t.Errorf("View after Close: %v (fn ran: %v), want ErrUnavailable", err, ran)
	}
}

// TestCloseDrains: Updates handed to the writer before Close are committed.
func TestCloseDrains(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	started := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = s.Update(context.Background(), func(tx kernel.Tx) error {
			select {
			case <-started:
			default:
				close(started)
			}
			<-release
			return tx.PutCounter("t", "blocker", []byte("1"))
		})
	}()
	<-started
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	<-s.closing // Close has begun: it now waits for the writer, which waits for the Update
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while an Update was running", err)
	default:
	}
	close(release)
	wg.Wait()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.View(t.Context(), func(tx kernel.ReadTx) error {
		v, err := tx.Counter("t", "blocker")
		if string(v) != "1" {
			t.Errorf("the Update running at Close was not committed: %q", v)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// hold blocks the writer with an Update until the returned release is called.
func hold(t *testing.T, s *Store) (release func()) {
	t.Helper()
	started, rel := make(chan struct{}), make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		done <- s.Update(context.Background(), func(tx kernel.Tx) error {
			once.Do(func() { close(started) })
			<-rel
			return nil
		})
	}()
	<-started
	return func() {
		close(rel)
		if err := <-done; err != nil {
			t.Errorf("holding update: %v", err)
		}
	}
}

// waitQueued waits until n Updates are waiting for the writer.
func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Waiting < int64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d Updates queued", s.Stats().Waiting, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGroupCommit: Updates queued behind a busy writer share one commit,
// and a failure among them costs the others one retry, not their commit.
func TestGroupCommit(t *testing.T) {
	cases := []struct {
		name        string
		k, maxBatch int
		fail        map[int]bool
		maxCommits  uint64
	}{
		{"all succeed", 20, 0, nil, 1},
		{"some fail", 20, 0, map[int]bool{3: true, 7: true, 19: true}, 1},
		{"all fail", 5, 0, map[int]bool{0: true, 1: true, 2: true, 3: true, 4: true}, 0},
		{"capped batches", 20, 8, nil, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openStore(t, Options{MaxBatch: c.maxBatch}, true)
			release := hold(t, s)
			before := s.Stats()
			var wg sync.WaitGroup
			errs := make([]error, c.k)
			for i := range c.k {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = s.Update(context.Background(), func(tx kernel.Tx) error {
						if err := tx.PutCounter("t", string(rune('a'+i)), []byte("1")); err != nil {
							return err
						}
						if c.fail[i] {
							return errors.New("no")
						}
						return nil
					})
				}()
			}
			waitQueued(t, s, c.k)
			release()
			wg.Wait()
			st := s.Stats()
			commits, updates := st.Commits-before.Commits-1, st.Updates-before.Updates-1
			if commits > c.maxCommits {
				t.Errorf("%d updates took %d commits, want at most %d", c.k, commits, c.maxCommits)
			}
			if want := uint64(c.k - len(c.fail)); updates != want {
				t.Errorf("%d updates committed, want %d", updates, want)
			}
			for i, err := range errs {
				if (err != nil) != c.fail[i] {
					t.Errorf("update %d: %v", i, err)
				}
			}
		})
	}
}

// TestStatsTimeTheWriter: the writer's time is split between the Update
// functions, the log (only with one) and bbolt's commit, and the functions'
// share covers at least the time they took themselves.
func TestStatsTimeTheWriter(t *testing.T) {
	for _, c := range []struct {
		name string
		opts Options
	}{{"wal", walOptions}, {"bbolt fsync", Options{}}} {
		t.Run(c.name, func(t *testing.T) {
			s := openStore(t, c.opts, true)
			before := s.Stats()
			var inside time.Duration
			for i := range 20 {
				if err := s.Update(t.Context(), func(tx kernel.Tx) error {
					start := time.Now()
					defer func() { inside += time.Since(start) }()
					return tx.PutCounter("t", fmt.Sprint(i), bytes.Repeat([]byte{byte(i)}, 512))
				}); err != nil {
					t.Fatal(err)
				}
			}
			// The writer's open transaction is committed to the file.
			if err := s.flush(); err != nil {
				t.Fatal(err)
			}
			st := s.Stats()
			fn, lg, fl := st.Functions-before.Functions, st.Log-before.Log, st.File-before.File
			if fn < inside || fl <= 0 || (lg > 0) != c.opts.WAL {
				t.Fatalf("functions %s (they took %s), log %s, file %s", fn, inside, lg, fl)
			}
		})
	}
}

// TestLoneUpdateDoesNotWait: without company, every Update commits at once
// (bbolt's Batch would wait up to 10 ms for more): the writer never holds a
// lone caller's batch open for a gather window.
func TestLoneUpdateDoesNotWait(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, true)
	if s.gather <= 0 {
		t.Fatalf("the store under test does not gather (window %s): the test would pass vacuously", s.gather)
	}
	const n = 200
	for i := range n {
		if err := s.Update(t.Context(), func(tx kernel.Tx) error {
			return tx.PutCounter("t", "c", []byte{byte(i)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	if w := s.windows.Load(); w != 0 {
		t.Errorf("%d serial Updates held a batch open for more %d times, want never", n, w)
	}
	if st := s.Stats(); st.Commits != n || st.Updates != n {
		t.Errorf("stats %+v, want %d commits of one update each", st, n)
	}
}

// TestUpdateCancelledWhileQueued: an Update whose context ends while the
// writer is busy returns the context's error and never runs.
func TestUpdateCancelledWhileQueued(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, true)
	release := hold(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	ran := false
	err := s.Update(ctx, func(tx kernel.Tx) error { ran = true; return tx.PutCounter("t", "c", []byte("1")) })
	release()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Update: %v, want context.DeadlineExceeded", err)
	}
	// Let the writer go idle, then make sure fn never ran.
	if err := s.Update(t.Context(), func(tx kernel.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if ran {
		t.Error("the cancelled Update's function ran")
	}
}

func TestPanicError(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, true)
	err := s.Update(t.Context(), func(tx kernel.Tx) error { panic("kaboom") })
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Value != "kaboom" || len(pe.Stack) == 0 {
		t.Errorf("Update of a panicking fn: %v, want a *PanicError with value and stack", err)
	}
}

func TestValidation(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, true)
	cases := []struct {
		name string
		fn   func(tx kernel.Tx) error
	}{
		{"empty tenant", func(tx kernel.Tx) error { return tx.PutExecution(&kernel.Execution{ID: "x"}) }},
		{"NUL in tenant", func(tx kernel.Tx) error { return tx.PutAgent(&kernel.Agent{Tenant: "a\x00b", ID: "x"}) }},
		{"NUL in execution id", func(tx kernel.Tx) error {
			return tx.PutStep(&kernel.Step{Tenant: "t", ExecutionID: "e\x00", ID: "s"})
		}},
		{"event seq 0", func(tx kernel.Tx) error { return tx.AppendEvent("t", kernel.Event{ExecutionID: "e"}) }},
		{"nil record", func(tx kernel.Tx) error { return tx.PutApproval(nil) }},
	}
	for _, c := range cases {
		err := s.Update(t.Context(), c.fn)
		if !errors.Is(err, kernel.ErrValidation) {
			t.Errorf("%s: %v, want ErrValidation", c.name, err)
		}
	}
	// Reads with such ids find nothing rather than another tenant's data.
	err := s.View(t.Context(), func(tx kernel.ReadTx) error {
		_, err := tx.Execution("a\x00b", "c")
		if !errors.Is(err, kernel.ErrNotFound) {
			t.Errorf("Execution with NUL in tenant: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCheckFindsCorruption damages a consistent store in each way Check
// knows about and expects Check to say so.
func TestCheckFindsCorruption(t *testing.T) {
	const id = "01960000-0000-7000-8000-000000000001"
	ev := func(seq uint64, typ kernel.EventType, payload string) kernel.Event {
		return kernel.Event{ExecutionID: id, Seq: seq, Type: typ, Payload: []byte(payload)}
	}
	cases := []struct {
		name    string
		corrupt func(tx *bolt.Tx) error
		want    string
	}{
		{"gap in events", func(tx *bolt.Tx) error {
			return tx.Bucket(bEvents).Delete(eventKey("t", id, 2))
		}, "gap"},
		{"missing event at the end", func(tx *bolt.Tx) error {
			return tx.Bucket(bEvents).Delete(eventKey("t", id, 4))
		}, "LastSeq is 4"},
		{"first event not created", func(tx *bolt.Tx) error {
			return put(wbucket{Bucket: tx.Bucket(bEvents)}, eventKey("t", id, 1), ev(1, kernel.EvExecutionStarted, `{}`))
		}, "first event"},
		{"event after terminal", func(tx *bolt.Tx) error {
			return put(wbucket{Bucket: tx.Bucket(bEvents)}, eventKey("t", id, 3), ev(3, kernel.EvExecutionCompleted, `{}`))
		}, "after terminal"},
		{"two terminal step events", func(tx *bolt.Tx) error {
			return put(wbucket{Bucket: tx.Bucket(bEvents)}, eventKey("t", id, 4), ev(4, kernel.EvStepFailed, `{"step_id":"s1"}`))
		}, "second terminal event"},
		{"orphan event", func(tx *bolt.Tx) error {
			return put(wbucket{Bucket: tx.Bucket(bEvents)}, eventKey("t", "nope", 1), ev(1, kernel.EvExecutionCreated, `{}`))
		}, "no such execution"},
		{"stale due entry", func(tx *bolt.Tx) error {
			return tx.Bucket(bDue).Put(timeKey(time.Unix(5, 0), "t", id), nil)
		}, "stale entry"},
		{"missing due entry", func(tx *bolt.Tx) error {
			return tx.Bucket(bDue).Delete(timeKey(time.Unix(100, 0), "t", id))
		}, "missing entry"},
		{"stale lease entry", func(tx *bolt.Tx) error {
			return tx.Bucket(bLeases).Put(timeKey(time.Unix(100, 0), "t", id), nil)
		}, "index leases: stale"},
		{"wrong tenant index", func(tx *bolt.Tx) error {
			return tx.Bucket(bExecTenant).Put([]byte(id), []byte("u"))
		}, "exec_tenant says"},
		{"dangling idem entry", func(tx *bolt.Tx) error {
			return tx.Bucket(bIdem).Put(key("t", "other-key"), []byte(id))
		}, "index idem"},
		{"stale approval expiry", func(tx *bolt.Tx) error {
			return tx.Bucket(bApprovalExp).Put(timeKey(time.Unix(1, 0), "t", "ap-x"), nil)
		}, "approval_exp"},
		{"dangling key hash", func(tx *bolt.Tx) error {
			return tx.Bucket(bAPIKeyHash).Put([]byte("h-x"), key("t", "k-x"))
		}, "apikey_hash"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openStore(t, Options{NoSync: true}, false)
			err := s.Update(t.Context(), func(tx kernel.Tx) error {
				e := &kernel.Execution{ID: id, Tenant: "t", AgentID: "a", LastSeq: 4, IdempotencyKey: "k",
					Dispatch: kernel.DispatchState{State: kernel.DispatchQueued, DueAt: time.Unix(100, 0)}}
				if err := tx.PutExecution(e); err != nil {
					return err
				}
				for _, ev := range []kernel.Event{
					ev(1, kernel.EvExecutionCreated, `{}`), ev(2, kernel.EvStepProposed, `{"step_id":"s1"}`),
					ev(3, kernel.EvStepSucceeded, `{"step_id":"s1"}`), ev(4, kernel.EvStepProposed, `{"step_id":"s2"}`),
				} {
					if err := tx.AppendEvent("t", ev); err != nil {
						return err
					}
				}
				if err := tx.PutApproval(&kernel.Approval{ID: "ap", Tenant: "t", Status: kernel.ApprovalPending, ExpiresAt: time.Unix(200, 0)}); err != nil {
					return err
				}
				return tx.PutAPIKey(&kernel.APIKey{ID: "k", Tenant: "t", Hash: "h"})
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Check(); err != nil {
				t.Fatalf("Check of a consistent store: %v", err)
			}
			if err := s.db.Update(c.corrupt); err != nil {
				t.Fatal(err)
			}
			err = s.Check()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Check after %s: %v, want an error mentioning %q", c.name, err, c.want)
			}
		})
	}
}

func TestTimeKeyOrder(t *testing.T) {
	times := []time.Time{
		{},
		time.Date(1500, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(-1, 0),
		time.Unix(0, 0),
		time.Unix(0, 1),
		time.Unix(1<<31, 5),
		time.Date(2500, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	for i := 1; i < len(times); i++ {
		a, b := putTime(nil, times[i-1]), putTime(nil, times[i])
		if string(a) > string(b) {
			t.Errorf("key of %v sorts after key of %v", times[i-1], times[i])
		}
	}
	if got := getTime(putTime(nil, time.Time{})); !got.IsZero() {
		t.Errorf("zero time decodes as %v", got)
	}
	now := time.Now()
	if got := getTime(putTime(nil, now)); !got.Equal(now) {
		t.Errorf("%v decodes as %v", now, got)
	}
}

// TestAgentCacheFollowsTheRecord: read transactions keep decoded agents,
// but a read after the record changed (or went) sees the change, and a
// caller changing what it was handed does not change what the next read
// gets.
func TestAgentCacheFollowsTheRecord(t *testing.T) {
	s := openStore(t, Options{}, true)
	ctx := context.Background()
	put := func(a kernel.Agent) {
		t.Helper()
		if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutAgent(&a) }); err != nil {
			t.Fatal(err)
		}
	}
	read := func() (*kernel.Agent, error) {
		var a *kernel.Agent
		err := s.View(ctx, func(tx kernel.ReadTx) error {
			var err error
			a, err = tx.Agent("default", "bot")
			return err
		})
		return a, err
	}
	put(kernel.Agent{Tenant: "default", ID: "bot", WebhookURL: "http://127.0.0.1:1/a", Bundle: "one"})
	for i := range 2 { // the second read is the cache's
		a, err := read()
		if err != nil || a.Bundle != "one" {
			t.Fatalf("read %d: %+v, %v", i, a, err)
		}
		a.Bundle = "changed by the caller"
	}
	put(kernel.Agent{Tenant: "default", ID: "bot", WebhookURL: "http://127.0.0.1:1/a", Bundle: "two"})
	if a, err := read(); err != nil || a.Bundle != "two" {
		t.Fatalf("after the update: %+v, %v", a, err)
	}
	if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.DeleteAgent("default", "bot") }); err != nil {
		t.Fatal(err)
	}
	if a, err := read(); !errors.Is(err, kernel.ErrNotFound) {
		t.Fatalf("after the delete: %+v, %v", a, err)
	}
}

// TestAgentCacheCopiesShareNothing: readTx.Agent hands out shallow copies
// of the cached record (recordCache.get), which is a fresh record only
// while kernel.Agent holds strings and times.
func TestAgentCacheCopiesShareNothing(t *testing.T) {
	typ := reflect.TypeFor[kernel.Agent]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type.Kind() != reflect.String && f.Type != reflect.TypeFor[time.Time]() {
			t.Errorf("kernel.Agent.%s is a %s: readTx.Agent must copy it deeply (recordCache.get copies shallowly)", f.Name, f.Type)
		}
	}
}
