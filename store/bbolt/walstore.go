package bbolt

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
)

// DefaultCheckpointInterval is the default Options.CheckpointInterval.
const DefaultCheckpointInterval = 100 * time.Millisecond

// walSegmentSize is the size of a log segment (a record larger than that
// gets a segment of its own); the checkpoint after a segment fills deletes
// it.
const walSegmentSize = 8 << 20

// walMmapReserve is the address space bbolt maps up front with a log: a
// checkpoint's base is protected by a read transaction, and bbolt cannot
// remap (grow its mapping) while one is open. Past half of it the store
// stops using the log (stopWAL) rather than wait.
// It is 1 TiB where int has 64 bits and 1 GiB elsewhere; the shift is
// not a constant, so that 32-bit builds, where 1 << 40 overflows int,
// compile.
var walMmapReserve = func() int {
	if strconv.IntSize == 64 {
		tib := 40
		return 1 << tib
	}
	return 1 << 30
}()

// ckptJob is a checkpoint the writer prepared for the checkpointer.
type ckptJob struct {
	cp   checkpoint
	base *bolt.Tx // a read transaction on cp.txid: keeps its pages
	done chan error
}

// walState is the write-ahead log side of a Store.
type walState struct {
	log      *wal // the writer's
	batch    walBatch
	every    time.Duration
	last     time.Time // the writer's: when the last checkpoint started
	pageSize int
	metaFile *os.File // reads meta pages
	limit    int64    // file size past which the log is dropped
	base     *bolt.Tx // the checkpointer's: protects the last checkpoint
	jobs     chan *ckptJob
	busy     bool // the writer's: a job is with the checkpointer
	// lastFirst is the first lsn of the active segment at the last
	// checkpoint (the writer's).
	lastFirst uint64
	idle      chan struct{}
	stopped   chan struct{} // closed when the checkpointer returns
	// writeback is the writer's word to the checkpointer that a commit
	// to the file left pages to write back (see startWriteback).
	writeback chan struct{}
}

// CheckClean returns ErrUnclean when the store at path has a write-ahead
// log left by a kernel that did not stop cleanly (the file lacks what the
// log holds until a writable Open applies it), and nil otherwise —
// including while a kernel runs on it (its lock then stops the caller's
// Open). Offline tools call it before reading the file.
func CheckClean(path string) error {
	_, err := checkLog(path, true)
	return err
}

// checkLog deals with a log beside the file at path before bbolt opens it.
// A kernel holding the file's lock owns its log: nothing is touched (and
// bbolt's Open then reports the lock). Otherwise a log means the last
// kernel did not stop cleanly: a read-only open is refused (ErrUnclean),
// any other recovers the file (recoverFile) under the lock.
func checkLog(path string, readOnly bool) (*checkpoint, error) {
	if _, err := os.Stat(WALDir(path)); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	release, held, err := lockFree(path)
	if err != nil || held {
		return nil, err
	}
	defer release()
	if readOnly {
		return nil, ErrUnclean
	}
	return recoverFile(path)
}

// logLeft reports whether a log is beside the file at path. Open asks
// once bbolt holds the file's lock, when checkLog applied no log: a log
// is then one left by a kernel that held the lock when checkLog looked
// (a supervisor restarting a kernel while the old process is still being
// killed) and died since without stopping cleanly. Used as it is, the
// file would lack the records the log holds beyond it, a log of its own
// could not be made (the directory exists), and without one the stale
// log, left beside a file written since, would make the next Open take
// the file back to its checkpoint (TestWALOpenWhileTheKernelDies).
func logLeft(path string) bool {
	_, err := os.Stat(WALDir(path))
	return err == nil
}

// recoverFile brings the file at path back to the state its log
// describes, before bbolt opens it: when the log's directory holds a
// checkpoint, the checkpoint's meta page goes back in place; replayWAL
// then applies the records after it. It returns the checkpoint (nil:
// nothing to replay).
func recoverFile(path string) (*checkpoint, error) {
	dir := WALDir(path)
	cp, err := readCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	if cp == nil {
		// Created without its first checkpoint (no record written yet),
		// or a removal cut short after the checkpoint went (removeWAL:
		// the file, synced, holds every record left): nothing to apply.
		return nil, removeWAL(dir)
	}
	if err := restoreMeta(path, cp); err != nil {
		return nil, err
	}
	return cp, nil
}

// walReplayOps is how many operations a recovery commits at a time (a
// variable for tests).
var walReplayOps = 100_000

// replayWAL applies the log's records after cp to db, syncs the file and
// removes the log. It returns the last lsn applied.
func replayWAL(db *bolt.DB, path string, cp *checkpoint) (uint64, error) {
	dir := WALDir(path)
	// Until the log is gone, the checkpoint's pages must stay as they
	// are, for the next Open should this one fail: a read transaction on
	// them keeps bbolt from reusing them (see the package doc, Write-ahead log).
	guard, err := db.Begin(false)
	if err != nil {
		return 0, fmt.Errorf("wal: recover %s: %w", path, err)
	}
	defer func() { _ = guard.Rollback() }()
	if got := uint64(guard.ID()); got != cp.txid {
		return 0, fmt.Errorf("wal: %s opened at transaction %d, its checkpoint is %d: %w", path, got, cp.txid, ErrDamaged)
	}
	sync := db.NoSync
	db.NoSync = true
	defer func() { db.NoSync = sync }()
	var btx *bolt.Tx
	ops := 0
	commit := func() error {
		if btx == nil {
			return nil
		}
		err := btx.Commit()
		btx, ops = nil, 0
		return err
	}
	last, err := readRecords(dir, cp.lsn, func(lsn uint64, payload []byte) error {
		if btx == nil {
			var err error
			if btx, err = db.Begin(true); err != nil {
				return err
			}
		}
		n, err := applyOps(btx, payload)
		ops += n
		if err != nil {
			return fmt.Errorf("wal: replay record %d: %w", lsn, err)
		}
		if ops >= walReplayOps {
			return commit()
		}
		return nil
	})
	if err == nil {
		err = commit()
	}
	if err != nil {
		if btx != nil {
			_ = btx.Rollback()
		}
		return 0, fmt.Errorf("wal: recover %s: %w", path, err)
	}
	if err := db.Sync(); err != nil {
		return 0, fmt.Errorf("wal: recover %s: sync: %w", path, err)
	}
	if err := removeWAL(dir); err != nil {
		return 0, err
	}
	return last, nil
}

// applyOps applies the operations of a record's payload to btx and
// returns how many there were.
func applyOps(btx *bolt.Tx, payload []byte) (int, error) {
	n := 0
	err := decodeOps(payload, func(o walOp) error {
		b := btx.Bucket(o.bucket)
		if b == nil {
			return fmt.Errorf("no bucket %q", o.bucket)
		}
		if bytes.Equal(o.bucket, bEvents) {
			b.FillPercent = eventsFill
		}
		n++
		if o.op == walOpPut {
			return b.Put(o.key, o.value)
		}
		return b.Delete(o.key)
	})
	return n, err
}

// startWAL starts a log for s after the records up to lsn: the file is
// synced, its state becomes the first checkpoint, and from then on
// commits skip bbolt's fsyncs.
func (s *Store) startWAL(lsn uint64, every time.Duration, mmap int, segSize int64) error {
	dir := WALDir(s.path)
	if err := os.Mkdir(dir, DirMode); err != nil {
		return fmt.Errorf("wal: create %s: %w", dir, err)
	}
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return err
	}
	mf, err := os.Open(s.path)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	w := &walState{
		log:      &wal{dir: dir, lsn: lsn, segSize: segSize, spare: make(chan spareSegment, 1)},
		every:    every,
		pageSize: s.db.Info().PageSize,
		metaFile: mf,
		limit:    int64(mmap / 2),
		// One job at most is with the checkpointer (busy), so a send
		// never waits while it starts a writeback.
		jobs:      make(chan *ckptJob, 1),
		idle:      make(chan struct{}, 1),
		stopped:   make(chan struct{}),
		writeback: make(chan struct{}, 1),
	}
	job, err := w.prepare(s.db)
	if err == nil {
		err = s.db.Sync()
	}
	if err == nil {
		err = writeCheckpoint(dir, &job.cp)
	}
	if err == nil {
		err = w.log.createSegment(0)
	}
	if err != nil {
		if job != nil {
			_ = job.base.Rollback()
		}
		mf.Close()
		_ = removeWAL(dir)
		return err
	}
	w.base = job.base
	w.last = time.Now()
	w.lastFirst = w.log.first
	s.wal = w
	s.db.NoSync = true
	go s.checkpointer(w)
	return nil
}

// prepare opens a read transaction on the last commit and reads its meta
// page: the next checkpoint. Only the writer (or Open) calls it, between
// commits.
func (w *walState) prepare(db *bolt.DB) (*ckptJob, error) {
	rtx, err := db.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("wal: checkpoint: %w", err)
	}
	meta, err := readMeta(w.metaFile, w.pageSize, uint64(rtx.ID()))
	var sum uint32
	if err == nil {
		sum, err = rootPageSum(w.metaFile, meta)
	}
	if err != nil {
		_ = rtx.Rollback()
		return nil, err
	}
	return &ckptJob{cp: checkpoint{lsn: w.log.lsn, txid: uint64(rtx.ID()), rootSum: sum, meta: meta}, base: rtx}, nil
}

// maybeCheckpoint, called by the writer after a commit, hands a checkpoint
// to the checkpointer when one is due (the interval passed, or a segment
// filled) and none is running.
func (s *Store) maybeCheckpoint() error {
	w := s.wal
	select {
	case <-w.idle:
		w.busy = false
	default:
	}
	force := false
	if w.log.first > w.lastFirst {
		// A segment filled: the checkpoint lets it go.
		w.lastFirst = w.log.first
		force = true
	}
	if w.busy || (!force && time.Since(w.last) < w.every) {
		return nil
	}
	job, err := w.prepare(s.db)
	if err != nil {
		return err
	}
	w.busy, w.last = true, time.Now()
	w.jobs <- job
	return nil
}

// checkpointer makes each checkpoint durable: it syncs the file (every
// commit up to the job's is then on disk), replaces the checkpoint,
// releases the previous base (bbolt may now reuse its pages) and deletes
// the segments the new checkpoint covers.
//
// Between checkpoints, after each commit of the writer's open transaction
// to the file, it starts writing the pages that commit dirtied back to the
// disk, without waiting for them (startWriteback). Left to the
// checkpoint's sync, 100 ms of commits (about 2 MB at 10 executions) went
// to the disk at once, and the log syncs that met that burst waited for
// it: they made the submit p99 (docs/benchmarks.md). The hint changes
// nothing of what is durable when: the checkpoint's sync still makes the
// file durable, and reports any error writing it back.
func (s *Store) checkpointer(w *walState) {
	defer close(w.stopped)
	for {
		select {
		case job, ok := <-w.jobs:
			if !ok {
				return
			}
			err := s.checkpoint(w, job)
			if err != nil {
				s.fail(err)
			}
			if job.done != nil {
				job.done <- err
			}
			w.idle <- struct{}{}
		case <-w.writeback:
			err := startWriteback(w.metaFile)
			if s.onWriteback != nil {
				s.onWriteback(err)
			}
		}
	}
}

// hintWriteback tells the checkpointer that a commit to the file left
// pages to write back; a hint already pending covers this one too. The
// writer's.
func (w *walState) hintWriteback() {
	if !writebackSupported {
		return
	}
	select {
	case w.writeback <- struct{}{}:
	default:
	}
}

func (s *Store) checkpoint(w *walState, job *ckptJob) error {
	if err := s.db.Sync(); err != nil {
		_ = job.base.Rollback()
		return fmt.Errorf("wal: checkpoint: sync %s: %w", s.path, err)
	}
	if err := sameFile(s.path, w.metaFile); err != nil {
		// The file was renamed over (a backup restored without stopping
		// the kernel) or removed: what the kernel writes from now on would
		// be in no file a restart opens. The store fails, so no write is
		// answered any more, and its log stays, as the file's.
		_ = job.base.Rollback()
		return replacedError(s.path, err)
	}
	if err := writeCheckpoint(w.log.dir, &job.cp); err != nil {
		_ = job.base.Rollback()
		return err
	}
	if w.base != nil {
		_ = w.base.Rollback()
	}
	w.base = job.base
	if err := removeCovered(w.log.dir, job.cp.lsn); err != nil {
		return err
	}
	if s.onCheckpoint != nil {
		s.onCheckpoint(s.path)
	}
	return nil
}

// removeCovered deletes the segments whose records all have lsns up to
// lsn.
func removeCovered(dir string, lsn uint64) error {
	segs, err := segments(dir)
	if err != nil {
		return fmt.Errorf("wal: list %s: %w", dir, err)
	}
	for i := 0; i+1 < len(segs) && segs[i+1] <= lsn+1; i++ {
		if err := walRemove(filepath.Join(dir, segmentName(segs[i]))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("wal: remove segment: %w", err)
		}
	}
	return nil
}

// stopWAL, with the writer stopped, waits for the checkpointer and, unless
// the store has failed, syncs the file and removes the log: the file alone
// is then the whole state.
func (s *Store) stopWAL() error {
	w := s.wal
	if w == nil {
		return nil
	}
	s.wal = nil
	close(w.jobs)
	<-w.stopped
	// Closing the log waits for a spare segment being made: made in the
	// directory while removeWAL deletes it, it could make the removal
	// fail (directory not empty).
	_ = w.log.close()
	var err error
	if s.failure.Load() == nil {
		if err = s.db.Sync(); err == nil {
			s.db.NoSync = false
			err = removeWAL(w.log.dir)
		}
	}
	if w.base != nil {
		_ = w.base.Rollback()
	}
	_ = w.metaFile.Close()
	return err
}

// forceCheckpoint has the writer take a checkpoint now and returns once it
// is durable. For tests.
func (s *Store) forceCheckpoint() error { return s.askWriter(ckptRequest{take: true}) }

// flush has the writer commit its open transaction to the file, for
// readers of the file's own transactions (backup, export, check).
// It asks the writer whenever the store may keep one (s.wal is the
// writer's: stopWAL clears it while others call flush).
func (s *Store) flush() error {
	if s.openFor <= 0 || s.readOnly || s.closed() {
		return nil
	}
	return s.askWriter(ckptRequest{commit: true})
}

// waitCheckpoint returns once no checkpoint is in flight. For tests.
func (s *Store) waitCheckpoint() error { return s.askWriter(ckptRequest{}) }

// ckptRequest is a test's request to the writer: wait for the checkpoint
// in flight, and take one when take is set.
type ckptRequest struct {
	take   bool
	commit bool // only commit the open transaction (see flush)
	done   chan error
}

func (s *Store) askWriter(r ckptRequest) error {
	r.done = make(chan error, 1)
	select {
	case s.ckptReq <- r:
	case <-s.closing:
		return errClosed("checkpoint")
	}
	return <-r.done
}

// fail marks the store failed: a write may be on disk and not in the
// file, or the other way round, so no further Update is accepted; the next
// Open recovers from the log.
func (s *Store) fail(err error) {
	e := fmt.Errorf("bbolt: %s: store failed, restart to recover: %w", s.path, err)
	s.failure.CompareAndSwap(nil, &e)
}

// checkpointNow waits for the checkpoint in flight and, when take is set,
// takes one and waits until it is durable. The writer's.
func (s *Store) checkpointNow(take bool) error {
	w := s.wal
	if w == nil {
		return nil
	}
	if w.busy {
		<-w.idle
		w.busy = false
	}
	if !take {
		return nil
	}
	job, err := w.prepare(s.db)
	if err != nil {
		return err
	}
	job.done = make(chan error, 1)
	w.busy, w.last = true, time.Now()
	w.jobs <- job
	err = <-job.done
	<-w.idle
	w.busy = false
	return err
}

// afterCommit runs in the writer after each commit with a log: a due
// checkpoint, or, past the address space reserved (walMmapReserve), the
// end of the log.
func (s *Store) afterCommit(size int64) error {
	if size > s.wal.limit {
		return s.stopWAL()
	}
	return s.maybeCheckpoint()
}
