package postgres

import (
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/wicket-run/wicket/kernel"
)

// DeleteExecution implements kernel.Tx. It deletes, in this order and at
// most limit records (the approvals of the deleted steps excepted): the
// execution's steps with the approvals they asked for, its occurrence
// counters, its counters under kernel.ExecCounterPrefix, and its events
// from the newest down (last_seq follows them, so that the log left is
// always 1..LastSeq); then, when nothing else is left, the execution row,
// and with it its idempotency key and its due and lease entries (columns of
// the row).
//
// The buffered writes are flushed first and the deletes run at once, in
// the function's savepoint: a function that fails afterwards rolls them
// back with the rest of its writes.
func (w *writeTx) DeleteExecution(tenant, id string, limit int) (kernel.PurgeStats, bool, error) {
	var st kernel.PurgeStats
	if err := checkIDs("delete execution", tenant, id); err != nil {
		return st, false, err
	}
	fail := func(what string, err error) (kernel.PurgeStats, bool, error) {
		return st, false, fmt.Errorf("postgres: delete execution %s/%s: %s: %w", tenant, id, what, err)
	}
	if err := w.flushForDirectWrite(); err != nil {
		return fail("flush", err)
	}
	var doc []byte
	found, err := w.s.queryRow(`SELECT doc FROM executions WHERE tenant = $1 AND id = $2 FOR UPDATE`, []any{tenant, id}, &doc)
	if err != nil {
		return fail("read", err)
	}
	if !found {
		return st, false, missing("execution", tenant, id)
	}
	budget := int64(limit)
	if limit <= 0 {
		budget = math.MaxInt64
	}
	ref := execRef{tenant, id}
	w.forgetEvents(ref)
	w.own.changes.executions[id] = true
	w.own.changes.queued[ref] = false

	// Steps, in id order, and the approvals they asked for.
	var approvals []string
	err = w.s.query(`DELETE FROM steps s USING (SELECT id FROM steps WHERE tenant = $1 AND execution_id = $2 ORDER BY id LIMIT $3) d
		WHERE s.tenant = $1 AND s.execution_id = $2 AND s.id = d.id RETURNING s.doc`, []any{tenant, id, budget}, func(rows pgx.Rows) error {
		var raw []byte
		if err := rows.Scan(&raw); err != nil {
			return err
		}
		s, err := decode[kernel.Step](raw)
		if err != nil {
			return err
		}
		st.Steps++
		if s.ApprovalID != "" {
			approvals = append(approvals, s.ApprovalID)
		}
		return nil
	})
	if err != nil {
		return fail("steps", err)
	}
	budget -= int64(st.Steps)
	if len(approvals) > 0 {
		var n int64
		if _, err := w.s.queryRow(`WITH d AS (DELETE FROM approvals WHERE tenant = $1 AND id = ANY($2) RETURNING 1) SELECT count(*) FROM d`,
			[]any{tenant, approvals}, &n); err != nil {
			return fail("approvals", err)
		}
		st.Approvals = int(n)
		budget -= n
	}

	// Occurrence counters, then the counters kept per execution: the keys
	// that start with the prefix (which ends in a NUL byte) are those in
	// [prefix, prefix with that last byte raised to 1).
	var occ, ctr int64
	if budget > 0 {
		if _, err := w.s.queryRow(`WITH d AS (DELETE FROM occurrences o USING
			(SELECT key FROM occurrences WHERE tenant = $1 AND execution_id = $2 ORDER BY key LIMIT $3) k
			WHERE o.tenant = $1 AND o.execution_id = $2 AND o.key = k.key RETURNING 1) SELECT count(*) FROM d`,
			[]any{tenant, id, budget}, &occ); err != nil {
			return fail("occurrence counters", err)
		}
		budget -= occ
	}
	if budget > 0 {
		lo := []byte(kernel.ExecCounterPrefix(id))
		hi := append([]byte(nil), lo...)
		hi[len(hi)-1]++
		if _, err := w.s.queryRow(`WITH d AS (DELETE FROM counters c USING
			(SELECT key FROM counters WHERE tenant = $1 AND key >= $2 AND key < $3 ORDER BY key LIMIT $4) k
			WHERE c.tenant = $1 AND c.key = k.key RETURNING 1) SELECT count(*) FROM d`,
			[]any{tenant, lo, hi, budget}, &ctr); err != nil {
			return fail("counters", err)
		}
		budget -= ctr
	}
	st.Counters = int(occ + ctr)

	// Events, newest first.
	var left int64
	if budget > 0 {
		var n int64
		var lowest *int64
		if _, err := w.s.queryRow(`WITH d AS (DELETE FROM events e USING
			(SELECT seq FROM events WHERE tenant = $1 AND execution_id = $2 ORDER BY seq DESC LIMIT $3) k
			WHERE e.tenant = $1 AND e.execution_id = $2 AND e.seq = k.seq RETURNING e.seq) SELECT count(*), min(seq) FROM d`,
			[]any{tenant, id, budget}, &n, &lowest); err != nil {
			return fail("events", err)
		}
		st.Events = int(n)
		budget -= n
		if budget <= 0 {
			// The budget ran out with the events: are there older ones?
			if _, err := w.s.queryRow(`SELECT coalesce(max(seq), 0) FROM events WHERE tenant = $1 AND execution_id = $2`,
				[]any{tenant, id}, &left); err != nil {
				return fail("events", err)
			}
		}
	} else if _, err := w.s.queryRow(`SELECT coalesce(max(seq), 0) FROM events WHERE tenant = $1 AND execution_id = $2`,
		[]any{tenant, id}, &left); err != nil {
		return fail("events", err)
	}

	if left > 0 || budget <= 0 {
		if st.Events > 0 {
			// The log left is 1..left: LastSeq follows it.
			e, err := decode[kernel.Execution](doc)
			if err != nil {
				return fail("read", err)
			}
			e.LastSeq = uint64(left)
			raw, err := encode(e)
			if err != nil {
				return fail("encode", err)
			}
			if err := w.s.pipeline([]statement{{sql: `UPDATE executions SET last_seq = $3, doc = $4 WHERE tenant = $1 AND id = $2`,
				args: []any{tenant, id, left, raw}}}); err != nil {
				return fail("record", err)
			}
		}
		w.own.execs[ref] = execInfo{exists: true, idem: w.idemOf(ref, doc), dbLast: uint64(left), lastKnown: true}
		return st, false, nil
	}
	if err := w.s.pipeline([]statement{{sql: `DELETE FROM executions WHERE tenant = $1 AND id = $2`, args: []any{tenant, id}}}); err != nil {
		return fail("record", err)
	}
	w.own.execs[ref] = execInfo{lastKnown: true}
	st.Executions = 1
	return st, true, nil
}

// flushForDirectWrite sends the buffered writes and makes sure the running
// function's savepoint is set, before statements that write at once.
func (w *writeTx) flushForDirectWrite() error {
	if err := w.flush(); err != nil {
		return err
	}
	if !w.savepoint {
		w.s.pre = append(w.s.pre, "SAVEPOINT fn") // sent with the next statement
		w.savepoint = true
	}
	return nil
}

// forgetEvents drops what the running function knows of an execution's
// events (they are about to be deleted): eventExists then asks the
// database, or what the function appends afterwards.
func (w *writeTx) forgetEvents(ref execRef) {
	for k := range w.own.events {
		if k.tenant == ref.tenant && k.id == ref.id {
			delete(w.own.events, k)
		}
	}
	w.own.purged[ref] = true
}

// idemOf returns the idempotency key of an execution's stored record.
func (w *writeTx) idemOf(ref execRef, doc []byte) string {
	if info, ok := w.info(ref); ok && info.exists {
		return info.idem
	}
	e, err := decode[kernel.Execution](doc)
	if err != nil {
		return ""
	}
	return e.IdempotencyKey
}
