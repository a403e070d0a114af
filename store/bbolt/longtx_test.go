package bbolt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestLongTxFlushWhileTheLogStops: Backup, Export and Check (flush) run
// while the writer drops the log past its reserve (stopWAL in afterCommit):
// flush must not read the writer's s.wal unsynchronized (go test -race).
func TestLongTxFlushWhileTheLogStops(t *testing.T) {
	opts := walOptions
	opts.walMmap = 1 << 20
	opts.CommitInterval = time.Millisecond
	s := openStore(t, opts, false)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			// What Backup, Export and Check do first.
			if err := s.flush(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for n := 0; n < 400; n += 10 {
		walWorkload(t, s, n, 10)
		if _, err := os.Stat(WALDir(s.path)); errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	close(stop)
	wg.Wait()
	if _, err := os.Stat(WALDir(s.path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("log still there past the reserve: %v", err)
	}
}

// TestLongTxFailedStoreDoesNotSpin: a store that failed (here: as the
// checkpointer fails it, in the middle of a batch) keeps its open
// transaction readable, and its writer waits: it does not wake up again
// and again to try a commit it will refuse.
func TestLongTxFailedStoreDoesNotSpin(t *testing.T) {
	opts := walOptions
	opts.CommitInterval = time.Millisecond
	s := openStore(t, opts, false)
	ctx := context.Background()
	err := s.Update(ctx, func(tx kernel.Tx) error {
		s.fail(errors.New("injected"))
		return tx.PutCounter("t", "k", []byte("v"))
	})
	if err != nil {
		t.Fatalf("Update whose record is in the log: %v", err)
	}
	before := s.idleWakes.Load()
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) && s.idleWakes.Load()-before < 50 {
		time.Sleep(time.Millisecond)
	}
	if n := s.idleWakes.Load() - before; n > 3 {
		t.Fatalf("the writer of a failed store woke %d times to commit", n)
	}
	if err := s.View(ctx, func(tx kernel.ReadTx) error {
		v, err := tx.Counter("t", "k")
		if err == nil && string(v) != "v" {
			err = fmt.Errorf("k reads %q", v)
		}
		return err
	}); err != nil {
		t.Fatalf("View of the failed store: %v", err)
	}
}

// TestLongTxReopenFailureFailsViews: when the writer cannot rebuild its
// open transaction after a failed function, the batches it answered are
// no longer readable from it, and not yet in the file: View must fail
// rather than read the file without them.
func TestLongTxReopenFailureFailsViews(t *testing.T) {
	opts := walOptions
	opts.CommitInterval = time.Hour
	s := openStore(t, opts, false)
	ctx := context.Background()
	if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutCounter("t", "acked", []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	bad := &walBatch{}
	bad.reset()
	bad.put([]byte("no such bucket"), []byte("k"), []byte("v"))
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx kernel.Tx) error {
		// The writer's, under s.mu: a kept record reopen cannot apply.
		s.pending = append(s.pending, bad.buf[walHeaderSize:])
		return boom
	})
	if err == nil {
		t.Fatal("Update succeeded")
	}
	err = s.View(ctx, func(tx kernel.ReadTx) error {
		v, err := tx.Counter("t", "acked")
		if err == nil && string(v) != "v" {
			return fmt.Errorf("acknowledged write reads %q", v)
		}
		return err
	})
	if err == nil {
		return // still readable: fine
	}
	if !errors.Is(err, boom) && s.failure.Load() != nil && err.Error() == (*s.failure.Load()).Error() {
		return // the store's failure: fine
	}
	t.Fatalf("View after the open transaction was lost: %v", err)
}

// TestLongTxReadYourWritesStress: several writers and readers on the same
// keys, with the open transaction committed every millisecond, flushed by
// Backup and checkpointed meanwhile: every value an Update wrote is seen
// by the View that follows it (or a later one), and -race finds nothing.
func TestLongTxReadYourWritesStress(t *testing.T) {
	opts := walOptions
	opts.CommitInterval = time.Millisecond
	opts.CheckpointInterval = 5 * time.Millisecond
	s := openStore(t, opts, true)
	ctx := context.Background()
	const writers, rounds = 4, 150
	var wg sync.WaitGroup
	var failed atomic.Bool
	stop := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("01960000-0000-7000-8000-%012d", w)
			seq := uint64(0)
			for i := 1; i <= rounds && !failed.Load(); i++ {
				val := fmt.Sprint(i)
				err := s.Update(ctx, func(tx kernel.Tx) error {
					if err := tx.PutCounter("t", "shared", []byte(val)); err != nil {
						return err
					}
					if i%7 == 0 {
						return errors.New("refused") // rolls the open transaction back
					}
					if err := tx.PutCounter("t", fmt.Sprint("w", w), []byte(val)); err != nil {
						return err
					}
					typ := kernel.EvStepProposed
					if seq == 0 {
						typ = kernel.EvExecutionCreated
					}
					if err := tx.AppendEvent("t", kernel.Event{ExecutionID: id, Seq: seq + 1, Type: typ, Payload: []byte(`{}`)}); err != nil {
						return err
					}
					return tx.PutExecution(&kernel.Execution{Tenant: "t", ID: id, AgentID: "a", Status: kernel.ExecRunning, LastSeq: seq + 1})
				})
				if i%7 == 0 {
					if err == nil {
						t.Error("refused Update succeeded")
						failed.Store(true)
					}
					continue
				}
				if err != nil {
					t.Error(err)
					failed.Store(true)
					return
				}
				seq++
				err = s.View(ctx, func(tx kernel.ReadTx) error {
					v, err := tx.Counter("t", fmt.Sprint("w", w))
					if err != nil {
						return err
					}
					if string(v) != val {
						return fmt.Errorf("writer %d wrote %s, reads %q", w, val, v)
					}
					evs, err := tx.Events("t", id, seq-1, 0)
					if err != nil {
						return err
					}
					if len(evs) != 1 || evs[0].Seq != seq {
						return fmt.Errorf("writer %d: event %d: read %d events", w, seq, len(evs))
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					failed.Store(true)
					return
				}
			}
		}()
	}
	var side sync.WaitGroup
	side.Add(3)
	go func() { // readers scanning the same buckets
		defer side.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = s.View(ctx, func(tx kernel.ReadTx) error {
				for w := range writers {
					id := fmt.Sprintf("01960000-0000-7000-8000-%012d", w)
					if _, err := tx.Events("t", id, 0, 0); err != nil {
						t.Error(err)
					}
				}
				_, err := tx.Counter("t", "shared")
				return err
			})
		}
	}()
	go func() {
		defer side.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Backup(ctx, io.Discard); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer side.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.forceCheckpoint(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	side.Wait()
	want := dumpStore(t, s)
	sameDump(t, recovered(t, crashCopy(t, s, nil)), want)
}
