package bbolt

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wicket-run/wicket/kernel"
)

// TestWritebackAfterTheFileCommit: each commit of the writer's open
// transaction to the file has the checkpointer start writing the file's
// pages back (sync_file_range), and the OS takes the request on the
// descriptor the store keeps for it.
func TestWritebackAfterTheFileCommit(t *testing.T) {
	s, started := openWritebackStore(t)
	for i := range 3 {
		err := s.Update(context.Background(), func(tx kernel.Tx) error {
			return tx.PutCounter("t", "k", []byte(strconv.Itoa(i)))
		})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-started:
			t.Fatalf("a writeback before the file commit %d (%v)", i, err)
		default:
		}
		if err := s.flush(); err != nil {
			t.Fatal(err)
		}
		waitWriteback(t, started, "file commit "+strconv.Itoa(i))
	}
}

// openWritebackStore opens a store whose open transaction is committed
// to the file only when a test flushes it; started gets the result of
// each writeback the checkpointer starts.
func openWritebackStore(t *testing.T) (s *Store, started <-chan error) {
	ch := make(chan error, 8)
	opts := openTxOptions
	opts.onWriteback = func(err error) {
		select {
		case ch <- err:
		default:
		}
	}
	return openStore(t, opts, true), ch
}

// waitWriteback fails the test unless a writeback starts, without error,
// after what.
func waitWriteback(t *testing.T, started <-chan error, what string) {
	t.Helper()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("writeback after %s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no writeback started after %s", what)
	}
}

// TestStartWritebackError: a descriptor the OS refuses is an error that
// names the call and the file.
func TestStartWritebackError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := startWriteback(f); err != nil {
		t.Fatalf("on an open file: %v", err)
	}
	f.Close()
	err = startWriteback(f)
	if err == nil || !strings.Contains(err.Error(), "sync_file_range") || !strings.Contains(err.Error(), p) {
		t.Fatalf("on a closed file: %v, want an error naming sync_file_range and %s", err, p)
	}
}

// dirtyPages returns how many of f's pages in the page cache are dirty
// (cachestat, Linux 6.5+), skipping the test where that cannot be known.
func dirtyPages(t *testing.T, fd uintptr) uint64 {
	t.Helper()
	var st unix.Cachestat_t
	err := unix.Cachestat(uint(fd), &unix.CachestatRange{}, &st, 0)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		t.Skip("no cachestat:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return st.Dirty
}

// TestWritebackLeavesNoDirtyPage: after a commit of the open transaction,
// the file's dirty pages are sent to the disk at once (not 30 s later by
// the kernel's flusher, nor at the next checkpoint): the hint does what
// it is for, on the descriptor the store keeps.
func TestWritebackLeavesNoDirtyPage(t *testing.T) {
	s, started := openWritebackStore(t)
	var fs unix.Statfs_t
	if err := unix.Statfs(s.path, &fs); err != nil || fs.Type == unix.TMPFS_MAGIC {
		t.Skip("no writeback on this file system")
	}
	for round := range 3 {
		for i := range 200 {
			err := s.Update(context.Background(), func(tx kernel.Tx) error {
				return tx.PutCounter("t", strconv.Itoa(round*1000+i), []byte(strings.Repeat("x", 2000)))
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := s.flush(); err != nil {
			t.Fatal(err)
		}
		fd := s.wal.metaFile.Fd() // the test runs between the writer's commits
		waitWriteback(t, started, "round "+strconv.Itoa(round))
		if n := dirtyPages(t, fd); n != 0 {
			t.Fatalf("round %d: %d dirty pages left after the writeback", round, n)
		}
	}
}

// TestWritebackHoldsNeitherTheWriterNorACheckpoint: while the checkpointer
// is starting a writeback, the writer hands it a checkpoint without
// waiting, and a Close meanwhile runs that checkpoint (not dropping it
// from the job channel's buffer) before it closes the file.
func TestWritebackHoldsNeitherTheWriterNorACheckpoint(t *testing.T) {
	entered := make(chan struct{}, 16)
	release := make(chan struct{})
	var released atomic.Bool
	unblock := func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}
	defer unblock()
	var ckpts atomic.Int32
	opts := openTxOptions
	opts.CheckpointInterval = time.Nanosecond
	opts.onWriteback = func(error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
	}
	opts.onCheckpoint = func(string) { ckpts.Add(1) }
	path := filepath.Join(t.TempDir(), "wicket.db")
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	within := func(what string, f func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(5 * time.Second):
			unblock()
			t.Fatalf("%s: still waiting after 5 s", what)
		}
	}
	commit := func(i int) {
		t.Helper()
		within("commit "+strconv.Itoa(i), func() error {
			err := s.Update(context.Background(), func(tx kernel.Tx) error {
				return tx.PutCounter("t", "k"+strconv.Itoa(i), []byte("v"))
			})
			if err != nil {
				return err
			}
			return s.flush() // a file commit: a hint and a checkpoint due
		})
	}
	commit(0)
	select {
	case <-entered: // the checkpointer is now held in a writeback
	case <-time.After(5 * time.Second):
		t.Fatal("no writeback")
	}
	// Either the first checkpoint is still in the job channel, or it ran
	// and this commit's is handed over: the writer must not wait for the
	// checkpointer either way.
	commit(1)
	before := ckpts.Load()
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while the checkpointer was held", err)
	case <-time.After(100 * time.Millisecond):
	}
	unblock()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waiting: a checkpoint's read transaction left open?")
	}
	if got := ckpts.Load(); got != before+1 {
		t.Fatalf("%d checkpoints made after Close began, want the 1 in the job channel", got-before)
	}
	s, err = Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 2 {
		var v []byte
		err := s.View(context.Background(), func(tx kernel.ReadTx) error {
			var err error
			v, err = tx.Counter("t", "k"+strconv.Itoa(i))
			return err
		})
		if err != nil || string(v) != "v" {
			t.Fatalf("k%d after reopen: %q, %v", i, v, err)
		}
	}
}

// TestWritebackAcrossTheLogsEnd: hints pending while the writer drops the
// log past its reserve (afterCommit -> stopWAL) never reach a closed
// descriptor (startWriteback would fail with EBADF) and never hold the
// writer.
func TestWritebackAcrossTheLogsEnd(t *testing.T) {
	var calls, failures atomic.Int64
	opts := walOptions
	opts.walMmap = 1 << 20
	opts.CommitInterval = time.Millisecond
	opts.CheckpointInterval = time.Millisecond
	opts.onWriteback = func(err error) {
		calls.Add(1)
		if err != nil {
			failures.Add(1)
			t.Error(err)
		}
		time.Sleep(200 * time.Microsecond) // hints pile up behind this one
	}
	s := openStore(t, opts, true)
	for i := 0; ; i++ {
		if _, err := os.Stat(WALDir(s.path)); os.IsNotExist(err) {
			break
		}
		if i == 2000 {
			t.Fatal("the log never stopped")
		}
		err := s.Update(context.Background(), func(tx kernel.Tx) error {
			return tx.PutCounter("t", "pad"+strconv.Itoa(i), make([]byte, 2048))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() == 0 {
		t.Fatal("no writeback before the log stopped")
	}
	t.Logf("%d writebacks, %d failed", calls.Load(), failures.Load())
}
