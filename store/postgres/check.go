package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/wicket-run/wicket/kernel"
)

// maxProblems bounds how many problems Check reports in detail.
const maxProblems = 50

// checker collects the problems Check finds.
type checker struct {
	problems []error
	n        int
}

func (c *checker) addf(format string, args ...any) {
	c.n++
	if len(c.problems) < maxProblems {
		c.problems = append(c.problems, fmt.Errorf(format, args...))
	}
}

// Check verifies the store's invariants in one REPEATABLE READ snapshot and
// returns an error describing every violation found (nil when there is
// none):
//
//   - the schema is at SchemaVersion;
//   - every record decodes, and the columns beside its doc (keys, status,
//     idempotency key, dispatch state, due and lease times, LastSeq,
//     approval status and times, API key hash) are what the doc implies;
//   - per execution, events have seq 1..LastSeq without gaps, the first is
//     execution.created, nothing follows a terminal execution event, and
//     each step_id has at most one terminal step event;
//   - no event or step belongs to a missing execution.
//
// It reads every table: it is meant for tests, for `wicket store check`
// and after `wicket store copy`.
func (s *Store) Check(ctx context.Context) error {
	c := &checker{}
	err := withConn(ctx, s.pool, func(conn *pgx.Conn) error {
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		return check(ctx, tx, c)
	})
	if err != nil {
		return fmt.Errorf("postgres: check %s: %w", s.name, err)
	}
	if c.n == 0 {
		return nil
	}
	more := ""
	if c.n > len(c.problems) {
		more = fmt.Sprintf(" (first %d shown)", len(c.problems))
	}
	return fmt.Errorf("postgres: check %s: %d problem(s)%s:\n%w", s.name, c.n, more, errors.Join(c.problems...))
}

func check(ctx context.Context, tx pgx.Tx, c *checker) error {
	var v int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM wicket_schema`).Scan(&v); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	if v != SchemaVersion {
		c.addf("schema version is %d, want %d", v, SchemaVersion)
	}
	execs, err := checkExecutions(ctx, tx, c)
	if err != nil {
		return err
	}
	steps := []func(context.Context, pgx.Tx, map[execRef]*kernel.Execution, *checker) error{
		checkEvents, checkSteps, checkApprovals, checkAPIKeys, checkOthers,
	}
	for _, fn := range steps {
		if err := fn(ctx, tx, execs, c); err != nil {
			return err
		}
	}
	return nil
}

// each runs sql and calls fn for every row.
func each(ctx context.Context, tx pgx.Tx, sql string, fn func(rows pgx.Rows) error) error {
	rows, err := tx.Query(ctx, sql)
	if err != nil {
		return err
	}
	return readRows(rows, fn)
}

func checkExecutions(ctx context.Context, tx pgx.Tx, c *checker) (map[execRef]*kernel.Execution, error) {
	execs := map[execRef]*kernel.Execution{}
	err := each(ctx, tx, `SELECT tenant, id, agent_id, status, idem_key, dispatch_state, due_at, lease_until, last_seq, doc FROM executions`,
		func(rows pgx.Rows) error {
			var tenant, id, agent, status, state string
			var idem, doc []byte
			var due, lease, last int64
			if err := rows.Scan(&tenant, &id, &agent, &status, &idem, &state, &due, &lease, &last, &doc); err != nil {
				return err
			}
			where := tenant + "/" + id
			e, err := decode[kernel.Execution](doc)
			if err != nil {
				c.addf("execution %s: %v", where, err)
				return nil
			}
			execs[execRef{tenant, id}] = e
			wantDue, wantLease := int64(0), int64(0)
			if queued(e.Dispatch.State) {
				wantDue = nanos(e.Dispatch.DueAt)
			}
			if leased(e.Dispatch.State) {
				wantLease = nanos(e.Dispatch.LeaseUntil)
			}
			switch {
			case e.Tenant != tenant || e.ID != id:
				c.addf("execution %s: stored under key %s/%s", e.Tenant+"/"+e.ID, tenant, id)
			case e.AgentID != agent || string(e.Status) != status || string(e.Dispatch.State) != state:
				c.addf("execution %s: columns (agent %q, status %q, dispatch %q) differ from the record (%q, %q, %q)",
					where, agent, status, state, e.AgentID, e.Status, e.Dispatch.State)
			case e.IdempotencyKey != string(idem) || (e.IdempotencyKey == "") != (idem == nil):
				c.addf("execution %s: idempotency key column %q, record %q", where, idem, e.IdempotencyKey)
			case due != wantDue || lease != wantLease:
				c.addf("execution %s: due/lease columns %d/%d, record implies %d/%d", where, due, lease, wantDue, wantLease)
			case uint64(last) != e.LastSeq:
				c.addf("execution %s: last_seq column %d, record %d", where, last, e.LastSeq)
			}
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("executions: %w", err)
	}
	return execs, nil
}

// terminalExecEvents and terminalStepEvents end an execution and a step.
var (
	terminalExecEvents = map[kernel.EventType]bool{
		kernel.EvExecutionCompleted: true, kernel.EvExecutionFailed: true, kernel.EvExecutionCancelled: true,
	}
	terminalStepEvents = map[kernel.EventType]bool{
		kernel.EvStepSucceeded: true, kernel.EvStepFailed: true, kernel.EvStepCancelled: true,
	}
)

// logState follows one execution's events in seq order.
type logState struct {
	ref      execRef
	next     uint64
	terminal kernel.EventType
	stepDone map[string]uint64
}

func checkEvents(ctx context.Context, tx pgx.Tx, execs map[execRef]*kernel.Execution, c *checker) error {
	var cur *logState
	seen := map[execRef]bool{}
	end := func() {
		if cur == nil {
			return
		}
		if e := execs[cur.ref]; e != nil && cur.next-1 != e.LastSeq {
			c.addf("execution %s/%s: last event seq is %d, LastSeq is %d", cur.ref.tenant, cur.ref.id, cur.next-1, e.LastSeq)
		}
	}
	err := each(ctx, tx, `SELECT tenant, execution_id, seq, type, payload FROM events ORDER BY tenant, execution_id, seq`,
		func(rows pgx.Rows) error {
			var ref execRef
			var seq int64
			var typ string
			var payload []byte
			if err := rows.Scan(&ref.tenant, &ref.id, &seq, &typ, &payload); err != nil {
				return err
			}
			if cur == nil || cur.ref != ref {
				end()
				cur = &logState{ref: ref, next: 1, stepDone: map[string]uint64{}}
				seen[ref] = true
				if execs[ref] == nil {
					c.addf("events: %s/%s: no such execution", ref.tenant, ref.id)
				}
			}
			checkEvent(cur, uint64(seq), kernel.EventType(typ), payload, c)
			return nil
		})
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	end()
	for ref, e := range execs {
		if !seen[ref] && e.LastSeq != 0 {
			c.addf("execution %s/%s: no events, LastSeq is %d", ref.tenant, ref.id, e.LastSeq)
		}
	}
	return nil
}

// checkEvent verifies one event against the log so far.
func checkEvent(st *logState, seq uint64, typ kernel.EventType, payload []byte, c *checker) {
	where := st.ref.tenant + "/" + st.ref.id
	if seq != st.next {
		c.addf("execution %s: event seq %d follows %d (gap)", where, seq, st.next-1)
	}
	st.next = seq + 1
	if seq == 1 && typ != kernel.EvExecutionCreated {
		c.addf("execution %s: first event is %s, not %s", where, typ, kernel.EvExecutionCreated)
	}
	if st.terminal != "" {
		c.addf("execution %s: event %d (%s) after terminal %s", where, seq, typ, st.terminal)
	}
	if terminalExecEvents[typ] && st.terminal == "" {
		st.terminal = typ
	}
	if !terminalStepEvents[typ] {
		return
	}
	var p struct {
		StepID string `json:"step_id"`
	}
	if err := json.Unmarshal(payload, &p); err != nil || p.StepID == "" {
		c.addf("execution %s: event %d (%s) names no step_id", where, seq, typ)
	} else if prev, dup := st.stepDone[p.StepID]; dup {
		c.addf("execution %s: step %s has a second terminal event %d (%s) after %d", where, p.StepID, seq, typ, prev)
	} else {
		st.stepDone[p.StepID] = seq
	}
}

func checkSteps(ctx context.Context, tx pgx.Tx, execs map[execRef]*kernel.Execution, c *checker) error {
	err := each(ctx, tx, `SELECT tenant, execution_id, id, seq, doc FROM steps`, func(rows pgx.Rows) error {
		var tenant, exec, id string
		var seq int64
		var doc []byte
		if err := rows.Scan(&tenant, &exec, &id, &seq, &doc); err != nil {
			return err
		}
		where := tenant + "/" + exec + "/" + id
		s, err := decode[kernel.Step](doc)
		switch {
		case err != nil:
			c.addf("step %s: %v", where, err)
		case s.Tenant != tenant || s.ExecutionID != exec || s.ID != id:
			c.addf("step %s/%s/%s: stored under key %s", s.Tenant, s.ExecutionID, s.ID, where)
		case uint64(seq) != s.Seq:
			c.addf("step %s: seq column %d, record %d", where, seq, s.Seq)
		case execs[execRef{tenant, exec}] == nil:
			c.addf("step %s: no such execution", where)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("steps: %w", err)
	}
	return nil
}

func checkApprovals(ctx context.Context, tx pgx.Tx, _ map[execRef]*kernel.Execution, c *checker) error {
	err := each(ctx, tx, `SELECT tenant, id, status, expires_at, created_at, doc FROM approvals`, func(rows pgx.Rows) error {
		var tenant, id, status string
		var expires, created int64
		var doc []byte
		if err := rows.Scan(&tenant, &id, &status, &expires, &created, &doc); err != nil {
			return err
		}
		where := tenant + "/" + id
		a, err := decode[kernel.Approval](doc)
		switch {
		case err != nil:
			c.addf("approval %s: %v", where, err)
		case a.Tenant != tenant || a.ID != id:
			c.addf("approval %s/%s: stored under key %s", a.Tenant, a.ID, where)
		case string(a.Status) != status || nanos(a.ExpiresAt) != expires || nanos(a.CreatedAt) != created:
			c.addf("approval %s: columns (%s, %d, %d) differ from the record (%s, %d, %d)",
				where, status, expires, created, a.Status, nanos(a.ExpiresAt), nanos(a.CreatedAt))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("approvals: %w", err)
	}
	return nil
}

func checkAPIKeys(ctx context.Context, tx pgx.Tx, _ map[execRef]*kernel.Execution, c *checker) error {
	err := each(ctx, tx, `SELECT tenant, id, hash, doc FROM api_keys`, func(rows pgx.Rows) error {
		var tenant, id, hash string
		var doc []byte
		if err := rows.Scan(&tenant, &id, &hash, &doc); err != nil {
			return err
		}
		k, err := decode[kernel.APIKey](doc)
		switch {
		case err != nil:
			c.addf("api key %s/%s: %v", tenant, id, err)
		case k.Tenant != tenant || k.ID != id:
			c.addf("api key %s/%s: stored under key %s/%s", k.Tenant, k.ID, tenant, id)
		case k.Hash != hash:
			c.addf("api key %s/%s: hash column differs from the record", tenant, id)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("api keys: %w", err)
	}
	return nil
}

// checkOthers decodes agents, bundles and tenants and compares their keys.
func checkOthers(ctx context.Context, tx pgx.Tx, _ map[execRef]*kernel.Execution, c *checker) error {
	keyed := func(what, sql string, keys func(doc []byte) (string, string, error)) error {
		return each(ctx, tx, sql, func(rows pgx.Rows) error {
			var a, b string
			var doc []byte
			if err := rows.Scan(&a, &b, &doc); err != nil {
				return err
			}
			ga, gb, err := keys(doc)
			switch {
			case err != nil:
				c.addf("%s %s/%s: %v", what, a, b, err)
			case ga != a || gb != b:
				c.addf("%s %s/%s: stored under key %s/%s", what, ga, gb, a, b)
			}
			return nil
		})
	}
	err := keyed("agent", `SELECT tenant, id, doc FROM agents`, func(doc []byte) (string, string, error) {
		a, err := decode[kernel.Agent](doc)
		if err != nil {
			return "", "", err
		}
		return a.Tenant, a.ID, nil
	})
	if err == nil {
		err = keyed("bundle", `SELECT tenant, name, doc FROM bundles`, func(doc []byte) (string, string, error) {
			b, err := decode[kernel.BundleRecord](doc)
			if err != nil {
				return "", "", err
			}
			return b.Tenant, b.Name, nil
		})
	}
	if err == nil {
		err = keyed("tenant", `SELECT '', id, doc FROM tenants`, func(doc []byte) (string, string, error) {
			t, err := decode[kernel.Tenant](doc)
			if err != nil {
				return "", "", err
			}
			return "", t.ID, nil
		})
	}
	if err != nil {
		return fmt.Errorf("records: %w", err)
	}
	return nil
}
