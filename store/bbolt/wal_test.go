package bbolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/storetest"
)

// walOptions keep the log and take checkpoints only when a test asks
// (forceCheckpoint), so that what the log holds is known.
// walOptions are those of the log's tests. The writer commits its open
// transaction only when a test asks (flush, forceCheckpoint) or past
// openMaxBytes: a store the test leaves idle stays as it is, with no
// commit or checkpoint of its own racing the test's crash images and its
// swaps of walRemove. (TestLongTx* cover commits on the writer's timer.)
var walOptions = Options{WAL: true, CheckpointInterval: time.Hour, CommitInterval: time.Hour, walSegment: 64 << 10}

// dump lists every bucket, key and value of db, in order.
func dump(t testing.TB, db *bolt.DB) []string {
	t.Helper()
	var out []string
	if err := db.View(func(tx *bolt.Tx) error { out = dumpTx(tx); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// dumpTx lists every bucket, key and value tx reads, in order.
func dumpTx(tx *bolt.Tx) []string {
	var out []string
	_ = tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			out = append(out, fmt.Sprintf("%s %x %x", name, k, v))
			return nil
		})
	})
	return out
}

// dumpStore is dump of what s's readers see: the writer's open
// transaction (see Store.tryOpen) when there is one, without committing it.
func dumpStore(t testing.TB, s *Store) []string {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.open == nil {
		return dump(t, s.db)
	}
	return dumpTx(s.open)
}

// crashCopy copies s's file and log, as a crash at this instant would
// leave them (with every write in the page cache), into a new directory,
// letting image change the file first. s must be idle: no Update running
// and no checkpoint in flight.
func crashCopy(t testing.TB, s *Store, image func(file []byte) []byte) string {
	t.Helper()
	// The writer commits its open transaction on its own (CommitInterval)
	// and a checkpoint may follow: hold it still while copying, once no
	// checkpoint is in flight and none started since.
	for {
		c := s.fileCommits.Load()
		if err := s.waitCheckpoint(); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		if s.fileCommits.Load() == c {
			break
		}
		s.mu.Unlock()
	}
	defer s.mu.Unlock()
	dst := filepath.Join(t.TempDir(), "wicket.db")
	file, err := os.ReadFile(s.path)
	if err != nil {
		t.Fatal(err)
	}
	if image != nil {
		file = image(file)
	}
	if err := os.WriteFile(dst, file, FileMode); err != nil {
		t.Fatal(err)
	}
	src := WALDir(s.path)
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(WALDir(dst), DirMode); err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(WALDir(dst), e.Name()), b, FileMode); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// recovered opens path (which recovers it from its log), checks it and
// returns its contents.
func recovered(t testing.TB, path string) []string {
	t.Helper()
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Errorf("recovered store: %v", err)
	}
	if _, err := os.Stat(WALDir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("log left after recovery without one: %v", err)
	}
	return dumpStore(t, s)
}

func sameDump(t testing.TB, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("recovered %d records, want %d", len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			t.Errorf("record %d: recovered\n%.200s\nwant\n%.200s", i, got[i], want[i])
			return
		}
	}
}

// TestWALReplayMatchesConformance runs the conformance suite on a store
// with a log and, after each test, replays the log onto the checkpoint
// Open took: the result must be the store's contents. A write that does
// not go through the log (wbucket), or a commit that overwrote a page of
// the checkpoint, makes it differ.
func TestWALReplayMatchesConformance(t *testing.T) {
	opts := walOptions
	opts.walSegment = 1 << 20 // no test fills one: the log holds all it wrote
	storetest.Run(t, func(t *testing.T) kernel.Store {
		s := openStore(t, opts, true)
		t.Cleanup(func() {
			if s.closed() || s.failure.Load() != nil {
				return
			}
			want := dumpStore(t, s)
			sameDump(t, recovered(t, crashCopy(t, s, nil)), want)
		})
		return s
	})
}

// walWorkload writes n executions of steps and events, and purges some
// of the executions written before, so that commits free pages and bbolt
// would reuse them.
func walWorkload(t testing.TB, s *Store, from, n int) {
	t.Helper()
	ctx := context.Background()
	for i := from; i < from+n; i++ {
		id := fmt.Sprintf("01960000-0000-7000-8000-%012d", i)
		err := s.Update(ctx, func(tx kernel.Tx) error {
			e := &kernel.Execution{Tenant: "t", ID: id, AgentID: "a", Status: kernel.ExecRunning,
				Input: []byte(`{"n":` + fmt.Sprint(i) + `}`), LastSeq: 0}
			return tx.PutExecution(e)
		})
		if err != nil {
			t.Fatal(err)
		}
		for seq := uint64(1); seq <= 20; seq++ {
			err := s.Update(ctx, func(tx kernel.Tx) error {
				ev := kernel.Event{ExecutionID: id, Seq: seq, Type: kernel.EvStepProposed,
					Payload: []byte(`{"step_id":"s` + fmt.Sprint(seq) + `","output":"` + strings.Repeat("x", 200) + `"}`)}
				if seq == 1 {
					ev.Type = kernel.EvExecutionCreated
				}
				if err := tx.AppendEvent("t", ev); err != nil {
					return err
				}
				if seq%5 == 0 {
					st := &kernel.Step{Tenant: "t", ExecutionID: id, ID: fmt.Sprint("s", seq), Seq: seq, Status: kernel.StepSucceeded}
					if err := tx.PutStep(st); err != nil {
						return err
					}
				}
				e := &kernel.Execution{Tenant: "t", ID: id, AgentID: "a", Status: kernel.ExecRunning,
					Input: []byte(`{"n":` + fmt.Sprint(i) + `}`), LastSeq: seq}
				if err := tx.PutExecution(e); err != nil {
					return err
				}
				return tx.PutCounter("t", "c"+fmt.Sprint(i%3), []byte(fmt.Sprint(seq)))
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if i%4 == 3 {
			old := fmt.Sprintf("01960000-0000-7000-8000-%012d", i-2)
			err := s.Update(ctx, func(tx kernel.Tx) error {
				_, _, err := tx.DeleteExecution("t", old, 0)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestWALSurvivesLostWrites simulates a power cut after a checkpoint: of
// every page of the file written since the checkpoint, the disk may hold
// the old content, the new, or garbage (none of it was synced), and the
// meta pages too; the log's last record may be cut short. What the store
// acknowledged must all come back.
func TestWALSurvivesLostWrites(t *testing.T) {
	// base is the file as the last checkpoint made it durable (segments
	// of 64 KiB: the workload fills several, and each one full brings a
	// checkpoint of its own). Later commits may have written other pages
	// since; the checkpoint's own are never written again.
	var mu sync.Mutex
	var base []byte
	checkpoints := 0
	opts := walOptions
	opts.onCheckpoint = func(path string) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Error(err)
		}
		mu.Lock()
		base = b
		checkpoints++
		mu.Unlock()
	}
	s := openStore(t, opts, true)
	walWorkload(t, s, 0, 12)
	if err := s.forceCheckpoint(); err != nil {
		t.Fatal(err)
	}
	walWorkload(t, s, 12, 12)
	if err := s.forceCheckpoint(); err != nil { // waits for the last one
		t.Fatal(err)
	}
	walWorkload(t, s, 24, 4)
	// Then writes the log alone holds: write until a write brought no
	// checkpoint (a full segment brings one).
	for i := 0; ; i++ {
		mu.Lock()
		n := checkpoints
		mu.Unlock()
		err := s.Update(context.Background(), func(tx kernel.Tx) error {
			return tx.PutCounter("t", fmt.Sprint("last", i), []byte(strings.Repeat("y", 300)))
		})
		if err != nil {
			t.Fatal(err)
		}
		// Committed to the file (unsynced): pages change after the checkpoint.
		if err := s.flush(); err != nil {
			t.Fatal(err)
		}
		if err := s.waitCheckpoint(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		same := checkpoints == n
		mu.Unlock()
		if same {
			break
		}
	}
	want := dumpStore(t, s)
	mu.Lock()
	defer mu.Unlock()
	ps := s.db.Info().PageSize
	changed := 0
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 1))
		path := crashCopy(t, s, func(file []byte) []byte {
			for off := 0; off < len(file); off += ps {
				end := min(off+ps, len(file))
				var old []byte
				if off < len(base) {
					old = base[off:min(end, len(base))]
				}
				if bytes.Equal(old, file[off:end]) {
					continue
				}
				changed++
				switch rng.IntN(3) {
				case 0: // the old content
					copy(file[off:end], old)
				case 1: // garbage
					for i := off; i < end; i++ {
						file[i] = byte(rng.Uint32())
					}
				} // 2: the new content reached the disk
			}
			return file
		})
		if seed%2 == 1 { // the crash cut a record short
			segs, err := segments(WALDir(path))
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(filepath.Join(WALDir(path), segmentName(segs[len(segs)-1])), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write([]byte{200, 0, 0, 0, 1, 2, 3}); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		sameDump(t, recovered(t, path), want)
	}
	if changed == 0 {
		t.Fatal("no page changed after the checkpoint: the test proves nothing")
	}
}

// TestWALCleanClose: Close syncs the file and removes the log; the file
// alone then holds everything, and a read-only open works.
func TestWALCleanClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	s, err := Open(path, walOptions)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(WALDir(path)); err != nil {
		t.Fatalf("no log while open: %v", err)
	}
	// Beside a running kernel, other opens report its lock and touch
	// nothing (the log is the kernel's).
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{true, false} {
		if _, err := Open(path, Options{ReadOnly: ro, Timeout: 10 * time.Millisecond}); !errors.Is(err, ErrLocked) {
			t.Errorf("open (read-only %v) beside a running kernel: %v, want ErrLocked", ro, err)
		}
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("an open beside a running kernel changed the file")
	}
	walWorkload(t, s, 0, 3)
	want := dumpStore(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(WALDir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("log left after Close: %v", err)
	}
	ro, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}

	sameDump(t, dump(t, ro.db), want)
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}
	// After a crash, a read-only open is refused until a writer recovers.
	crashed := crashCopyFile(t, path)
	if _, err := Open(crashed, Options{ReadOnly: true}); !errors.Is(err, ErrUnclean) {
		t.Errorf("read-only open of a crashed store: %v, want ErrUnclean", err)
	}
	sameDump(t, recovered(t, crashed), want)
}

// TestWALDamage: a log damaged before its last record is refused, naming
// the segment; a checkpoint that does not check out too.
func TestWALDamage(t *testing.T) {
	s := openStore(t, walOptions, false)
	walWorkload(t, s, 0, 2)
	for _, tc := range []struct {
		name   string
		damage func(dir string)
		want   string
	}{
		{"flipped byte in a record", func(dir string) {
			segs, _ := segments(dir)
			p := filepath.Join(dir, segmentName(segs[0]))
			b, _ := os.ReadFile(p)
			b[len(walMagic)+walHeaderSize+3] ^= 0xff
			// A later segment makes the damaged record not the last.
			next := filepath.Join(dir, segmentName(segs[0]+1_000_000))
			if err := os.WriteFile(next, []byte(walMagic), FileMode); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, FileMode); err != nil {
				t.Fatal(err)
			}
		}, "checksum mismatch"},
		{"flipped byte in the last segment's first record", func(dir string) {
			// Records follow it: it was acknowledged, not cut short.
			segs, _ := segments(dir)
			p := filepath.Join(dir, segmentName(segs[len(segs)-1]))
			b, _ := os.ReadFile(p)
			rest := b[len(walMagic):]
			n, ok := recordAt(rest)
			if !ok || !soundRecordAt(rest[walHeaderSize+n:]) {
				t.Fatal("the last segment holds fewer than two records: the case proves nothing")
			}
			b[len(walMagic)+walHeaderSize+3] ^= 0xff
			if err := os.WriteFile(p, b, FileMode); err != nil {
				t.Fatal(err)
			}
		}, "checksum mismatch"},
		{"checkpoint", func(dir string) {
			p := filepath.Join(dir, ckptName)
			b, _ := os.ReadFile(p)
			b[20] ^= 0xff
			if err := os.WriteFile(p, b, FileMode); err != nil {
				t.Fatal(err)
			}
		}, "checkpoint"},
		{"checkpoint with a meta page that is not one", func(dir string) {
			// Its own checksum right: only the meta page's check sees it,
			// before the page is written over the file's.
			c, err := readCheckpoint(dir)
			if err != nil {
				t.Fatal(err)
			}
			c.meta[pageHeaderSize] ^= 0xff // bbolt's magic
			if err := os.WriteFile(filepath.Join(dir, ckptName), c.encode(), FileMode); err != nil {
				t.Fatal(err)
			}
		}, "bad magic"},
		{"another file's log", func(dir string) {
			// A backup restored over the file, the old log left beside it.
			other := openStore(t, Options{}, false)
			walWorkload(t, other, 100, 3)
			if err := other.Close(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(other.path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(strings.TrimSuffix(dir, "-wal"), b, FileMode); err != nil {
				t.Fatal(err)
			}
		}, "not this file's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := crashCopy(t, s, nil)
			tc.damage(WALDir(path))
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Open(path, Options{})
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v, want ErrDamaged naming %q", err, tc.want)
			}
			if tc.want != "checksum mismatch" { // refused before touching the file
				if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
					t.Fatal("the refused recovery changed the file")
				}
			}
		})
	}
}

// TestWALBatchRetry: a batch rolled back because one function failed
// logs only what the committed functions wrote.
func TestWALBatchRetry(t *testing.T) {
	s := openStore(t, walOptions, true)
	walWorkload(t, s, 0, 1)
	ctx := context.Background()
	errBoom := errors.New("boom")
	done := make(chan error, 3)
	for i := range 3 {
		go func() {
			done <- s.Update(ctx, func(tx kernel.Tx) error {
				if err := tx.PutCounter("t", fmt.Sprint("k", i), []byte("v")); err != nil {
					return err
				}
				if i == 1 {
					return errBoom
				}
				return nil
			})
		}()
	}
	for range 3 {
		if err := <-done; err != nil && !errors.Is(err, errBoom) {
			t.Fatal(err)
		}
	}
	want := dumpStore(t, s)
	got := recovered(t, crashCopy(t, s, nil))
	sameDump(t, got, want)
	for _, r := range got {
		if strings.HasPrefix(r, "counters ") && strings.Contains(r, fmt.Sprintf("%x", "t\x00k1")) {
			t.Fatalf("the failed function's write was replayed: %s", r)
		}
	}
}

// TestWALDropsPastReserve: past half the address space reserved for the
// mapping, the store syncs, drops its log and goes on with bbolt's own
// fsyncs (a remap would wait for the checkpoint's read transaction).
func TestWALDropsPastReserve(t *testing.T) {
	opts := walOptions
	opts.walMmap = 1 << 20
	s := openStore(t, opts, true)
	// Executions are written, and the writer's open transaction committed
	// to the file, until the file passes the reserve.
	n := 0
	for ; n < 400; n += 10 {
		walWorkload(t, s, n, 10)
		if err := s.flush(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(WALDir(s.path)); errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	if _, err := os.Stat(WALDir(s.path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("log still there past the reserve, after %d executions: %v", n, err)
	}
	if size := s.Stats().Size; size <= int64(opts.walMmap/2) {
		t.Fatalf("the log went with the file at %d bytes, under the reserve's half", size)
	}
	if s.db.NoSync {
		t.Fatal("bbolt's fsync still off without a log")
	}
	walWorkload(t, s, n+10, 2)
}

// crashCopyFile copies a closed store's file with an empty log beside it,
// as a kernel killed right after Open would leave it.
func crashCopyFile(t *testing.T, path string) string {
	t.Helper()
	s, err := Open(path, walOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return crashCopy(t, s, nil)
}

// TestWALOfflineTools: Compact, Space and CheckClean refuse a crashed store's
// file (it lacks what its log holds) and leave it as it was.
func TestWALOfflineTools(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	walWorkload(t, s, 0, 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	crashed := crashCopyFile(t, path)
	before, _ := os.ReadFile(crashed)
	if err := CheckClean(crashed); !errors.Is(err, ErrUnclean) {
		t.Errorf("CheckClean = %v, want ErrUnclean", err)
	}
	if _, err := Compact(crashed, "", time.Second); !errors.Is(err, ErrUnclean) {
		t.Errorf("Compact = %v, want ErrUnclean", err)
	}
	if _, err := Space(crashed, time.Second); !errors.Is(err, ErrUnclean) {
		t.Errorf("Space = %v, want ErrUnclean", err)
	}
	if after, _ := os.ReadFile(crashed); !bytes.Equal(before, after) {
		t.Error("refused, and changed the file")
	}
	if err := CheckClean(path); err != nil {
		t.Errorf("CheckClean of a cleanly closed store: %v", err)
	}
}
