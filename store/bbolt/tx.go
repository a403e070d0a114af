package bbolt

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
)

// readTx implements kernel.ReadTx on a bbolt transaction. Every record it
// returns is a fresh copy that may outlive the transaction.
//
// A limit <= 0 given to Events, DueDispatches, ExpiredLeases or
// ExpiredApprovals, and ExecutionFilter.Limit <= 0, mean "no limit".
type readTx struct {
	tx *bolt.Tx
	// agents and tenants cache decoded agent and tenant records (nil:
	// none, in write transactions).
	agents  *recordCache[kernel.Agent]
	tenants *recordCache[kernel.Tenant]
	// cur are the cursors lookup keeps for the transaction, by hot bucket.
	cur [nHot]*bolt.Cursor
	// memo holds, in a write transaction, the last lookups of the hot
	// buckets that are read again (see lookup); nil until the first.
	memo *lookupMemo
	// write is set in a write transaction's own readTx: a View reading
	// the writer's open transaction (see Store.View) keeps no memo.
	write bool
}

// The buckets of the step path, whose point lookups go through lookup.
// The first nMemo are those an Update function reads a record of and
// later writes it back (the execution and its input, a step's slot).
const (
	hotExecutions = iota
	hotSteps
	hotExecTenant
	hotEvents
	nHot
	nMemo = hotSteps + 1
)

var hotBuckets = [nHot][]byte{bExecutions, bSteps, bExecTenant, bEvents}

// memoSize is how many lookups of each of the first nMemo hot buckets a
// write transaction remembers: a record is read and written back a few
// lookups apart.
const memoSize = 4

// lookupMemo is what lookup remembers in a write transaction: its last
// memoSize answers for each of the first nMemo hot buckets, and where
// each bucket's next one goes.
type lookupMemo struct {
	e    [nMemo][memoSize]memoEntry
	next [nMemo]uint8
}

// memoEntry is a lookup of a write transaction: the value stored under k
// (nil: none). k is nil in an unused entry.
type memoEntry struct{ k, v []byte }

// lookup returns the value stored under k in hot bucket i, or nil. It is
// bbolt's Bucket.Get through a cursor kept for the transaction: Get makes
// a new cursor, and grows its stack, on every call, which is most of a
// lookup's allocations. A cursor moved by Seek is valid after writes (Seek
// starts from the root). The value is valid for the life of the
// transaction (bbolt's guarantee: a write replaces a value, never changes
// its bytes).
//
// In a write transaction, lookup remembers its last few answers for the
// buckets read again (nMemo), and every write of the transaction keeps them true (wbucket
// calls wrote), so that reading a record again, as PutExecution does
// after Execution, does not walk the tree again. k is kept: the caller
// must not change it afterwards.
func (r *readTx) lookup(i int, k []byte) []byte {
	if i >= nMemo {
		v, _ := r.seek(i, k)
		return v
	}
	m := r.memo
	if m == nil && r.write {
		m = new(lookupMemo)
		r.memo = m
	}
	if m != nil {
		for j := range m.e[i] {
			if e := &m.e[i][j]; e.k != nil && bytes.Equal(e.k, k) {
				return e.v
			}
		}
	}
	v, _ := r.seek(i, k)
	if m != nil {
		j := m.next[i]
		m.e[i][j] = memoEntry{k: k, v: v}
		m.next[i] = (j + 1) % memoSize
	}
	return v
}

// seek is lookup without the memo. When there is no value under k, after
// is the first key after k in the bucket (nil: none), valid for the life
// of the transaction.
func (r *readTx) seek(i int, k []byte) (v, after []byte) {
	c := r.cur[i]
	if c == nil {
		c = r.tx.Bucket(hotBuckets[i]).Cursor()
		r.cur[i] = c
	}
	kk, v := c.Seek(k)
	if kk == nil || !bytes.Equal(kk, k) {
		return nil, kk
	}
	return v, nil
}

// wrote keeps the memo of hot bucket i true after v was stored under k
// (v nil: k was deleted).
func (r *readTx) wrote(i int, k, v []byte) {
	if i >= nMemo || r.memo == nil {
		return
	}
	for j := range r.memo.e[i] {
		if e := &r.memo.e[i][j]; e.k != nil && bytes.Equal(e.k, k) {
			e.v = v
		}
	}
}

// writeTx implements kernel.Tx. Writes are visible to later reads in the
// same transaction.
type writeTx struct {
	readTx
	// log, when the store keeps a write-ahead log, records every write of
	// the transaction (see wbucket).
	log *walBatch
	// gap is a key range of the events bucket known to hold no key:
	// [gapFrom, gapTo), or (gapFrom, gapTo) when gapAfter is set; gapTo nil
	// is the end of the bucket. AppendEvent learns it when it looks for an
	// execution's next seq, and need not look again for the ones after
	// (see inGap). gapFrom nil: none known.
	gapFrom, gapTo []byte
	gapAfter       bool
	gapKey         []byte // gapFrom's own copy of a key written, in gapBuf
	gapBuf         [128]byte
}

// inGap reports whether k is in the events bucket's known gap.
func (w *writeTx) inGap(k []byte) bool {
	if w.gapFrom == nil {
		return false
	}
	c := bytes.Compare(k, w.gapFrom)
	return (c > 0 || c == 0 && !w.gapAfter) && (w.gapTo == nil || bytes.Compare(k, w.gapTo) < 0)
}

// wbucket is a bucket of a write transaction. Every write of the store
// goes through its Put and Delete, which also record the write for the
// write-ahead log: a write that bypassed them would be lost by a crash
// that the log is there to survive (TestWALReplayMatchesConformance
// replays the log of every conformance test and compares). They also
// keep what the transaction remembers of the hot buckets true (lookup,
// inGap).
type wbucket struct {
	*bolt.Bucket
	name []byte
	log  *walBatch
	w    *writeTx // nil: not a hot bucket
	hot  int      // the hot bucket's index, with w
}

// Put stores v under k.
func (b wbucket) Put(k, v []byte) error {
	if err := b.Bucket.Put(k, v); err != nil {
		return err
	}
	if b.log != nil {
		b.log.put(b.name, k, v)
	}
	if b.w != nil {
		b.w.wrote(b.hot, k, v)
		if b.hot == hotEvents && b.w.inGap(k) {
			// The keys after k are still free.
			b.w.gapKey = append(b.w.gapBuf[:0], k...)
			b.w.gapFrom, b.w.gapAfter = b.w.gapKey, true
		}
	}
	return nil
}

// Delete removes k.
func (b wbucket) Delete(k []byte) error {
	if err := b.Bucket.Delete(k); err != nil {
		return err
	}
	if b.log != nil {
		b.log.del(b.name, k)
	}
	if b.w != nil {
		b.w.wrote(b.hot, k, nil)
	}
	return nil
}

// bucket returns the named bucket for writing.
func (w *writeTx) bucket(name []byte) wbucket {
	b := wbucket{Bucket: w.tx.Bucket(name), name: name, log: w.log}
	for i, h := range hotBuckets {
		if bytes.Equal(name, h) {
			b.w, b.hot = w, i
			break
		}
	}
	return b
}

var (
	_ kernel.ReadTx                 = (*readTx)(nil)
	_ kernel.Tx                     = (*writeTx)(nil)
	_ kernel.ExecutionHeadReader    = (*readTx)(nil)
	_ kernel.ExecutionScanner       = (*readTx)(nil)
	_ kernel.ApprovalScanner        = (*readTx)(nil)
	_ kernel.PendingApprovalScanner = (*readTx)(nil)
)

func (r *readTx) bucket(name []byte) *bolt.Bucket { return r.tx.Bucket(name) }

// get decodes the record stored under k; ok is false when there is none.
func get[T any](b *bolt.Bucket, k []byte) (v *T, ok bool, err error) {
	raw := b.Get(k)
	if raw == nil {
		return nil, false, nil
	}
	v, err = decode[T](raw)
	if err != nil {
		return nil, false, err
	}
	return v, true, nil
}

// scan decodes every record whose key starts with pfx, in key order.
func scan[T any](b *bolt.Bucket, pfx []byte) ([]*T, error) {
	var out []*T
	c := b.Cursor()
	for k, v := c.Seek(pfx); k != nil && bytes.HasPrefix(k, pfx); k, v = c.Next() {
		x, err := decode[T](v)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", k, err)
		}
		out = append(out, x)
	}
	return out, nil
}

func notFound(format string, args ...any) error {
	return fmt.Errorf("bbolt: "+format+": %w", append(args, kernel.ErrNotFound)...)
}

// missingError is notFound for a record named by up to three ids, built
// without formatting: a lookup that misses is on the hot path (SubmitStep
// looks a new step up before deciding it).
type missingError struct {
	what string
	ids  [3]string
	n    int
}

// missing returns "bbolt: what id/id/id: not found", matching ErrNotFound.
func missing(what string, ids ...string) error {
	e := &missingError{what: what}
	e.n = copy(e.ids[:], ids)
	return e
}

func (e *missingError) Error() string {
	return "bbolt: " + e.what + " " + strings.Join(e.ids[:e.n], "/") + ": " + kernel.ErrNotFound.Error()
}

func (e *missingError) Unwrap() error { return kernel.ErrNotFound }

// Execution implements kernel.ReadTx.
func (r *readTx) Execution(tenant, id string) (*kernel.Execution, error) {
	return r.execution(tenant, id, true)
}

// ExecutionHead implements kernel.ExecutionHeadReader: Execution without
// the input (Input nil), which is stored under a key of its own (one
// lookup and a copy fewer).
func (r *readTx) ExecutionHead(tenant, id string) (*kernel.Execution, error) {
	return r.execution(tenant, id, false)
}

// ExecutionHead of a write transaction reads the input too: an execution
// read in a write transaction may be written back, and putExecution takes
// a missing input for one removed.
func (w *writeTx) ExecutionHead(tenant, id string) (*kernel.Execution, error) {
	return w.execution(tenant, id, true)
}

// execution reads an execution, with its input when input is set.
func (r *readTx) execution(tenant, id string, input bool) (*kernel.Execution, error) {
	if !readable(tenant, id) {
		return nil, missing("execution", tenant, id)
	}
	k, ik := execKeys(tenant, id)
	raw := r.lookup(hotExecutions, k)
	if raw == nil {
		return nil, missing("execution", tenant, id)
	}
	e, err := decodeExecution(raw)
	if err != nil {
		return nil, fmt.Errorf("bbolt: execution %s/%s: %w", tenant, id, err)
	}
	if input {
		r.readInputAt(ik, e)
	} else {
		e.Input = nil
	}
	return e, nil
}

// decodeExecutionIn decodes the execution stored under k as raw, with its
// input, which is kept under inputKey(k) (see putExecution).
func (r *readTx) decodeExecutionIn(k, raw []byte) (*kernel.Execution, error) {
	e, err := decodeExecution(raw)
	if err != nil {
		return nil, err
	}
	r.readInput(k, e)
	return e, nil
}

// readInput sets e.Input to the input stored for the execution under k.
func (r *readTx) readInput(k []byte, e *kernel.Execution) { r.readInputAt(inputKey(k), e) }

// readInputAt sets e.Input to the input stored under ik (inputKey).
func (r *readTx) readInputAt(ik []byte, e *kernel.Execution) {
	if in := r.lookup(hotExecutions, ik); in != nil {
		e.Input = bytes.Clone(in)
	}
}

// ExecutionTenant implements kernel.ReadTx.
func (r *readTx) ExecutionTenant(id string) (string, error) {
	if !readable(id) {
		return "", notFound("execution %s", id)
	}
	t := r.lookup(hotExecTenant, []byte(id))
	if t == nil {
		return "", notFound("execution %s", id)
	}
	return string(t), nil
}

// ExecutionByIdempotencyKey implements kernel.ReadTx.
func (r *readTx) ExecutionByIdempotencyKey(tenant, k string) (string, error) {
	if !readable(tenant) || k == "" {
		return "", notFound("idempotency key %q in tenant %s", k, tenant)
	}
	id := r.bucket(bIdem).Get(key(tenant, k))
	if id == nil {
		return "", notFound("idempotency key %q in tenant %s", k, tenant)
	}
	return string(id), nil
}

// ListExecutions implements kernel.ReadTx: a reverse scan of the tenant's
// executions (ids are UUIDv7, so key order is creation order), from just
// before f.Before, filtered as it goes.
func (r *readTx) ListExecutions(tenant string, f kernel.ExecutionFilter) ([]*kernel.Execution, error) {
	out, _, err := r.ScanExecutions(tenant, f, 0)
	return out, err
}

// ScanExecutions implements kernel.ExecutionScanner: ListExecutions that
// examines at most maxScan executions (0: no bound).
func (r *readTx) ScanExecutions(tenant string, f kernel.ExecutionFilter, maxScan int) ([]*kernel.Execution, string, error) {
	if !readable(tenant) || (f.Before != "" && !readable(f.Before)) {
		return nil, "", nil
	}
	pfx := prefix(tenant)
	c := r.bucket(bExecutions).Cursor()
	var k, v []byte
	if f.Before != "" {
		k, _ = c.Seek(key(tenant, f.Before))
	} else {
		// tenant␁ sorts after every tenant␀… key.
		k, _ = c.Seek(append(key(tenant), sep+1))
	}
	if k == nil {
		k, v = c.Last()
	} else {
		k, v = c.Prev()
	}
	var out []*kernel.Execution
	var last []byte
	for scanned := 0; k != nil && bytes.HasPrefix(k, pfx); k, v = c.Prev() {
		if maxScan > 0 && scanned == maxScan {
			// The next call goes on before the last one examined.
			return out, string(last[len(pfx):]), nil
		}
		scanned++
		last = k
		e, err := decodeExecution(v)
		if err != nil {
			return nil, "", fmt.Errorf("bbolt: list executions of %s: key %q: %w", tenant, k, err)
		}
		if (f.AgentID != "" && e.AgentID != f.AgentID) || (f.Status != "" && e.Status != f.Status) {
			continue
		}
		r.readInput(k, e) // only for the executions listed
		out = append(out, e)
		if f.Limit > 0 && len(out) >= f.Limit {
			break
		}
	}
	return out, "", nil
}

// Step implements kernel.ReadTx: the steps bucket names the step's seq,
// its record is in the events bucket (stepLogKey).
func (r *readTx) Step(tenant, executionID, stepID string) (*kernel.Step, error) {
	if !readable(tenant, executionID, stepID) {
		return nil, missing("step", tenant, executionID, stepID)
	}
	raw, err := r.stepRecord(tenant, executionID, stepID)
	if err != nil {
		return nil, fmt.Errorf("bbolt: step %s/%s/%s: %w", tenant, executionID, stepID, err)
	}
	if raw == nil {
		return nil, missing("step", tenant, executionID, stepID)
	}
	s, err := decodeStepAt(raw, tenant, executionID, stepID)
	if err != nil {
		return nil, fmt.Errorf("bbolt: step %s/%s/%s: %w", tenant, executionID, stepID, err)
	}
	return s, nil
}

// stepRecord returns the stored record of a step (nil when there is no
// such step), found through its slot in the steps bucket.
func (r *readTx) stepRecord(tenant, executionID, stepID string) ([]byte, error) {
	sk, lk := stepKeys(tenant, executionID, stepID, 0)
	raw := r.lookup(hotSteps, sk)
	if raw == nil {
		return nil, nil
	}
	sl, err := decodeSlot(raw)
	if err != nil || !sl.hasSeq {
		return nil, err
	}
	binary.BigEndian.PutUint64(lk[len(tenant)+len(executionID)+2:], sl.seq)
	rec := r.lookup(hotEvents, lk)
	if rec == nil {
		return nil, fmt.Errorf("the step index names seq %d, where no record is", sl.seq)
	}
	return rec, nil
}

// ListSteps implements kernel.ReadTx.
func (r *readTx) ListSteps(tenant, executionID string) ([]*kernel.Step, error) {
	if !readable(tenant, executionID) {
		return nil, nil
	}
	var steps []*kernel.Step
	err := forEachStep(r.tx, tenant, executionID, func(id string, raw []byte) error {
		s, err := decodeStepAt(raw, tenant, executionID, id)
		if err != nil {
			return err
		}
		steps = append(steps, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bbolt: list steps of %s/%s: %w", tenant, executionID, err)
	}
	slices.SortStableFunc(steps, func(a, b *kernel.Step) int { return cmp.Compare(a.Seq, b.Seq) })
	return steps, nil
}

// StepsPage implements kernel.ReadTx. The steps index holds each step's
// seq, so the page is chosen from the index and only its records are read.
func (r *readTx) StepsPage(tenant, executionID string, afterSeq uint64, limit, maxBytes int) ([]*kernel.Step, bool, error) {
	if !readable(tenant, executionID) {
		return nil, false, nil
	}
	type ref struct {
		seq uint64
		id  string
	}
	var refs []ref
	pfx := prefix(tenant, executionID)
	c := r.tx.Bucket(bSteps).Cursor()
	for k, v := c.Seek(pfx); k != nil && bytes.HasPrefix(k, pfx); k, v = c.Next() {
		sl, err := decodeSlot(v)
		if err != nil {
			return nil, false, fmt.Errorf("bbolt: steps of %s/%s: index entry %q: %w", tenant, executionID, k, err)
		}
		if sl.hasSeq && sl.seq > afterSeq {
			refs = append(refs, ref{sl.seq, string(k[len(pfx):])})
		}
	}
	slices.SortFunc(refs, func(a, b ref) int {
		if c := cmp.Compare(a.seq, b.seq); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	log := r.tx.Bucket(bEvents)
	var out []*kernel.Step
	size := 0
	for _, x := range refs {
		if limit > 0 && len(out) == limit || maxBytes > 0 && len(out) > 0 && size >= maxBytes {
			return out, true, nil
		}
		raw := log.Get(stepLogKey(tenant, executionID, x.seq, x.id))
		if raw == nil {
			return nil, false, fmt.Errorf("bbolt: steps of %s/%s: the index names seq %d for step %q, where no record is", tenant, executionID, x.seq, x.id)
		}
		size += len(raw)
		st, err := decodeStepAt(raw, tenant, executionID, x.id)
		if err != nil {
			return nil, false, fmt.Errorf("bbolt: steps of %s/%s: step %q: %w", tenant, executionID, x.id, err)
		}
		out = append(out, st)
	}
	return out, false, nil
}

// OpenSteps implements kernel.OpenStepsLister: it reads each step's
// status from the head of its record and decodes only the steps that are
// not terminal, so ending an execution does not copy the arguments and
// results of every step it ran.
func (r *readTx) OpenSteps(tenant, executionID string) ([]*kernel.Step, error) {
	if !readable(tenant, executionID) {
		return nil, nil
	}
	var steps []*kernel.Step
	err := forEachStep(r.tx, tenant, executionID, func(id string, raw []byte) error {
		if st, ok := stepStatus(raw); ok && st.Terminal() {
			return nil
		}
		s, err := decodeStepAt(raw, tenant, executionID, id)
		if err != nil {
			return err
		}
		if !s.Status.Terminal() {
			steps = append(steps, s)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bbolt: open steps of %s/%s: %w", tenant, executionID, err)
	}
	slices.SortStableFunc(steps, func(a, b *kernel.Step) int { return cmp.Compare(a.Seq, b.Seq) })
	return steps, nil
}

// forEachStep calls fn with the id and the record of every step of an
// execution, in step id order. The record is valid only during the call.
func forEachStep(tx *bolt.Tx, tenant, executionID string, fn func(id string, raw []byte) error) error {
	pfx := prefix(tenant, executionID)
	log := tx.Bucket(bEvents)
	c := tx.Bucket(bSteps).Cursor()
	for k, v := c.Seek(pfx); k != nil && bytes.HasPrefix(k, pfx); k, v = c.Next() {
		sl, err := decodeSlot(v)
		if err != nil {
			return fmt.Errorf("step index entry %q: %w", k, err)
		}
		if !sl.hasSeq {
			continue // an occurrence counter alone
		}
		id := string(k[len(pfx):])
		lk := stepLogKey(tenant, executionID, sl.seq, id)
		raw := log.Get(lk)
		if raw == nil {
			return fmt.Errorf("step index entry %q names seq %d, where no record is", k, sl.seq)
		}
		if err := fn(id, raw); err != nil {
			return fmt.Errorf("step %q: %w", id, err)
		}
	}
	return nil
}

// Occurrence implements kernel.ReadTx: the counter is in the slot of the
// steps bucket named by its key.
func (r *readTx) Occurrence(tenant, executionID, k string) (kernel.Occurrence, error) {
	if !readable(tenant, executionID) {
		return kernel.Occurrence{}, nil
	}
	raw := r.lookup(hotSteps, key(tenant, executionID, k))
	if raw == nil {
		return kernel.Occurrence{}, nil
	}
	sl, err := decodeSlot(raw)
	if err == nil && sl.occ == nil {
		return kernel.Occurrence{}, nil
	}
	var o kernel.Occurrence
	if err == nil {
		o, err = decodeOccurrence(sl.occ)
	}
	if err != nil {
		return kernel.Occurrence{}, fmt.Errorf("bbolt: occurrence %s/%s/%q: %w", tenant, executionID, k, err)
	}
	return o, nil
}

// Events implements kernel.ReadTx: a range scan from afterSeq+1.
func (r *readTx) Events(tenant, executionID string, afterSeq uint64, limit int) ([]kernel.Event, error) {
	if !readable(tenant, executionID) || afterSeq == math.MaxUint64 {
		return nil, nil
	}
	pfx := prefix(tenant, executionID)
	var out []kernel.Event
	c := r.bucket(bEvents).Cursor()
	for k, v := c.Seek(eventKey(tenant, executionID, afterSeq+1)); k != nil && bytes.HasPrefix(k, pfx); k, v = c.Next() {
		if len(k) != len(pfx)+8 {
			continue // a step's record (stepLogKey), not an event
		}
		out = append(out, kernel.Event{})
		if err := decodeEvent(v, executionID, binary.BigEndian.Uint64(k[len(pfx):]), &out[len(out)-1]); err != nil {
			return nil, fmt.Errorf("bbolt: events of %s/%s: seq %d: %w", tenant, executionID, binary.BigEndian.Uint64(k[len(pfx):]), err)
		}
		if limit > 0 && len(out) >= limit {
			break
		}
	}
	return out, nil
}

// Agent implements kernel.ReadTx.
func (r *readTx) Agent(tenant, id string) (*kernel.Agent, error) {
	if !readable(tenant, id) {
		return nil, notFound("agent %s/%s", tenant, id)
	}
	k := key(tenant, id)
	raw := r.bucket(bAgents).Get(k)
	if raw == nil {
		return nil, notFound("agent %s/%s", tenant, id)
	}
	if a, ok := r.agents.get(k, raw); ok {
		return &a, nil // strings and times only: a copy shares nothing mutable
	}
	a, err := decode[kernel.Agent](raw)
	if err != nil {
		return nil, fmt.Errorf("bbolt: agent %s/%s: %w", tenant, id, err)
	}
	r.agents.put(k, raw, a)
	return a, nil
}

// recordCache holds decoded records of a JSON kind with the bytes they
// were decoded from: every step policy decides reads its agent (for its
// bundle) and its tenant's record (for its guards). A cached record is
// used only when the stored bytes are still the same, so it is never
// stale, whoever wrote the file. A nil cache caches nothing.
type recordCache[T any] struct {
	mu sync.RWMutex
	m  map[string]cachedRecord[T] // by key
}

// cachedRecord is a decoded record and a copy of the stored bytes it was
// decoded from (recordCache.get hands v out only while they are the same).
type cachedRecord[T any] struct {
	raw []byte
	v   T
}

// maxCachedRecords bounds a cache; when full it starts over.
const maxCachedRecords = 4096

// get returns a shallow copy of the record decoded from raw under k; ok
// is false when there is none. The caller copies what the record holds by
// reference (slices, maps, pointers) before handing it out.
func (c *recordCache[T]) get(k, raw []byte) (v T, ok bool) {
	if c == nil {
		return v, false
	}
	c.mu.RLock()
	e, ok := c.m[string(k)]
	c.mu.RUnlock()
	if !ok || !bytes.Equal(e.raw, raw) {
		return v, false
	}
	return e.v, true
}

// put caches v, decoded from raw under k. v must not be changed after.
func (c *recordCache[T]) put(k, raw []byte, v *T) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedRecords {
		c.m = make(map[string]cachedRecord[T])
	}
	c.m[string(k)] = cachedRecord[T]{raw: bytes.Clone(raw), v: *v}
	c.mu.Unlock()
}

// ListAgents implements kernel.ReadTx.
func (r *readTx) ListAgents(tenant string) ([]*kernel.Agent, error) {
	if !readable(tenant) {
		return nil, nil
	}
	agents, err := scan[kernel.Agent](r.bucket(bAgents), prefix(tenant))
	if err != nil {
		return nil, fmt.Errorf("bbolt: list agents of %s: %w", tenant, err)
	}
	return agents, nil
}

// CountAgents implements kernel.ReadTx, without decoding a record.
func (r *readTx) CountAgents(tenant string) (int, error) {
	if !readable(tenant) {
		return 0, nil
	}
	return count(r.bucket(bAgents), prefix(tenant)), nil
}

// count returns how many keys start with pfx.
func count(b *bolt.Bucket, pfx []byte) int {
	n := 0
	c := b.Cursor()
	for k, _ := c.Seek(pfx); k != nil && bytes.HasPrefix(k, pfx); k, _ = c.Next() {
		n++
	}
	return n
}

// DueDispatches implements kernel.ReadTx.
func (r *readTx) DueDispatches(now time.Time, limit int) ([]kernel.DispatchRef, error) {
	var out []kernel.DispatchRef
	_, err := scanTimeIndex(r.bucket(bDue), now, nil, limit, func(at time.Time, tenant, id string) {
		out = append(out, kernel.DispatchRef{Tenant: tenant, ExecutionID: id, At: at})
	})
	if err != nil {
		return nil, fmt.Errorf("bbolt: due dispatches: %w", err)
	}
	return out, nil
}

// NextDue implements kernel.ReadTx.
func (r *readTx) NextDue() (time.Time, bool, error) {
	k, _ := r.bucket(bDue).Cursor().First()
	if k == nil {
		return time.Time{}, false, nil
	}
	at, _, _, ok := parseTimeKey(k)
	if !ok {
		return time.Time{}, false, fmt.Errorf("bbolt: next due: malformed index key %q", k)
	}
	return at, true, nil
}

// ExpiredLeases implements kernel.ReadTx.
func (r *readTx) ExpiredLeases(now time.Time, limit int) ([]kernel.DispatchRef, error) {
	var out []kernel.DispatchRef
	_, err := scanTimeIndex(r.bucket(bLeases), now, nil, limit, func(at time.Time, tenant, id string) {
		out = append(out, kernel.DispatchRef{Tenant: tenant, ExecutionID: id, At: at})
	})
	if err != nil {
		return nil, fmt.Errorf("bbolt: expired leases: %w", err)
	}
	return out, nil
}

// scanTimeIndex calls fn for each entry of a time index with time <= now,
// oldest first, from just after the key after (nil: from the first), at
// most limit times (limit <= 0: no limit). When limit stopped it with
// entries left, it returns the key of the last one read, where the next
// call goes on (bbolt's bytes: valid only within the transaction).
func scanTimeIndex(b *bolt.Bucket, now time.Time, after []byte, limit int, fn func(at time.Time, tenant, id string)) (resume []byte, err error) {
	end := putTime(nil, now)
	due := func(k []byte) bool { return len(k) >= 8 && bytes.Compare(k[:8], end) <= 0 }
	c := b.Cursor()
	k, _ := c.First()
	if after != nil {
		if k, _ = c.Seek(after); bytes.Equal(k, after) {
			k, _ = c.Next()
		}
	}
	for n := 0; due(k); k, _ = c.Next() {
		if limit > 0 && n == limit {
			return resume, nil
		}
		at, tenant, id, ok := parseTimeKey(k)
		if !ok {
			return nil, fmt.Errorf("malformed index key %q", k)
		}
		fn(at, tenant, id)
		n++
		resume = k
	}
	return nil, nil
}

// Approval implements kernel.ReadTx.
func (r *readTx) Approval(tenant, id string) (*kernel.Approval, error) {
	if !readable(tenant, id) {
		return nil, notFound("approval %s/%s", tenant, id)
	}
	a, ok, err := get[kernel.Approval](r.bucket(bApprovals), key(tenant, id))
	if err != nil {
		return nil, fmt.Errorf("bbolt: approval %s/%s: %w", tenant, id, err)
	}
	if !ok {
		return nil, notFound("approval %s/%s", tenant, id)
	}
	return a, nil
}

// ListApprovals implements kernel.ReadTx: newest (CreatedAt, then id)
// first.
func (r *readTx) ListApprovals(tenant string, status kernel.ApprovalStatus) ([]*kernel.Approval, error) {
	list, _, err := r.ScanApprovals(tenant, status, "", 0)
	if err != nil {
		return nil, err
	}
	kernel.SortApprovals(list)
	return list, nil
}

// ScanApprovals implements kernel.ApprovalScanner. after and resume are
// approval ids: the tenant's approvals are keyed by id.
func (r *readTx) ScanApprovals(tenant string, status kernel.ApprovalStatus, after string, maxScan int) ([]*kernel.Approval, string, error) {
	if !readable(tenant) || (after != "" && !readable(after)) {
		return nil, "", nil
	}
	pfx := prefix(tenant)
	c := r.bucket(bApprovals).Cursor()
	var k, v []byte
	if after == "" {
		k, v = c.Seek(pfx)
	} else if k, v = c.Seek(key(tenant, after)); k != nil && bytes.Equal(k, key(tenant, after)) {
		k, v = c.Next()
	}
	var out []*kernel.Approval
	var last []byte
	for scanned := 0; k != nil && bytes.HasPrefix(k, pfx); k, v = c.Next() {
		if maxScan > 0 && scanned == maxScan {
			// The next call goes on after the last one examined.
			return out, string(last[len(pfx):]), nil
		}
		scanned++
		last = k
		a, err := decode[kernel.Approval](v)
		if err != nil {
			return nil, "", fmt.Errorf("bbolt: list approvals of %s: key %q: %w", tenant, k, err)
		}
		if status == "" || a.Status == status {
			out = append(out, a)
		}
	}
	return out, "", nil
}

// ScanPendingApprovals implements kernel.PendingApprovalScanner. after
// and resume are keys of the index of pending approvals.
func (r *readTx) ScanPendingApprovals(after string, max int) ([]kernel.ApprovalRef, string, error) {
	var out []kernel.ApprovalRef
	var from []byte
	if after != "" {
		from = []byte(after)
	}
	resume, err := scanTimeIndex(r.bucket(bApprovalExp), time.Unix(1<<62, 0), from, max, func(at time.Time, tenant, id string) {
		out = append(out, kernel.ApprovalRef{Tenant: tenant, ApprovalID: id, At: at})
	})
	if err != nil {
		return nil, "", fmt.Errorf("bbolt: pending approvals: %w", err)
	}
	return out, string(resume), nil
}

// ExpiredApprovals implements kernel.ReadTx.
func (r *readTx) ExpiredApprovals(now time.Time, limit int) ([]kernel.ApprovalRef, error) {
	var out []kernel.ApprovalRef
	_, err := scanTimeIndex(r.bucket(bApprovalExp), now, nil, limit, func(at time.Time, tenant, id string) {
		out = append(out, kernel.ApprovalRef{Tenant: tenant, ApprovalID: id, At: at})
	})
	if err != nil {
		return nil, fmt.Errorf("bbolt: expired approvals: %w", err)
	}
	return out, nil
}

// Bundle implements kernel.ReadTx.
func (r *readTx) Bundle(tenant, name string) (*kernel.BundleRecord, error) {
	if !readable(tenant, name) {
		return nil, notFound("bundle %s/%s", tenant, name)
	}
	b, ok, err := get[kernel.BundleRecord](r.bucket(bBundles), key(tenant, name))
	if err != nil {
		return nil, fmt.Errorf("bbolt: bundle %s/%s: %w", tenant, name, err)
	}
	if !ok {
		return nil, notFound("bundle %s/%s", tenant, name)
	}
	return b, nil
}

// ListBundles implements kernel.ReadTx: ordered by (tenant, name).
func (r *readTx) ListBundles(tenant string) ([]*kernel.BundleRecord, error) {
	var pfx []byte // tenant "": every tenant's
	if tenant != "" {
		if !readable(tenant) {
			return nil, nil
		}
		pfx = prefix(tenant)
	}
	list, err := scan[kernel.BundleRecord](r.bucket(bBundles), pfx)
	if err != nil {
		return nil, fmt.Errorf("bbolt: list bundles of %q: %w", tenant, err)
	}
	return list, nil
}

// Counter implements kernel.ReadTx.
func (r *readTx) Counter(tenant, k string) ([]byte, error) {
	if !readable(tenant) {
		return nil, nil
	}
	v := r.bucket(bCounters).Get(key(tenant, k))
	if v == nil {
		return nil, nil
	}
	return bytes.Clone(v), nil
}

// Tenant implements kernel.ReadTx.
func (r *readTx) Tenant(id string) (*kernel.Tenant, error) {
	// A tenant without a record is the default tenant's usual state, read
	// for every step policy decides: missing, not notFound's formatting.
	if !readable(id) {
		return nil, missing("tenant", id)
	}
	k := []byte(id)
	raw := r.bucket(bTenants).Get(k)
	if raw == nil {
		return nil, missing("tenant", id)
	}
	if t, ok := r.tenants.get(k, raw); ok {
		t.Guards, t.BundleKeys = slices.Clone(t.Guards), slices.Clone(t.BundleKeys) // strings within
		return &t, nil
	}
	t, err := decode[kernel.Tenant](raw)
	if err != nil {
		return nil, fmt.Errorf("bbolt: tenant %s: %w", id, err)
	}
	r.tenants.put(k, raw, t)
	// The caller gets its own slices: the cached record keeps these.
	out := *t
	out.Guards, out.BundleKeys = slices.Clone(t.Guards), slices.Clone(t.BundleKeys)
	return &out, nil
}

// ListTenants implements kernel.ReadTx: ordered by id.
func (r *readTx) ListTenants() ([]*kernel.Tenant, error) {
	list, err := scan[kernel.Tenant](r.bucket(bTenants), nil)
	if err != nil {
		return nil, fmt.Errorf("bbolt: list tenants: %w", err)
	}
	return list, nil
}

// APIKeyByHash implements kernel.ReadTx.
func (r *readTx) APIKeyByHash(hash string) (*kernel.APIKey, error) {
	if hash == "" {
		return nil, notFound("api key by hash")
	}
	ref := r.bucket(bAPIKeyHash).Get([]byte(hash))
	if ref == nil {
		return nil, notFound("api key by hash")
	}
	k, ok, err := get[kernel.APIKey](r.bucket(bAPIKeys), ref)
	if err != nil {
		return nil, fmt.Errorf("bbolt: api key %q: %w", ref, err)
	}
	if !ok {
		return nil, fmt.Errorf("bbolt: api key %q: hash index names a missing key: %w", ref, kernel.ErrNotFound)
	}
	return k, nil
}

// ListAPIKeys implements kernel.ReadTx: ordered by key id.
func (r *readTx) ListAPIKeys(tenant string) ([]*kernel.APIKey, error) {
	if !readable(tenant) {
		return nil, nil
	}
	list, err := scan[kernel.APIKey](r.bucket(bAPIKeys), prefix(tenant))
	if err != nil {
		return nil, fmt.Errorf("bbolt: list api keys of %s: %w", tenant, err)
	}
	return list, nil
}

// CountAPIKeys implements kernel.ReadTx, without decoding a record.
func (r *readTx) CountAPIKeys(tenant string) (int, error) {
	if !readable(tenant) {
		return 0, nil
	}
	return count(r.bucket(bAPIKeys), prefix(tenant)), nil
}

// put encodes v and stores it under k.
func put(b wbucket, k []byte, v any) error {
	raw, err := encode(v)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	return b.Put(k, raw)
}

// PutExecution implements kernel.Tx. It refuses (ErrConflict) an id owned by
// another tenant and an idempotency key that names another execution.
// Conflicts are found before anything is written.
func (w *writeTx) PutExecution(e *kernel.Execution) error {
	if e == nil {
		return fmt.Errorf("bbolt: put execution: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put execution", e.Tenant, e.ID); err != nil {
		return err
	}
	owners, idem := w.bucket(bExecTenant), w.bucket(bIdem)
	owner := w.lookup(hotExecTenant, []byte(e.ID))
	if owner != nil && string(owner) != e.Tenant {
		return fmt.Errorf("bbolt: put execution %s/%s: id belongs to another tenant: %w", e.Tenant, e.ID, kernel.ErrConflict)
	}
	var ik []byte
	ikHeld := false // the idempotency entry already names e
	if e.IdempotencyKey != "" {
		ik = key(e.Tenant, e.IdempotencyKey)
		cur := idem.Get(ik)
		if cur != nil && string(cur) != e.ID {
			return fmt.Errorf("bbolt: put execution %s/%s: idempotency key %q names execution %s: %w",
				e.Tenant, e.ID, e.IdempotencyKey, cur, kernel.ErrConflict)
		}
		ikHeld = cur != nil
	}
	k, inKey := execKeys(e.Tenant, e.ID)
	dk, lk := dueKey(e), leaseKey(e)
	var oldDK, oldLK []byte
	if raw := w.lookup(hotExecutions, k); raw != nil {
		// Only the index fields of the previous version are read.
		old, err := decodeExecIndex(raw)
		if err != nil {
			return fmt.Errorf("bbolt: put execution %s/%s: read previous: %w", e.Tenant, e.ID, err)
		}
		oldDK, oldLK = old.dueKey(), old.leaseKey()
		if err := w.unindexExecution(&old, oldDK, oldLK, dk, lk, ik); err != nil {
			return fmt.Errorf("bbolt: put execution %s/%s: %w", e.Tenant, e.ID, err)
		}
	}
	if err := w.putExecution(k, inKey, e); err != nil {
		return fmt.Errorf("bbolt: put execution %s/%s: %w", e.Tenant, e.ID, err)
	}
	// Entries that are already right are not written again: a Put dirties
	// its page even when it changes nothing.
	if owner == nil {
		if err := owners.Put([]byte(e.ID), []byte(e.Tenant)); err != nil {
			return fmt.Errorf("bbolt: put execution %s/%s: tenant index: %w", e.Tenant, e.ID, err)
		}
	}
	if ik != nil && !ikHeld {
		if err := idem.Put(ik, []byte(e.ID)); err != nil {
			return fmt.Errorf("bbolt: put execution %s/%s: idempotency index: %w", e.Tenant, e.ID, err)
		}
	}
	if dk != nil && !bytes.Equal(dk, oldDK) {
		if err := w.bucket(bDue).Put(dk, nil); err != nil {
			return fmt.Errorf("bbolt: put execution %s/%s: due index: %w", e.Tenant, e.ID, err)
		}
	}
	if lk != nil && !bytes.Equal(lk, oldLK) {
		if err := w.bucket(bLeases).Put(lk, nil); err != nil {
			return fmt.Errorf("bbolt: put execution %s/%s: lease index: %w", e.Tenant, e.ID, err)
		}
	}
	return nil
}

// putExecution writes e under k: its input under ik (inputKey(k)), when
// it changed (an input is written once, when the execution is created,
// instead of with the record at every commit), and the rest of the record
// under k.
func (w *writeTx) putExecution(k, ik []byte, e *kernel.Execution) error {
	execs := w.bucket(bExecutions)
	cur := w.lookup(hotExecutions, ik)
	switch in := e.Input; {
	case len(in) == 0 || string(in) == "null":
		if cur != nil {
			if err := execs.Delete(ik); err != nil {
				return fmt.Errorf("input: %w", err)
			}
		}
	case !bytes.Equal(cur, in):
		if err := execs.Put(ik, bytes.Clone(in)); err != nil {
			return fmt.Errorf("input: %w", err)
		}
	}
	return execs.Put(k, encodeExecutionWith(e, nil)) // input: null
}

// unindexExecution removes the index entries of the previous version old
// of an execution (whose due and lease keys are oldDK and oldLK) that the
// new version (keys dk, lk, idempotency key ik) does not keep.
func (w *writeTx) unindexExecution(old *execIndex, oldDK, oldLK, dk, lk, ik []byte) error {
	if oldDK != nil && !bytes.Equal(oldDK, dk) {
		if err := w.bucket(bDue).Delete(oldDK); err != nil {
			return fmt.Errorf("due index: %w", err)
		}
	}
	if oldLK != nil && !bytes.Equal(oldLK, lk) {
		if err := w.bucket(bLeases).Delete(oldLK); err != nil {
			return fmt.Errorf("lease index: %w", err)
		}
	}
	if len(old.idemKey) > 0 {
		oik := make([]byte, 0, len(old.tenant)+1+len(old.idemKey))
		oik = append(append(append(oik, old.tenant...), sep), old.idemKey...)
		if !bytes.Equal(oik, ik) {
			idem := w.bucket(bIdem)
			if cur := idem.Get(oik); cur != nil && bytes.Equal(cur, old.id) {
				if err := idem.Delete(oik); err != nil {
					return fmt.Errorf("idempotency index: %w", err)
				}
			}
		}
	}
	return nil
}

// PutStep implements kernel.Tx. The record goes to the events bucket
// beside the step's first event (stepLogKey), where the execution's events
// are being appended, so that a commit writes one leaf per execution for
// both; the steps bucket maps the step id to that seq and is written only
// when the step is new (or its seq changed).
func (w *writeTx) PutStep(s *kernel.Step) error {
	if s == nil {
		return fmt.Errorf("bbolt: put step: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put step", s.Tenant, s.ExecutionID, s.ID); err != nil {
		return err
	}
	idx, log := w.bucket(bSteps), w.bucket(bEvents)
	log.FillPercent = eventsFill
	ik, lk := stepKeys(s.Tenant, s.ExecutionID, s.ID, s.Seq)
	var sl slot
	if raw := w.lookup(hotSteps, ik); raw != nil {
		var err error
		if sl, err = decodeSlot(raw); err != nil {
			return fmt.Errorf("bbolt: put step %s/%s/%s: %w", s.Tenant, s.ExecutionID, s.ID, err)
		}
	}
	if !sl.hasSeq || sl.seq != s.Seq {
		if sl.hasSeq {
			if err := log.Delete(stepLogKey(s.Tenant, s.ExecutionID, sl.seq, s.ID)); err != nil {
				return fmt.Errorf("bbolt: put step %s/%s/%s: move: %w", s.Tenant, s.ExecutionID, s.ID, err)
			}
		}
		sl.seq, sl.hasSeq = s.Seq, true
		if err := idx.Put(ik, sl.encode()); err != nil {
			return fmt.Errorf("bbolt: put step %s/%s/%s: index: %w", s.Tenant, s.ExecutionID, s.ID, err)
		}
	}
	if err := log.Put(lk, encodeStep(s)); err != nil {
		return fmt.Errorf("bbolt: put step %s/%s/%s: %w", s.Tenant, s.ExecutionID, s.ID, err)
	}
	return nil
}

// PutOccurrence implements kernel.Tx: the counter goes to the slot of
// the steps bucket named by its key, beside the index entry of the step
// of the same name (see slot).
func (w *writeTx) PutOccurrence(tenant, executionID, k string, o kernel.Occurrence) error {
	if err := checkIDs("put occurrence", tenant, executionID); err != nil {
		return err
	}
	idx := w.bucket(bSteps)
	sk := key(tenant, executionID, k)
	var sl slot
	if raw := w.lookup(hotSteps, sk); raw != nil {
		var err error
		if sl, err = decodeSlot(raw); err != nil {
			return fmt.Errorf("bbolt: put occurrence %s/%s/%q: %w", tenant, executionID, k, err)
		}
	}
	if err := idx.Put(sk, sl.encodeWith(o)); err != nil {
		return fmt.Errorf("bbolt: put occurrence %s/%s/%q: %w", tenant, executionID, k, err)
	}
	return nil
}

// eventsFill is how full the events bucket's pages are left when one
// splits. Events (and the records of new steps) are appended at the end
// of each execution's key range, so the left page of a split is seldom
// written again: bbolt's default (half full) leaves half of every such
// page empty. Full (1.0) rather than 0.9: the only record rewritten there
// is a step's, once, when it ends, and keeping 10% of every page free for
// that rewrite cost more than the splits it saves (2.40 against 2.75 KB
// per step at 10 executions, the same page writes per commit;
// docs/benchmarks.md).
const eventsFill = 1.0

// AppendEvent implements kernel.Tx. Seq 0 is refused (seqs start at 1).
func (w *writeTx) AppendEvent(tenant string, ev kernel.Event) error {
	if err := checkIDs("append event", tenant, ev.ExecutionID); err != nil {
		return err
	}
	if ev.Seq == 0 {
		return fmt.Errorf("bbolt: append event %s/%s: seq 0: %w", tenant, ev.ExecutionID, kernel.ErrValidation)
	}
	b := w.bucket(bEvents)
	b.FillPercent = eventsFill
	k := eventKey(tenant, ev.ExecutionID, ev.Seq)
	if !w.inGap(k) {
		v, after := w.seek(hotEvents, k)
		if v == nil {
			// Nothing is stored from k up to after: the events the
			// transaction appends next to this execution's log are free.
			w.gapFrom, w.gapTo, w.gapAfter = k, after, false
		}
	}
	if !w.inGap(k) {
		return fmt.Errorf("bbolt: append event %s/%s seq %d (%s): already recorded: %w",
			tenant, ev.ExecutionID, ev.Seq, ev.Type, kernel.ErrConflict)
	}
	if err := b.Put(k, encodeEvent(&ev)); err != nil {
		return fmt.Errorf("bbolt: append event %s/%s seq %d: %w", tenant, ev.ExecutionID, ev.Seq, err)
	}
	return nil
}

// PutAgent implements kernel.Tx.
func (w *writeTx) PutAgent(a *kernel.Agent) error {
	if a == nil {
		return fmt.Errorf("bbolt: put agent: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put agent", a.Tenant, a.ID); err != nil {
		return err
	}
	if err := put(w.bucket(bAgents), key(a.Tenant, a.ID), a); err != nil {
		return fmt.Errorf("bbolt: put agent %s/%s: %w", a.Tenant, a.ID, err)
	}
	return nil
}

// DeleteAgent implements kernel.Tx; a missing agent is ErrNotFound.
func (w *writeTx) DeleteAgent(tenant, id string) error {
	return deleteKey(w.bucket(bAgents), "agent", tenant, id)
}

// deleteKey deletes tenant␀id from b, or returns ErrNotFound.
func deleteKey(b wbucket, what, tenant, id string) error {
	if !readable(tenant, id) {
		return notFound("delete %s %s/%s", what, tenant, id)
	}
	k := key(tenant, id)
	if b.Get(k) == nil {
		return notFound("delete %s %s/%s", what, tenant, id)
	}
	if err := b.Delete(k); err != nil {
		return fmt.Errorf("bbolt: delete %s %s/%s: %w", what, tenant, id, err)
	}
	return nil
}

// PutApproval implements kernel.Tx.
func (w *writeTx) PutApproval(a *kernel.Approval) error {
	if a == nil {
		return fmt.Errorf("bbolt: put approval: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put approval", a.Tenant, a.ID); err != nil {
		return err
	}
	b, exp := w.bucket(bApprovals), w.bucket(bApprovalExp)
	k := key(a.Tenant, a.ID)
	if raw := b.Get(k); raw != nil {
		old, err := decodeApprovalIndex(raw)
		if err != nil {
			return fmt.Errorf("bbolt: put approval %s/%s: read previous: %w", a.Tenant, a.ID, err)
		}
		if ek := approvalExpKey(old); ek != nil {
			if err := exp.Delete(ek); err != nil {
				return fmt.Errorf("bbolt: put approval %s/%s: expiry index: %w", a.Tenant, a.ID, err)
			}
		}
	}
	if err := put(b, k, a); err != nil {
		return fmt.Errorf("bbolt: put approval %s/%s: %w", a.Tenant, a.ID, err)
	}
	if ek := approvalExpKey(a); ek != nil {
		if err := exp.Put(ek, nil); err != nil {
			return fmt.Errorf("bbolt: put approval %s/%s: expiry index: %w", a.Tenant, a.ID, err)
		}
	}
	return nil
}

// PutBundle implements kernel.Tx.
func (w *writeTx) PutBundle(b *kernel.BundleRecord) error {
	if b == nil {
		return fmt.Errorf("bbolt: put bundle: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put bundle", b.Tenant, b.Name); err != nil {
		return err
	}
	if err := put(w.bucket(bBundles), key(b.Tenant, b.Name), b); err != nil {
		return fmt.Errorf("bbolt: put bundle %s/%s: %w", b.Tenant, b.Name, err)
	}
	return nil
}

// DeleteBundle implements kernel.Tx; a missing bundle is ErrNotFound.
func (w *writeTx) DeleteBundle(tenant, name string) error {
	return deleteKey(w.bucket(bBundles), "bundle", tenant, name)
}

// PutCounter implements kernel.Tx. value is copied.
func (w *writeTx) PutCounter(tenant, k string, value []byte) error {
	if err := checkIDs("put counter", tenant); err != nil {
		return err
	}
	if value == nil {
		value = []byte{}
	}
	if err := w.bucket(bCounters).Put(key(tenant, k), bytes.Clone(value)); err != nil {
		return fmt.Errorf("bbolt: put counter %s/%q: %w", tenant, k, err)
	}
	return nil
}

// PutTenant implements kernel.Tx.
func (w *writeTx) PutTenant(t *kernel.Tenant) error {
	if t == nil {
		return fmt.Errorf("bbolt: put tenant: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put tenant", t.ID); err != nil {
		return err
	}
	if err := put(w.bucket(bTenants), []byte(t.ID), t); err != nil {
		return fmt.Errorf("bbolt: put tenant %s: %w", t.ID, err)
	}
	return nil
}

// PutAPIKey implements kernel.Tx and keeps the hash index. A hash already
// used by another key is ErrConflict.
func (w *writeTx) PutAPIKey(ak *kernel.APIKey) error {
	if ak == nil {
		return fmt.Errorf("bbolt: put api key: nil: %w", kernel.ErrValidation)
	}
	if err := checkIDs("put api key", ak.Tenant, ak.ID, ak.Hash); err != nil {
		return err
	}
	keys, hashes := w.bucket(bAPIKeys), w.bucket(bAPIKeyHash)
	k := key(ak.Tenant, ak.ID)
	if cur := hashes.Get([]byte(ak.Hash)); cur != nil && !bytes.Equal(cur, k) {
		return fmt.Errorf("bbolt: put api key %s/%s: hash already used by another key: %w", ak.Tenant, ak.ID, kernel.ErrConflict)
	}
	old, ok, err := get[kernel.APIKey](keys.Bucket, k)
	if err != nil {
		return fmt.Errorf("bbolt: put api key %s/%s: read previous: %w", ak.Tenant, ak.ID, err)
	}
	if ok && old.Hash != ak.Hash {
		if err := hashes.Delete([]byte(old.Hash)); err != nil {
			return fmt.Errorf("bbolt: put api key %s/%s: hash index: %w", ak.Tenant, ak.ID, err)
		}
	}
	if err := put(keys, k, ak); err != nil {
		return fmt.Errorf("bbolt: put api key %s/%s: %w", ak.Tenant, ak.ID, err)
	}
	if err := hashes.Put([]byte(ak.Hash), k); err != nil {
		return fmt.Errorf("bbolt: put api key %s/%s: hash index: %w", ak.Tenant, ak.ID, err)
	}
	return nil
}

// DeleteAPIKey implements kernel.Tx; a missing key is ErrNotFound.
func (w *writeTx) DeleteAPIKey(tenant, id string) error {
	if !readable(tenant, id) {
		return notFound("delete api key %s/%s", tenant, id)
	}
	keys := w.bucket(bAPIKeys)
	k := key(tenant, id)
	old, ok, err := get[kernel.APIKey](keys.Bucket, k)
	if err != nil {
		return fmt.Errorf("bbolt: delete api key %s/%s: %w", tenant, id, err)
	}
	if !ok {
		return notFound("delete api key %s/%s", tenant, id)
	}
	if err := w.bucket(bAPIKeyHash).Delete([]byte(old.Hash)); err != nil {
		return fmt.Errorf("bbolt: delete api key %s/%s: hash index: %w", tenant, id, err)
	}
	if err := keys.Delete(k); err != nil {
		return fmt.Errorf("bbolt: delete api key %s/%s: %w", tenant, id, err)
	}
	return nil
}
