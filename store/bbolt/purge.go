package bbolt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/wicket-run/wicket/kernel"
)

// DeleteExecution implements kernel.Tx. It deletes, in this order and at
// most limit records: the execution's steps (with the approvals they asked
// for), occurrence counters, counters under kernel.ExecCounterPrefix, and
// events from the newest down (LastSeq follows them, so that the log left
// is always 1..LastSeq); then, when nothing else is left, the execution
// and its index entries.
func (w *writeTx) DeleteExecution(tenant, id string, limit int) (kernel.PurgeStats, bool, error) {
	var st kernel.PurgeStats
	if err := checkIDs("delete execution", tenant, id); err != nil {
		return st, false, err
	}
	fail := func(what string, err error) (kernel.PurgeStats, bool, error) {
		return st, false, fmt.Errorf("bbolt: delete execution %s/%s: %s: %w", tenant, id, what, err)
	}
	execs := w.bucket(bExecutions)
	k := key(tenant, id)
	raw := execs.Get(k)
	if raw == nil {
		return st, false, missing("execution", tenant, id)
	}
	budget := limit
	if budget <= 0 {
		budget = math.MaxInt
	}
	pfx := prefix(tenant, id)
	var err error
	var approvals []string
	var occ int
	if st.Steps, occ, err = deleteSteps(w, tenant, id, budget, func(raw []byte) error {
		s, err := decodeStep(raw)
		if err == nil && s.ApprovalID != "" {
			approvals = append(approvals, s.ApprovalID)
		}
		return err
	}); err != nil {
		return fail("steps", err)
	}
	budget = max(budget-st.Steps-occ, 0) // a slot holds up to two records
	for _, aid := range approvals {
		ak := key(tenant, aid)
		araw := w.bucket(bApprovals).Get(ak)
		if araw == nil {
			continue
		}
		a, err := decodeApprovalIndex(araw)
		if err != nil {
			return fail("approval "+aid, err)
		}
		if ek := approvalExpKey(a); ek != nil {
			if err := w.bucket(bApprovalExp).Delete(ek); err != nil {
				return fail("approval expiry index", err)
			}
		}
		if err := w.bucket(bApprovals).Delete(ak); err != nil {
			return fail("approval "+aid, err)
		}
		st.Approvals++
		budget--
	}
	budget = max(budget, 0) // the approvals of the steps deleted go with them
	ctr, err := deleteForward(w.bucket(bCounters), key(tenant, kernel.ExecCounterPrefix(id)), budget)
	if err != nil {
		return fail("counters", err)
	}
	budget -= ctr
	st.Counters = occ + ctr
	left, n, err := deleteEventsBackward(w.bucket(bEvents), pfx, budget)
	st.Events = n
	if err != nil {
		return fail("events", err)
	}
	budget -= n
	if left > 0 || budget <= 0 {
		if n > 0 {
			// The log left is 1..left: LastSeq follows it.
			e, err := decode[kernel.Execution](raw)
			if err != nil {
				return fail("read", err)
			}
			e.LastSeq = left // e.Input is null: the input stays in its bucket
			if err := execs.Put(k, encodeExecution(e)); err != nil {
				return fail("record", err)
			}
		}
		return st, false, nil
	}
	old, err := decodeExecIndex(raw)
	if err != nil {
		return fail("read", err)
	}
	if err := w.unindexExecution(&old, old.dueKey(), old.leaseKey(), nil, nil, nil); err != nil {
		return fail("unindex", err)
	}
	if err := execs.Delete(k); err != nil {
		return fail("record", err)
	}
	if err := execs.Delete(inputKey(k)); err != nil {
		return fail("input", err)
	}
	if owner := w.bucket(bExecTenant).Get([]byte(id)); string(owner) == tenant {
		if err := w.bucket(bExecTenant).Delete([]byte(id)); err != nil {
			return fail("tenant index", err)
		}
	}
	st.Executions = 1
	return st, true, nil
}

// deleteForward deletes up to limit keys of b that start with pfx, in key
// order, and returns how many it deleted. Keys are collected first and
// deleted after: bbolt cursors are not moved across their own deletes.
func deleteForward(b wbucket, pfx []byte, limit int) (int, error) {
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(pfx); len(keys) < limit && k != nil && bytes.HasPrefix(k, pfx); k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return 0, err
		}
	}
	return len(keys), nil
}

// deleteSteps deletes up to limit slots of an execution's steps bucket
// (the steps, with their records, and the occurrence counters), in key
// order, calling seen with each step record first. It returns how many
// steps and counters it deleted.
func deleteSteps(w *writeTx, tenant, id string, limit int, seen func(raw []byte) error) (steps, occ int, err error) {
	pfx := prefix(tenant, id)
	idx, log := w.bucket(bSteps), w.bucket(bEvents)
	var keys, logKeys [][]byte
	c := idx.Cursor()
	for k, v := c.Seek(pfx); steps+occ < limit && k != nil && bytes.HasPrefix(k, pfx); k, v = c.Next() {
		keys = append(keys, bytes.Clone(k))
		sl, err := decodeSlot(v)
		if err != nil {
			steps++ // deleted all the same
			continue
		}
		if sl.occ != nil {
			occ++
		}
		if !sl.hasSeq {
			continue
		}
		steps++
		lk := stepLogKey(tenant, id, sl.seq, string(k[len(pfx):]))
		if raw := log.Get(lk); raw != nil {
			if err := seen(raw); err != nil {
				return 0, 0, fmt.Errorf("step %q: %w", k[len(pfx):], err)
			}
			logKeys = append(logKeys, lk)
		}
	}
	for _, k := range logKeys {
		if err := log.Delete(k); err != nil {
			return 0, 0, err
		}
	}
	for _, k := range keys {
		if err := idx.Delete(k); err != nil {
			return 0, 0, err
		}
	}
	return steps, occ, nil
}

// deleteEventsBackward deletes up to limit events under pfx (keys
// pfx+seq(8)), newest first. It returns the seq of the newest event left
// (0: none) and how many it deleted. Step records (longer keys under pfx)
// are deleted with their steps (deleteSteps); one left without its index
// entry goes with the last event. It walks the events forward (bbolt's
// Prev does not step over the pages this transaction's deletes emptied).
func deleteEventsBackward(b wbucket, pfx []byte, limit int) (uint64, int, error) {
	var keys, strays [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(pfx); k != nil && bytes.HasPrefix(k, pfx); k, _ = c.Next() {
		if len(k) != len(pfx)+8 {
			strays = append(strays, bytes.Clone(k))
			continue
		}
		keys = append(keys, bytes.Clone(k))
	}
	var left uint64
	if limit < len(keys) {
		keep := keys[len(keys)-limit-1]
		left = binary.BigEndian.Uint64(keep[len(pfx):])
		keys = keys[len(keys)-limit:]
	}
	n := len(keys)
	if left == 0 {
		keys = append(keys, strays...)
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return 0, 0, err
		}
	}
	return left, n, nil
}
