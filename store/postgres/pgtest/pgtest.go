// Package pgtest gives tests a PostgreSQL database of their own: a fresh
// schema in the database WICKET_TEST_POSTGRES names, dropped when the test
// ends. Without WICKET_TEST_POSTGRES the test is skipped with a message
// saying how to run it.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/wicket-run/wicket/store/postgres"
)

// Env is the variable naming the test database.
const Env = "WICKET_TEST_POSTGRES"

// SkipMessage is why a PostgreSQL test skips, and how to run it.
const SkipMessage = Env + " is not set: PostgreSQL tests skipped. Run them with " +
	"`eval \"$(.ci/postgres.sh start)\"` (a private cluster from Debian's postgresql), then go test again"

// BaseDSN returns the test database's connection string, or skips tb.
func BaseDSN(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv(Env)
	if dsn == "" {
		tb.Skip(SkipMessage)
	}
	return dsn
}

// Schema creates a schema of its own for tb (dropped at cleanup) and
// returns its name and a connection string whose search_path is that
// schema, for stores opened in this process or in others.
func Schema(tb testing.TB) (schema, dsn string) {
	tb.Helper()
	base := BaseDSN(tb)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema = "t_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := postgres.CreateSchema(ctx, base, schema); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := postgres.DropSchema(ctx, base, schema); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return schema, postgres.WithSearchPath(base, schema)
}

// Open opens a store in a schema of its own; the store is closed (and the
// schema dropped) when tb ends.
func Open(tb testing.TB, opts postgres.Options) *postgres.Store {
	tb.Helper()
	_, dsn := Schema(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := postgres.Open(ctx, dsn, opts)
	if err != nil {
		tb.Fatalf("pgtest: open: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}
