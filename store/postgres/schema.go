package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrNewerSchema is returned by Open for a database migrated by a newer binary.
var ErrNewerSchema = errors.New("store schema is newer than this binary supports")

// migrations[v] takes the schema from version v to v+1. They are applied in
// order, in one transaction, under an advisory lock (replicas starting
// together migrate once), and never edited once released: a change of layout
// is a new entry.
var migrations = []string{
	0: schemaV1,
}

// SchemaVersion is the schema version this binary writes: the number of
// migrations it knows.
var SchemaVersion = len(migrations)

// schemaV1 is the first layout. Every key starts with the tenant; text keys
// are in the "C" collation so that their order is byte order (keyset paging
// and the conformance suite rely on it); free-form keys (idempotency keys,
// counter and occurrence keys) are bytea. Times are Unix nanoseconds
// (bigint), exact, with the zero time as the smallest bigint. doc is the
// record's JSON (codec.go). Executions are rewritten at every step and
// steps once when they end: their pages keep room (fillfactor) so that
// those updates stay on the page and leave the indexes alone (HOT), which
// they can since the indexed columns rarely change (renew moves a lease
// only every eighth of its length).
const schemaV1 = `
CREATE TABLE executions (
	tenant         text COLLATE "C" NOT NULL,
	id             text COLLATE "C" NOT NULL,
	agent_id       text COLLATE "C" NOT NULL,
	status         text NOT NULL,
	idem_key       bytea,
	dispatch_state text NOT NULL,
	due_at         bigint NOT NULL,
	lease_until    bigint NOT NULL,
	last_seq       bigint NOT NULL,
	doc            bytea NOT NULL,
	PRIMARY KEY (tenant, id),
	CONSTRAINT executions_id_key UNIQUE (id),
	CONSTRAINT executions_idem_key UNIQUE (tenant, idem_key) DEFERRABLE INITIALLY DEFERRED
) WITH (fillfactor = 70);
CREATE INDEX executions_due ON executions (due_at, tenant, id) WHERE dispatch_state = 'queued';
CREATE INDEX executions_lease ON executions (lease_until, tenant, id) WHERE dispatch_state IN ('delivering', 'acked');

CREATE TABLE steps (
	tenant       text COLLATE "C" NOT NULL,
	execution_id text COLLATE "C" NOT NULL,
	id           text COLLATE "C" NOT NULL,
	seq          bigint NOT NULL,
	doc          bytea NOT NULL,
	PRIMARY KEY (tenant, execution_id, id)
) WITH (fillfactor = 90);

CREATE TABLE occurrences (
	tenant       text COLLATE "C" NOT NULL,
	execution_id text COLLATE "C" NOT NULL,
	key          bytea NOT NULL,
	dispatch_id  text NOT NULL,
	attempt      integer NOT NULL,
	count        integer NOT NULL,
	PRIMARY KEY (tenant, execution_id, key)
);

CREATE TABLE events (
	tenant       text COLLATE "C" NOT NULL,
	execution_id text COLLATE "C" NOT NULL,
	seq          bigint NOT NULL,
	type         text NOT NULL,
	at           bigint NOT NULL,
	payload      bytea NOT NULL,
	PRIMARY KEY (tenant, execution_id, seq)
);

CREATE TABLE agents (
	tenant text COLLATE "C" NOT NULL,
	id     text COLLATE "C" NOT NULL,
	doc    bytea NOT NULL,
	PRIMARY KEY (tenant, id)
);

CREATE TABLE approvals (
	tenant     text COLLATE "C" NOT NULL,
	id         text COLLATE "C" NOT NULL,
	status     text NOT NULL,
	expires_at bigint NOT NULL,
	created_at bigint NOT NULL,
	doc        bytea NOT NULL,
	PRIMARY KEY (tenant, id)
);
CREATE INDEX approvals_expiry ON approvals (expires_at, tenant, id) WHERE status = 'pending';

CREATE TABLE bundles (
	tenant  text COLLATE "C" NOT NULL,
	name    text COLLATE "C" NOT NULL,
	doc     bytea NOT NULL,
	archive bytea NOT NULL,
	PRIMARY KEY (tenant, name)
);

CREATE TABLE counters (
	tenant text COLLATE "C" NOT NULL,
	key    bytea NOT NULL,
	value  bytea NOT NULL,
	PRIMARY KEY (tenant, key)
);

CREATE TABLE tenants (
	id  text COLLATE "C" PRIMARY KEY,
	doc bytea NOT NULL
);

CREATE TABLE api_keys (
	tenant text COLLATE "C" NOT NULL,
	id     text COLLATE "C" NOT NULL,
	hash   text COLLATE "C" NOT NULL,
	doc    bytea NOT NULL,
	PRIMARY KEY (tenant, id),
	CONSTRAINT api_keys_hash_key UNIQUE (hash) DEFERRABLE INITIALLY DEFERRED
);
`

// migrationLock is the advisory lock key Open holds while it migrates
// ("wicket" in ASCII).
const migrationLock = 0x7769636b6574

// migrate brings the schema to SchemaVersion in one transaction, or refuses
// a database whose schema is newer than this binary's. upTo bounds the
// version it migrates to (tests of older layouts); <= 0 means all.
func migrate(ctx context.Context, conn *pgx.Conn, upTo int) error {
	if upTo <= 0 || upTo > len(migrations) {
		upTo = len(migrations)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Serializes concurrent Opens of one database; released at commit.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	if err := createSchema(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS wicket_schema (
		version    integer PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("migrate: create wicket_schema: %w", err)
	}
	var v int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM wicket_schema`).Scan(&v); err != nil {
		return fmt.Errorf("migrate: read version: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("database has schema version %d, this binary supports up to %d (upgrade wicket): %w",
			v, len(migrations), ErrNewerSchema)
	}
	if v >= upTo {
		return nil
	}
	for ; v < upTo; v++ {
		if _, err := tx.Exec(ctx, migrations[v]); err != nil {
			return fmt.Errorf("migrate schema %d → %d: %w", v, v+1, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO wicket_schema (version) VALUES ($1)`, v+1); err != nil {
			return fmt.Errorf("migrate schema %d → %d: record version: %w", v, v+1, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	return nil
}

// createSchema creates the schema the connection's search_path names first
// when it does not exist (current_schema() is then null), so that a URL
// with ?search_path=NAME works on an empty database. It runs under the
// migration lock: replicas starting together create it once (CREATE SCHEMA
// IF NOT EXISTS alone is not safe against a concurrent one).
func createSchema(ctx context.Context, tx pgx.Tx) error {
	var current *string
	if err := tx.QueryRow(ctx, `SELECT current_schema()`).Scan(&current); err != nil {
		return fmt.Errorf("migrate: read current schema: %w", err)
	}
	if current != nil {
		return nil
	}
	var path, user string
	if err := tx.QueryRow(ctx, `SELECT current_setting('search_path'), current_user`).Scan(&path, &user); err != nil {
		return fmt.Errorf("migrate: read search_path: %w", err)
	}
	name := firstInPath(path, user)
	if name == "" {
		return fmt.Errorf("migrate: the search_path (%q) names no schema to create the tables in; set ?search_path=NAME in the URL", path)
	}
	if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("migrate: create schema %q, the first of the search_path: %w", name, err)
	}
	return nil
}

// firstInPath returns the first schema of a search_path setting (a list of
// identifiers, double-quoted or not; "$user" is the user's name).
func firstInPath(path, user string) string {
	path = strings.TrimSpace(path)
	var name string
	if strings.HasPrefix(path, `"`) {
		var b strings.Builder
		for i := 1; i < len(path); i++ {
			if path[i] == '"' {
				if i+1 < len(path) && path[i+1] == '"' {
					b.WriteByte('"')
					i++
					continue
				}
				break
			}
			b.WriteByte(path[i])
		}
		name = b.String()
	} else {
		name, _, _ = strings.Cut(path, ",")
		name = strings.ToLower(strings.TrimSpace(name)) // unquoted identifiers fold to lower case
	}
	if name == "$user" {
		return user
	}
	return name
}
