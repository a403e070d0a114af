package bbolt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

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

// Check verifies the store's invariants in one read transaction and returns
// an error describing every violation found (nil when there is none):
//
//   - bbolt's own page-level consistency;
//   - per execution, events have seq 1..LastSeq without gaps, the first is
//     execution.created, nothing follows a terminal execution event, and
//     each step_id has at most one terminal step event;
//   - no event (or input) belongs to a missing execution;
//   - every step record (in its execution's log) names itself and is the
//     one the step index points at, and every step index entry points at
//     a record;
//   - the indexes (exec_tenant, idem, due, leases, approval_exp,
//     apikey_hash) hold exactly the entries their records imply.
//
// It reads the whole file: it is meant for tests and offline checks.
func (s *Store) Check() error {
	c := &checker{}
	if err := s.flush(); err != nil {
		return err
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			c.addf("bbolt: %w", err)
		}
		checkExecutions(tx, c)
		checkApprovals(tx, c)
		checkAPIKeys(tx, c)
		return nil
	})
	if err != nil {
		return fmt.Errorf("bbolt: check %s: %w", s.path, err)
	}
	if c.n == 0 {
		return nil
	}
	more := ""
	if c.n > len(c.problems) {
		more = fmt.Sprintf(" (first %d shown)", len(c.problems))
	}
	return fmt.Errorf("bbolt: check %s: %d problem(s)%s:\n%w", s.path, c.n, more, errors.Join(c.problems...))
}

// expected is the set of index keys the records imply.
type expected map[string]bool

// compareIndex reports entries of b not in want and entries of want not in b.
func compareIndex(tx *bolt.Tx, name []byte, want expected, c *checker) {
	seen := 0
	_ = tx.Bucket(name).ForEach(func(k, _ []byte) error {
		if want[string(k)] {
			seen++
			return nil
		}
		c.addf("index %s: stale entry %q", name, k)
		return nil
	})
	if seen == len(want) {
		return
	}
	b := tx.Bucket(name)
	for k := range want {
		if b.Get([]byte(k)) == nil {
			c.addf("index %s: missing entry %q", name, k)
		}
	}
}

func checkExecutions(tx *bolt.Tx, c *checker) {
	execs, owners, idem := tx.Bucket(bExecutions), tx.Bucket(bExecTenant), tx.Bucket(bIdem)
	due, leases := expected{}, expected{}
	owned, idemWant := expected{}, expected{}
	_ = execs.ForEach(func(k, v []byte) error {
		if isInputKey(k) {
			if execs.Get(k[1:]) == nil {
				c.addf("executions: the input %q names no execution", k[1:])
			}
			return nil
		}
		e, err := decode[kernel.Execution](v)
		if err != nil {
			c.addf("execution %q: undecodable: %v", k, err)
			return nil
		}
		where := e.Tenant + "/" + e.ID
		if !bytes.Equal(k, key(e.Tenant, e.ID)) {
			c.addf("execution %s: stored under key %q", where, k)
		}
		owned[e.ID] = true
		if t := owners.Get([]byte(e.ID)); string(t) != e.Tenant {
			c.addf("execution %s: exec_tenant says %q", where, t)
		}
		if e.IdempotencyKey != "" {
			ik := key(e.Tenant, e.IdempotencyKey)
			idemWant[string(ik)] = true
			if id := idem.Get(ik); string(id) != e.ID {
				c.addf("execution %s: idempotency key %q names %q", where, e.IdempotencyKey, id)
			}
		}
		if dk := dueKey(e); dk != nil {
			due[string(dk)] = true
		}
		if lk := leaseKey(e); lk != nil {
			leases[string(lk)] = true
		}
		checkEvents(tx, e, c)
		return nil
	})
	compareIndex(tx, bDue, due, c)
	compareIndex(tx, bLeases, leases, c)
	_ = owners.ForEach(func(k, v []byte) error {
		if !owned[string(k)] {
			c.addf("index exec_tenant: entry %q → %q names no execution", k, v)
		}
		return nil
	})
	_ = idem.ForEach(func(k, v []byte) error {
		if !idemWant[string(k)] {
			c.addf("index idem: entry %q → %q names no execution with that key", k, v)
		}
		return nil
	})
	// Events (and step records) of missing executions.
	_ = tx.Bucket(bEvents).ForEach(func(k, _ []byte) error {
		ek, rest, ok := splitExecKey(k)
		if !ok || len(rest) < 8 {
			c.addf("events: malformed key %q", k)
			return nil
		}
		if execs.Get(ek) == nil {
			c.addf("events: seq %d of %q: no such execution", binary.BigEndian.Uint64(rest), ek)
		}
		return nil
	})
	checkStepIndex(tx, c)
}

// splitExecKey splits tenant␀execID␀rest into tenant␀execID and rest.
func splitExecKey(k []byte) (execKey, rest []byte, ok bool) {
	i := bytes.IndexByte(k, sep)
	if i < 0 {
		return nil, nil, false
	}
	j := bytes.IndexByte(k[i+1:], sep)
	if j < 0 {
		return nil, nil, false
	}
	return k[:i+1+j], k[i+2+j:], true
}

// checkStepIndex verifies that every slot of the steps bucket decodes and
// that the step it names (if any) has its record at the seq it gives (a
// step record of a missing execution is found by the events check).
func checkStepIndex(tx *bolt.Tx, c *checker) {
	log := tx.Bucket(bEvents)
	_ = tx.Bucket(bSteps).ForEach(func(k, v []byte) error {
		ek, id, ok := splitExecKey(k)
		if !ok {
			c.addf("steps: malformed index key %q", k)
			return nil
		}
		sl, err := decodeSlot(v)
		if err == nil && sl.occ != nil {
			_, err = decodeOccurrence(sl.occ)
		}
		if err != nil {
			c.addf("steps: entry %q of %q: %v", id, ek, err)
			return nil
		}
		if !sl.hasSeq {
			return nil
		}
		lk := binary.BigEndian.AppendUint64(append(bytes.Clone(ek), sep), sl.seq)
		if log.Get(append(lk, id...)) == nil {
			c.addf("steps: step %s of %q: no record at seq %d", id, ek, sl.seq)
		}
		return nil
	})
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

// checkEvents verifies the event log invariants of e (docs/durability.md).
func checkEvents(tx *bolt.Tx, e *kernel.Execution, c *checker) {
	where := e.Tenant + "/" + e.ID
	pfx := prefix(e.Tenant, e.ID)
	var next uint64 = 1
	var terminal kernel.EventType
	stepDone := map[string]uint64{}
	cur := tx.Bucket(bEvents).Cursor()
	for k, v := cur.Seek(pfx); k != nil && bytes.HasPrefix(k, pfx); k, v = cur.Next() {
		if len(k) < len(pfx)+8 {
			c.addf("execution %s: malformed event key %q", where, k)
			continue
		}
		seq := binary.BigEndian.Uint64(k[len(pfx):])
		if len(k) > len(pfx)+8 {
			checkStepRecord(tx, e, seq, string(k[len(pfx)+8:]), v, c)
			continue
		}
		ev := new(kernel.Event)
		if err := decodeEvent(v, e.ID, seq, ev); err != nil {
			c.addf("execution %s: event %d undecodable: %v", where, seq, err)
			next = seq + 1
			continue
		}
		if ev.Seq != seq || ev.ExecutionID != e.ID {
			c.addf("execution %s: event stored as seq %d says %s seq %d", where, seq, ev.ExecutionID, ev.Seq)
		}
		if seq != next {
			c.addf("execution %s: event seq %d follows %d (gap)", where, seq, next-1)
		}
		next = seq + 1
		if seq == 1 && ev.Type != kernel.EvExecutionCreated {
			c.addf("execution %s: first event is %s, not %s", where, ev.Type, kernel.EvExecutionCreated)
		}
		if terminal != "" {
			c.addf("execution %s: event %d (%s) after terminal %s", where, seq, ev.Type, terminal)
		}
		if terminalExecEvents[ev.Type] && terminal == "" {
			terminal = ev.Type
		}
		if terminalStepEvents[ev.Type] {
			var p struct {
				StepID string `json:"step_id"`
			}
			if err := json.Unmarshal(ev.Payload, &p); err != nil || p.StepID == "" {
				c.addf("execution %s: event %d (%s) names no step_id", where, seq, ev.Type)
			} else if prev, dup := stepDone[p.StepID]; dup {
				c.addf("execution %s: step %s has a second terminal event %d (%s) after %d", where, p.StepID, seq, ev.Type, prev)
			} else {
				stepDone[p.StepID] = seq
			}
		}
	}
	if last := next - 1; last != e.LastSeq {
		c.addf("execution %s: last event seq is %d, LastSeq is %d", where, last, e.LastSeq)
	}
}

// checkStepRecord verifies the record of step id stored at seq in e's log:
// it decodes, names itself, and the step index points at it.
func checkStepRecord(tx *bolt.Tx, e *kernel.Execution, seq uint64, id string, v []byte, c *checker) {
	where := e.Tenant + "/" + e.ID
	s, err := decodeStepAt(v, e.Tenant, e.ID, id)
	if err != nil {
		c.addf("execution %s: step %s at seq %d undecodable: %v", where, id, seq, err)
		return
	}
	if s.ID != id || s.Seq != seq || s.ExecutionID != e.ID || s.Tenant != e.Tenant {
		c.addf("execution %s: step stored as %s at seq %d says %s/%s/%s at seq %d", where, id, seq, s.Tenant, s.ExecutionID, s.ID, s.Seq)
	}
	sl, err := decodeSlot(tx.Bucket(bSteps).Get(key(e.Tenant, e.ID, id)))
	if err != nil || !sl.hasSeq || sl.seq != seq {
		c.addf("execution %s: step %s at seq %d: the step index does not point at it", where, id, seq)
	}
}

func checkApprovals(tx *bolt.Tx, c *checker) {
	want := expected{}
	_ = tx.Bucket(bApprovals).ForEach(func(k, v []byte) error {
		a, err := decode[kernel.Approval](v)
		if err != nil {
			c.addf("approval %q: undecodable: %v", k, err)
			return nil
		}
		if !bytes.Equal(k, key(a.Tenant, a.ID)) {
			c.addf("approval %s/%s: stored under key %q", a.Tenant, a.ID, k)
		}
		if ek := approvalExpKey(a); ek != nil {
			want[string(ek)] = true
		}
		return nil
	})
	compareIndex(tx, bApprovalExp, want, c)
}

func checkAPIKeys(tx *bolt.Tx, c *checker) {
	want := map[string]string{} // hash → tenant␀id
	_ = tx.Bucket(bAPIKeys).ForEach(func(k, v []byte) error {
		ak, err := decode[kernel.APIKey](v)
		if err != nil {
			c.addf("api key %q: undecodable: %v", k, err)
			return nil
		}
		if !bytes.Equal(k, key(ak.Tenant, ak.ID)) {
			c.addf("api key %s/%s: stored under key %q", ak.Tenant, ak.ID, k)
		}
		if other, dup := want[ak.Hash]; dup {
			c.addf("api key %s/%s: hash shared with %q", ak.Tenant, ak.ID, other)
		}
		want[ak.Hash] = string(k)
		return nil
	})
	hashes := tx.Bucket(bAPIKeyHash)
	_ = hashes.ForEach(func(h, ref []byte) error {
		if want[string(h)] != string(ref) {
			c.addf("index apikey_hash: entry names key %q, whose hash differs (or which is missing)", ref)
		}
		return nil
	})
	for h, ref := range want {
		if hashes.Get([]byte(h)) == nil {
			c.addf("index apikey_hash: missing entry for %q", ref)
		}
	}
}
