package bbolt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
)

// openTxOptions keep the writer's transaction open until a test commits it
// (flush), so that what is in the file and what only in the open
// transaction is known.
var openTxOptions = func() Options {
	o := walOptions
	o.CommitInterval = time.Hour
	return o
}()

// fileCounter reads counter k of tenant t from the file's last commit,
// not from the writer's open transaction.
func fileCounter(t *testing.T, s *Store, k string) []byte {
	t.Helper()
	var v []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		v = append(v, tx.Bucket(bCounters).Get([]byte("t\x00"+k))...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func viewCounter(t *testing.T, s *Store, k string) string {
	t.Helper()
	var v []byte
	err := s.View(context.Background(), func(tx kernel.ReadTx) error {
		var err error
		v, err = tx.Counter("t", k)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(v)
}

// TestOpenTxVisibleBeforeTheFile: an Update that returned is read by View
// at once, from the writer's open transaction, while the file has it only
// once the transaction is committed; a crash before that commit gets it
// back from the log.
func TestOpenTxVisibleBeforeTheFile(t *testing.T) {
	s := openStore(t, openTxOptions, true)
	put := func(k, v string) {
		t.Helper()
		if err := s.Update(context.Background(), func(tx kernel.Tx) error { return tx.PutCounter("t", k, []byte(v)) }); err != nil {
			t.Fatal(err)
		}
	}
	put("a", "1")
	put("b", "2")
	if got := viewCounter(t, s, "a"); got != "1" {
		t.Fatalf("View after the Update: %q, want 1", got)
	}
	if got := fileCounter(t, s, "a"); got != nil {
		t.Fatalf("the file has %q before the open transaction is committed", got)
	}
	want := dumpStore(t, s)
	sameDump(t, recovered(t, crashCopy(t, s, nil)), want)
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	if got := string(fileCounter(t, s, "b")); got != "2" {
		t.Fatalf("the file after the commit: %q, want 2", got)
	}
	if st := s.Stats(); st.FileCommits == 0 {
		t.Fatal("no commit of the file counted")
	}
	put("a", "3")
	if got := viewCounter(t, s, "a"); got != "3" {
		t.Fatalf("View after a second open transaction's Update: %q, want 3", got)
	}
}

// TestOpenTxFailedFunctionKeepsTheAnswered: a function that fails rolls
// the open transaction back; the batches answered before it in the same
// transaction are applied again, and its own writes are gone, for readers,
// in the file and after a crash.
func TestOpenTxFailedFunctionKeepsTheAnswered(t *testing.T) {
	s := openStore(t, openTxOptions, true)
	ctx := context.Background()
	for i := range 5 {
		if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutCounter("t", fmt.Sprint("k", i), []byte("v")) }); err != nil {
			t.Fatal(err)
		}
	}
	errBoom := errors.New("boom")
	err := s.Update(ctx, func(tx kernel.Tx) error {
		if err := tx.PutCounter("t", "k0", []byte("overwritten")); err != nil {
			return err
		}
		if err := tx.PutCounter("t", "failed", []byte("v")); err != nil {
			return err
		}
		return errBoom
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("the failing Update: %v, want boom", err)
	}
	check := func(where string, read func(k string) string) {
		t.Helper()
		for i := range 5 {
			if got := read(fmt.Sprint("k", i)); got != "v" {
				t.Errorf("%s: k%d = %q, want v", where, i, got)
			}
		}
		if got := read("failed"); got != "" {
			t.Errorf("%s: the failed function's write is there: %q", where, got)
		}
	}
	check("View", func(k string) string { return viewCounter(t, s, k) })
	want := dumpStore(t, s)
	sameDump(t, recovered(t, crashCopy(t, s, nil)), want)
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	check("file", func(k string) string { return string(fileCounter(t, s, k)) })
	if st := s.Stats(); st.Retries != 1 {
		t.Errorf("retries %d, want 1", st.Retries)
	}
}

// TestOpenTxViewWaitsForTheBatch: a View waits while the writer runs a
// batch's functions, and then reads what they wrote (after its record is
// synced: TestOpenTxViewDuringTheSync): a reader never sees a batch half
// written, nor misses one whose Update returned.
func TestOpenTxViewWaitsForTheBatch(t *testing.T) {
	s := openStore(t, openTxOptions, true)
	ctx := context.Background()
	if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutCounter("t", "first", []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	running, release := make(chan struct{}), make(chan struct{})
	updated := make(chan error, 1)
	go func() {
		updated <- s.Update(ctx, func(tx kernel.Tx) error {
			if err := tx.PutCounter("t", "second", []byte("v")); err != nil {
				return err
			}
			close(running)
			<-release
			return nil
		})
	}()
	<-running
	read := make(chan string, 1)
	go func() {
		var v []byte
		_ = s.View(ctx, func(tx kernel.ReadTx) error {
			v, _ = tx.Counter("t", "second")
			return nil
		})
		read <- string(v)
	}()
	// The View cannot finish while the batch holds the writer's lock: a
	// View that did would have read the open transaction mid-batch.
	select {
	case v := <-read:
		t.Fatalf("a View finished during the batch, reading %q", v)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-updated; err != nil {
		t.Fatal(err)
	}
	if v := <-read; v != "v" {
		t.Fatalf("the View after the batch read %q, want v", v)
	}
}

// TestOpenTxCommittedWhenIdle: without further Updates, the open
// transaction is committed to the file once CommitInterval passed.
func TestOpenTxCommittedWhenIdle(t *testing.T) {
	opts := walOptions
	opts.CommitInterval = 5 * time.Millisecond
	s := openStore(t, opts, true)
	if err := s.Update(context.Background(), func(tx kernel.Tx) error { return tx.PutCounter("t", "k", []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for string(fileCounter(t, s, "k")) != "v" {
		if time.Now().After(deadline) {
			t.Fatal("the open transaction was not committed to the file within 10 s of going idle")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOpenTxOff: a negative CommitInterval commits every batch to the
// file, as before the open transaction.
func TestOpenTxOff(t *testing.T) {
	opts := walOptions
	opts.CommitInterval = -1
	s := openStore(t, opts, true)
	if err := s.Update(context.Background(), func(tx kernel.Tx) error { return tx.PutCounter("t", "k", []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	if got := string(fileCounter(t, s, "k")); got != "v" {
		t.Fatalf("the file after the Update: %q, want v", got)
	}
}

// TestOpenTxConcurrentViews: Views read the open transaction together
// while Updates run (the race detector checks that they only read it).
func TestOpenTxConcurrentViews(t *testing.T) {
	s := openStore(t, walOptions, true)
	ctx := context.Background()
	const writers, readers, n = 4, 4, 50
	errc := make(chan error, writers+readers)
	for w := range writers {
		go func() {
			for i := range n {
				k := fmt.Sprintf("w%d-%d", w, i)
				err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutCounter("t", k, []byte(k)) })
				if err != nil {
					errc <- err
					return
				}
				if got := viewCounterErr(s, k); got != k {
					errc <- fmt.Errorf("View after Update %s: %q", k, got)
					return
				}
			}
			errc <- nil
		}()
	}
	for range readers {
		go func() {
			for range n {
				err := s.View(ctx, func(tx kernel.ReadTx) error {
					_, err := tx.ListTenants()
					if err == nil {
						_, err = tx.Counter("t", "w0-0")
					}
					return err
				})
				if err != nil && !strings.Contains(err.Error(), "not found") {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range writers + readers {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

func viewCounterErr(s *Store, k string) string {
	var v []byte
	_ = s.View(context.Background(), func(tx kernel.ReadTx) error {
		v, _ = tx.Counter("t", k)
		return nil
	})
	return string(v)
}

// TestOpenTxViewDuringTheSync: while a batch's record is being synced, a
// View reads the batch but returns only once the sync is done: it is
// neither held up by the sync before it reads, nor able to hand out what
// a crash could still take back.
func TestOpenTxViewDuringTheSync(t *testing.T) {
	s := openStore(t, openTxOptions, true)
	ctx := context.Background()
	release, updated := updateHeldInSync(t, s, "k", nil)
	read, returned := make(chan string, 1), make(chan string, 1)
	go func() {
		var v []byte
		_ = s.View(ctx, func(tx kernel.ReadTx) error {
			v, _ = tx.Counter("t", "k")
			read <- string(v)
			return nil
		})
		returned <- string(v)
	}()
	if v := <-read; v != "v" {
		t.Fatalf("a View during the sync read %q, want the batch's v", v)
	}
	select {
	case v := <-returned:
		t.Fatalf("the View returned %q before the batch's record was synced", v)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if err := <-updated; err != nil {
		t.Fatal(err)
	}
	if v := <-returned; v != "v" {
		t.Fatalf("the View returned %q after the sync, want v", v)
	}
}

// updateHeldInSync starts an Update that puts counter k of tenant t to
// "v", and holds its record's sync: the writer runs during (if any), then
// waits until release is closed. It returns once the batch is in the open
// transaction and its record not yet synced; updated gets the Update's
// result. Later batches sync at once. A test that ends without calling
// release has it called first by its cleanup, so that the store closes
// and the test fails rather than hangs.
func updateHeldInSync(t *testing.T, s *Store, k string, during func()) (release func(), updated <-chan error) {
	t.Helper()
	syncing, rel := make(chan struct{}), make(chan struct{})
	release = sync.OnceFunc(func() { close(rel) })
	testHookSync = func() {
		testHookSync = nil
		if during != nil {
			during()
		}
		close(syncing)
		<-rel
	}
	t.Cleanup(func() {
		release()
		testHookSync = nil
	})
	up := make(chan error, 1)
	go func() {
		up <- s.Update(context.Background(), func(tx kernel.Tx) error { return tx.PutCounter("t", k, []byte("v")) })
	}()
	<-syncing
	return release, up
}
