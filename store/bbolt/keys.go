package bbolt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// Bucket names.
var (
	bMeta        = []byte("meta")
	bExecutions  = []byte("executions")
	bExecTenant  = []byte("exec_tenant")
	bIdem        = []byte("idem")
	bSteps       = []byte("steps")
	bOcc         = []byte("occ")
	bEvents      = []byte("events")
	bAgents      = []byte("agents")
	bApprovals   = []byte("approvals")
	bBundles     = []byte("bundles")
	bCounters    = []byte("counters")
	bTenants     = []byte("tenants")
	bAPIKeys     = []byte("apikeys")
	bAPIKeyHash  = []byte("apikey_hash")
	bDue         = []byte("due")
	bLeases      = []byte("leases")
	bApprovalExp = []byte("approval_exp")
)

// keySchemaVersion is the meta key holding the schema version.
var keySchemaVersion = []byte("schema_version")

// sep joins the parts of a key.
const sep = 0x00

// checkIDs returns a validation error when an identifier is empty or
// contains the separator: such an id could make one tenant's key look like
// another's.
func checkIDs(what string, ids ...string) error {
	for _, id := range ids {
		if id == "" {
			return fmt.Errorf("bbolt: %s: empty identifier: %w", what, kernel.ErrValidation)
		}
		if strings.IndexByte(id, sep) >= 0 {
			return fmt.Errorf("bbolt: %s: identifier %q contains NUL: %w", what, id, kernel.ErrValidation)
		}
	}
	return nil
}

// readable reports whether ids can name a stored record (see checkIDs).
func readable(ids ...string) bool {
	for _, id := range ids {
		if id == "" || strings.IndexByte(id, sep) >= 0 {
			return false
		}
	}
	return true
}

// key joins parts with sep.
func key(parts ...string) []byte { return appendKey(0, parts...) }

// appendKey returns key(parts...) with room for extra more bytes.
func appendKey(extra int, parts ...string) []byte {
	n := max(len(parts)-1, 0) + extra
	for _, p := range parts {
		n += len(p)
	}
	b := make([]byte, 0, n)
	for i, p := range parts {
		if i > 0 {
			b = append(b, sep)
		}
		b = append(b, p...)
	}
	return b
}

// prefix is key(parts...) followed by sep: the prefix of every key below parts.
func prefix(parts ...string) []byte { return append(appendKey(1, parts...), sep) }

// splitPair splits tenant␀rest at the first separator.
func splitPair(k []byte) (string, string, bool) {
	i := bytes.IndexByte(k, sep)
	if i < 0 {
		return "", "", false
	}
	return string(k[:i]), string(k[i+1:]), true
}

var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

// putTime appends t as 8 bytes whose byte order is time order. Times
// outside the range of int64 nanoseconds (the zero time among them) are
// clamped to it.
func putTime(b []byte, t time.Time) []byte {
	return appendNanos(b, clampNanos(t))
}

// clampNanos is t in Unix nanoseconds, clamped to the range of int64.
func clampNanos(t time.Time) int64 {
	switch {
	case t.Before(minTime):
		return math.MinInt64
	case t.After(maxTime):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// appendNanos appends Unix nanoseconds n as 8 bytes whose byte order is
// numeric order.
func appendNanos(b []byte, n int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(n)^(1<<63))
}

// getTime decodes putTime; the smallest value decodes as the zero time.
func getTime(b []byte) time.Time {
	n := int64(binary.BigEndian.Uint64(b) ^ (1 << 63))
	if n == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// timeKey is an index key: time(8) tenant␀id.
func timeKey(t time.Time, tenant, id string) []byte {
	return nanosKey(clampNanos(t), tenant, id)
}

// nanosKey is the index key of a time already in Unix nanoseconds.
func nanosKey[S ~string | ~[]byte](n int64, tenant, id S) []byte {
	b := make([]byte, 0, 8+len(tenant)+1+len(id))
	b = appendNanos(b, n)
	b = append(b, tenant...)
	b = append(b, sep)
	return append(b, id...)
}

// parseTimeKey decodes timeKey.
func parseTimeKey(k []byte) (t time.Time, tenant, id string, ok bool) {
	if len(k) < 8 {
		return time.Time{}, "", "", false
	}
	tenant, id, ok = splitPair(k[8:])
	return getTime(k[:8]), tenant, id, ok
}

// eventKey is tenant␀execID␀seq(8).
func eventKey(tenant, execID string, seq uint64) []byte {
	b := append(appendKey(9, tenant, execID), sep)
	return binary.BigEndian.AppendUint64(b, seq)
}

// stepLogKey is the key of a step's record in the events bucket: the key
// of the step's first event (seq, step.proposed) followed by the step id,
// so that it sorts right after that event and before the next. Event keys
// are exactly 8 bytes longer than their execution's prefix; step keys are
// longer still.
func stepLogKey(tenant, execID string, seq uint64, stepID string) []byte {
	b := append(appendKey(9+len(stepID), tenant, execID), sep)
	b = binary.BigEndian.AppendUint64(b, seq)
	return append(b, stepID...)
}

// inputKey is the key of the input of the execution stored under k
// (tenant␀execID) in the executions bucket: NUL then k. No record key
// starts with NUL (a tenant id is never empty), so the inputs sort before
// every record, on pages of their own.
func inputKey(k []byte) []byte {
	b := make([]byte, 1, 1+len(k))
	return append(b, k...)
}

// execKeys returns an execution's key, key(tenant, id), and its input's,
// inputKey of it, in one allocation.
func execKeys(tenant, id string) (k, ik []byte) {
	ik = make([]byte, 0, 2+len(tenant)+len(id))
	ik = append(append(append(append(ik, sep), tenant...), sep), id...)
	return ik[1:len(ik):len(ik)], ik
}

// isInputKey reports whether k, a key of the executions bucket, is an
// input's (inputKey).
func isInputKey(k []byte) bool { return len(k) > 0 && k[0] == sep }

// stepKeys returns a step's slot key (tenant␀execID␀stepID) and its
// record's key at seq (stepLogKey), in one allocation.
func stepKeys(tenant, execID, stepID string, seq uint64) (slotKey, logKey []byte) {
	n := len(tenant) + 1 + len(execID) + 1
	b := make([]byte, 0, 2*(n+len(stepID))+8)
	b = append(append(append(append(b, tenant...), sep), execID...), sep)
	b = append(b, stepID...)
	slotKey = b[:len(b):len(b)]
	b = append(b, b[:n]...)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = append(b, stepID...)
	return slotKey, b[len(slotKey):]
}

// dueKey returns the due-index key of e, or nil when e is not queued.
func dueKey(e *kernel.Execution) []byte {
	if e.Dispatch.State != kernel.DispatchQueued {
		return nil
	}
	return timeKey(e.Dispatch.DueAt, e.Tenant, e.ID)
}

// leaseKey returns the lease-index key of e, or nil when e holds no lease.
func leaseKey(e *kernel.Execution) []byte {
	switch e.Dispatch.State {
	case kernel.DispatchDelivering, kernel.DispatchAcked:
		return timeKey(e.Dispatch.LeaseUntil, e.Tenant, e.ID)
	}
	return nil
}

// dueKey returns the due-index key of the stored execution x, or nil when
// it is not queued.
func (x *execIndex) dueKey() []byte {
	if kernel.DispatchStatus(x.state) != kernel.DispatchQueued {
		return nil
	}
	return nanosKey(x.dueAt, x.tenant, x.id)
}

// leaseKey returns the lease-index key of the stored execution x, or nil
// when it holds no lease.
func (x *execIndex) leaseKey() []byte {
	switch kernel.DispatchStatus(x.state) {
	case kernel.DispatchDelivering, kernel.DispatchAcked:
		return nanosKey(x.leaseUntil, x.tenant, x.id)
	}
	return nil
}

// approvalExpKey returns the expiry-index key of a, or nil when a is not pending.
func approvalExpKey(a *kernel.Approval) []byte {
	if a.Status != kernel.ApprovalPending {
		return nil
	}
	return timeKey(a.ExpiresAt, a.Tenant, a.ID)
}
