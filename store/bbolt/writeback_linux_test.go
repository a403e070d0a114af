package bbolt

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestWritebackAfterTheFileCommit: each commit of the writer's open
// transaction to the file has the checkpointer start writing the file's
// pages back (sync_file_range), and the OS takes the request on the
// descriptor the store keeps for it.
func TestWritebackAfterTheFileCommit(t *testing.T) {
	started := make(chan error, 8)
	opts := openTxOptions
	opts.onWriteback = func(err error) {
		select {
		case started <- err:
		default:
		}
	}
	s := openStore(t, opts, true)
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
		select {
		case err := <-started:
			if err != nil {
				t.Fatalf("writeback after file commit %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no writeback started after file commit %d", i)
		}
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
