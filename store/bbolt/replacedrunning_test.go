package bbolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel"
)

// TestWritesRefusedOnceTheFileIsReplaced: a store file renamed over (a
// backup restored the documented way, but without stopping the kernel) or
// removed while the kernel runs is no longer where its writes go: the
// kernel kept writing to the unlinked file, answering every write, and
// the next start found none of them. The next checkpoint now notices and
// fails the store, so no further write is answered. It failed before the
// fix: the Update after the checkpoint succeeded.
func TestWritesRefusedOnceTheFileIsReplaced(t *testing.T) {
	for _, how := range []string{"renamed over", "removed"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "wicket.db")
			s, err := Open(path, walOptions)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			put := func(i int) error {
				return s.Update(context.Background(), func(tx kernel.Tx) error {
					return tx.PutCounter("t", fmt.Sprintf("k%d", i), []byte("v"))
				})
			}
			if err := put(0); err != nil {
				t.Fatal(err)
			}
			switch how {
			case "renamed over":
				backup := filepath.Join(dir, "backup.db")
				b, err := Open(backup, Options{})
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(backup, path); err != nil {
					t.Fatal(err)
				}
			case "removed":
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			}
			if err := put(1); err != nil { // answered before any checkpoint could look
				t.Fatal(err)
			}
			if err := s.forceCheckpoint(); err == nil || !strings.Contains(err.Error(), "no longer the file") {
				t.Errorf("checkpoint after the file was %s: %v", how, err)
			}
			err = put(2)
			if err == nil || !strings.Contains(err.Error(), "no longer the file") {
				t.Fatalf("a write after the file was %s: %v, want refused", how, err)
			}
			if errors.Is(err, ErrLocked) {
				t.Fatal(err)
			}
		})
	}
}
