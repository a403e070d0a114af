package bbolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// fillStore writes n executions, each with a created event, to the store
// file at path and closes it.
func fillStore(t *testing.T, path string, n int) {
	t.Helper()
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := putExecution(t.Context(), s, "t", fmt.Sprintf("01960000-0000-7000-8000-%012d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// putExecution writes one completed execution with its created event.
func putExecution(ctx context.Context, s *Store, tenant, id string) error {
	return s.Update(ctx, func(tx kernel.Tx) error {
		e := &kernel.Execution{ID: id, Tenant: tenant, AgentID: "a", Status: kernel.ExecRunning, LastSeq: 1,
			Input: []byte(`"` + strings.Repeat("x", 200) + `"`)}
		if err := tx.PutExecution(e); err != nil {
			return err
		}
		return tx.AppendEvent(tenant, kernel.Event{ExecutionID: id, Seq: 1, Type: kernel.EvExecutionCreated, Payload: []byte("{}")})
	})
}

// headerOf reads the newest valid meta of a store file.
func headerOf(t *testing.T, path string) fileMeta {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m0, err0 := parseMeta(b)
	if err0 != nil {
		t.Fatal(err0)
	}
	m1, err1 := parseMeta(b[m0.pageSize:])
	if err1 == nil && m1.txid > m0.txid {
		return m1
	}
	return m0
}

// TestOpenRefusesDamagedFile damages real store files the ways a disk or an
// operator does, and checks Open refuses each with ErrDamaged and a message
// naming the file and the damage, instead of starting empty or crashing.
func TestOpenRefusesDamagedFile(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, path string)
		want   string
	}{
		{"empty", func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		}, "empty (0 bytes)"},
		{"truncated by one page", func(t *testing.T, path string) {
			m := headerOf(t, path)
			if err := os.Truncate(path, int64(m.hwm-1)*int64(m.pageSize)); err != nil {
				t.Fatal(err)
			}
		}, "truncated"},
		{"truncated to three pages", func(t *testing.T, path string) {
			m := headerOf(t, path)
			if err := os.Truncate(path, 3*int64(m.pageSize)); err != nil {
				t.Fatal(err)
			}
		}, "truncated"},
		{"shorter than a page", func(t *testing.T, path string) {
			if err := os.Truncate(path, 100); err != nil {
				t.Fatal(err)
			}
		}, "truncated: 100 bytes"},
		{"shorter than a header", func(t *testing.T, path string) {
			if err := os.Truncate(path, 40); err != nil {
				t.Fatal(err)
			}
		}, "no valid header page"},
		{"both headers overwritten", func(t *testing.T, path string) {
			m := headerOf(t, path)
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			junk := bytes.Repeat([]byte{0xAB}, 64)
			for _, off := range []int64{16, int64(m.pageSize) + 16} {
				if _, err := f.WriteAt(junk, off); err != nil {
					t.Fatal(err)
				}
			}
		}, "no valid header page"},
		{"not a store", func(t *testing.T, path string) {
			if err := os.WriteFile(path, bytes.Repeat([]byte("hello world\n"), 2000), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "no valid header page"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "wicket.db")
			fillStore(t, path, 300)
			if m := headerOf(t, path); m.hwm < 8 {
				t.Fatalf("the store uses only %d pages: too small to damage", m.hwm)
			}
			c.damage(t, path)
			s, err := Open(path, Options{Timeout: 100 * time.Millisecond})
			if err == nil {
				s.Close()
				t.Fatal("Open accepted a damaged file")
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q: want ErrDamaged naming the path and %q", err, c.want)
			}
			if CheckFile(path) == nil {
				t.Fatal("CheckFile accepts the damaged file")
			}
		})
	}
}

// TestOpenSurvivesOneBadHeader: bbolt keeps two header pages so that a torn
// write of one loses nothing; CheckFile must accept such a file.
func TestOpenSurvivesOneBadHeader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	fillStore(t, path, 50)
	m := headerOf(t, path)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Spoil the older header (bbolt writes meta txid%2).
	off := int64(0)
	if m.txid%2 == 0 {
		off = int64(m.pageSize)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xAB}, 64), off+16); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := CheckFile(path); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestCheckFileMissingIsFine(t *testing.T) {
	if err := CheckFile(filepath.Join(t.TempDir(), "nope.db")); err != nil {
		t.Fatal(err)
	}
}

// TestReadOnly: a read-only store reads and checks but never writes, and
// cannot be opened while a writer holds the file.
func TestReadOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	fillStore(t, path, 3)
	ro, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ro.Check(); err != nil {
		t.Fatal(err)
	}
	err = ro.View(t.Context(), func(tx kernel.ReadTx) error {
		_, err := tx.Execution("t", "01960000-0000-7000-8000-000000000002")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := putExecution(t.Context(), ro, "t", "x"); err == nil {
		t.Fatal("Update succeeded on a read-only store")
	}
	// A second reader is fine; a writer is locked out.
	ro2, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	ro2.Close()
	if w, err := Open(path, Options{Timeout: 50 * time.Millisecond}); !errors.Is(err, ErrLocked) {
		if err == nil {
			w.Close()
		}
		t.Fatalf("a writer opened a file held read-only: %v", err)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	w, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if r, err := Open(path, Options{ReadOnly: true, Timeout: 50 * time.Millisecond}); !errors.Is(err, ErrLocked) {
		if err == nil {
			r.Close()
		}
		t.Fatalf("a reader opened a file a writer holds: %v", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.db"), Options{ReadOnly: true}); err == nil {
		t.Fatal("read-only Open created a file")
	}
	// Nor a directory: `wicket store check --data TYPO` leaves no TYPO behind.
	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := Open(filepath.Join(missing, "wicket.db"), Options{ReadOnly: true}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("read-only Open in a missing directory: %v", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("read-only Open created the directory: %v", err)
	}
}

// TestBackupUnderLoad takes a backup while writers commit, and checks the
// copy opens, passes the checker and holds every execution acknowledged
// before the backup began.
func TestBackupUnderLoad(t *testing.T) {
	s := openStore(t, Options{}, true)
	ctx := t.Context()
	var acked sync.Map
	var n atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("01960000-0000-7000-%04d-%012d", w, i)
				if err := putExecution(ctx, s, "t", id); err != nil {
					t.Error(err)
					return
				}
				acked.Store(id, true)
				n.Add(1)
			}
		}()
	}
	// Let some commits land, then note what was acknowledged.
	deadline := time.Now().Add(30 * time.Second)
	for n.Load() < 200 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	var before []string
	acked.Range(func(k, _ any) bool { before = append(before, k.(string)); return true })
	path := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, FileMode)
	if err != nil {
		t.Fatal(err)
	}
	written, err := s.Backup(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	after := n.Load()
	close(stop)
	wg.Wait()
	if fi, _ := os.Stat(path); fi.Size() != written {
		t.Fatalf("backup wrote %d bytes, file has %d", written, fi.Size())
	}
	b, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Check(); err != nil {
		t.Fatal(err)
	}
	err = b.View(ctx, func(tx kernel.ReadTx) error {
		for _, id := range before {
			if _, err := tx.Execution("t", id); err != nil {
				return fmt.Errorf("execution %s acknowledged before the backup is missing: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d executions before the backup, %d when it ended, %d bytes", len(before), after, written)
	if len(before) < 200 {
		t.Fatalf("only %d executions before the backup", len(before))
	}
}

func TestBackupCancelled(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, false)
	for i := range 50 {
		if err := putExecution(t.Context(), s, "t", fmt.Sprint("e", i)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var buf bytes.Buffer
	if _, err := s.Backup(ctx, &buf); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled backup: %v", err)
	}
}

// TestCompact: deleting records leaves the file as large as before;
// Compact gives the space back, keeps every record, and refuses a store
// that is open.
func TestCompact(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	for i := range 20 {
		if err := s.Update(t.Context(), func(tx kernel.Tx) error {
			return tx.PutBundle(&kernel.BundleRecord{Tenant: "t", Name: fmt.Sprint("b", i), Archive: big})
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := putExecution(t.Context(), s, "t", "keep"); err != nil {
		t.Fatal(err)
	}
	for i := range 19 {
		if err := s.Update(t.Context(), func(tx kernel.Tx) error { return tx.DeleteBundle("t", fmt.Sprint("b", i)) }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Compact(path, "", 50*time.Millisecond); !errors.Is(err, ErrLocked) {
		t.Fatalf("Compact of an open store: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := Compact(path, "", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.After != fi.Size() || st.After*4 > st.Before || fi.Mode().Perm() != FileMode {
		t.Fatalf("compact: %+v, file %d bytes mode %v", st, fi.Size(), fi.Mode())
	}
	if _, err := os.Stat(path + ".compact"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the temporary file is left: %v", err)
	}
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	err = s.View(t.Context(), func(tx kernel.ReadTx) error {
		if _, err := tx.Execution("t", "keep"); err != nil {
			return err
		}
		b, err := tx.Bundle("t", "b19")
		if err != nil || !bytes.Equal(b.Archive, big) {
			return fmt.Errorf("bundle b19: %v", err)
		}
		bs, err := tx.ListBundles("t")
		if len(bs) != 1 {
			return fmt.Errorf("%d bundles, want 1 (%v)", len(bs), err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
