package bbolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"

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
	want := dumpStore(t, s)
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
			want := dumpStore(t, r)
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

// TestWALCrashDuringCheckpoint: a checkpoint replaces the checkpoint
// file, then deletes the segments it covers, oldest first. A crash after
// the replacement leaves covered segments beside it, all or the newest of
// them: recovery skips their records and applies the rest.
func TestWALCrashDuringCheckpoint(t *testing.T) {
	defer func() { walRemove = os.Remove }()
	walRemove = func(string) error { return nil } // every checkpoint crashes before its deletions
	opts := walOptions
	opts.walSegment = 16 << 10
	s := openStore(t, opts, false)
	walWorkload(t, s, 0, 6) // fills segments: each brings a checkpoint
	if err := s.forceCheckpoint(); err != nil {
		t.Fatal(err)
	}
	walWorkload(t, s, 6, 1)
	want := dumpStore(t, s)
	path := crashCopy(t, s, nil)
	walRemove = os.Remove
	cp, err := readCheckpoint(WALDir(path))
	if err != nil {
		t.Fatal(err)
	}
	segs, err := segments(WALDir(path))
	if err != nil {
		t.Fatal(err)
	}
	covered := 0
	for i := 0; i+1 < len(segs) && segs[i+1] <= cp.lsn+1; i++ {
		covered++
	}
	if covered < 3 {
		t.Fatalf("%d segments covered by the checkpoint (of %d): the test needs several", covered, len(segs))
	}
	saved := readDir(t, WALDir(path))
	for gone := 0; gone <= covered; gone++ {
		t.Run(fmt.Sprintf("%d of %d covered segments deleted", gone, covered), func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "wicket.db")
			copyFile(t, path, p)
			if err := os.Mkdir(WALDir(p), DirMode); err != nil {
				t.Fatal(err)
			}
			for name, b := range saved {
				if slices.ContainsFunc(segs[:gone], func(s uint64) bool { return segmentName(s) == name }) {
					continue
				}
				if err := os.WriteFile(filepath.Join(WALDir(p), name), b, FileMode); err != nil {
					t.Fatal(err)
				}
			}
			sameDump(t, recovered(t, p), want)
		})
	}
}

// cutLog keeps the first n records of dir's log after lsn after, as a
// recovery that applied only those leaves it (and deletes the rest).
func cutLog(t *testing.T, dir string, after uint64, n int) {
	t.Helper()
	segs, err := segments(dir)
	if err != nil {
		t.Fatal(err)
	}
	cut := false
	for _, s := range segs {
		p := filepath.Join(dir, segmentName(s))
		if cut {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for off := len(walMagic); off+walHeaderSize <= len(b) && !allZero(b[off:off+walHeaderSize]); {
			if lsn := binary.LittleEndian.Uint64(b[off+8:]); lsn > after+uint64(n) {
				clear(b[off:])
				cut = true
				break
			}
			off += walHeaderSize + int(binary.LittleEndian.Uint32(b[off:]))
		}
		if err := os.WriteFile(p, b, FileMode); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWALCrashDuringRecovery: a recovery applies the log in transactions
// of its own (walReplayOps operations each), unsynced, the checkpoint's
// pages kept by a read transaction; killed part way, the next start restores the checkpoint
// again and applies the whole log, and so does a third start after a
// second recovery killed part way.
func TestWALCrashDuringRecovery(t *testing.T) {
	// Many transactions: a later one would reuse the pages an earlier
	// one freed, the checkpoint's, but for the read transaction.
	defer func(n int) { walReplayOps = n }(walReplayOps)
	walReplayOps = 20
	s := openStore(t, walOptions, false)
	walWorkload(t, s, 0, 3)
	if err := s.forceCheckpoint(); err != nil {
		t.Fatal(err)
	}
	walWorkload(t, s, 3, 3)
	want := dumpStore(t, s)
	crashed := crashCopy(t, s, nil)
	cp, err := readCheckpoint(WALDir(crashed))
	if err != nil {
		t.Fatal(err)
	}
	records := 0
	if _, err := readRecords(WALDir(crashed), cp.lsn, func(uint64, []byte) error { records++; return nil }); err != nil || records < 10 {
		t.Fatalf("%d records after the checkpoint: %v", records, err)
	}
	saved := readDir(t, WALDir(crashed))
	// partial runs a recovery of path that applies n records and
	// stops: no sync, no removal of the log, which is whole again.
	partial := func(t *testing.T, path string, n int) {
		t.Helper()
		cutLog(t, WALDir(path), cp.lsn, n)
		cp, err := recoverFile(path)
		if err != nil {
			t.Fatal(err)
		}
		db, err := bolt.Open(path, FileMode, &bolt.Options{FreelistType: bolt.FreelistMapType, InitialMmapSize: 1 << 30, NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := replayWAL(db, path, cp); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(WALDir(path)); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(WALDir(path), DirMode); err != nil {
			t.Fatal(err)
		}
		for name, b := range saved {
			if err := os.WriteFile(filepath.Join(WALDir(path), name), b, FileMode); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range [][]int{{0}, {1}, {records / 2}, {records - 1}, {records / 3, records / 2}, {records - 1, 1}} {
		t.Run(fmt.Sprint("killed after ", tc), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "wicket.db")
			copyFile(t, crashed, path)
			copyDir(t, WALDir(crashed), WALDir(path))
			for _, n := range tc {
				partial(t, path, n)
			}
			sameDump(t, recovered(t, path), want)
		})
	}
}

// copyDir copies the files of directory src into a new directory dst.
func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	if err := os.Mkdir(dst, DirMode); err != nil {
		t.Fatal(err)
	}
	for name, b := range readDir(t, src) {
		if err := os.WriteFile(filepath.Join(dst, name), b, FileMode); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(t testing.TB, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, FileMode); err != nil {
		t.Fatal(err)
	}
}

// readDir returns the contents of the files of dir by name.
func readDir(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// TestWALSegmentTail: a record goes to a new segment when it does not fit
// in the rest of the active one, which may then end with fewer zeros than
// a record header. That is the end of the segment, not a header cut
// short: recovery must read on into the next segment (a crash after a
// segment filled and before the checkpoint that deletes it leaves such a
// segment before the last).
func TestWALSegmentTail(t *testing.T) {
	dir := t.TempDir()
	const payload = 100 // 1 + 2 + 2 + 1 + 94: see walBatch.put
	for _, tail := range []int{0, 1, 8, walHeaderSize - 1, walHeaderSize} {
		t.Run(fmt.Sprint("tail ", tail), func(t *testing.T) {
			dir := filepath.Join(dir, fmt.Sprint(tail))
			if err := os.Mkdir(dir, DirMode); err != nil {
				t.Fatal(err)
			}
			w := &wal{dir: dir, segSize: int64(len(walMagic) + 2*(walHeaderSize+payload) + tail), spare: make(chan spareSegment, 1)}
			if err := w.createSegment(0); err != nil {
				t.Fatal(err)
			}
			var b walBatch
			for i := range 5 {
				b.reset()
				b.put([]byte("b"), []byte("k"), bytes.Repeat([]byte{byte('a' + i)}, 94))
				if len(b.buf) != walHeaderSize+payload {
					t.Fatalf("record of %d bytes", len(b.buf))
				}
				if err := w.append(&b); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.close(); err != nil {
				t.Fatal(err)
			}
			if segs, _ := segments(dir); len(segs) != 3 {
				t.Fatalf("segments %v, want 3", segs)
			}
			var got []uint64
			last, err := readRecords(dir, 0, func(lsn uint64, p []byte) error {
				if len(p) != payload || p[len(p)-1] != byte('a'+lsn-1) {
					return fmt.Errorf("record %d: %q", lsn, p)
				}
				got = append(got, lsn)
				return nil
			})
			if err != nil || last != 5 || len(got) != 5 {
				t.Fatalf("read back %v (last %d): %v", got, last, err)
			}
		})
	}
}

// TestWALCrashMakingASegment: a crash while the next segment is made
// leaves a spare (not yet named a segment, zeros) and maybe the newest
// segment renamed into place with no record yet: recovery ignores the
// one and ends the log at the other.
func TestWALCrashMakingASegment(t *testing.T) {
	s := openStore(t, walOptions, false)
	walWorkload(t, s, 0, 2)
	want := dumpStore(t, s)
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprint("renamed ", named), func(t *testing.T) {
			path := crashCopy(t, s, nil)
			sp := makeSegment(WALDir(path), 64<<10)
			if sp.err != nil {
				t.Fatal(sp.err)
			}
			sp.f.Close()
			if named {
				if err := os.Rename(sp.f.Name(), filepath.Join(WALDir(path), segmentName(s.wal.log.lsn+1))); err != nil {
					t.Fatal(err)
				}
			}
			sameDump(t, recovered(t, path), want)
		})
	}
}
