package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
	"github.com/wicket-run/wicket/store/postgres"
)

// openedStore is the store a command runs on, with what the commands
// report about it.
type openedStore struct {
	kernel.Store
	// desc names the store for logs: a path, or user@host:port/db.
	desc string
	// kind is "bbolt" or "postgres".
	kind string
	// counts returns committed transactions, Update functions, and
	// attempts retried after a conflict with another replica.
	counts func() (commits, updates, conflicts uint64)
	// check verifies the store's invariants.
	check func(ctx context.Context) error
	// bolt is the embedded store, nil on PostgreSQL.
	bolt *bbolt.Store
}

// isPostgres reports whether a --store value names a PostgreSQL database.
func isPostgres(spec string) bool {
	return strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://")
}

// openStore opens the store a --store value names: a postgres:// URL, or
// (empty) the embedded bbolt file under data. noSync skips fsync on bbolt
// and sets synchronous_commit off on PostgreSQL (benchmarks only); noWAL
// commits bbolt with its own fsyncs instead of its write-ahead log;
// commitEvery is bbolt.Options.CommitInterval (zero: the default).
func openStore(ctx context.Context, spec, data string, noSync, noWAL bool, commitEvery time.Duration, onCommit func(took time.Duration, updates int)) (*openedStore, error) {
	switch {
	case spec == "":
		path := filepath.Join(data, "wicket.db")
		st, err := bbolt.Open(path, bbolt.Options{NoSync: noSync, WAL: !noWAL, CommitInterval: commitEvery, OnCommit: onCommit})
		if errors.Is(err, bbolt.ErrLocked) {
			return nil, fmt.Errorf("open store: %w: is another `wicket serve` running with --data %s? stop it, or give this one another --data", err, data)
		}
		if err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		return &openedStore{Store: st, desc: path, kind: "bbolt", bolt: st,
			counts: func() (uint64, uint64, uint64) { s := st.Stats(); return s.Commits, s.Updates, 0 },
			check:  func(context.Context) error { return st.Check() }}, nil
	case isPostgres(spec):
		st, err := postgres.Open(ctx, spec, postgres.Options{NoSyncCommit: noSync, OnCommit: onCommit})
		if err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		return &openedStore{Store: st, desc: st.Name(), kind: "postgres",
			counts: func() (uint64, uint64, uint64) { s := st.Stats(); return s.Commits, s.Updates, s.Conflicts },
			check:  st.Check}, nil
	}
	return nil, usageError{fmt.Sprintf("--store %q: want a postgres:// URL, or nothing for the embedded store under --data", redactSpec(spec))}
}

// redactSpec hides what may be a password in a store spec.
func redactSpec(spec string) string {
	if i := strings.Index(spec, "@"); i >= 0 {
		return "…" + spec[i:]
	}
	return spec
}
