package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/postgres"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
)

// sqlConn connects to dsn for statements the Store API cannot make
// (corruption, inspection).
func sqlConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func exec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func open(t *testing.T, dsn string, opts postgres.Options) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), dsn, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func update(t testing.TB, s kernel.Store, fn func(tx kernel.Tx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func counter(t testing.TB, s kernel.Store, key string) string {
	t.Helper()
	var v []byte
	if err := s.View(context.Background(), func(tx kernel.ReadTx) error {
		var err error
		v, err = tx.Counter("t", key)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return string(v)
}

// newExecution is an execution with its execution.created event, as the
// kernel writes it.
func create(tx kernel.Tx, tenant, id string) error {
	now := time.Now().UTC()
	e := &kernel.Execution{ID: id, Tenant: tenant, AgentID: "a", Status: kernel.ExecPending,
		Input: json.RawMessage(`{}`), CreatedAt: now, UpdatedAt: now, LastSeq: 1}
	if err := tx.PutExecution(e); err != nil {
		return err
	}
	return tx.AppendEvent(tenant, kernel.Event{ExecutionID: id, Seq: 1, Type: kernel.EvExecutionCreated, Time: now, Payload: json.RawMessage(`{}`)})
}

func TestMigrations(t *testing.T) {
	schema, dsn := pgtest.Schema(t)
	c := sqlConn(t, dsn)
	// Replicas starting together migrate once.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := postgres.Open(context.Background(), dsn, postgres.Options{})
			if err == nil {
				err = s.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Open: %v", err)
		}
	}
	var versions []int
	rows, err := c.Query(context.Background(), `SELECT version FROM wicket_schema ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	versions, err = pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if len(versions) != postgres.SchemaVersion || versions[len(versions)-1] != postgres.SchemaVersion {
		t.Fatalf("schema %s versions %v, want 1..%d once each", schema, versions, postgres.SchemaVersion)
	}

	// A database a newer binary migrated is refused, untouched.
	exec(t, c, `INSERT INTO wicket_schema (version) VALUES ($1)`, postgres.SchemaVersion+1)
	_, err = postgres.Open(context.Background(), dsn, postgres.Options{})
	if !errors.Is(err, postgres.ErrNewerSchema) {
		t.Fatalf("Open of a newer schema: %v, want ErrNewerSchema", err)
	}
	if strings.Contains(err.Error(), "password") {
		t.Errorf("error shows the connection string: %v", err)
	}
}

// TestSchemaCreatedAtFirstStart: the schema the connection's search_path
// names first does not exist yet; replicas starting together create it
// once and migrate it (docs/operations.md says the role may create it).
func TestSchemaCreatedAtFirstStart(t *testing.T) {
	base := pgtest.BaseDSN(t)
	schema := "t_new_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() { _ = postgres.DropSchema(context.Background(), base, schema) })
	dsn := postgres.WithSearchPath(base, schema)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := postgres.Open(context.Background(), dsn, postgres.Options{})
			if err == nil {
				err = s.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Open on a schema to create: %v", err)
		}
	}
	var n int
	c := sqlConn(t, dsn)
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM wicket_schema`).Scan(&n); err != nil || n != postgres.SchemaVersion {
		t.Errorf("schema %s: %d versions (%v), want %d", schema, n, err, postgres.SchemaVersion)
	}
}

func TestFirstInPath(t *testing.T) {
	for path, want := range map[string]string{
		"wicket":             "wicket",
		" Wicket , public":   "wicket",
		`"My ""Schema""", x`: `My "Schema"`,
		`"$user", public`:    "alice",
		"":                   "",
	} {
		if got := postgres.FirstInPath(path, "alice"); got != want {
			t.Errorf("FirstInPath(%q) = %q, want %q", path, got, want)
		}
	}
}

// TestMigrateFromEveryVersion opens a store at every released schema
// version with data written at that version, and checks that the current
// binary migrates it and reads the data back.
func TestMigrateFromEveryVersion(t *testing.T) {
	for v := 1; v <= postgres.SchemaVersion; v++ {
		t.Run(fmt.Sprintf("from%d", v), func(t *testing.T) {
			_, dsn := pgtest.Schema(t)
			old, err := postgres.OpenVersion(context.Background(), dsn, postgres.Options{}, v)
			if err != nil {
				t.Fatal(err)
			}
			update(t, old, func(tx kernel.Tx) error {
				if err := create(tx, "t", "e1"); err != nil {
					return err
				}
				return tx.PutCounter("t", "c", []byte("v"+strconv.Itoa(v)))
			})
			if err := old.Close(); err != nil {
				t.Fatal(err)
			}
			s := open(t, dsn, postgres.Options{})
			if got := counter(t, s, "c"); got != "v"+strconv.Itoa(v) {
				t.Errorf("counter after migration: %q", got)
			}
			if err := s.Check(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestCheckFindsProblems(t *testing.T) {
	_, dsn := pgtest.Schema(t)
	s := open(t, dsn, postgres.Options{})
	update(t, s, func(tx kernel.Tx) error {
		for _, id := range []string{"e1", "e2", "e3", "e4"} {
			if err := create(tx, "t", id); err != nil {
				return err
			}
		}
		return tx.PutAPIKey(&kernel.APIKey{ID: "k", Tenant: "t", Hash: "h", CreatedAt: time.Now()})
	})
	if err := s.Check(context.Background()); err != nil {
		t.Fatalf("Check of a sound store: %v", err)
	}
	c := sqlConn(t, dsn)
	exec(t, c, `DELETE FROM events WHERE execution_id = 'e1'`)
	exec(t, c, `UPDATE executions SET status = 'completed' WHERE id = 'e2'`)
	exec(t, c, `INSERT INTO events (tenant, execution_id, seq, type, at, payload) VALUES ('t', 'gone', 1, 'execution.created', 0, '{}')`)
	exec(t, c, `UPDATE events SET seq = 5 WHERE execution_id = 'e3'`)
	exec(t, c, `UPDATE api_keys SET hash = 'other'`)
	exec(t, c, `UPDATE executions SET doc = 'not json' WHERE id = 'e4'`)
	err := s.Check(context.Background())
	if err == nil {
		t.Fatal("Check found nothing")
	}
	for _, want := range []string{
		"execution t/e1: no events, LastSeq is 1",
		"execution t/e2: columns",
		"events: t/gone: no such execution",
		"execution t/e3: event seq 5 follows 0 (gap)",
		"api key t/k: hash column differs",
		"execution t/e4: undecodable record",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Check does not report %q:\n%v", want, err)
		}
	}
}

// TestReplicasCountExactly: two stores (two replicas) on one database
// increment shared counters concurrently; serialization failures are
// retried, and no increment is lost or applied twice.
func TestReplicasCountExactly(t *testing.T) {
	_, dsn := pgtest.Schema(t)
	stores := []*postgres.Store{open(t, dsn, postgres.Options{}), open(t, dsn, postgres.Options{})}
	const g, n = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, g*n)
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[i%len(stores)]
			for range n {
				errs <- s.Update(context.Background(), func(tx kernel.Tx) error {
					for _, k := range []string{"total", "g" + strconv.Itoa(i)} {
						v, err := tx.Counter("t", k)
						if err != nil {
							return err
						}
						x, _ := strconv.Atoi(string(v))
						if err := tx.PutCounter("t", k, []byte(strconv.Itoa(x+1))); err != nil {
							return err
						}
					}
					return nil
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := counter(t, stores[0], "total"); got != strconv.Itoa(g*n) {
		t.Errorf("total = %s, want %d", got, g*n)
	}
	for i := range g {
		if got := counter(t, stores[1], "g"+strconv.Itoa(i)); got != strconv.Itoa(n) {
			t.Errorf("goroutine %d: %s increments, want %d", i, got, n)
		}
	}
	t.Logf("conflicts retried: %d + %d", stores[0].Stats().Conflicts, stores[1].Stats().Conflicts)
}

// TestFlushedWritesOfAFailedFunction: functions of one batch that flush
// their writes (a listing reads the database) and then fail or panic leave
// nothing behind, and the others of the batch commit.
func TestFlushedWritesOfAFailedFunction(t *testing.T) {
	s := pgtest.Open(t, postgres.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	blocker := make(chan error, 1)
	go func() {
		blocker <- s.Update(context.Background(), func(tx kernel.Tx) error {
			once.Do(func() { close(started) })
			<-release
			return tx.PutCounter("t", "blocker", []byte("1"))
		})
	}()
	<-started
	const k = 12
	results := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = s.Update(context.Background(), func(tx kernel.Tx) error {
				if err := tx.PutCounter("t", "c"+strconv.Itoa(i), []byte("1")); err != nil {
					return err
				}
				if err := tx.PutTenant(&kernel.Tenant{ID: "tenant-" + strconv.Itoa(i)}); err != nil {
					return err
				}
				if _, err := tx.ListTenants(); err != nil { // flushes
					return err
				}
				if err := tx.PutCounter("t", "d"+strconv.Itoa(i), []byte("1")); err != nil {
					return err
				}
				switch i % 3 {
				case 1:
					return errors.New("boom")
				case 2:
					panic("boom")
				}
				return nil
			})
		}()
	}
	// Let the updates queue behind the blocker (the test passes either
	// way; batched, it exercises the savepoints).
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().Waiting < k && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if err := <-blocker; err != nil {
		t.Fatal(err)
	}
	var tenants []*kernel.Tenant
	if err := s.View(context.Background(), func(tx kernel.ReadTx) error {
		var err error
		tenants, err = tx.ListTenants()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(tenants) != (k+2)/3 {
		t.Errorf("%d tenants committed, want %d", len(tenants), (k+2)/3)
	}
	for i, err := range results {
		ok := i%3 == 0
		if ok != (err == nil) {
			t.Errorf("update %d: %v", i, err)
		}
		for _, key := range []string{"c", "d"} {
			if got := counter(t, s, key+strconv.Itoa(i)) == "1"; got != ok {
				t.Errorf("update %d: counter %s%d committed %v, want %v", i, key, i, got, ok)
			}
		}
	}
}

// TestEventConflictFoundAtCommit: when the database holds an event the
// transaction did not expect (here one written behind the store's back),
// the COMMIT refuses it, and the batch runs again in strict mode: the
// function that appended it gets ErrConflict, the others commit.
func TestEventConflictFoundAtCommit(t *testing.T) {
	_, dsn := pgtest.Schema(t)
	s := open(t, dsn, postgres.Options{})
	update(t, s, func(tx kernel.Tx) error { return create(tx, "t", "e1") })
	c := sqlConn(t, dsn)
	exec(t, c, `INSERT INTO events (tenant, execution_id, seq, type, at, payload) VALUES ('t', 'e1', 2, 'sneaky', 0, '{}')`)
	runs := 0
	err := s.Update(context.Background(), func(tx kernel.Tx) error {
		runs++
		e, err := tx.Execution("t", "e1")
		if err != nil {
			return err
		}
		e.LastSeq++
		if err := tx.AppendEvent("t", kernel.Event{ExecutionID: "e1", Seq: e.LastSeq, Type: kernel.EvDispatchQueued, Payload: json.RawMessage(`{}`)}); err != nil {
			return err
		}
		return tx.PutExecution(e)
	})
	if !errors.Is(err, kernel.ErrConflict) {
		t.Fatalf("Update over a stored event: %v, want ErrConflict", err)
	}
	if runs != 2 {
		t.Errorf("the function ran %d times, want 2 (optimistic, then strict)", runs)
	}
	var evs []kernel.Event
	_ = s.View(context.Background(), func(tx kernel.ReadTx) error {
		evs, err = tx.Events("t", "e1", 0, 0)
		return err
	})
	if len(evs) != 2 || evs[1].Type != "sneaky" {
		t.Errorf("events after the refused append: %+v", evs)
	}
}

// TestConnectionLostBeforeCommit: the connection of a write transaction
// dies before its COMMIT; the batch runs again on a new connection and
// commits once.
func TestConnectionLostBeforeCommit(t *testing.T) {
	_, dsn := pgtest.Schema(t)
	app := "wicket-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	s := open(t, dsn, postgres.Options{AppName: app})
	admin := sqlConn(t, dsn)
	var runs atomic.Int32
	update(t, s, func(tx kernel.Tx) error {
		v, err := tx.Counter("t", "n")
		if err != nil {
			return err
		}
		if runs.Add(1) == 1 {
			var killed int
			if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT pg_terminate_backend(pid)
				FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%') k`, app).Scan(&killed); err != nil || killed != 1 {
				t.Errorf("terminated %d backends (%v), want the writer's", killed, err)
			}
		}
		x, _ := strconv.Atoi(string(v))
		if _, err := tx.Counter("t", "other"); err != nil {
			return err // the dead connection answers here on the first run
		}
		return tx.PutCounter("t", "n", []byte(strconv.Itoa(x+1)))
	})
	if runs.Load() != 2 {
		t.Errorf("the function ran %d times, want 2", runs.Load())
	}
	if got := counter(t, s, "n"); got != "1" {
		t.Errorf("counter = %q, want 1", got)
	}
}

// TestConnectionLostInView: the connection of a read transaction dies
// under it (the database restarted, or an operator ended the session); View
// reports the store unavailable (a 503 to the client, which may retry), not
// an unexplained error (a 500), and the next View runs on a new connection.
func TestConnectionLostInView(t *testing.T) {
	_, dsn := pgtest.Schema(t)
	app := "wicket-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	s := open(t, dsn, postgres.Options{AppName: app})
	admin := sqlConn(t, dsn)
	update(t, s, func(tx kernel.Tx) error { return tx.PutCounter("t", "n", []byte("1")) })
	err := s.View(context.Background(), func(tx kernel.ReadTx) error {
		if _, err := tx.Counter("t", "n"); err != nil {
			return err
		}
		var killed int
		if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT pg_terminate_backend(pid)
			FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%') k`, app).Scan(&killed); err != nil || killed != 1 {
			t.Errorf("terminated %d backends (%v), want the view's", killed, err)
		}
		_, err := tx.Counter("t", "n")
		return fmt.Errorf("read again: %w", err)
	})
	if !errors.Is(err, kernel.ErrUnavailable) {
		t.Errorf("View on a lost connection: %v, want ErrUnavailable", err)
	}
	if got := counter(t, s, "n"); got != "1" {
		t.Errorf("counter after the lost connection = %q, want 1", got)
	}
}

func TestValidation(t *testing.T) {
	s := pgtest.Open(t, postgres.Options{})
	for name, fn := range map[string]func(tx kernel.Tx) error{
		"NUL in tenant": func(tx kernel.Tx) error { return tx.PutCounter("t\x00u", "k", nil) },
		"invalid UTF-8": func(tx kernel.Tx) error { return tx.PutAgent(&kernel.Agent{ID: "a\xff", Tenant: "t"}) },
		"empty id":      func(tx kernel.Tx) error { return tx.PutStep(&kernel.Step{Tenant: "t", ExecutionID: "e"}) },
		"NUL in status": func(tx kernel.Tx) error {
			return tx.PutApproval(&kernel.Approval{ID: "a", Tenant: "t", Status: "x\x00"})
		},
		"event seq zero": func(tx kernel.Tx) error { return tx.AppendEvent("t", kernel.Event{ExecutionID: "e"}) },
		"nil execution":  func(tx kernel.Tx) error { return tx.PutExecution(nil) },
		"NUL in exec id": func(tx kernel.Tx) error { return create(tx, "t", "e\x00") },
		"NUL in event ty": func(tx kernel.Tx) error {
			return tx.AppendEvent("t", kernel.Event{ExecutionID: "e", Seq: 1, Type: "a\x00"})
		},
	} {
		err := s.Update(context.Background(), fn)
		if !errors.Is(err, kernel.ErrValidation) {
			t.Errorf("%s: %v, want ErrValidation", name, err)
		}
	}
	// Free-form keys keep their bytes, NUL and invalid UTF-8 included, and
	// reads of unstorable ids find nothing (no database error).
	key := "idem\x00\xff"
	update(t, s, func(tx kernel.Tx) error {
		if err := create(tx, "t", "e1"); err != nil {
			return err
		}
		e, err := tx.Execution("t", "e1")
		if err != nil {
			return err
		}
		e.IdempotencyKey = key
		if err := tx.PutExecution(e); err != nil {
			return err
		}
		return tx.PutCounter("t", key, []byte(key))
	})
	if err := s.View(context.Background(), func(tx kernel.ReadTx) error {
		id, err := tx.ExecutionByIdempotencyKey("t", key)
		if err != nil || id != "e1" {
			t.Errorf("ExecutionByIdempotencyKey = %q, %v", id, err)
		}
		if v, err := tx.Counter("t", key); string(v) != key || err != nil {
			t.Errorf("Counter = %q, %v", v, err)
		}
		if _, err := tx.Execution("t\x00", "e1"); !errors.Is(err, kernel.ErrNotFound) {
			t.Errorf("Execution with a NUL tenant: %v", err)
		}
		if _, err := tx.Agent("t", "\xff"); !errors.Is(err, kernel.ErrNotFound) {
			t.Errorf("Agent with invalid UTF-8: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestClosed: after Close, Update and View fail with ErrUnavailable.
func TestClosed(t *testing.T) {
	s := pgtest.Open(t, postgres.Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(context.Background(), func(kernel.Tx) error { return nil }); !errors.Is(err, kernel.ErrUnavailable) {
		t.Errorf("Update after Close: %v", err)
	}
	if err := s.View(context.Background(), func(kernel.ReadTx) error { return nil }); !errors.Is(err, kernel.ErrUnavailable) {
		t.Errorf("View after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestUnreachable: a database that cannot be reached is a clear error
// naming it, without its password.
func TestUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := postgres.Open(ctx, "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=2", postgres.Options{})
	if err == nil {
		t.Fatal("Open of an unreachable database succeeded")
	}
	if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("error: %v", err)
	}
	_, err = postgres.Open(ctx, "postgres://u:s3cret@[::1", postgres.Options{})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("malformed connection string: %v", err)
	}
}
