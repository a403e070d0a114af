package bbolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestWritesRefusedOnceTheFileIsReplacedNoWAL: without a log (serve
// --no-wal) the writer itself checks, at most every fileCheckEvery before
// a write, that the path still names its file. Before, every write to the
// unlinked file was answered. It failed before the fix.
func TestWritesRefusedOnceTheFileIsReplacedNoWAL(t *testing.T) {
	defer func(d time.Duration) { fileCheckEvery = d }(fileCheckEvery)
	fileCheckEvery = 0 // every write checks
	for _, how := range []string{"renamed over", "removed"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "wicket.db")
			s, err := Open(path, Options{})
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
				if err := os.WriteFile(filepath.Join(dir, "other"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(filepath.Join(dir, "other"), path); err != nil {
					t.Fatal(err)
				}
			case "removed":
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			}
			for i := 1; i <= 2; i++ {
				if err := put(i); err == nil || !strings.Contains(err.Error(), "no longer the file") {
					t.Fatalf("write %d after the file was %s: %v, want refused", i, how, err)
				}
			}
		})
	}
}
