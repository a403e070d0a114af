package bbolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/wicket-run/wicket/kernel"
	bolt "go.etcd.io/bbolt"
)

// errRecordTooLarge is the error of an Update whose writes exceed the
// largest record of the write-ahead log (walMaxRecord).
var errRecordTooLarge = fmt.Errorf("more than one commit of the write-ahead log can hold (%d MiB)", walMaxRecord>>20)

// request is one Update waiting for the writer.
type request struct {
	ctx  context.Context
	fn   func(kernel.Tx) error
	done chan error // buffered (1): the writer never blocks answering
}

// PanicError is what Update returns when its function panicked.
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the goroutine stack at the panic.
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("bbolt: update function panicked: %v", e.Value)
}

// run is the writer goroutine: it owns every write transaction. It returns
// when Close is called, after committing the requests already waiting.
func (s *Store) run() {
	defer close(s.stopped)
	batch := make([]*request, 0, s.maxBatch)
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	for {
		// An open transaction is committed once it is openFor old, by
		// the next batch or, when none comes, by idle.
		// A failed store commits nothing more (commitOpen): its writer
		// waits for Updates to refuse and for Close.
		var idleC <-chan time.Time
		if s.open != nil && s.failure.Load() == nil {
			idle.Reset(s.openFor - time.Since(s.openAt))
			idleC = idle.C
		}
		select {
		case <-idleC:
			s.idleWakes.Add(1)
			_ = s.commitOpenLocked()
		case r := <-s.ckptReq:
			if r.take || r.commit {
				if err := s.commitOpenLocked(); err != nil || r.commit {
					r.done <- err
					continue
				}
			}
			r.done <- s.checkpointNow(r.take)
		case r := <-s.reqs:
			s.waiting.Add(-1)
			batch = s.gatherMore(s.collect(append(batch[:0], r)))
			n := len(batch)
			s.commit(batch)
			// The n callers just answered will likely come back, and the
			// Updates that were waiting as they were answered are other
			// writers: that many are active. (Read after the answers, the
			// count could hold a caller just answered and already back
			// with its next Update, counted twice: a lone caller in the
			// same process would then wait a window for itself.)
			s.expect = n + s.others
			// A due commit of the file comes after the answers, while
			// their callers are on their way back, not before.
			if s.open != nil && (time.Since(s.openAt) >= s.openFor || s.pendingSize >= openMaxBytes) {
				_ = s.commitOpenLocked()
			}
		case <-s.closing:
			for {
				select {
				case r := <-s.reqs:
					s.waiting.Add(-1)
					s.commit(s.collect(append(batch[:0], r)))
				default:
					s.mu.Lock()
					if s.commitOpen() != nil && s.open != nil {
						_ = s.open.Rollback() // failed: the log has it
						s.open = nil
						if len(s.pending) > 0 {
							// A View racing Close must not read the
							// file without them.
							s.lost.Store(true)
						}
					}
					s.mu.Unlock()
					return
				}
			}
		}
		idle.Stop()
	}
}

// collect adds to batch every request already waiting, up to maxBatch. It
// never waits: a lone request is committed at once.
func (s *Store) collect(batch []*request) []*request {
	for len(batch) < s.maxBatch {
		select {
		case r := <-s.reqs:
			s.waiting.Add(-1)
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// gatherMore holds the batch open, up to the gather window (no longer than
// three times the last commit), until as many
// requests as there were active writers at the last commit have arrived. A
// window that brings nobody turns gathering off for the next 16 commits, so
// a lone or thinning set of writers pays it rarely.
func (s *Store) gatherMore(batch []*request) []*request {
	if s.gather <= 0 || s.maxBatch <= 1 {
		return batch
	}
	if s.cool > 0 {
		s.cool--
		return batch
	}
	target := min(s.expect, s.maxBatch)
	if len(batch) >= target {
		return batch
	}
	// The window is three times the last commit's duration, at most the
	// configured one: with a log, a commit is one record's sync (about
	// 0.7 ms here), shorter than the round trip that brings the callers
	// just answered back (their HTTP answer, the agent, the next request
	// and its read), so a window of one commit closed before most of them
	// were back; three brings 9 updates per sync at 10 executions against
	// 4.7, for less CPU and latency (docs/RATIONALE.md, "The writer's open
	// transaction"). The window closes as soon as they are all there, and
	// a store without fsync, whose commits take a fraction of a
	// millisecond, waits no more than that.
	window := min(s.gather, 3*s.lastCommit)
	if window <= 0 {
		return batch
	}
	start := len(batch)
	s.windows.Add(1)
	timer := time.NewTimer(window)
	defer timer.Stop()
	for len(batch) < target {
		select {
		case r := <-s.reqs:
			s.waiting.Add(-1)
			batch = append(batch, r)
		case <-timer.C:
			if len(batch) == start {
				s.cool = 16
			}
			return batch
		case <-s.closing:
			return batch
		}
	}
	return batch
}

// commit runs batch in one transaction and answers every request. A request
// whose function fails is answered with its error and removed, and the
// rest are run again in a fresh transaction, so each caller observes a
// serial order of the committed functions.
func (s *Store) commit(batch []*request) {
	live := batch[:0]
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.done <- fmt.Errorf("bbolt: update: %w", err)
			continue
		}
		if f := s.failure.Load(); f != nil {
			r.done <- *f
			continue
		}
		live = append(live, r)
	}
	for len(live) > 0 {
		failed, ferr, err := s.try(live)
		if errors.Is(err, errRecordTooLarge) && len(live) > 1 {
			// Together past the log's largest record: each alone.
			for _, r := range live {
				s.commit([]*request{r})
			}
			return
		}
		if failed >= 0 {
			s.retries.Add(1)
			live[failed].done <- ferr
			live = append(live[:failed], live[failed+1:]...)
			continue
		}
		if err == nil {
			s.commits.Add(1)
			s.updates.Add(uint64(len(live)))
		}
		s.others = int(s.waiting.Load())
		for _, r := range live {
			r.done <- err
		}
		return
	}
}

// tryOpen is try with a write-ahead log: the functions of batch run in
// the writer's open bbolt transaction (begun if there is none), their
// record is appended and synced, and the transaction is committed to the
// file only once it is older than openFor (by run, after the answers).
// Until then the batch is durable (its record is in the log) and visible
// to View, which reads the open transaction under s.mu's read lock.
//
// The writer holds s.mu while the functions run, and lets it go for the
// record's sync: a View may then read the batch, but does not return
// until the batch's record is synced (see View), so nothing read from a
// batch reaches a caller before the batch is durable, and readers work
// while the disk syncs instead of waiting for it. A function that fails
// rolls the open transaction back, and the records of the batches before
// it in the same transaction are applied again to a fresh one
// (s.pending); so does a failed sync, whose batch readers were shown and
// now get the store's failure instead.
func (s *Store) tryOpen(batch []*request) (failed int, fnErr, err error) {
	begin := time.Now()
	s.mu.Lock()
	locked := true
	defer func() {
		if locked {
			s.mu.Unlock()
		}
	}()
	if s.open == nil {
		btx, err := s.begin()
		if err != nil {
			return -1, nil, fmt.Errorf("bbolt: update %s: begin: %w", s.path, err)
		}
		s.open, s.openAt = btx, begin
	}
	rec := &s.rec
	if s.wal != nil {
		rec = &s.wal.batch
	}
	rec.reset()
	tx := &writeTx{readTx: readTx{tx: s.open, write: true}, log: rec}
	for i, r := range batch {
		if err := call(r.fn, tx); err != nil {
			if rerr := s.reopen(); rerr != nil {
				s.fail(rerr)
				return -1, nil, fmt.Errorf("bbolt: update %s: %w", s.path, rerr)
			}
			return i, err, nil
		}
	}
	t0 := time.Now()
	s.fnTime.Add(int64(t0.Sub(begin)))
	if len(rec.buf)-walHeaderSize > walMaxRecord {
		if rerr := s.reopen(); rerr != nil {
			s.fail(rerr)
			return -1, nil, fmt.Errorf("bbolt: update %s: %w", s.path, rerr)
		}
		return -1, nil, fmt.Errorf("bbolt: update %s: %d bytes of writes: %w", s.path, len(rec.buf)-walHeaderSize, errRecordTooLarge)
	}
	if w := s.wal; w != nil && rec.ops > 0 {
		// Views from here on read the batch and wait for its sync.
		s.applied++
		synced := make(chan struct{})
		s.synced = synced
		s.mu.Unlock()
		locked = false
		if testHookSync != nil {
			testHookSync()
		}
		err := w.log.append(rec)
		if err != nil {
			// The batches answered before stay readable; this one goes,
			// and the Views that read it get the failure.
			s.fail(err)
			s.mu.Lock()
			_ = s.reopen()               // marks the store lost if answered batches become unreadable
			s.applied = s.durable.Load() // later Views read without it
			s.mu.Unlock()
			close(synced)
			return -1, nil, fmt.Errorf("bbolt: update %s: %w", s.path, err)
		}
		s.durable.Store(s.applied)
		close(synced)
	}
	if rec.ops > 0 {
		s.pending = append(s.pending, bytes.Clone(rec.buf[walHeaderSize:]))
		s.pendingSize += len(rec.buf)
	}
	t1 := time.Now()
	s.logTime.Add(int64(t1.Sub(t0)))
	// The file's commit, when due, is run's, once the callers are answered.
	took := time.Since(t0)
	s.lastCommit = took
	if s.onCommit != nil {
		s.onCommit(took, len(batch))
	}
	return -1, nil, nil
}

// testHookSync, when set (tests), runs in tryOpen between the batch's
// functions and its record's append and sync, with s.mu released.
var testHookSync func()

// openMaxBytes bounds the records an open transaction holds: past it, the
// transaction is committed, so that one commit grows the file by a
// bounded amount (the log's mapping reserve, walMmapReserve, is checked
// after each commit).
const openMaxBytes = 4 << 20

// reopen rolls the open transaction back and applies the records of the
// batches already answered to a fresh one. The writer's, under s.mu.
func (s *Store) reopen() error {
	if s.open != nil {
		_ = s.open.Rollback()
		s.open = nil
	}
	btx, err := s.begin()
	if err != nil {
		// The batches answered are in the log, no longer readable.
		if len(s.pending) > 0 {
			s.lost.Store(true)
		}
		return fmt.Errorf("begin: %w", err)
	}
	for _, p := range s.pending {
		if _, err := applyOps(btx, p); err != nil {
			_ = btx.Rollback()
			s.lost.Store(true)
			return fmt.Errorf("apply the open transaction's records again: %w", err)
		}
	}
	s.open = btx
	return nil
}

// commitOpen commits the open transaction, if any, to the file (without
// fsync: the checkpoints sync it), and takes a checkpoint when one is due.
// The writer's, under s.mu. A failed commit fails the store: its batches
// are in the log, for the next Open, and no longer readable meanwhile.
func (s *Store) commitOpen() error {
	if s.open == nil {
		return nil
	}
	if s.failure.Load() != nil {
		// A failed store commits nothing more; its open transaction
		// stays readable until Close.
		return *s.failure.Load()
	}
	t := time.Now()
	err := s.open.Commit()
	s.open = nil
	s.fileTime.Add(int64(time.Since(t)))
	if err != nil {
		err = fmt.Errorf("bbolt: commit %s: %w", s.path, err)
		s.fail(err)
		// The batches answered are in the log; readers get them back
		// from the records kept (reopen marks the store lost if not).
		_ = s.reopen()
		return err
	}
	clear(s.pending)
	s.pending, s.pendingSize = s.pending[:0], 0
	s.fileCommits.Add(1)
	if s.wal == nil {
		return nil
	}
	s.wal.hintWriteback()
	var size int64
	if err := s.db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err != nil {
		s.fail(err)
		return err
	}
	if err := s.afterCommit(size); err != nil {
		s.fail(err)
		return err
	}
	return nil
}

// commitOpenLocked is commitOpen under s.mu.
func (s *Store) commitOpenLocked() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commitOpen()
}

// begin begins the writer's open transaction. Every bucket is opened in
// it first: bbolt caches the buckets a write transaction opens, and with
// all of them cached, Views reading it together (under s.mu's read lock)
// only read the cache.
func (s *Store) begin() (*bolt.Tx, error) {
	btx, err := s.db.Begin(true)
	if err != nil {
		return nil, err
	}
	if err := btx.ForEach(func([]byte, *bolt.Bucket) error { return nil }); err != nil {
		_ = btx.Rollback()
		return nil, err
	}
	return btx, nil
}

// try runs the functions of batch in order in one transaction and commits
// it. It returns the index and error of the first function that failed (the
// transaction is then rolled back), or -1 and the commit's error.
func (s *Store) try(batch []*request) (failed int, fnErr, err error) {
	if s.openFor > 0 && (s.wal != nil || s.noSync) {
		return s.tryOpen(batch)
	}
	if s.wal == nil {
		if err := s.checkFile(); err != nil {
			return -1, nil, err
		}
	}
	begin := time.Now()
	btx, err := s.db.Begin(true)
	if err != nil {
		return -1, nil, fmt.Errorf("bbolt: update %s: begin: %w", s.path, err)
	}
	tx := &writeTx{readTx: readTx{tx: btx}}
	w := s.wal
	if w != nil {
		w.batch.reset()
		tx.log = &w.batch
	}
	for i, r := range batch {
		if err := call(r.fn, tx); err != nil {
			_ = btx.Rollback()
			return i, err, nil
		}
	}
	t0 := time.Now()
	s.fnTime.Add(int64(t0.Sub(begin)))
	if w != nil && len(w.batch.buf)-walHeaderSize > walMaxRecord {
		// Recovery would take its record for a write the crash cut
		// short, and end the log there (TestWALRecordTooLarge).
		_ = btx.Rollback()
		return -1, nil, fmt.Errorf("bbolt: update %s: %d bytes of writes: %w", s.path, len(w.batch.buf)-walHeaderSize, errRecordTooLarge)
	}
	t1 := t0
	if w != nil && w.batch.ops > 0 {
		// Durable before visible: the record is synced before bbolt's
		// commit (without fsync) shows the writes to readers.
		if err := w.log.append(&w.batch); err != nil {
			_ = btx.Rollback()
			s.fail(err)
			return -1, nil, fmt.Errorf("bbolt: update %s: %w", s.path, err)
		}
		t1 = time.Now()
		s.logTime.Add(int64(t1.Sub(t0)))
	}
	size := btx.Size()
	if err := btx.Commit(); err != nil {
		if w != nil && w.batch.ops > 0 {
			// Its record is in the log: the next Open applies it.
			s.fail(err)
		}
		return -1, nil, fmt.Errorf("bbolt: update %s: commit: %w", s.path, err)
	}
	if w != nil {
		if err := s.afterCommit(size); err != nil {
			s.fail(err)
		}
	}
	took := time.Since(t0)
	s.fileTime.Add(int64(took - t1.Sub(t0)))
	s.lastCommit = took
	if s.onCommit != nil {
		s.onCommit(took, len(batch))
	}
	return -1, nil, nil
}

// call runs fn, turning a panic into a *PanicError.
func call(fn func(kernel.Tx) error, tx *writeTx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{Value: p, Stack: debug.Stack()}
		}
	}()
	return fn(tx)
}
