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
)

// offlineLockTimeout is how long an offline store command waits for the
// store's lock before saying a kernel holds it.
const offlineLockTimeout = 500 * time.Millisecond

func init() {
	register(
		&command{name: "store check", client: false, max: 0, summary: "verify a store file offline (bbolt pages, event logs, indexes)",
			help: `Opens the store of a stopped kernel read-only (--data DIR, or --file for a
backup) and runs its consistency checker: bbolt's page-level check, every
execution's event log (seq 1..last without gaps, nothing after the terminal
event, one terminal event per step) and every index against its records.
Prints "ok" or the problems found, and exits 1 when there are any.`,
			setup: func(fs *flag.FlagSet, _ *clientOpts) runFunc {
				file := offlineFileFlags(fs)
				return func(_ context.Context, _ []string, stdout, _ io.Writer) error {
					path := file()
					start := time.Now()
					if err := checkStoreFile(path); err != nil {
						return err
					}
					_, err := fmt.Fprintf(stdout, "ok: %s (%s)\n", path, time.Since(start).Round(time.Millisecond))
					return err
				}
			}},
		&command{name: "store compact", max: 0, summary: "rewrite a stopped kernel's store file to give back deleted space",
			help: `Copies the store of a stopped kernel into a new file with bbolt's compaction
(pages filled, free pages dropped) and renames it over the old one; the
store's lock is held throughout, so a running kernel makes it fail. Retention
(serve --retention) deletes records but a bbolt file never shrinks by itself:
this gives the space back. -o writes the compacted copy elsewhere and leaves
the store as it is. It needs free disk space for the copy.`,
			setup: func(fs *flag.FlagSet, _ *clientOpts) runFunc {
				data := fs.String("data", envString("WICKET_DATA", "./wicket-data"), "data directory of a stopped kernel (WICKET_DATA)")
				out := fs.String("o", "", "write the compacted copy to this file instead of replacing the store")
				return func(_ context.Context, _ []string, stdout, _ io.Writer) error {
					start := time.Now()
					st, err := bbolt.Compact(storePath(*data), *out, offlineLockTimeout)
					if errors.Is(err, bbolt.ErrLocked) {
						return fmt.Errorf("%w: is `wicket serve` running on %s? stop it first", err, *data)
					}
					if err != nil {
						return err
					}
					what := storePath(*data)
					if *out != "" {
						what += " into " + *out
					}
					_, err = fmt.Fprintf(stdout, "compacted %s: %s → %s (%s)\n", what, bytesString(st.Before), bytesString(st.After), time.Since(start).Round(time.Millisecond))
					return err
				}
			}},
		&command{name: "store stats", client: false, max: 0, summary: "show where a store file's bytes go, by bucket and record type",
			help: `Opens the store of a stopped kernel read-only (--data DIR, or --file for a
backup) and prints its pages by use (buckets, free pages, the freelist), each
bucket's leaf bytes in use against those allocated, and its records by type
(events by type, step records by status, slots, executions, inputs) with
their average key and value sizes. A record costs its key, its value and 16
bytes of bbolt's element header on a leaf page.`,
			setup: func(fs *flag.FlagSet, _ *clientOpts) runFunc {
				file := offlineFileFlags(fs)
				return func(_ context.Context, _ []string, stdout, _ io.Writer) error {
					rep, err := bbolt.Space(file(), offlineLockTimeout)
					if errors.Is(err, bbolt.ErrLocked) {
						return fmt.Errorf("%w: is `wicket serve` running on it? stop it first, or look at a backup (wicket store backup)", err)
					}
					if err != nil {
						return err
					}
					_, err = rep.WriteTo(stdout)
					return err
				}
			}},
		&command{name: "store backup", client: true, max: 0, summary: "save a consistent copy of a running kernel's store",
			help: `Downloads a hot copy of the store of the kernel at --url (GET /v0/store/backup,
an admin key): the file as of one read transaction, taken while the kernel
serves. It is written beside -o, checked (as "wicket store check" does) and
renamed to -o only when whole and consistent. To restore: stop the kernel,
put the file at DIR/wicket.db (mode 0600) and start it with --data DIR.`,
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				out := fs.String("o", "", "the backup file to write (required)")
				noCheck := fs.Bool("no-check", false, "skip the consistency check of the copy")
				return func(ctx context.Context, _ []string, stdout, _ io.Writer) error {
					if *out == "" {
						return usagef("store backup: -o FILE is required")
					}
					if fi, err := os.Stat(*out); err == nil && fi.IsDir() {
						return usagef("store backup: -o %s is a directory: name the backup file", *out)
					}
					start := time.Now()
					n, err := backupTo(ctx, o, *out, !*noCheck)
					if err != nil {
						return err
					}
					checked := "checked"
					if *noCheck {
						checked = "not checked"
					}
					_, err = fmt.Fprintf(stdout, "wrote %s: %s, %s (%s)\n", *out, bytesString(n), checked, time.Since(start).Round(time.Millisecond))
					return err
				}
			}},
	)
}

// offlineFileFlags defines --data and --file, for the commands that read
// a stopped kernel's store file or a backup, and returns the path they name.
func offlineFileFlags(fs *flag.FlagSet) func() string {
	data := fs.String("data", envString("WICKET_DATA", "./wicket-data"), "data directory of a stopped kernel (WICKET_DATA)")
	file := fs.String("file", "", "a store file (a backup) instead of --data")
	return func() string {
		if *file != "" {
			return *file
		}
		return storePath(*data)
	}
}

// checkStoreFile opens a store file read-only and runs its checker. The
// read-only Open refuses a file a crash left a log beside (ErrUnclean) and
// one too damaged to open (CheckFile) by itself.
func checkStoreFile(path string) error {
	st, err := bbolt.Open(path, bbolt.Options{ReadOnly: true, Timeout: offlineLockTimeout})
	if errors.Is(err, bbolt.ErrLocked) {
		return fmt.Errorf("%w: is `wicket serve` running on it? stop it first, or check a backup (wicket store backup)", err)
	}
	if err != nil {
		return err
	}
	defer st.Close()
	return st.Check()
}

// backupTo downloads a backup to a temporary file beside path, checks it
// and renames it to path.
func backupTo(ctx context.Context, o *clientOpts, path string, check bool) (int64, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".part*")
	var pe *os.PathError
	if errors.As(err, &pe) {
		return 0, fmt.Errorf("-o %s: cannot write in %s: %w", path, filepath.Dir(path), pe.Err)
	}
	if err != nil {
		return 0, err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	n, err := o.client().Backup(ctx, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, err
	}
	if err := os.Chmod(tmp, bbolt.FileMode); err != nil {
		return n, err
	}
	if check {
		if err := checkStoreFile(tmp); err != nil {
			return n, fmt.Errorf("the copy fails its check, %s not written: %w", path, err)
		}
	}
	return n, os.Rename(tmp, path)
}

// bytesString is n in readable units.
func bytesString(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
