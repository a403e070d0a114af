package bbolt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestWALWriteFailureFailsTheStore: when the log cannot be written (the
// disk is full), the Update whose record failed gets an error, so does
// every later one (the store is failed: only a restart knows what is on
// disk), reads go on, Close keeps the log, and the next Open brings back
// every write acknowledged before the failure and not the failed one.
func TestWALWriteFailureFailsTheStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	opts := walOptions
	opts.walSegment = 1 << 20 // the failing record fits: no new segment
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	put := func(k string) error {
		return s.Update(ctx, func(tx kernel.Tx) error { return tx.PutCounter("t", k, []byte(k)) })
	}
	for i := range 20 {
		if err := put(fmt.Sprint("acked", i)); err != nil {
			t.Fatal(err)
		}
	}
	// The active segment's descriptor now writes to /dev/full.
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	if err := syscall.Dup3(int(full.Fd()), int(s.wal.log.f.Fd()), 0); err != nil {
		t.Fatal(err)
	}
	full.Close()
	err = put("lost")
	if err == nil || !strings.Contains(err.Error(), "wal: write record") || !strings.Contains(err.Error(), ".wal: no space left") {
		t.Fatalf("Update with the log failing: %v, want the log's error", err)
	}
	if err := put("after"); err == nil || !strings.Contains(err.Error(), "store failed") {
		t.Fatalf("Update after the failure: %v, want the store failed", err)
	}
	if err := s.View(ctx, func(tx kernel.ReadTx) error {
		v, err := tx.Counter("t", "acked19")
		if err == nil && string(v) != "acked19" {
			err = fmt.Errorf("acked19 reads %q", v)
		}
		return err
	}); err != nil {
		t.Fatalf("View after the failure: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(WALDir(path)); err != nil {
		t.Fatalf("Close of a failed store removed its log: %v", err)
	}
	s2, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	err = s2.View(ctx, func(tx kernel.ReadTx) error {
		for i := range 20 {
			k := fmt.Sprint("acked", i)
			if v, err := tx.Counter("t", k); err != nil || string(v) != k {
				return fmt.Errorf("acknowledged write %s: %q %v", k, v, err)
			}
		}
		for _, k := range []string{"lost", "after"} {
			if v, err := tx.Counter("t", k); err != nil || v != nil {
				return fmt.Errorf("unacknowledged write %s: %q %v", k, v, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestWALViewOfAFailedSync: a View that read a batch while its record was
// being written gets the store's failure, not the batch, when the write
// fails; the batch is gone for later readers and after a restart.
func TestWALViewOfAFailedSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	opts := walOptions
	opts.walSegment = 1 << 20 // the failing record fits: no new segment
	opts.CommitInterval = time.Hour
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutCounter("t", "acked", []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer full.Close()
	release, updated := updateHeldInSync(t, s, "lost", func() {
		// The active segment's descriptor now writes to /dev/full.
		if err := syscall.Dup3(int(full.Fd()), int(s.wal.log.f.Fd()), 0); err != nil {
			panic(err)
		}
	})
	read, returned := make(chan string, 1), make(chan error, 1)
	go func() {
		returned <- s.View(ctx, func(tx kernel.ReadTx) error {
			v, _ := tx.Counter("t", "lost")
			read <- string(v)
			return nil
		})
	}()
	if v := <-read; v != "v" {
		t.Fatalf("a View during the write read %q, want the batch's v", v)
	}
	release()
	if err := <-updated; err == nil {
		t.Fatal("the Update whose record failed returned nil")
	}
	if err := <-returned; err == nil || !strings.Contains(err.Error(), "store failed") {
		t.Fatalf("the View that read the failed batch: %v, want the store's failure", err)
	}
	err = s.View(ctx, func(tx kernel.ReadTx) error {
		if v, _ := tx.Counter("t", "lost"); v != nil {
			return fmt.Errorf("the failed batch is readable: %q", v)
		}
		if v, err := tx.Counter("t", "acked"); err != nil || string(v) != "v" {
			return fmt.Errorf("the batch acknowledged before: %q, %v", v, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
