package postgres

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wicket-run/wicket/kernel"
)

// writeTx implements kernel.Tx for the functions of one batch, run one
// after the other in one PostgreSQL transaction.
//
// # Buffered writes
//
// Writes do not reach the database when they are made: each becomes an op
// in the layer of the running function (own), keyed by its record's
// primary key, and is sent with the batch's COMMIT, all of them in one
// round trip. Point reads (Execution, Step, Occurrence, Agent, Approval,
// Bundle, Counter, Tenant) look at own, then at the layer of the functions
// already run (batch), then at the database. Every other read (listings,
// range scans, secondary keys) first flushes the buffered writes so that
// the database answers it.
//
// A function that fails loses its layer; the others stay. When some of
// the running function's writes were already flushed, they are inside a
// savepoint the function set before flushing them, and are rolled back to
// it. A function that succeeds hands its layer to batch.
//
// # Conflicts
//
// AppendEvent and PutExecution must refuse, at once, what conflicts with
// stored records. They answer from what the transaction knows when they
// can, and ask the database otherwise:
//
//   - an event (execution, seq) exists when this transaction appended it,
//     or when 1 <= seq <= LastSeq of the execution's row as last read from
//     the database (an execution's events run from 1 to its LastSeq; Check
//     verifies it). Without such a read, a query answers. The events
//     table's primary key refuses a duplicate at COMMIT in any case, and
//     the batch is then run again with strict set, which asks the database
//     every time.
//   - PutExecution of an execution this transaction read or wrote, with
//     the idempotency key it already has (or none), cannot conflict; any
//     other PutExecution flushes and queries the id and the key.
type writeTx struct {
	readTx
	strict bool // ask the database for every conflict check
	batch  *layer
	own    *layer
	// savepoint is set when the running function set its savepoint: some
	// of its writes are in the database.
	savepoint bool
}

var _ kernel.Tx = (*writeTx)(nil)

// table names an op's table.
type table uint8

const (
	tExecutions table = iota
	tSteps
	tOccurrences
	tEvents
	tAgents
	tApprovals
	tBundles
	tCounters
	tTenants
	tAPIKeys
)

// okey is the primary key of a buffered write.
type okey struct {
	t      table
	tenant string
	id     string // execution id, agent id, approval id, bundle name, tenant id, counter key, api key id
	sub    string // step id, occurrence key
	seq    uint64 // event seq
}

func compareKeys(a, b okey) int {
	if c := cmp.Compare(a.t, b.t); c != 0 {
		return c
	}
	if c := strings.Compare(a.tenant, b.tenant); c != 0 {
		return c
	}
	if c := strings.Compare(a.id, b.id); c != 0 {
		return c
	}
	if c := strings.Compare(a.sub, b.sub); c != 0 {
		return c
	}
	return cmp.Compare(a.seq, b.seq)
}

// op is one buffered write.
type op struct {
	del  bool
	stmt statement
	// What point reads return: the encoded record (doc), a bundle's
	// archive, an occurrence, a counter's value.
	doc     []byte
	archive []byte
	occ     kernel.Occurrence
	value   []byte
}

// execInfo is what a transaction knows of an execution's stored row.
type execInfo struct {
	exists bool   // the execution exists in this tenant (stored or buffered)
	idem   string // its idempotency key
	// dbLast is the LastSeq of the row as read from the database (0 when
	// there is no row); valid when lastKnown.
	dbLast    uint64
	lastKnown bool
}

// execRef names an execution.
type execRef struct{ tenant, id string }

// layer holds the buffered writes and the knowledge of one function (own)
// or of the functions already run (batch).
type layer struct {
	ops    map[okey]*op
	execs  map[execRef]execInfo
	events map[okey]bool // events appended (flushed or not)
	// purged are the executions DeleteExecution deleted from (its events
	// known before that are forgotten).
	purged  map[execRef]bool
	changes changes // what other replicas are told at commit
}

func newLayer() *layer {
	return &layer{ops: map[okey]*op{}, execs: map[execRef]execInfo{}, events: map[okey]bool{}, purged: map[execRef]bool{},
		changes: newChanges()}
}

// absorb moves l's writes and knowledge into dst (l's win).
func (l *layer) absorb(src *layer) {
	for k, o := range src.ops {
		l.ops[k] = o
	}
	for k, v := range src.execs {
		l.execs[k] = v
	}
	for ref := range src.purged {
		for k := range l.events {
			if k.tenant == ref.tenant && k.id == ref.id {
				delete(l.events, k)
			}
		}
		l.purged[ref] = true
	}
	for k := range src.events {
		l.events[k] = true
	}
	l.changes.absorb(src.changes)
}

// statements returns the layer's buffered writes as statements, deletes
// first, then the writes of each table in key order (the same order in
// every replica, which keeps row-lock deadlocks rare), and empties the
// layer's ops. The rows written to a table that has a bulk form go in one
// statement (see bulkWrites).
func (l *layer) statements() []statement {
	if len(l.ops) == 0 {
		return nil
	}
	keys := make([]okey, 0, len(l.ops))
	for k := range l.ops {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b okey) int {
		da, db := l.ops[a].del, l.ops[b].del
		if da != db {
			if da {
				return -1
			}
			return 1
		}
		return compareKeys(a, b)
	})
	out := make([]statement, 0, len(keys))
	for i := 0; i < len(keys); {
		o := l.ops[keys[i]]
		j := i + 1
		for j < len(keys) && keys[j].t == keys[i].t && !l.ops[keys[j]].del {
			j++
		}
		if b, ok := bulkWrites[keys[i].t]; ok && !o.del && j-i > 1 {
			rows := make([][]any, 0, j-i)
			for _, k := range keys[i:j] {
				rows = append(rows, l.ops[k].stmt.args)
			}
			out = append(out, b.statement(rows))
			i = j
			continue
		}
		out = append(out, o.stmt)
		i++
	}
	clear(l.ops)
	return out
}

// colType is the PostgreSQL type of a column of a bulk write.
type colType string

const (
	cText  colType = "text"
	cBytea colType = "bytea"
	cInt8  colType = "bigint"
	cInt4  colType = "integer"
)

// bulk is the many-row form of a table's write: INSERT … SELECT FROM
// unnest(one array per column), with the single-row statement's ON
// CONFLICT clause. One statement instead of one per row is the largest
// saving of a group commit on the database's side.
type bulk struct {
	sql   string
	types []colType
}

// newBulk derives the bulk form of a single-row write "head VALUES (…) tail".
func newBulk(single string, types ...colType) bulk {
	head, rest, ok := strings.Cut(single, "VALUES (")
	if !ok {
		panic("postgres: bulk write of a statement without VALUES: " + single)
	}
	_, tail, _ := strings.Cut(rest, ")")
	params := make([]string, len(types))
	for i, t := range types {
		params[i] = fmt.Sprintf("$%d::%s[]", i+1, t)
	}
	return bulk{sql: head + "SELECT * FROM unnest(" + strings.Join(params, ", ") + ")" + tail, types: types}
}

// statement turns rows (each the arguments of the single-row statement)
// into the bulk statement's arrays.
func (b bulk) statement(rows [][]any) statement {
	args := make([]any, len(b.types))
	for c, t := range b.types {
		switch t {
		case cText:
			col := make([]string, len(rows))
			for i, r := range rows {
				col[i] = r[c].(string)
			}
			args[c] = col
		case cBytea:
			col := make([][]byte, len(rows))
			for i, r := range rows {
				if v, ok := r[c].([]byte); ok {
					col[i] = v
				}
			}
			args[c] = col
		case cInt8:
			col := make([]int64, len(rows))
			for i, r := range rows {
				col[i] = r[c].(int64)
			}
			args[c] = col
		case cInt4:
			col := make([]int32, len(rows))
			for i, r := range rows {
				col[i] = r[c].(int32)
			}
			args[c] = col
		}
	}
	return statement{sql: b.sql, args: args}
}

// bulkWrites are the tables written in bulk: those of the step hot path.
var bulkWrites = map[table]bulk{
	tExecutions:  newBulk(sqlPutExecution, cText, cText, cText, cText, cBytea, cText, cInt8, cInt8, cInt8, cBytea),
	tSteps:       newBulk(sqlPutStep, cText, cText, cText, cInt8, cBytea),
	tOccurrences: newBulk(sqlPutOccurrence, cText, cText, cBytea, cText, cInt4, cInt4),
	tEvents:      newBulk(sqlAppendEvent, cText, cText, cInt8, cText, cInt8, cBytea),
	tCounters:    newBulk(sqlPutCounter, cText, cBytea, cBytea),
}

func newWriteTx(s *session, strict bool) *writeTx {
	return &writeTx{readTx: readTx{s: s}, strict: strict, batch: newLayer()}
}

// beginFn starts a function's layer.
func (w *writeTx) beginFn() {
	w.own = newLayer()
	w.savepoint = false
}

// endFn ends the running function: ok keeps its writes, otherwise they
// are dropped (and rolled back to its savepoint, if it set one).
func (w *writeTx) endFn(ok bool) {
	if ok {
		w.batch.absorb(w.own)
		if w.savepoint {
			w.s.pre = append(w.s.pre, "RELEASE SAVEPOINT fn")
		}
	} else if w.savepoint {
		w.s.pre = append(w.s.pre, "ROLLBACK TO SAVEPOINT fn", "RELEASE SAVEPOINT fn")
	}
	w.own, w.savepoint = nil, false
}

// flush sends every buffered write: batch's, then (after setting the
// function's savepoint) own's.
func (w *writeTx) flush() error {
	stmts := w.batch.statements()
	if len(w.own.ops) > 0 {
		if !w.savepoint {
			stmts = append(stmts, statement{sql: "SAVEPOINT fn"})
			w.savepoint = true
		}
		stmts = append(stmts, w.own.statements()...)
	}
	if len(stmts) == 0 {
		return nil
	}
	if err := w.s.pipeline(stmts); err != nil {
		return fmt.Errorf("postgres: flush buffered writes: %w", err)
	}
	return nil
}

// finalStatements returns what the COMMIT carries: the batch's writes and
// the notifications of what they change (delivered at commit, or never).
func (w *writeTx) finalStatements(channel, origin string) []statement {
	return append(w.batch.statements(), w.batch.changes.notifications(channel, origin)...)
}

// lookup returns the buffered write of k, own's first.
func (w *writeTx) lookup(k okey) (*op, bool) {
	if o, ok := w.own.ops[k]; ok {
		return o, true
	}
	o, ok := w.batch.ops[k]
	return o, ok
}

// put buffers a write.
func (w *writeTx) put(k okey, o *op) { w.own.ops[k] = o }

// info returns what the transaction knows of an execution.
func (w *writeTx) info(ref execRef) (execInfo, bool) {
	if v, ok := w.own.execs[ref]; ok {
		return v, true
	}
	v, ok := w.batch.execs[ref]
	return v, ok
}

// flushed runs fn after a flush: the reads that the buffer cannot answer.
func flushed[T any](w *writeTx, fn func() (T, error)) (T, error) {
	if err := w.flush(); err != nil {
		var zero T
		return zero, err
	}
	return fn()
}

// Execution implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) Execution(tenant, id string) (*kernel.Execution, error) {
	if !readable(tenant, id) {
		return nil, missing("execution", tenant, id)
	}
	if o, ok := w.lookup(okey{t: tExecutions, tenant: tenant, id: id}); ok {
		e, err := decode[kernel.Execution](o.doc)
		if err != nil {
			return nil, fmt.Errorf("postgres: execution %s/%s: buffered: %w", tenant, id, err)
		}
		return e, nil
	}
	e, err := w.readTx.Execution(tenant, id)
	switch {
	case err == nil:
		w.own.execs[execRef{tenant, id}] = execInfo{exists: true, idem: e.IdempotencyKey, dbLast: e.LastSeq, lastKnown: true}
	case errors.Is(err, kernel.ErrNotFound) && w.s.err == nil:
		w.own.execs[execRef{tenant, id}] = execInfo{lastKnown: true}
	}
	return e, err
}

// ExecutionTenant implements kernel.ReadTx.
func (w *writeTx) ExecutionTenant(id string) (string, error) {
	return flushed(w, func() (string, error) { return w.readTx.ExecutionTenant(id) })
}

// ExecutionByIdempotencyKey implements kernel.ReadTx.
func (w *writeTx) ExecutionByIdempotencyKey(tenant, k string) (string, error) {
	return flushed(w, func() (string, error) { return w.readTx.ExecutionByIdempotencyKey(tenant, k) })
}

// ListExecutions implements kernel.ReadTx.
func (w *writeTx) ListExecutions(tenant string, f kernel.ExecutionFilter) ([]*kernel.Execution, error) {
	return flushed(w, func() ([]*kernel.Execution, error) { return w.readTx.ListExecutions(tenant, f) })
}

// Step implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) Step(tenant, executionID, stepID string) (*kernel.Step, error) {
	if !readable(tenant, executionID, stepID) {
		return nil, missing("step", tenant, executionID, stepID)
	}
	if o, ok := w.lookup(okey{t: tSteps, tenant: tenant, id: executionID, sub: stepID}); ok {
		s, err := decode[kernel.Step](o.doc)
		if err != nil {
			return nil, fmt.Errorf("postgres: step %s/%s/%s: buffered: %w", tenant, executionID, stepID, err)
		}
		return s, nil
	}
	return w.readTx.Step(tenant, executionID, stepID)
}

// ListSteps implements kernel.ReadTx.
func (w *writeTx) ListSteps(tenant, executionID string) ([]*kernel.Step, error) {
	return flushed(w, func() ([]*kernel.Step, error) { return w.readTx.ListSteps(tenant, executionID) })
}

// StepsPage implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) StepsPage(tenant, executionID string, afterSeq uint64, limit, maxBytes int) ([]*kernel.Step, bool, error) {
	if err := w.flush(); err != nil {
		return nil, false, err
	}
	return w.readTx.StepsPage(tenant, executionID, afterSeq, limit, maxBytes)
}

// Occurrence implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) Occurrence(tenant, executionID, k string) (kernel.Occurrence, error) {
	if !readable(tenant, executionID) {
		return kernel.Occurrence{}, nil
	}
	if o, ok := w.lookup(okey{t: tOccurrences, tenant: tenant, id: executionID, sub: k}); ok {
		return o.occ, nil
	}
	return w.readTx.Occurrence(tenant, executionID, k)
}

// Events implements kernel.ReadTx.
func (w *writeTx) Events(tenant, executionID string, afterSeq uint64, limit int) ([]kernel.Event, error) {
	return flushed(w, func() ([]kernel.Event, error) { return w.readTx.Events(tenant, executionID, afterSeq, limit) })
}

// Agent implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) Agent(tenant, id string) (*kernel.Agent, error) {
	if !readable(tenant, id) {
		return nil, notFound("agent %s/%s", tenant, id)
	}
	if o, ok := w.lookup(okey{t: tAgents, tenant: tenant, id: id}); ok {
		if o.del {
			return nil, notFound("agent %s/%s", tenant, id)
		}
		return decodeBuffered[kernel.Agent]("agent", o)
	}
	return w.readTx.Agent(tenant, id)
}

// decodeBuffered decodes the record of a buffered write.
func decodeBuffered[T any](what string, o *op) (*T, error) {
	v, err := decode[T](o.doc)
	if err != nil {
		return nil, fmt.Errorf("postgres: buffered %s: %w", what, err)
	}
	return v, nil
}

// ListAgents implements kernel.ReadTx.
func (w *writeTx) ListAgents(tenant string) ([]*kernel.Agent, error) {
	return flushed(w, func() ([]*kernel.Agent, error) { return w.readTx.ListAgents(tenant) })
}

// DueDispatches implements kernel.ReadTx.
func (w *writeTx) DueDispatches(now time.Time, limit int) ([]kernel.DispatchRef, error) {
	return flushed(w, func() ([]kernel.DispatchRef, error) { return w.readTx.DueDispatches(now, limit) })
}

// NextDue implements kernel.ReadTx.
func (w *writeTx) NextDue() (time.Time, bool, error) {
	if err := w.flush(); err != nil {
		return time.Time{}, false, err
	}
	return w.readTx.NextDue()
}

// ExpiredLeases implements kernel.ReadTx.
func (w *writeTx) ExpiredLeases(now time.Time, limit int) ([]kernel.DispatchRef, error) {
	return flushed(w, func() ([]kernel.DispatchRef, error) { return w.readTx.ExpiredLeases(now, limit) })
}

// Approval implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) Approval(tenant, id string) (*kernel.Approval, error) {
	if !readable(tenant, id) {
		return nil, notFound("approval %s/%s", tenant, id)
	}
	if o, ok := w.lookup(okey{t: tApprovals, tenant: tenant, id: id}); ok {
		return decodeBuffered[kernel.Approval]("approval", o)
	}
	return w.readTx.Approval(tenant, id)
}

// ListApprovals implements kernel.ReadTx.
func (w *writeTx) ListApprovals(tenant string, status kernel.ApprovalStatus) ([]*kernel.Approval, error) {
	return flushed(w, func() ([]*kernel.Approval, error) { return w.readTx.ListApprovals(tenant, status) })
}

// ExpiredApprovals implements kernel.ReadTx.
func (w *writeTx) ExpiredApprovals(now time.Time, limit int) ([]kernel.ApprovalRef, error) {
	return flushed(w, func() ([]kernel.ApprovalRef, error) { return w.readTx.ExpiredApprovals(now, limit) })
}

// Bundle implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) Bundle(tenant, name string) (*kernel.BundleRecord, error) {
	if !readable(tenant, name) {
		return nil, notFound("bundle %s/%s", tenant, name)
	}
	if o, ok := w.lookup(okey{t: tBundles, tenant: tenant, id: name}); ok {
		if o.del {
			return nil, notFound("bundle %s/%s", tenant, name)
		}
		b, err := decodeBuffered[kernel.BundleRecord]("bundle", o)
		if err != nil {
			return nil, err
		}
		b.Archive = bytes.Clone(o.archive)
		return b, nil
	}
	return w.readTx.Bundle(tenant, name)
}

// ListBundles implements kernel.ReadTx.
func (w *writeTx) ListBundles(tenant string) ([]*kernel.BundleRecord, error) {
	return flushed(w, func() ([]*kernel.BundleRecord, error) { return w.readTx.ListBundles(tenant) })
}

// Counter implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) Counter(tenant, k string) ([]byte, error) {
	if !readable(tenant) {
		return nil, nil
	}
	if o, ok := w.lookup(okey{t: tCounters, tenant: tenant, id: k}); ok {
		return bytes.Clone(o.value), nil
	}
	return w.readTx.Counter(tenant, k)
}

// Tenant implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) Tenant(id string) (*kernel.Tenant, error) {
	if !readable(id) {
		return nil, notFound("tenant %s", id)
	}
	if o, ok := w.lookup(okey{t: tTenants, id: id}); ok {
		return decodeBuffered[kernel.Tenant]("tenant", o)
	}
	return w.readTx.Tenant(id)
}

// ListTenants implements kernel.ReadTx.
func (w *writeTx) ListTenants() ([]*kernel.Tenant, error) {
	return flushed(w, w.readTx.ListTenants)
}

// APIKeyByHash implements kernel.ReadTx.
func (w *writeTx) APIKeyByHash(hash string) (*kernel.APIKey, error) {
	return flushed(w, func() (*kernel.APIKey, error) { return w.readTx.APIKeyByHash(hash) })
}

// CountAgents implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) CountAgents(tenant string) (int, error) {
	return flushed(w, func() (int, error) { return w.readTx.CountAgents(tenant) })
}

// CountAPIKeys implements kernel.ReadTx, seeing buffered writes.
func (w *writeTx) CountAPIKeys(tenant string) (int, error) {
	return flushed(w, func() (int, error) { return w.readTx.CountAPIKeys(tenant) })
}

// ListAPIKeys implements kernel.ReadTx.
func (w *writeTx) ListAPIKeys(tenant string) ([]*kernel.APIKey, error) {
	return flushed(w, func() ([]*kernel.APIKey, error) { return w.readTx.ListAPIKeys(tenant) })
}

// encodeOp encodes v as the doc of an upsert.
func encodeOp(what string, v any, sql string, args ...any) (*op, error) {
	doc, err := encode(v)
	if err != nil {
		return nil, fmt.Errorf("postgres: %s: encode: %w", what, err)
	}
	return &op{doc: doc, stmt: statement{sql: sql, args: append(args, doc)}}, nil
}

const sqlPutExecution = `INSERT INTO executions
	(tenant, id, agent_id, status, idem_key, dispatch_state, due_at, lease_until, last_seq, doc)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
	ON CONFLICT (tenant, id) DO UPDATE SET agent_id = excluded.agent_id, status = excluded.status,
	idem_key = excluded.idem_key, dispatch_state = excluded.dispatch_state, due_at = excluded.due_at,
	lease_until = excluded.lease_until, last_seq = excluded.last_seq, doc = excluded.doc`

// PutExecution implements kernel.Tx. It refuses (ErrConflict) an id owned
// by another tenant and an idempotency key that names another execution of
// the tenant, before anything is written.
func (w *writeTx) PutExecution(e *kernel.Execution) error {
	if e == nil {
		return fmt.Errorf("postgres: put execution: nil: %w", kernel.ErrValidation)
	}
	what := "put execution"
	if err := checkIDs(what, e.Tenant, e.ID); err != nil {
		return err
	}
	for _, f := range [][2]string{{"agent_id", e.AgentID}, {"status", string(e.Status)}, {"dispatch state", string(e.Dispatch.State)}} {
		if err := checkText(what, f[0], f[1]); err != nil {
			return err
		}
	}
	if e.LastSeq > math.MaxInt64 {
		return fmt.Errorf("postgres: put execution %s/%s: last_seq %d out of range: %w", e.Tenant, e.ID, e.LastSeq, kernel.ErrValidation)
	}
	ref := execRef{e.Tenant, e.ID}
	info, known := w.info(ref)
	if w.strict || !known || !info.exists || (e.IdempotencyKey != "" && e.IdempotencyKey != info.idem) {
		var err error
		if info, err = w.checkExecution(e); err != nil {
			return err
		}
	}
	var idem any // NULL: no key
	if e.IdempotencyKey != "" {
		idem = []byte(e.IdempotencyKey)
	}
	due, lease := int64(0), int64(0)
	if queued(e.Dispatch.State) {
		due = nanos(e.Dispatch.DueAt)
	}
	if leased(e.Dispatch.State) {
		lease = nanos(e.Dispatch.LeaseUntil)
	}
	o, err := encodeOp("put execution "+e.Tenant+"/"+e.ID, e, sqlPutExecution,
		e.Tenant, e.ID, e.AgentID, string(e.Status), idem, string(e.Dispatch.State), due, lease, int64(e.LastSeq))
	if err != nil {
		return err
	}
	w.put(okey{t: tExecutions, tenant: e.Tenant, id: e.ID}, o)
	w.own.changes.queued[ref] = queued(e.Dispatch.State)
	info.exists, info.idem = true, e.IdempotencyKey
	w.own.execs[ref] = info
	return nil
}

// checkExecution looks for the rows an execution's id and idempotency key
// may conflict with, after flushing, and returns what it learnt of e's row.
func (w *writeTx) checkExecution(e *kernel.Execution) (execInfo, error) {
	if err := w.flush(); err != nil {
		return execInfo{}, err
	}
	var idem any
	if e.IdempotencyKey != "" {
		idem = []byte(e.IdempotencyKey)
	}
	info := execInfo{lastKnown: true}
	var conflict error
	err := w.s.query(`SELECT tenant, id, idem_key, last_seq FROM executions WHERE id = $1 OR (tenant = $2 AND idem_key = $3)`,
		[]any{e.ID, e.Tenant, idem}, func(rows pgx.Rows) error {
			var tenant, id string
			var key []byte
			var last int64
			if err := rows.Scan(&tenant, &id, &key, &last); err != nil {
				return err
			}
			switch {
			case id == e.ID && tenant != e.Tenant:
				conflict = fmt.Errorf("postgres: put execution %s/%s: id belongs to another tenant: %w", e.Tenant, e.ID, kernel.ErrConflict)
			case id == e.ID:
				info = execInfo{exists: true, idem: string(key), dbLast: uint64(last), lastKnown: true}
			case e.IdempotencyKey != "" && string(key) == e.IdempotencyKey && conflict == nil:
				conflict = fmt.Errorf("postgres: put execution %s/%s: idempotency key %q names execution %s: %w",
					e.Tenant, e.ID, e.IdempotencyKey, id, kernel.ErrConflict)
			}
			return nil
		})
	if err != nil {
		return execInfo{}, fmt.Errorf("postgres: put execution %s/%s: check id and key: %w", e.Tenant, e.ID, err)
	}
	return info, conflict
}

const sqlPutStep = `INSERT INTO steps (tenant, execution_id, id, seq, doc) VALUES ($1, $2, $3, $4, $5)
	ON CONFLICT (tenant, execution_id, id) DO UPDATE SET seq = excluded.seq, doc = excluded.doc`

// PutStep implements kernel.Tx.
func (w *writeTx) PutStep(s *kernel.Step) error {
	if s == nil {
		return fmt.Errorf("postgres: put step: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put step", s.Tenant, s.ExecutionID, s.ID); err != nil {
		return err
	}
	if s.Seq > math.MaxInt64 {
		return fmt.Errorf("postgres: put step %s: seq %d out of range: %w", s.ID, s.Seq, kernel.ErrValidation)
	}
	o, err := encodeOp("put step "+s.ID, s, sqlPutStep, s.Tenant, s.ExecutionID, s.ID, int64(s.Seq))
	if err != nil {
		return err
	}
	w.put(okey{t: tSteps, tenant: s.Tenant, id: s.ExecutionID, sub: s.ID}, o)
	return nil
}

const sqlPutOccurrence = `INSERT INTO occurrences (tenant, execution_id, key, dispatch_id, attempt, count)
	VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, execution_id, key) DO UPDATE SET
	dispatch_id = excluded.dispatch_id, attempt = excluded.attempt, count = excluded.count`

// PutOccurrence implements kernel.Tx.
func (w *writeTx) PutOccurrence(tenant, executionID, k string, o kernel.Occurrence) error {
	if err := checkIDs("put occurrence", tenant, executionID); err != nil {
		return err
	}
	if err := checkText("put occurrence", "dispatch_id", o.Lease.DispatchID); err != nil {
		return err
	}
	if o.Count > math.MaxInt32 || o.Count < math.MinInt32 || o.Lease.Attempt > math.MaxInt32 || o.Lease.Attempt < math.MinInt32 {
		return fmt.Errorf("postgres: put occurrence %s/%s/%q: count or attempt out of range: %w", tenant, executionID, k, kernel.ErrValidation)
	}
	w.put(okey{t: tOccurrences, tenant: tenant, id: executionID, sub: k}, &op{occ: o, stmt: statement{sql: sqlPutOccurrence,
		args: []any{tenant, executionID, []byte(k), o.Lease.DispatchID, int32(o.Lease.Attempt), int32(o.Count)}}})
	return nil
}

const sqlAppendEvent = `INSERT INTO events (tenant, execution_id, seq, type, at, payload) VALUES ($1, $2, $3, $4, $5, $6)`

// AppendEvent implements kernel.Tx. Seq 0 is refused (seqs start at 1).
func (w *writeTx) AppendEvent(tenant string, ev kernel.Event) error {
	if err := checkIDs("append event", tenant, ev.ExecutionID); err != nil {
		return err
	}
	if ev.Seq == 0 || ev.Seq > math.MaxInt64 {
		return fmt.Errorf("postgres: append event %s/%s: seq %d: %w", tenant, ev.ExecutionID, ev.Seq, kernel.ErrValidation)
	}
	if err := checkText("append event", "type", string(ev.Type)); err != nil {
		return err
	}
	k := okey{t: tEvents, tenant: tenant, id: ev.ExecutionID, seq: ev.Seq}
	exists, err := w.eventExists(k)
	if err != nil {
		return err
	}
	if exists {
		return fmt.Errorf("postgres: append event %s/%s seq %d (%s): already recorded: %w",
			tenant, ev.ExecutionID, ev.Seq, ev.Type, kernel.ErrConflict)
	}
	payload := []byte(ev.Payload)
	if payload == nil {
		payload = []byte{}
	}
	w.put(k, &op{stmt: statement{sql: sqlAppendEvent,
		args: []any{tenant, ev.ExecutionID, int64(ev.Seq), string(ev.Type), nanos(ev.Time), bytes.Clone(payload)}}})
	w.own.events[k] = true
	w.own.changes.executions[ev.ExecutionID] = true
	return nil
}

// eventExists reports whether the event k is recorded (see writeTx).
func (w *writeTx) eventExists(k okey) (bool, error) {
	if w.own.events[k] || (w.batch.events[k] && !w.own.purged[execRef{k.tenant, k.id}]) {
		return true, nil
	}
	if !w.strict {
		if info, ok := w.info(execRef{k.tenant, k.id}); ok && info.lastKnown {
			return k.seq <= info.dbLast, nil
		}
	}
	found, err := w.s.queryRow(`SELECT true FROM events WHERE tenant = $1 AND execution_id = $2 AND seq = $3`,
		[]any{k.tenant, k.id, int64(k.seq)}, new(bool))
	if err != nil {
		return false, fmt.Errorf("postgres: append event %s/%s seq %d: %w", k.tenant, k.id, k.seq, err)
	}
	return found, nil
}

const sqlPutAgent = `INSERT INTO agents (tenant, id, doc) VALUES ($1, $2, $3)
	ON CONFLICT (tenant, id) DO UPDATE SET doc = excluded.doc`

// PutAgent implements kernel.Tx.
func (w *writeTx) PutAgent(a *kernel.Agent) error {
	if a == nil {
		return fmt.Errorf("postgres: put agent: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put agent", a.Tenant, a.ID); err != nil {
		return err
	}
	o, err := encodeOp("put agent "+a.ID, a, sqlPutAgent, a.Tenant, a.ID)
	if err != nil {
		return err
	}
	w.put(okey{t: tAgents, tenant: a.Tenant, id: a.ID}, o)
	w.own.changes.agents[kernel.Ref{Tenant: a.Tenant, Name: a.ID}] = true
	return nil
}

// DeleteAgent implements kernel.Tx; a missing agent is ErrNotFound.
func (w *writeTx) DeleteAgent(tenant, id string) error {
	if _, err := w.Agent(tenant, id); err != nil {
		if errors.Is(err, kernel.ErrNotFound) {
			return notFound("delete agent %s/%s", tenant, id)
		}
		return err
	}
	w.put(okey{t: tAgents, tenant: tenant, id: id}, &op{del: true,
		stmt: statement{sql: `DELETE FROM agents WHERE tenant = $1 AND id = $2`, args: []any{tenant, id}}})
	w.own.changes.agents[kernel.Ref{Tenant: tenant, Name: id}] = true
	return nil
}

const sqlPutApproval = `INSERT INTO approvals (tenant, id, status, expires_at, created_at, doc) VALUES ($1, $2, $3, $4, $5, $6)
	ON CONFLICT (tenant, id) DO UPDATE SET status = excluded.status, expires_at = excluded.expires_at,
	created_at = excluded.created_at, doc = excluded.doc`

// PutApproval implements kernel.Tx; the expiry index follows Status and
// ExpiresAt.
func (w *writeTx) PutApproval(a *kernel.Approval) error {
	if a == nil {
		return fmt.Errorf("postgres: put approval: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put approval", a.Tenant, a.ID); err != nil {
		return err
	}
	if err := checkText("put approval", "status", string(a.Status)); err != nil {
		return err
	}
	o, err := encodeOp("put approval "+a.ID, a, sqlPutApproval, a.Tenant, a.ID, string(a.Status), nanos(a.ExpiresAt), nanos(a.CreatedAt))
	if err != nil {
		return err
	}
	w.put(okey{t: tApprovals, tenant: a.Tenant, id: a.ID}, o)
	return nil
}

const sqlPutBundle = `INSERT INTO bundles (tenant, name, doc, archive) VALUES ($1, $2, $3, $4)
	ON CONFLICT (tenant, name) DO UPDATE SET doc = excluded.doc, archive = excluded.archive`

// PutBundle implements kernel.Tx. The archive is kept in its own column.
func (w *writeTx) PutBundle(b *kernel.BundleRecord) error {
	if b == nil {
		return fmt.Errorf("postgres: put bundle: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put bundle", b.Tenant, b.Name); err != nil {
		return err
	}
	meta := *b
	meta.Archive = nil
	archive := bytes.Clone(b.Archive)
	if archive == nil {
		archive = []byte{}
	}
	doc, err := encode(&meta)
	if err != nil {
		return fmt.Errorf("postgres: put bundle %s/%s: encode: %w", b.Tenant, b.Name, err)
	}
	w.put(okey{t: tBundles, tenant: b.Tenant, id: b.Name}, &op{doc: doc, archive: archive,
		stmt: statement{sql: sqlPutBundle, args: []any{b.Tenant, b.Name, doc, archive}}})
	w.own.changes.bundles[kernel.Ref{Tenant: b.Tenant, Name: b.Name}] = true
	return nil
}

// DeleteBundle implements kernel.Tx; a missing bundle is ErrNotFound.
func (w *writeTx) DeleteBundle(tenant, name string) error {
	if _, err := w.Bundle(tenant, name); err != nil {
		if errors.Is(err, kernel.ErrNotFound) {
			return notFound("delete bundle %s/%s", tenant, name)
		}
		return err
	}
	w.put(okey{t: tBundles, tenant: tenant, id: name}, &op{del: true,
		stmt: statement{sql: `DELETE FROM bundles WHERE tenant = $1 AND name = $2`, args: []any{tenant, name}}})
	w.own.changes.bundles[kernel.Ref{Tenant: tenant, Name: name}] = true
	return nil
}

const sqlPutCounter = `INSERT INTO counters (tenant, key, value) VALUES ($1, $2, $3)
	ON CONFLICT (tenant, key) DO UPDATE SET value = excluded.value`

// PutCounter implements kernel.Tx. value is copied.
func (w *writeTx) PutCounter(tenant, k string, value []byte) error {
	if err := checkIDs("put counter", tenant); err != nil {
		return err
	}
	v := bytes.Clone(value)
	if v == nil {
		v = []byte{}
	}
	w.put(okey{t: tCounters, tenant: tenant, id: k}, &op{value: v,
		stmt: statement{sql: sqlPutCounter, args: []any{tenant, []byte(k), v}}})
	return nil
}

const sqlPutTenant = `INSERT INTO tenants (id, doc) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET doc = excluded.doc`

// PutTenant implements kernel.Tx.
func (w *writeTx) PutTenant(t *kernel.Tenant) error {
	if t == nil {
		return fmt.Errorf("postgres: put tenant: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put tenant", t.ID); err != nil {
		return err
	}
	o, err := encodeOp("put tenant "+t.ID, t, sqlPutTenant, t.ID)
	if err != nil {
		return err
	}
	w.put(okey{t: tTenants, id: t.ID}, o)
	return nil
}

const sqlPutAPIKey = `INSERT INTO api_keys (tenant, id, hash, doc) VALUES ($1, $2, $3, $4)
	ON CONFLICT (tenant, id) DO UPDATE SET hash = excluded.hash, doc = excluded.doc`

// PutAPIKey implements kernel.Tx. A hash already used by another key is
// ErrConflict.
func (w *writeTx) PutAPIKey(ak *kernel.APIKey) error {
	if ak == nil {
		return fmt.Errorf("postgres: put api key: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put api key", ak.Tenant, ak.ID, ak.Hash); err != nil {
		return err
	}
	if err := w.flush(); err != nil {
		return err
	}
	var tenant, id string
	found, err := w.s.queryRow(`SELECT tenant, id FROM api_keys WHERE hash = $1`, []any{ak.Hash}, &tenant, &id)
	if err != nil {
		return fmt.Errorf("postgres: put api key %s/%s: check hash: %w", ak.Tenant, ak.ID, err)
	}
	if found && (tenant != ak.Tenant || id != ak.ID) {
		return fmt.Errorf("postgres: put api key %s/%s: hash already used by another key: %w", ak.Tenant, ak.ID, kernel.ErrConflict)
	}
	o, err := encodeOp("put api key "+ak.ID, ak, sqlPutAPIKey, ak.Tenant, ak.ID, ak.Hash)
	if err != nil {
		return err
	}
	w.put(okey{t: tAPIKeys, tenant: ak.Tenant, id: ak.ID}, o)
	return nil
}

// DeleteAPIKey implements kernel.Tx; a missing key is ErrNotFound.
func (w *writeTx) DeleteAPIKey(tenant, id string) error {
	if !readable(tenant, id) {
		return notFound("delete api key %s/%s", tenant, id)
	}
	if err := w.flush(); err != nil {
		return err
	}
	found, err := w.s.queryRow(`SELECT true FROM api_keys WHERE tenant = $1 AND id = $2`, []any{tenant, id}, new(bool))
	if err != nil {
		return fmt.Errorf("postgres: delete api key %s/%s: %w", tenant, id, err)
	}
	if !found {
		return notFound("delete api key %s/%s", tenant, id)
	}
	w.put(okey{t: tAPIKeys, tenant: tenant, id: id}, &op{del: true,
		stmt: statement{sql: `DELETE FROM api_keys WHERE tenant = $1 AND id = $2`, args: []any{tenant, id}}})
	w.own.changes.keys[kernel.Ref{Tenant: tenant, Name: id}] = true
	return nil
}
