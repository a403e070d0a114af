package bbolt

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestCompactAfterAKilledCompact: a compaction killed before its rename
// leaves its copy, half written, beside the store. The next compaction
// goes ahead (it refused: "already exists (remove it)"), and keeps
// every record; a copy whose lock is held is a compaction running, which
// a second one leaves alone.
func TestCompactAfterAKilledCompact(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := putExecution(t.Context(), s, "t", "keep"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	left := path + ".compact"
	if err := os.WriteFile(left, whole[:len(whole)/2], FileMode); err != nil {
		t.Fatal(err)
	}

	if runtime.GOOS != "windows" {
		// A compaction running: its copy's lock is held.
		release, held, err := lockFree(left)
		if err != nil || held {
			t.Fatalf("lock: %v (held %v)", err, held)
		}
		_, err = Compact(path, "", time.Second)
		release()
		if err == nil || !strings.Contains(err.Error(), "another compaction") {
			t.Fatalf("Compact beside a compaction running: %v", err)
		}
		if _, err := os.Stat(left); err != nil {
			t.Fatalf("the running compaction's copy: %v", err)
		}
	}

	if _, err := Compact(path, "", time.Second); err != nil {
		t.Fatalf("Compact after a killed one: %v", err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("the copy after the compaction: %v", err)
	}
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	if err := s.View(context.Background(), func(tx kernel.ReadTx) error {
		_, err := tx.Execution("t", "keep")
		return err
	}); err != nil {
		t.Fatal(err)
	}
}
