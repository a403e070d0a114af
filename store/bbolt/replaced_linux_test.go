package bbolt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestOpenWhileTheFileIsReplaced: a kernel started while `wicket store
// compact` runs opens the file, finds it locked and waits for the lock;
// compact renames its compacted copy over the file and lets the lock of
// the old one go. The Open must use the file that now has the name, not
// the old one it opened (unlinked: every write made to it would be lost,
// a clean stop included), nor fail because the log's checkpoint reads
// the new file's meta page.
func TestOpenWhileTheFileIsReplaced(t *testing.T) {
	for _, wal := range []bool{true, false} {
		t.Run(fmt.Sprintf("wal %v", wal), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "wicket.db")
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 20 {
				if err := s.Update(context.Background(), func(tx kernel.Tx) error {
					return tx.PutCounter("t", fmt.Sprintf("before-%d", i), []byte("v"))
				}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			compacted := filepath.Join(dir, "compacted.db")
			if _, err := Compact(path, compacted, time.Second); err != nil {
				t.Fatal(err)
			}

			// Compact holds the lock of the file it copies until its copy
			// has the file's name.
			release, held, err := lockFree(path)
			if err != nil || held {
				t.Fatalf("lock: %v (held %v)", err, held)
			}
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
			deadline := time.Now().Add(30 * time.Second)
			for openedForWriting(t, path) == before {
				if time.Now().After(deadline) {
					release()
					t.Fatal("Open never opened the file")
				}
				time.Sleep(time.Millisecond)
			}
			if err := os.Rename(compacted, path); err != nil {
				t.Fatal(err)
			}
			release()

			r := <-opened
			if r.err != nil {
				t.Fatalf("Open of a file replaced while it waited for the lock: %v", r.err)
			}
			if err := r.s.Update(context.Background(), func(tx kernel.Tx) error { return tx.PutCounter("t", "after", []byte("v")) }); err != nil {
				t.Fatal(err)
			}
			if err := r.s.Close(); err != nil {
				t.Fatal(err)
			}
			again, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer again.Close()
			for _, k := range []string{"before-0", "before-19", "after"} {
				err := again.View(context.Background(), func(tx kernel.ReadTx) error {
					v, err := tx.Counter("t", k)
					if err == nil && string(v) != "v" {
						err = fmt.Errorf("counter %s: %q", k, v)
					}
					return err
				})
				if err != nil {
					t.Errorf("after the reopen, counter %s: %v", k, err)
				}
			}
		})
	}
}
