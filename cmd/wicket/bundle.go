package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
	"github.com/wicket-run/wicket/store/bbolt"
)

// The bundle commands manage the bundles a kernel stores, over its API
// (PUT/GET/DELETE /v0/bundles); `bundle rm --data` also works on the store
// of a stopped kernel.

func init() {
	register(
		&command{name: "bundle put", args: "BUNDLE", min: 1, max: 1, client: true, summary: "upload a bundle (directory or .tar.gz) and make it live",
			help: `Builds the bundle's reproducible archive (as "wicket policy build" does) and
uploads it under the name its bundle.yaml gives. The kernel compiles it
before answering; a bundle that does not load is refused whole (400) and the
running revision stays. --tenant (admin keys) uploads into another tenant.`,
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				name := fs.String("name", "", "the name to store it under (must match bundle.yaml's; default: bundle.yaml's)")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					b, err := loadBundle(pos[0])
					if err != nil {
						return refused(pos[0], err)
					}
					n := b.Manifest.Name
					if *name != "" && *name != n {
						return usagef("bundle put: --name %q but %s names %q", *name, pos[0], n)
					}
					data, err := b.TarGz()
					if err != nil {
						return err
					}
					rec, err := o.client().PutBundle(ctx, n, data)
					return printAnswer(stdout, rec, err)
				}
			}},
		&command{name: "bundle get", args: "NAME", min: 1, max: 1, client: true, summary: "print a stored bundle's metadata, or save its archive with -o",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				out := fs.String("o", "", "write the bundle's .tar.gz to this file (- for stdout) instead of printing its metadata")
				return func(ctx context.Context, pos []string, stdout, stderr io.Writer) error {
					c := o.client()
					if *out == "" {
						b, err := c.Bundle(ctx, pos[0])
						return printAnswer(stdout, b, err)
					}
					data, err := c.BundleArchive(ctx, pos[0])
					if err != nil {
						return err
					}
					if *out == "-" {
						_, err = stdout.Write(data)
						return err
					}
					if err := writeFileAtomic(*out, data, 0o644); err != nil {
						return err
					}
					fmt.Fprintf(stderr, "wrote %s (%d bytes)\n", *out, len(data))
					return nil
				}
			}},
		&command{name: "bundle ls", client: true, max: 0, summary: "list stored bundles",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				asJSON := fs.Bool("json", false, "print the answer as JSON instead of a table")
				return func(ctx context.Context, _ []string, stdout, _ io.Writer) error {
					bs, err := o.client().Bundles(ctx)
					if err != nil || *asJSON {
						return printAnswer(stdout, wire.BundleList{Bundles: bs}, err)
					}
					rows := make([][]string, 0, len(bs))
					for _, b := range bs {
						rows = append(rows, []string{b.Name, b.Revision, b.Engine, b.Owner, b.Digest, strconv.Itoa(b.Size), when(b.UpdatedAt)})
					}
					return table(stdout, []string{"NAME", "REVISION", "ENGINE", "OWNER", "SHA256", "SIZE", "UPDATED"}, rows)
				}
			}},
		&command{name: "bundle rm", args: "NAME", min: 1, max: 1, client: true, summary: "remove a bundle (--data: from a stopped kernel's store)",
			help: `Removes a bundle over the API. With --data DIR it removes it from the store
file of a kernel that is not running (a bundle that keeps the kernel from
booting, say); agents bound to it then fail closed until rebound.
--tenant names the bundle's tenant (default: default).`,
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				data := fs.String("data", "", "offline: the data directory of a stopped kernel")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					if *data == "" {
						if err := o.client().DeleteBundle(ctx, pos[0]); err != nil {
							return err
						}
						_, err := fmt.Fprintln(stdout, "deleted", pos[0])
						return err
					}
					tenant := o.tenant
					if tenant == "" {
						tenant = kernel.DefaultTenant
					}
					if err := removeBundleOffline(ctx, *data, tenant, pos[0]); err != nil {
						return err
					}
					_, err := fmt.Fprintf(stdout, "deleted %s/%s from %s\n", tenant, pos[0], storePath(*data))
					return err
				}
			}},
	)
}

// storePath is the store file of a data directory.
func storePath(dataDir string) string { return filepath.Join(dataDir, "wicket.db") }

// openOffline opens the store of a data directory for an offline command:
// it must exist, and no kernel may hold it.
func openOffline(dataDir string, readOnly bool) (*bbolt.Store, error) {
	path := storePath(dataDir)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no store at %s: %w", path, err)
	}
	// Open checks the file, and refuses a crashed store's read-only
	// (ErrUnclean) or applies its log first.
	st, err := bbolt.Open(path, bbolt.Options{Timeout: offlineLockTimeout, ReadOnly: readOnly})
	if errors.Is(err, bbolt.ErrLocked) {
		return nil, fmt.Errorf("%w: is `wicket serve` running on %s? stop it first", err, dataDir)
	}
	return st, err
}

// removeBundleOffline deletes a bundle from the store of a stopped kernel.
func removeBundleOffline(ctx context.Context, dataDir, tenant, name string) error {
	st, err := openOffline(dataDir, false)
	if err != nil {
		return err
	}
	defer st.Close()
	err = st.Update(ctx, func(tx kernel.Tx) error {
		if _, err := tx.Bundle(tenant, name); err != nil {
			if errors.Is(err, kernel.ErrNotFound) {
				return fmt.Errorf("bundle %s of tenant %s is not in %s", name, tenant, st.Path())
			}
			return err
		}
		return tx.DeleteBundle(tenant, name)
	})
	if err != nil {
		return err
	}
	return st.Close()
}

// writeFileAtomic writes data to a temporary file beside path, syncs it and
// renames it over path.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
