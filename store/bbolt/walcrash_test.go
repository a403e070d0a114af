package bbolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/wicket-run/wicket/kernel"
)

// errCrash is what walRemove returns once a test's crash has happened.
var errCrash = errors.New("crashed")

// crashRemovingAfter has the log's removal stop after n files, as a crash
// would, until the returned function is called.
func crashRemovingAfter(n int) (restore func()) {
	removed := 0
	walRemove = func(name string) error {
		if removed == n {
			return errCrash
		}
		removed++
		return os.Remove(name)
	}
	return func() { walRemove = os.Remove }
}

// TestWALCrashWhileRemovingTheLog: a log is removed once the file holds
// all of it, synced: by a recovery after its replay, and by Close (and
// by a store dropping its log past the reserve). A crash part way leaves
// some of the log's files and not others. Whatever it leaves, the next
// Open must bring back every commit: not take the file back to the
// checkpoint without the records after it.
func TestWALCrashWhileRemovingTheLog(t *testing.T) {
	s := openStore(t, walOptions, false)
	walWorkload(t, s, 0, 4)
	if err := s.forceCheckpoint(); err != nil {
		t.Fatal(err)
	}
	walWorkload(t, s, 4, 4) // after the checkpoint: in the log alone
	want := dump(t, s.db)
	segs, err := segments(WALDir(s.path))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments %v %v", segs, err)
	}
	ctx := context.Background()
	// n files removed, then the crash: every segment and the checkpoint
	// (n == files: the directory itself is left).
	files := len(segs) + 1
	for n := 0; n <= files; n++ {
		t.Run(fmt.Sprintf("recovery/after %d", n), func(t *testing.T) {
			path := crashCopy(t, s, nil)
			restore := crashRemovingAfter(n)
			r, err := Open(path, Options{})
			restore()
			if n < files {
				if !errors.Is(err, errCrash) {
					t.Fatalf("Open with the removal crashing: %v", err)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			sameDump(t, recovered(t, path), want)
		})
	}
	// Close, of a store recovered with a log, which it fills.
	closeFiles := -1
	for n := 0; closeFiles < 0 || n <= closeFiles; n++ {
		t.Run(fmt.Sprintf("Close/after %d", n), func(t *testing.T) {
			r, err := Open(crashCopy(t, s, nil), walOptions)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 100 {
				err := r.Update(ctx, func(tx kernel.Tx) error { return tx.PutCounter("t", fmt.Sprint("more", i), make([]byte, 500)) })
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := r.waitCheckpoint(); err != nil {
				t.Fatal(err)
			}
			want := dump(t, r.db)
			if closeFiles < 0 {
				segs, err := segments(WALDir(r.path))
				if err != nil || len(segs) == 0 {
					t.Fatalf("segments %v %v", segs, err)
				}
				closeFiles = len(segs) + 1
			}
			restore := crashRemovingAfter(n)
			err = r.Close()
			restore()
			if (n < closeFiles) != errors.Is(err, errCrash) {
				t.Fatalf("Close with the removal crashing after %d of %d files: %v", n, closeFiles, err)
			}
			sameDump(t, recovered(t, r.path), want)
		})
		if closeFiles < 0 {
			return // the first run failed before counting the files
		}
	}
}
