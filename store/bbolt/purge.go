package bbolt

import (
	"bytes"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
)

// DeleteExecution implements kernel.Tx: it deletes the execution and
// everything stored under it — its index entries (tenant, idempotency key,
// due dispatch, lease), events, steps, occurrence counters, the approvals
// its steps asked for (and their expiry entries), and the counters kept
// under kernel.ExecCounterPrefix(id).
func (w *writeTx) DeleteExecution(tenant, id string) (kernel.PurgeStats, error) {
	var st kernel.PurgeStats
	if err := checkIDs("delete execution", tenant, id); err != nil {
		return st, err
	}
	fail := func(what string, err error) (kernel.PurgeStats, error) {
		return st, fmt.Errorf("bbolt: delete execution %s/%s: %s: %w", tenant, id, what, err)
	}
	execs := w.bucket(bExecutions)
	k := key(tenant, id)
	raw := execs.Get(k)
	if raw == nil {
		return st, missing("execution", tenant, id)
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
	if owner := w.bucket(bExecTenant).Get([]byte(id)); string(owner) == tenant {
		if err := w.bucket(bExecTenant).Delete([]byte(id)); err != nil {
			return fail("tenant index", err)
		}
	}
	st.Executions = 1
	pfx := prefix(tenant, id)
	// Steps first: they name the approvals to delete.
	var approvals []string
	n, err := deletePrefix(w.bucket(bSteps), pfx, func(v []byte) error {
		s, err := decode[kernel.Step](v)
		if err != nil {
			return err
		}
		if s.ApprovalID != "" {
			approvals = append(approvals, s.ApprovalID)
		}
		return nil
	})
	if err != nil {
		return fail("steps", err)
	}
	st.Steps = n
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
	}
	if st.Events, err = deletePrefix(w.bucket(bEvents), pfx, nil); err != nil {
		return fail("events", err)
	}
	occ, err := deletePrefix(w.bucket(bOcc), pfx, nil)
	if err != nil {
		return fail("occurrence counters", err)
	}
	ctr, err := deletePrefix(w.bucket(bCounters), key(tenant, kernel.ExecCounterPrefix(id)), nil)
	if err != nil {
		return fail("counters", err)
	}
	st.Counters = occ + ctr
	return st, nil
}

// deletePrefix deletes every key of b that starts with pfx, calling seen
// (when set) with each value first, and returns how many it deleted.
func deletePrefix(b *bolt.Bucket, pfx []byte, seen func(v []byte) error) (int, error) {
	c := b.Cursor()
	n := 0
	for k, v := c.Seek(pfx); k != nil && bytes.HasPrefix(k, pfx); k, v = c.Seek(pfx) {
		if seen != nil {
			if err := seen(v); err != nil {
				return n, fmt.Errorf("key %q: %w", k, err)
			}
		}
		if err := c.Delete(); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
