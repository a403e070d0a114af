package bbolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// openedForWriting counts this process's descriptors open read-write on
// path (bbolt's Open opens its file read-write before it waits for the
// lock; checkLog's probe of the lock opens it read-only).
func openedForWriting(t *testing.T, path string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err != nil || target != path {
			continue
		}
		info, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				if flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64); err == nil && flags&uint64(os.O_RDWR|os.O_WRONLY|os.O_RDONLY) == uint64(os.O_RDWR) {
					n++
				}
			}
		}
	}
	return n
}

// TestWALOpenWhileTheKernelDies: a kernel is started on a store whose
// kernel still holds it (a supervisor restarting it while the old
// process is being killed): its Open finds the file locked, so it cannot
// apply the log, and waits for the lock. The old kernel then dies without
// stopping cleanly, its log beside the file. The new Open must apply that
// log before using the file, with or without a log of its own: not fail,
// and not leave the stale log for a later Open to take the file back to
// its checkpoint.
func TestWALOpenWhileTheKernelDies(t *testing.T) {
	for _, wal := range []bool{true, false} {
		t.Run(fmt.Sprintf("wal %v", wal), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "wicket.db")
			old, err := Open(path, walOptions)
			if err != nil {
				t.Fatal(err)
			}
			walWorkload(t, old, 0, 2)
			if err := old.forceCheckpoint(); err != nil {
				t.Fatal(err)
			}
			walWorkload(t, old, 2, 2) // in the log alone
			want := dumpStore(t, old)
			before := openedForWriting(t, path)

			type result struct {
				s   *Store
				err error
			}
			opened := make(chan result, 1)
			go func() {
				s, err := Open(path, Options{WAL: wal, Timeout: time.Minute})
				opened <- result{s, err}
			}()
			// The new Open is past its look at the log once bbolt has
			// opened the file and waits for the lock.
			deadline := time.Now().Add(30 * time.Second)
			for openedForWriting(t, path) == before {
				if time.Now().After(deadline) {
					t.Fatal("the second Open never opened the file")
				}
				time.Sleep(time.Millisecond)
			}
			// The old kernel dies: its log stays, its lock goes.
			old.fail(errors.New("killed"))
			if err := old.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(WALDir(path)); err != nil {
				t.Fatalf("the dead kernel's log: %v", err)
			}
			r := <-opened
			if r.err != nil {
				t.Fatalf("Open after the kernel holding the file died: %v", r.err)
			}
			sameDump(t, dumpStore(t, r.s), want)
			err = r.s.Update(context.Background(), func(tx kernel.Tx) error { return tx.PutCounter("t", "after", []byte("v")) })
			if err != nil {
				t.Fatal(err)
			}
			want = dumpStore(t, r.s)
			if err := r.s.Close(); err != nil {
				t.Fatal(err)
			}
			sameDump(t, recovered(t, path), want)
		})
	}
}

// TestWALOpenAfterAnotherRecovered: two kernels started on a store a
// crash left a log beside (a supervisor's double start). The first
// restores the checkpoint's meta page and, before bbolt takes the file's
// lock for it, the second does the same, takes the lock first, applies
// the log, works (checkpoints included) and dies without stopping
// cleanly. The first then gets the lock with the checkpoint it read,
// which is no longer the log's: it must recover from the log as it is
// now, not refuse the file as damaged ("opened at transaction N, its
// checkpoint is M").
func TestWALOpenAfterAnotherRecovered(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	old, err := Open(path, walOptions)
	if err != nil {
		t.Fatal(err)
	}
	walWorkload(t, old, 0, 2)
	if err := old.forceCheckpoint(); err != nil {
		t.Fatal(err)
	}
	walWorkload(t, old, 2, 2)
	old.fail(errors.New("killed"))
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	atHook, release := make(chan struct{}), make(chan struct{})
	first := true
	testHookBeforeLock = func() {
		if first {
			first = false
			close(atHook)
			<-release
		}
	}
	defer func() { testHookBeforeLock = nil }()
	type result struct {
		s   *Store
		err error
	}
	opened := make(chan result, 1)
	go func() {
		s, err := Open(path, Options{WAL: true, Timeout: time.Minute})
		opened <- result{s, err}
	}()
	<-atHook // the first has restored the checkpoint, and waits to lock

	second, err := Open(path, walOptions)
	if err != nil {
		t.Fatal(err)
	}
	walWorkload(t, second, 4, 2)
	if err := second.forceCheckpoint(); err != nil {
		t.Fatal(err)
	}
	walWorkload(t, second, 6, 2)
	want := dumpStore(t, second)
	second.fail(errors.New("killed"))
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	close(release)

	r := <-opened
	if r.err != nil {
		t.Fatalf("Open after another kernel recovered the log and died: %v", r.err)
	}
	sameDump(t, dumpStore(t, r.s), want)
	if err := r.s.Close(); err != nil {
		t.Fatal(err)
	}
	sameDump(t, recovered(t, path), want)
}
