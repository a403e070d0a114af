package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wicket-run/wicket/kernel"
)

// Defaults of Options.
const (
	DefaultMaxBatch   = 64
	DefaultMaxConns   = 16
	DefaultTxTimeout  = 30 * time.Second
	DefaultMaxRetries = 64
)

// Options configure Open. The zero value is usable.
type Options struct {
	// Schema, when set, is the PostgreSQL schema holding the tables
	// (created if missing); otherwise the connection's search_path decides
	// (by default the public schema).
	Schema string
	// MaxConns bounds the pool of connections that serve View (zero:
	// DefaultMaxConns). The writer and the feed have one connection each
	// besides.
	MaxConns int32
	// MaxBatch caps how many Update functions share one transaction (zero:
	// DefaultMaxBatch; 1 disables group commit).
	MaxBatch int
	// TxTimeout bounds one attempt of a write transaction (zero:
	// DefaultTxTimeout).
	TxTimeout time.Duration
	// MaxRetries bounds how many times a batch is run again after a
	// serialization failure or a deadlock (zero: DefaultMaxRetries).
	MaxRetries int
	// AppName is the application_name the connections report in
	// pg_stat_activity (default "wicket").
	AppName string
	// Serializable runs write transactions at SERIALIZABLE instead of
	// REPEATABLE READ (see the package doc: the kernel does not need it,
	// and it costs throughput between replicas).
	Serializable bool
	// NoSyncCommit sets synchronous_commit off: a commit returns before
	// its WAL reaches the disk, so a crash of the database server may lose
	// the last acknowledged commits (never corrupt). For benchmarks only.
	NoSyncCommit bool
	// OnCommit, when set, is called by the writer after each commit with
	// the time the committed attempt took (its statements and the COMMIT)
	// and the number of Update functions it carried. It must be quick: the
	// writer waits for it.
	OnCommit func(took time.Duration, updates int)
}

func (o Options) withDefaults() Options {
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.TxTimeout <= 0 {
		o.TxTimeout = DefaultTxTimeout
	}
	if o.MaxRetries <= 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	if o.AppName == "" {
		o.AppName = "wicket"
	}
	return o
}

// Store is a kernel.Store on a PostgreSQL database. It is safe for
// concurrent use, and several Stores (in several processes) may share one
// database.
type Store struct {
	pool *pgxpool.Pool
	name string // the database, for messages (no credentials)
	opts Options

	connConfig *pgx.ConnConfig // for the writer's and the feed's own connections
	wconn      *pgx.Conn       // the writer's connection (the writer goroutine's alone)
	channel    string          // the feed's NOTIFY channel: "wicket:" + schema
	origin     string          // this store's id in its notifications

	reqs      chan *request // unbuffered: a sender blocks until the writer takes it
	closing   chan struct{} // closed by Close
	stopped   chan struct{} // closed when the writer returns
	closeOnce sync.Once

	waiting   atomic.Int64  // Updates waiting for the writer to take them
	commits   atomic.Uint64 // committed write transactions
	updates   atomic.Uint64 // Update functions committed
	conflicts atomic.Uint64 // attempts run again after a serialization failure or deadlock

	listenErrors atomic.Uint64 // feed connections lost
}

var _ kernel.Store = (*Store)(nil)

// Open connects to the database dsn names (a postgres:// URL or a
// key=value connection string), creates or migrates the schema to
// SchemaVersion and starts the writer.
//
// # Errors
//
// Open refuses a database whose schema is newer (ErrNewerSchema) and
// reports a database it cannot reach; messages name the database, never
// its password.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	return openVersion(ctx, dsn, opts, 0)
}

// openVersion is Open migrating no further than schema version upTo (<= 0:
// SchemaVersion), for tests of older layouts.
func openVersion(ctx context.Context, dsn string, opts Options, upTo int) (*Store, error) {
	opts = opts.withDefaults()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse connection string: %w", redact(err))
	}
	name := fmt.Sprintf("%s@%s:%d/%s", cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	cfg.MaxConns = opts.MaxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = opts.AppName
	if opts.NoSyncCommit {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	if opts.Schema != "" {
		if err := CreateSchema(ctx, dsn, opts.Schema); err != nil {
			return nil, err
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{opts.Schema}.Sanitize()
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: open %s: %w", name, err)
	}
	var schema string
	err = withConn(ctx, pool, func(c *pgx.Conn) error {
		if err := migrate(ctx, c, upTo); err != nil {
			return err
		}
		return c.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema)
	})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: open %s: %w", name, err)
	}
	var origin [8]byte
	_, _ = rand.Read(origin[:])
	s := &Store{
		pool:       pool,
		name:       name,
		opts:       opts,
		connConfig: cfg.ConnConfig,
		channel:    "wicket:" + schema,
		origin:     hex.EncodeToString(origin[:]),
		reqs:       make(chan *request),
		closing:    make(chan struct{}),
		stopped:    make(chan struct{}),
	}
	go s.run()
	return s, nil
}

// redact drops a connection string (which may hold a password) from a
// parse error.
func redact(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New("malformed connection string (not shown: it may hold a password)")
	}
	return err
}

// withConn runs fn on a pooled connection.
func withConn(ctx context.Context, pool *pgxpool.Pool, fn func(c *pgx.Conn) error) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer c.Release()
	return fn(c.Conn())
}

// CreateSchema creates a schema in the database dsn names, if it is
// missing (for Options.Schema, and for tests that each use their own).
func CreateSchema(ctx context.Context, dsn, schema string) error {
	return adminExec(ctx, dsn, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
}

// DropSchema drops a schema and everything in it.
func DropSchema(ctx context.Context, dsn, schema string) error {
	return adminExec(ctx, dsn, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
}

func adminExec(ctx context.Context, dsn, sql string) error {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("postgres: connect: %w", redact(err))
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, sql); err != nil {
		return fmt.Errorf("postgres: %s: %w", sql, err)
	}
	return nil
}

// WithSearchPath returns the connection string dsn (a URL or key=value
// pairs) with its search_path set to schema: the stores opened with it keep
// their tables in that schema.
func WithSearchPath(dsn, schema string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			q := u.Query()
			q.Set("search_path", schema)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	return dsn + " search_path=" + schema
}

// Name returns user@host:port/database.
func (s *Store) Name() string { return s.name }

// Close stops the writer once it has committed every Update already handed
// to it, then closes the connections. Updates and Views after Close fail
// with an error matching kernel.ErrUnavailable. Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.closing)
		<-s.stopped
		s.pool.Close()
	})
	return nil
}

func (s *Store) closed() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

func errClosed(op string) error {
	return fmt.Errorf("postgres: %s: store closed: %w", op, kernel.ErrUnavailable)
}

// View runs fn in a read-only REPEATABLE READ transaction: one snapshot,
// concurrently with other Views and with the writer. The transaction
// begins with fn's first query (in the same round trip). tx must not be
// used after fn returns; the records it returns are copies and may be
// kept. A panic in fn propagates.
func (s *Store) View(ctx context.Context, fn func(tx kernel.ReadTx) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("postgres: view: %w", err)
	}
	if s.closed() {
		return errClosed("view")
	}
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		if s.closed() {
			return errClosed("view")
		}
		return fmt.Errorf("postgres: view: %w: %w", kernel.ErrUnavailable, err)
	}
	defer c.Release() // a connection left inside a transaction is destroyed
	sess := newSession(ctx, c.Conn(), "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
	ferr := fn(&readTx{s: sess})
	err = sess.end(ferr == nil, nil)
	if sess.err != nil && ctx.Err() == nil && connectionLost(sess.err) && (pgCode(sess.err) != "" || c.Conn().IsClosed()) {
		// The connection died under the transaction (the database restarted
		// or ended the session): the store is unavailable for now, not
		// broken. The pool discards the dead connection.
		if ferr == nil {
			ferr = err
		}
		return fmt.Errorf("postgres: view on %s: %w: %w", s.name, kernel.ErrUnavailable, ferr)
	}
	if err != nil && ferr == nil {
		return fmt.Errorf("postgres: view: %w", err)
	}
	return ferr
}

// Update runs fn in a read-write transaction and returns once it is
// committed. It hands fn to the writer goroutine, which runs it in one
// REPEATABLE READ transaction with the other Updates waiting at that moment
// (see the package doc); fn may therefore run more than once and must have
// no effect outside tx. fn's error is returned unchanged; a panic in fn is
// returned as a *PanicError. Either discards everything fn wrote.
//
// ctx is honoured until the writer takes fn (and checked once more just
// before fn runs); after that Update waits for the outcome, so that its
// answer is always the truth. An error that leaves the outcome unknown (the
// connection broke while the COMMIT was on its way) is reported as such,
// matching kernel.ErrUnavailable: the changes may or may not be committed.
func (s *Store) Update(ctx context.Context, fn func(tx kernel.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("postgres: update: %w", err)
	}
	if s.closed() {
		return errClosed("update")
	}
	r := &request{ctx: ctx, fn: fn, done: make(chan error, 1)}
	s.waiting.Add(1)
	select {
	case s.reqs <- r:
		s.waiting.Add(-1)
	case <-ctx.Done():
		s.waiting.Add(-1)
		return fmt.Errorf("postgres: update: %w", ctx.Err())
	case <-s.closing:
		s.waiting.Add(-1)
		return errClosed("update")
	}
	return <-r.done
}

// Stats are counters of a Store's activity.
type Stats struct {
	// Commits counts write transactions committed by the writer.
	Commits uint64
	// Updates counts Update functions committed; Updates/Commits is the
	// group-commit factor.
	Updates uint64
	// Conflicts counts attempts run again after a serialization failure
	// or a deadlock (another replica wrote the same rows).
	Conflicts uint64
	// Waiting is the number of Updates now waiting for the writer.
	Waiting int64
	// ListenErrors counts the feed's lost connections (Follow reconnects).
	ListenErrors uint64
	// Conns are the pool's connections: acquired and total.
	AcquiredConns, TotalConns int32
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	ps := s.pool.Stat()
	return Stats{
		Commits:       s.commits.Load(),
		Updates:       s.updates.Load(),
		Conflicts:     s.conflicts.Load(),
		Waiting:       s.waiting.Load(),
		ListenErrors:  s.listenErrors.Load(),
		AcquiredConns: ps.AcquiredConns(),
		TotalConns:    ps.TotalConns(),
	}
}
