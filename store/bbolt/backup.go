package bbolt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Backup writes a consistent copy of the whole store to w: the file as of
// one read transaction, taken while writers go on (bbolt's Tx.WriteTo).
// The copy is a store file Open accepts as is. It returns the bytes
// written, which the copy's size equals when err is nil.
//
// While it runs, pages freed by later commits cannot be reused (the file
// may grow by what is written meanwhile), and a commit that must grow the
// memory map waits for the copy to end. ctx is checked as the copy is
// written: a cancelled backup stops with ctx's error.
func (s *Store) Backup(ctx context.Context, w io.Writer) (int64, error) {
	if s.closed() {
		return 0, errClosed("backup")
	}
	if err := s.flush(); err != nil {
		return 0, err
	}
	var n int64
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		n, err = tx.WriteTo(ctxWriter{ctx: ctx, w: w})
		return err
	})
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr // bbolt's WriteTo does not wrap the writer's error
		}
		return n, fmt.Errorf("bbolt: backup %s: %w", s.path, err)
	}
	return n, nil
}

// ctxWriter fails writes once ctx is done.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// CompactStats are the sizes Compact saw.
type CompactStats struct {
	Before, After int64
}

// openOffline opens the store file at path read-only for an offline tool
// (op names it in errors), after CheckClean and CheckFile: a running
// kernel's lock makes it fail with ErrLocked after timeout. o's Timeout
// and ReadOnly are set here.
func openOffline(op, path string, timeout time.Duration, o bolt.Options) (*bolt.DB, error) {
	if err := CheckClean(path); err != nil {
		return nil, fmt.Errorf("bbolt: %s %s: %w", op, path, err)
	}
	if err := CheckFile(path); err != nil {
		return nil, err
	}
	o.Timeout, o.ReadOnly = timeout, true
	db, err := bolt.Open(path, FileMode, &o)
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("bbolt: %s %s: %w (gave up after %s)", op, path, ErrLocked, timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("bbolt: %s %s: %w", op, path, err)
	}
	return db, nil
}

// Compact rewrites the store file at path into a new file with bbolt's
// compaction (every page filled, free pages dropped) and renames it over
// path, giving back the space deleted records left behind. The store must
// not be open: Compact holds the file's lock throughout and fails with
// ErrLocked after timeout when another process (a running kernel) holds it.
// With dst set, the compacted copy is written there instead and path is
// left as it was.
func Compact(path, dst string, timeout time.Duration) (CompactStats, error) {
	var st CompactStats
	fi, err := os.Stat(path)
	if err != nil {
		return st, fmt.Errorf("bbolt: compact %s: %w", path, err)
	}
	st.Before = fi.Size()
	src, err := openOffline("compact", path, timeout, bolt.Options{})
	if err != nil {
		return st, err
	}
	defer src.Close() // the lock is held until the new file is in place
	if err := checkSchema(src); err != nil {
		return st, fmt.Errorf("bbolt: compact %s: %w", path, err)
	}
	inPlace := dst == ""
	if inPlace {
		dst = path + ".compact"
		if err := removeStaleCopy(dst); err != nil {
			return st, fmt.Errorf("bbolt: compact %s: %w", path, err)
		}
	}
	if _, err := os.Stat(dst); err == nil {
		return st, fmt.Errorf("bbolt: compact %s: %s already exists (remove it)", path, dst)
	}
	// Created, never opened: a second compaction at the same time fails
	// here instead of waiting for the lock of a file renamed over path.
	exclusive := func(name string, flag int, perm os.FileMode) (*os.File, error) {
		return os.OpenFile(name, flag|os.O_CREATE|os.O_EXCL, perm)
	}
	out, err := bolt.Open(dst, FileMode, &bolt.Options{NoSync: true, FreelistType: bolt.FreelistMapType, OpenFile: exclusive})
	if err != nil {
		return st, fmt.Errorf("bbolt: compact %s: create %s: %w", path, dst, err)
	}
	fail := func(err error) (CompactStats, error) {
		_ = out.Close()
		_ = os.Remove(dst)
		return st, fmt.Errorf("bbolt: compact %s: %w", path, err)
	}
	if err := bolt.Compact(out, src, 64<<20); err != nil {
		return fail(err)
	}
	if err := out.Sync(); err != nil {
		return fail(err)
	}
	if err := out.Close(); err != nil {
		return fail(err)
	}
	if fi, err := os.Stat(dst); err == nil {
		st.After = fi.Size()
	}
	if !inPlace {
		return st, nil
	}
	if err := os.Rename(dst, path); err != nil {
		_ = os.Remove(dst)
		return st, fmt.Errorf("bbolt: compact %s: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return st, nil
}

// removeStaleCopy removes the copy a compaction killed before its rename
// left at dst (nobody holds its lock), so that the next one goes ahead;
// a copy whose lock is held is another compaction's, running.
func removeStaleCopy(dst string) error {
	release, held, err := lockFree(dst)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if held {
		return fmt.Errorf("%s is being written by another compaction", dst)
	}
	defer release()
	if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the copy a compaction left: %w", err)
	}
	return nil
}
