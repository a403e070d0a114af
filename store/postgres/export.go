package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/storecopy"
)

var _ storecopy.Source = (*Store)(nil)

// Export implements storecopy.Source: every record, read in one REPEATABLE
// READ READ ONLY snapshot, in the order storecopy.Source documents.
func (s *Store) Export(ctx context.Context, fn func(storecopy.Record) error) error {
	if s.closed() {
		return errClosed("export")
	}
	err := withConn(ctx, s.pool, func(conn *pgx.Conn) error {
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		return export(ctx, tx, fn)
	})
	if err != nil {
		return fmt.Errorf("postgres: export %s: %w", s.name, err)
	}
	return nil
}

// docs emits the records of a doc column.
func docs[T any](ctx context.Context, tx pgx.Tx, sql string, wrap func(*T) storecopy.Record, fn func(storecopy.Record) error, args ...any) error {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	var recs []storecopy.Record
	err = readRows(rows, func(rows pgx.Rows) error {
		var doc []byte
		if err := rows.Scan(&doc); err != nil {
			return err
		}
		v, err := decode[T](doc)
		if err != nil {
			return err
		}
		recs = append(recs, wrap(v))
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

func export(ctx context.Context, tx pgx.Tx, fn func(storecopy.Record) error) error {
	err := docs(ctx, tx, `SELECT doc FROM tenants ORDER BY id`, func(t *kernel.Tenant) storecopy.Record { return storecopy.Record{Tenant: t} }, fn)
	if err == nil {
		err = docs(ctx, tx, `SELECT doc FROM api_keys ORDER BY tenant, id`, func(k *kernel.APIKey) storecopy.Record { return storecopy.Record{APIKey: k} }, fn)
	}
	if err == nil {
		err = docs(ctx, tx, `SELECT doc FROM agents ORDER BY tenant, id`, func(a *kernel.Agent) storecopy.Record { return storecopy.Record{Agent: a} }, fn)
	}
	if err == nil {
		err = exportBundles(ctx, tx, fn)
	}
	if err == nil {
		err = docs(ctx, tx, `SELECT doc FROM approvals ORDER BY tenant, id`, func(a *kernel.Approval) storecopy.Record { return storecopy.Record{Approval: a} }, fn)
	}
	if err == nil {
		err = exportCounters(ctx, tx, fn)
	}
	if err != nil {
		return err
	}
	// Executions one by one, each with its records: the ids first (small),
	// then a query per execution.
	rows, err := tx.Query(ctx, `SELECT tenant, id FROM executions ORDER BY tenant, id`)
	if err != nil {
		return err
	}
	var refs []execRef
	if err := readRows(rows, func(rows pgx.Rows) error {
		var r execRef
		if err := rows.Scan(&r.tenant, &r.id); err != nil {
			return err
		}
		refs = append(refs, r)
		return nil
	}); err != nil {
		return err
	}
	for _, ref := range refs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := exportExecution(ctx, tx, ref, fn); err != nil {
			return fmt.Errorf("execution %s/%s: %w", ref.tenant, ref.id, err)
		}
	}
	return nil
}

func exportBundles(ctx context.Context, tx pgx.Tx, fn func(storecopy.Record) error) error {
	rows, err := tx.Query(ctx, `SELECT doc, archive FROM bundles ORDER BY tenant, name`)
	if err != nil {
		return err
	}
	var recs []*kernel.BundleRecord
	if err := readRows(rows, func(rows pgx.Rows) error {
		var doc, archive []byte
		if err := rows.Scan(&doc, &archive); err != nil {
			return err
		}
		b, err := scanBundle(doc, archive)
		recs = append(recs, b)
		return err
	}); err != nil {
		return err
	}
	for _, b := range recs {
		if err := fn(storecopy.Record{Bundle: b}); err != nil {
			return err
		}
	}
	return nil
}

func exportCounters(ctx context.Context, tx pgx.Tx, fn func(storecopy.Record) error) error {
	rows, err := tx.Query(ctx, `SELECT tenant, key, value FROM counters ORDER BY tenant, key`)
	if err != nil {
		return err
	}
	var recs []*storecopy.Counter
	if err := readRows(rows, func(rows pgx.Rows) error {
		var c storecopy.Counter
		var key []byte
		if err := rows.Scan(&c.Tenant, &key, &c.Value); err != nil {
			return err
		}
		if c.Value == nil {
			c.Value = []byte{}
		}
		c.Key = string(key)
		recs = append(recs, &c)
		return nil
	}); err != nil {
		return err
	}
	for _, c := range recs {
		if err := fn(storecopy.Record{Counter: c}); err != nil {
			return err
		}
	}
	return nil
}

// exportExecution emits an execution, its events, steps and occurrence
// counters.
func exportExecution(ctx context.Context, tx pgx.Tx, ref execRef, fn func(storecopy.Record) error) error {
	err := docs(ctx, tx, `SELECT doc FROM executions WHERE tenant = $1 AND id = $2`,
		func(e *kernel.Execution) storecopy.Record { return storecopy.Record{Execution: e} }, fn, ref.tenant, ref.id)
	if err != nil {
		return err
	}
	r := &readTx{s: &session{ctx: ctx, conn: tx.Conn()}}
	evs, err := r.Events(ref.tenant, ref.id, 0, 0)
	if err != nil {
		return err
	}
	for i := range evs {
		if err := fn(storecopy.Record{Event: &storecopy.Event{Tenant: ref.tenant, Event: evs[i]}}); err != nil {
			return err
		}
	}
	err = docs(ctx, tx, `SELECT doc FROM steps WHERE tenant = $1 AND execution_id = $2 ORDER BY id`,
		func(s *kernel.Step) storecopy.Record { return storecopy.Record{Step: s} }, fn, ref.tenant, ref.id)
	if err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT key, dispatch_id, attempt, count FROM occurrences WHERE tenant = $1 AND execution_id = $2 ORDER BY key`, ref.tenant, ref.id)
	if err != nil {
		return err
	}
	var occs []*storecopy.Occurrence
	if err := readRows(rows, func(rows pgx.Rows) error {
		o := &storecopy.Occurrence{Tenant: ref.tenant, ExecutionID: ref.id}
		var key []byte
		var attempt, count int32
		if err := rows.Scan(&key, &o.Occurrence.Lease.DispatchID, &attempt, &count); err != nil {
			return err
		}
		o.Key, o.Occurrence.Lease.Attempt, o.Occurrence.Count = string(key), int(attempt), int(count)
		occs = append(occs, o)
		return nil
	}); err != nil {
		return err
	}
	for _, o := range occs {
		if err := fn(storecopy.Record{Occurrence: o}); err != nil {
			return err
		}
	}
	return nil
}
