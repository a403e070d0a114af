package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/wicket-run/wicket/store/bbolt"
	"github.com/wicket-run/wicket/store/storecopy"
)

func init() {
	register(&command{name: "store copy", max: 0, summary: "copy a store into an empty one (embedded directory ↔ PostgreSQL), verified",
		help: `Copies every record of a store into another, empty, one, in either direction:
each side is a data directory (its wicket.db) or a postgres:// URL. Stop the
kernels first. The copy is verified: the source must pass its checker, the
destination passes its own afterwards, and a SHA-256 over every record read
back from the destination must equal the source's. A destination that is
not empty is refused.`,
		setup: func(fs *flag.FlagSet, _ *clientOpts) runFunc {
			from := fs.String("from", "", "source: a data directory (its wicket.db) or a postgres:// URL")
			to := fs.String("to", "", "destination (must be empty): a data directory or a postgres:// URL")
			return func(ctx context.Context, _ []string, stdout, _ io.Writer) error {
				return storeCopy(ctx, *from, *to, stdout)
			}
		}})
}

// copyStore is a store opened for a copy: it can export, and be checked.
type copyStore struct {
	*openedStore
	storecopy.Source
}

// openCopyStore opens the store a --from or --to value names: a
// postgres:// URL, or a data directory (its wicket.db). A source must
// exist; a destination directory is created.
func openCopyStore(ctx context.Context, spec string, source bool) (*copyStore, error) {
	st, dir := spec, ""
	if !isPostgres(spec) {
		st, dir = "", spec
		if source {
			if _, err := os.Stat(filepath.Join(dir, "wicket.db")); err != nil {
				return nil, fmt.Errorf("store copy: no store in %s: %w", dir, err)
			}
		} else if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("store copy: create %s: %w", dir, err)
		}
	}
	o, err := openStore(ctx, st, dir, false, true, 0, nil)
	if errors.Is(err, bbolt.ErrLocked) {
		return nil, fmt.Errorf("store copy: %s: %w: is `wicket serve` running on it? stop it first", dir, bbolt.ErrLocked)
	}
	if err != nil {
		return nil, err
	}
	src, ok := o.Store.(storecopy.Source)
	if !ok {
		_ = o.Close()
		return nil, fmt.Errorf("store copy: %s cannot export", o.kind)
	}
	return &copyStore{openedStore: o, Source: src}, nil
}

// sameDir reports whether two data directories (not postgres:// URLs) are
// one: the same path however spelled, or the same directory.
func sameDir(a, b string) bool {
	if isPostgres(a) || isPostgres(b) {
		return false
	}
	aa, err1 := filepath.Abs(a)
	ab, err2 := filepath.Abs(b)
	if err1 == nil && err2 == nil && aa == ab {
		return true
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// storeCopy copies every record of one store into another, empty, one
// and proves the copy: both checkers pass and the records read back from
// the destination have the source's digest.
func storeCopy(ctx context.Context, from, to string, stdout io.Writer) error {
	if from == "" || to == "" {
		return usageError{"store copy: want --from and --to (a data directory or a postgres:// URL each)"}
	}
	if from == to || sameDir(from, to) {
		return usageError{"store copy: --from and --to name the same store"}
	}
	src, err := openCopyStore(ctx, from, true)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := openCopyStore(ctx, to, false)
	if err != nil {
		return err
	}
	defer dst.Close()
	if err := src.check(ctx); err != nil {
		return fmt.Errorf("store copy: the source does not pass its check, nothing copied: %w", err)
	}
	want, err := storecopy.Digest(ctx, src)
	if err != nil {
		return fmt.Errorf("store copy: read the source: %w", err)
	}
	counts, err := storecopy.Copy(ctx, src, dst, dst)
	if err != nil {
		if errors.Is(err, storecopy.ErrNotEmpty) {
			return fmt.Errorf("store copy: %s: %w", dst.desc, err)
		}
		return fmt.Errorf("store copy: %w (the destination holds a partial copy: empty it before trying again)", err)
	}
	if err := dst.check(ctx); err != nil {
		return fmt.Errorf("store copy: the copy does not pass its check: %w", err)
	}
	got, err := storecopy.Digest(ctx, dst)
	if err != nil {
		return fmt.Errorf("store copy: read the copy back: %w", err)
	}
	if got.Digest != want.Digest {
		return fmt.Errorf("store copy: the copy differs from the source: source %s (%s), copy %s (%s)", want.Digest, want.Counts, got.Digest, got.Counts)
	}
	note := fmt.Sprintf("copied from a %s store at %s, records sha256 %s", src.kind, time.Now().UTC().Format(time.RFC3339), got.Digest)
	if err := storecopy.Finish(ctx, dst, note); err != nil {
		return fmt.Errorf("store copy: the copy is verified, but %w (a kernel will refuse it: copy again)", err)
	}
	fmt.Fprintf(stdout, "copied %s (%s) to %s (%s)\n", src.desc, src.kind, dst.desc, dst.kind)
	fmt.Fprintf(stdout, "records: %s\n", counts)
	fmt.Fprintf(stdout, "verified: both stores pass their checks; sha256 of the records %s on both sides\n", got.Digest)
	return nil
}
