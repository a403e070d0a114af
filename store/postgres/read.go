package postgres

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wicket-run/wicket/kernel"
)

// readTx implements kernel.ReadTx with one query per call. Every record it
// returns is freshly decoded and may be kept.
//
// A limit <= 0 given to Events, DueDispatches, ExpiredLeases or
// ExpiredApprovals, and ExecutionFilter.Limit <= 0, mean "no limit".
type readTx struct{ s *session }

var _ kernel.ReadTx = (*readTx)(nil)

func notFound(format string, args ...any) error {
	return fmt.Errorf("postgres: "+format+": %w", append(args, kernel.ErrNotFound)...)
}

// missingError is notFound for a record named by up to three ids, built
// without formatting: a lookup that misses is on the hot path (SubmitStep
// looks a new step up before deciding it).
type missingError struct {
	what string
	ids  [3]string
	n    int
}

// missing returns "postgres: what id/id/id: not found", matching ErrNotFound.
func missing(what string, ids ...string) error {
	e := &missingError{what: what}
	e.n = copy(e.ids[:], ids)
	return e
}

func (e *missingError) Error() string {
	return "postgres: " + e.what + " " + strings.Join(e.ids[:e.n], "/") + ": " + kernel.ErrNotFound.Error()
}

func (e *missingError) Unwrap() error { return kernel.ErrNotFound }

// limitArg is the LIMIT parameter of a limit (NULL: no limit).
func limitArg(limit int) any {
	if limit <= 0 {
		return nil
	}
	return int64(limit)
}

// getDoc reads one doc column and decodes it as T.
func getDoc[T any](s *session, what, sql string, args ...any) (*T, bool, error) {
	var raw []byte
	ok, err := s.queryRow(sql, args, &raw)
	if err != nil || !ok {
		return nil, false, err
	}
	v, err := decode[T](raw)
	if err != nil {
		return nil, false, &decodeError{what: what, err: err}
	}
	return v, true, nil
}

// listDocs reads the doc column of every row and decodes each as T.
func listDocs[T any](s *session, what, sql string, args ...any) ([]*T, error) {
	var out []*T
	err := s.query(sql, args, func(rows pgx.Rows) error {
		var raw []byte
		if err := rows.Scan(&raw); err != nil {
			return err
		}
		v, err := decode[T](raw)
		if err != nil {
			return &decodeError{what: what, err: err}
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

const sqlExecution = `SELECT doc FROM executions WHERE tenant = $1 AND id = $2`

// Execution implements kernel.ReadTx.
func (r *readTx) Execution(tenant, id string) (*kernel.Execution, error) {
	if !readable(tenant, id) {
		return nil, missing("execution", tenant, id)
	}
	e, ok, err := getDoc[kernel.Execution](r.s, "execution "+tenant+"/"+id, sqlExecution, tenant, id)
	if err != nil {
		return nil, fmt.Errorf("postgres: execution %s/%s: %w", tenant, id, err)
	}
	if !ok {
		return nil, missing("execution", tenant, id)
	}
	return e, nil
}

// ExecutionTenant implements kernel.ReadTx.
func (r *readTx) ExecutionTenant(id string) (string, error) {
	if !readable(id) {
		return "", notFound("execution %s", id)
	}
	var tenant string
	ok, err := r.s.queryRow(`SELECT tenant FROM executions WHERE id = $1`, []any{id}, &tenant)
	if err != nil {
		return "", fmt.Errorf("postgres: execution tenant of %s: %w", id, err)
	}
	if !ok {
		return "", notFound("execution %s", id)
	}
	return tenant, nil
}

// ExecutionByIdempotencyKey implements kernel.ReadTx.
func (r *readTx) ExecutionByIdempotencyKey(tenant, k string) (string, error) {
	if !readable(tenant) || k == "" {
		return "", notFound("idempotency key %q in tenant %s", k, tenant)
	}
	var id string
	ok, err := r.s.queryRow(`SELECT id FROM executions WHERE tenant = $1 AND idem_key = $2`, []any{tenant, []byte(k)}, &id)
	if err != nil {
		return "", fmt.Errorf("postgres: idempotency key %q in tenant %s: %w", k, tenant, err)
	}
	if !ok {
		return "", notFound("idempotency key %q in tenant %s", k, tenant)
	}
	return id, nil
}

// ListExecutions implements kernel.ReadTx: newest (largest id; ids are
// UUIDv7) first, from just before f.Before.
func (r *readTx) ListExecutions(tenant string, f kernel.ExecutionFilter) ([]*kernel.Execution, error) {
	if !readable(tenant) || (f.Before != "" && !readable(f.Before)) || !validText(f.AgentID) || !validText(string(f.Status)) {
		return nil, nil
	}
	list, err := listDocs[kernel.Execution](r.s, "execution of "+tenant, `SELECT doc FROM executions
		WHERE tenant = $1 AND ($2 = '' OR agent_id = $2) AND ($3 = '' OR status = $3) AND ($4 = '' OR id < $4)
		ORDER BY id DESC LIMIT $5`, tenant, f.AgentID, string(f.Status), f.Before, limitArg(f.Limit))
	if err != nil {
		return nil, fmt.Errorf("postgres: list executions of %s: %w", tenant, err)
	}
	return list, nil
}

const sqlStep = `SELECT doc FROM steps WHERE tenant = $1 AND execution_id = $2 AND id = $3`

// Step implements kernel.ReadTx.
func (r *readTx) Step(tenant, executionID, stepID string) (*kernel.Step, error) {
	if !readable(tenant, executionID, stepID) {
		return nil, missing("step", tenant, executionID, stepID)
	}
	s, ok, err := getDoc[kernel.Step](r.s, "step "+stepID, sqlStep, tenant, executionID, stepID)
	if err != nil {
		return nil, fmt.Errorf("postgres: step %s/%s/%s: %w", tenant, executionID, stepID, err)
	}
	if !ok {
		return nil, missing("step", tenant, executionID, stepID)
	}
	return s, nil
}

// ListSteps implements kernel.ReadTx: by Seq, then id.
func (r *readTx) ListSteps(tenant, executionID string) ([]*kernel.Step, error) {
	if !readable(tenant, executionID) {
		return nil, nil
	}
	list, err := listDocs[kernel.Step](r.s, "step of "+executionID,
		`SELECT doc FROM steps WHERE tenant = $1 AND execution_id = $2 ORDER BY seq, id`, tenant, executionID)
	if err != nil {
		return nil, fmt.Errorf("postgres: list steps of %s/%s: %w", tenant, executionID, err)
	}
	return list, nil
}

// StepsPage implements kernel.ReadTx: the page is chosen from the steps'
// seqs and sizes, then only its documents are read.
func (r *readTx) StepsPage(tenant, executionID string, afterSeq uint64, limit, maxBytes int) ([]*kernel.Step, bool, error) {
	if !readable(tenant, executionID) {
		return nil, false, nil
	}
	if limit <= 0 {
		limit = math.MaxInt32 - 1
	}
	n, size, more := 0, 0, false
	var last int64
	err := r.s.query(`SELECT seq, octet_length(doc) FROM steps WHERE tenant = $1 AND execution_id = $2 AND seq > $3 ORDER BY seq, id LIMIT $4`,
		[]any{tenant, executionID, int64(afterSeq), limit + 1}, func(rows pgx.Rows) error {
			var seq int64
			var l int
			if err := rows.Scan(&seq, &l); err != nil {
				return err
			}
			switch {
			case more:
			case n == limit || maxBytes > 0 && n > 0 && size >= maxBytes:
				more = true
			default:
				n, size, last = n+1, size+l, seq
			}
			return nil
		})
	if err != nil || n == 0 {
		if err != nil {
			err = fmt.Errorf("postgres: steps of %s/%s: %w", tenant, executionID, err)
		}
		return nil, false, err
	}
	list, err := listDocs[kernel.Step](r.s, "step of "+executionID,
		`SELECT doc FROM steps WHERE tenant = $1 AND execution_id = $2 AND seq > $3 AND seq <= $4 ORDER BY seq, id LIMIT $5`,
		tenant, executionID, int64(afterSeq), last, n)
	if err != nil {
		return nil, false, fmt.Errorf("postgres: steps of %s/%s: %w", tenant, executionID, err)
	}
	return list, more, nil
}

const sqlOccurrence = `SELECT dispatch_id, attempt, count FROM occurrences WHERE tenant = $1 AND execution_id = $2 AND key = $3`

// Occurrence implements kernel.ReadTx.
func (r *readTx) Occurrence(tenant, executionID, k string) (kernel.Occurrence, error) {
	if !readable(tenant, executionID) {
		return kernel.Occurrence{}, nil
	}
	var o kernel.Occurrence
	_, err := r.s.queryRow(sqlOccurrence, []any{tenant, executionID, []byte(k)}, &o.Lease.DispatchID, &o.Lease.Attempt, &o.Count)
	if err != nil {
		return kernel.Occurrence{}, fmt.Errorf("postgres: occurrence %s/%s/%q: %w", tenant, executionID, k, err)
	}
	return o, nil
}

// Events implements kernel.ReadTx: a range scan from afterSeq+1.
func (r *readTx) Events(tenant, executionID string, afterSeq uint64, limit int) ([]kernel.Event, error) {
	if !readable(tenant, executionID) || afterSeq >= math.MaxInt64 {
		return nil, nil
	}
	var out []kernel.Event
	err := r.s.query(`SELECT seq, type, at, payload FROM events
		WHERE tenant = $1 AND execution_id = $2 AND seq > $3 ORDER BY seq LIMIT $4`,
		[]any{tenant, executionID, int64(afterSeq), limitArg(limit)}, func(rows pgx.Rows) error {
			var seq, at int64
			ev := kernel.Event{ExecutionID: executionID}
			if err := rows.Scan(&seq, &ev.Type, &at, &ev.Payload); err != nil {
				return err
			}
			ev.Seq, ev.Time = uint64(seq), fromNanos(at)
			out = append(out, ev)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("postgres: events of %s/%s: %w", tenant, executionID, err)
	}
	return out, nil
}

const sqlAgent = `SELECT doc FROM agents WHERE tenant = $1 AND id = $2`

// Agent implements kernel.ReadTx.
func (r *readTx) Agent(tenant, id string) (*kernel.Agent, error) {
	if !readable(tenant, id) {
		return nil, notFound("agent %s/%s", tenant, id)
	}
	a, ok, err := getDoc[kernel.Agent](r.s, "agent "+id, sqlAgent, tenant, id)
	if err != nil {
		return nil, fmt.Errorf("postgres: agent %s/%s: %w", tenant, id, err)
	}
	if !ok {
		return nil, notFound("agent %s/%s", tenant, id)
	}
	return a, nil
}

// ListAgents implements kernel.ReadTx: ordered by id.
func (r *readTx) ListAgents(tenant string) ([]*kernel.Agent, error) {
	if !readable(tenant) {
		return nil, nil
	}
	list, err := listDocs[kernel.Agent](r.s, "agent of "+tenant, `SELECT doc FROM agents WHERE tenant = $1 ORDER BY id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("postgres: list agents of %s: %w", tenant, err)
	}
	return list, nil
}

// CountAgents implements kernel.ReadTx.
func (r *readTx) CountAgents(tenant string) (int, error) {
	return r.count("agents", tenant)
}

// CountAPIKeys implements kernel.ReadTx.
func (r *readTx) CountAPIKeys(tenant string) (int, error) {
	return r.count("api_keys", tenant)
}

// count returns how many rows of table (a constant of this package)
// belong to tenant.
func (r *readTx) count(table, tenant string) (int, error) {
	if !readable(tenant) {
		return 0, nil
	}
	var n int64
	if _, err := r.s.queryRow(`SELECT count(*) FROM `+table+` WHERE tenant = $1`, []any{tenant}, &n); err != nil {
		return 0, fmt.Errorf("postgres: count %s of %s: %w", table, tenant, err)
	}
	return int(n), nil
}

// timeRefs runs a query of (tenant, id, time) rows.
func (r *readTx) timeRefs(sql string, now time.Time, limit int, fn func(tenant, id string, at time.Time)) error {
	return r.s.query(sql, []any{nanos(now), limitArg(limit)}, func(rows pgx.Rows) error {
		var tenant, id string
		var at int64
		if err := rows.Scan(&tenant, &id, &at); err != nil {
			return err
		}
		fn(tenant, id, fromNanos(at))
		return nil
	})
}

// DueDispatches implements kernel.ReadTx.
func (r *readTx) DueDispatches(now time.Time, limit int) ([]kernel.DispatchRef, error) {
	var out []kernel.DispatchRef
	err := r.timeRefs(`SELECT tenant, id, due_at FROM executions WHERE dispatch_state = 'queued' AND due_at <= $1
		ORDER BY due_at, tenant, id LIMIT $2`, now, limit, func(tenant, id string, at time.Time) {
		out = append(out, kernel.DispatchRef{Tenant: tenant, ExecutionID: id, At: at})
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: due dispatches: %w", err)
	}
	return out, nil
}

// NextDue implements kernel.ReadTx.
func (r *readTx) NextDue() (time.Time, bool, error) {
	var at int64
	ok, err := r.s.queryRow(`SELECT due_at FROM executions WHERE dispatch_state = 'queued' ORDER BY due_at LIMIT 1`, nil, &at)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("postgres: next due: %w", err)
	}
	if !ok {
		return time.Time{}, false, nil
	}
	return fromNanos(at), true, nil
}

// ExpiredLeases implements kernel.ReadTx.
func (r *readTx) ExpiredLeases(now time.Time, limit int) ([]kernel.DispatchRef, error) {
	var out []kernel.DispatchRef
	err := r.timeRefs(`SELECT tenant, id, lease_until FROM executions WHERE dispatch_state IN ('delivering', 'acked')
		AND lease_until <= $1 ORDER BY lease_until, tenant, id LIMIT $2`, now, limit, func(tenant, id string, at time.Time) {
		out = append(out, kernel.DispatchRef{Tenant: tenant, ExecutionID: id, At: at})
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: expired leases: %w", err)
	}
	return out, nil
}

const sqlApproval = `SELECT doc FROM approvals WHERE tenant = $1 AND id = $2`

// Approval implements kernel.ReadTx.
func (r *readTx) Approval(tenant, id string) (*kernel.Approval, error) {
	if !readable(tenant, id) {
		return nil, notFound("approval %s/%s", tenant, id)
	}
	a, ok, err := getDoc[kernel.Approval](r.s, "approval "+id, sqlApproval, tenant, id)
	if err != nil {
		return nil, fmt.Errorf("postgres: approval %s/%s: %w", tenant, id, err)
	}
	if !ok {
		return nil, notFound("approval %s/%s", tenant, id)
	}
	return a, nil
}

// ListApprovals implements kernel.ReadTx: newest (CreatedAt, then id) first.
func (r *readTx) ListApprovals(tenant string, status kernel.ApprovalStatus) ([]*kernel.Approval, error) {
	if !readable(tenant) || !validText(string(status)) {
		return nil, nil
	}
	list, err := listDocs[kernel.Approval](r.s, "approval of "+tenant, `SELECT doc FROM approvals
		WHERE tenant = $1 AND ($2 = '' OR status = $2) ORDER BY created_at DESC, id DESC`, tenant, string(status))
	if err != nil {
		return nil, fmt.Errorf("postgres: list approvals of %s: %w", tenant, err)
	}
	return list, nil
}

// ExpiredApprovals implements kernel.ReadTx.
func (r *readTx) ExpiredApprovals(now time.Time, limit int) ([]kernel.ApprovalRef, error) {
	var out []kernel.ApprovalRef
	err := r.timeRefs(`SELECT tenant, id, expires_at FROM approvals WHERE status = 'pending' AND expires_at <= $1
		ORDER BY expires_at, tenant, id LIMIT $2`, now, limit, func(tenant, id string, at time.Time) {
		out = append(out, kernel.ApprovalRef{Tenant: tenant, ApprovalID: id, At: at})
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: expired approvals: %w", err)
	}
	return out, nil
}

const sqlBundle = `SELECT doc, archive FROM bundles WHERE tenant = $1 AND name = $2`

// scanBundle decodes a (doc, archive) row.
func scanBundle(doc, archive []byte) (*kernel.BundleRecord, error) {
	b, err := decode[kernel.BundleRecord](doc)
	if err != nil {
		return nil, &decodeError{what: "bundle", err: err}
	}
	b.Archive = archive
	return b, nil
}

// Bundle implements kernel.ReadTx.
func (r *readTx) Bundle(tenant, name string) (*kernel.BundleRecord, error) {
	if !readable(tenant, name) {
		return nil, notFound("bundle %s/%s", tenant, name)
	}
	var doc, archive []byte
	ok, err := r.s.queryRow(sqlBundle, []any{tenant, name}, &doc, &archive)
	if err == nil && ok {
		var b *kernel.BundleRecord
		if b, err = scanBundle(doc, archive); err == nil {
			return b, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("postgres: bundle %s/%s: %w", tenant, name, err)
	}
	return nil, notFound("bundle %s/%s", tenant, name)
}

// ListBundles implements kernel.ReadTx: ordered by (tenant, name).
func (r *readTx) ListBundles(tenant string) ([]*kernel.BundleRecord, error) {
	if tenant != "" && !readable(tenant) {
		return nil, nil
	}
	var out []*kernel.BundleRecord
	err := r.s.query(`SELECT doc, archive FROM bundles WHERE ($1 = '' OR tenant = $1) ORDER BY tenant, name`,
		[]any{tenant}, func(rows pgx.Rows) error {
			var doc, archive []byte
			if err := rows.Scan(&doc, &archive); err != nil {
				return err
			}
			b, err := scanBundle(doc, archive)
			if err != nil {
				return err
			}
			out = append(out, b)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("postgres: list bundles of %q: %w", tenant, err)
	}
	return out, nil
}

const sqlCounter = `SELECT value FROM counters WHERE tenant = $1 AND key = $2`

// Counter implements kernel.ReadTx.
func (r *readTx) Counter(tenant, k string) ([]byte, error) {
	if !readable(tenant) {
		return nil, nil
	}
	var v []byte
	ok, err := r.s.queryRow(sqlCounter, []any{tenant, []byte(k)}, &v)
	if err != nil {
		return nil, fmt.Errorf("postgres: counter %s/%q: %w", tenant, k, err)
	}
	if ok && v == nil {
		v = []byte{}
	}
	return v, nil
}

const sqlTenant = `SELECT doc FROM tenants WHERE id = $1`

// Tenant implements kernel.ReadTx.
func (r *readTx) Tenant(id string) (*kernel.Tenant, error) {
	if !readable(id) {
		return nil, notFound("tenant %s", id)
	}
	t, ok, err := getDoc[kernel.Tenant](r.s, "tenant "+id, sqlTenant, id)
	if err != nil {
		return nil, fmt.Errorf("postgres: tenant %s: %w", id, err)
	}
	if !ok {
		return nil, notFound("tenant %s", id)
	}
	return t, nil
}

// ListTenants implements kernel.ReadTx: ordered by id.
func (r *readTx) ListTenants() ([]*kernel.Tenant, error) {
	list, err := listDocs[kernel.Tenant](r.s, "tenant", `SELECT doc FROM tenants ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("postgres: list tenants: %w", err)
	}
	return list, nil
}

// APIKeyByHash implements kernel.ReadTx.
func (r *readTx) APIKeyByHash(hash string) (*kernel.APIKey, error) {
	if !readable(hash) {
		return nil, notFound("api key by hash")
	}
	k, ok, err := getDoc[kernel.APIKey](r.s, "api key", `SELECT doc FROM api_keys WHERE hash = $1`, hash)
	if err != nil {
		return nil, fmt.Errorf("postgres: api key by hash: %w", err)
	}
	if !ok {
		return nil, notFound("api key by hash")
	}
	return k, nil
}

// ListAPIKeys implements kernel.ReadTx: ordered by key id.
func (r *readTx) ListAPIKeys(tenant string) ([]*kernel.APIKey, error) {
	if !readable(tenant) {
		return nil, nil
	}
	list, err := listDocs[kernel.APIKey](r.s, "api key of "+tenant, `SELECT doc FROM api_keys WHERE tenant = $1 ORDER BY id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("postgres: list api keys of %s: %w", tenant, err)
	}
	return list, nil
}
