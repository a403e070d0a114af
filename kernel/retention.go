package kernel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Retention deletes terminal executions older than the retention of their
// tenant (Tenant.Retention, else Config.Retention) with everything stored
// under them. It runs every Config.RetentionInterval while the kernel runs,
// one tenant at a time, oldest executions first, in small transactions
// (Config.RetentionBatch records at most, but never less than one whole
// execution) with a pause between them, so that step traffic keeps the
// store's writer.
//
// Candidates are found without an index: execution ids are UUIDv7, so the
// executions created before the cutoff are exactly those whose id sorts
// below the id of the cutoff instant, and a pass reads only those (the
// terminal ones among them are deleted; the few still running are read
// again by the next pass).

// PurgeStats counts what retention deleted.
type PurgeStats struct {
	Executions, Events, Steps, Approvals, Counters int
}

// Add adds o to p.
func (p *PurgeStats) Add(o PurgeStats) {
	p.Executions += o.Executions
	p.Events += o.Events
	p.Steps += o.Steps
	p.Approvals += o.Approvals
	p.Counters += o.Counters
}

func (p PurgeStats) records() int {
	return p.Executions + p.Events + p.Steps + p.Approvals + p.Counters
}

// ExecCounterPrefix is the start of the keys of the counters the kernel
// keeps per execution (PutCounter); DeleteExecution deletes them with it.
func ExecCounterPrefix(executionID string) string { return "exec\x00" + executionID + "\x00" }

// idFloor is the smallest UUIDv7 id of the millisecond of t: every id
// made at t or later sorts at or above it.
func idFloor(t time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[0:8], uint64(max(t.UnixMilli(), 0))<<16)
	b[6] = 0x70
	b[8] = 0x80
	return uuidText(&b)
}

// retentionOf is how long a tenant's terminal executions are kept (0:
// forever).
func (k *Kernel) retentionOf(t *Tenant) time.Duration {
	if t.Retention != "" {
		d, err := time.ParseDuration(t.Retention)
		if err == nil && d >= 0 {
			return d
		}
		k.log.Warn("tenant retention is invalid: using the kernel's", "tenant", t.ID, "retention", t.Retention)
	}
	return k.cfg.Retention
}

// ValidRetention checks a tenant's retention setting: "" (the kernel's),
// "0s" (forever) or a duration of at least MinRetention.
func ValidRetention(s string) error {
	if s == "" {
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return Errorf(CodeValidation, "retention %q is not a duration (want e.g. 720h; 0s keeps forever)", s)
	}
	if d != 0 && d < MinRetention {
		return Errorf(CodeValidation, "retention %s is shorter than the minimum %s", d, MinRetention)
	}
	return nil
}

// SetTenantRetention sets how long a tenant's ended executions are kept
// ("" follows the kernel's Retention, "0s" keeps them forever; see
// ValidRetention). The default tenant's record is made when missing.
func (k *Kernel) SetTenantRetention(ctx context.Context, tenant, retention string) (*Tenant, error) {
	if err := ValidRetention(retention); err != nil {
		return nil, err
	}
	var out *Tenant
	_, err := k.update(ctx, func(r *rec) error {
		t, err := tenantToChange(r, tenant)
		if err != nil {
			return err
		}
		t.Retention = retention
		out = t
		return r.tx.PutTenant(t)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// MinRetention is the shortest retention a tenant or the kernel may set.
const MinRetention = time.Minute

// retentionLoop runs Purge every RetentionInterval until ctx ends.
func (k *Kernel) retentionLoop(ctx context.Context) {
	t := time.NewTicker(k.cfg.RetentionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := k.Purge(ctx)
		if err != nil && ctx.Err() == nil {
			k.log.Error("retention", "err", err)
		}
		if st.Executions > 0 {
			k.log.Info("retention deleted executions", "executions", st.Executions, "events", st.Events,
				"steps", st.Steps, "approvals", st.Approvals, "counters", st.Counters)
		}
	}
}

// Purge runs one retention pass over every tenant now and returns what it
// deleted. The kernel runs it by itself every RetentionInterval; tests and
// tools may call it directly.
func (k *Kernel) Purge(ctx context.Context) (PurgeStats, error) { return k.purgeAt(ctx, k.now()) }

// purgeAt runs a retention pass as if it were now.
func (k *Kernel) purgeAt(ctx context.Context, now time.Time) (PurgeStats, error) {
	var total PurgeStats
	tenants, err := k.ListTenants(ctx)
	if err != nil {
		return total, err
	}
	for _, t := range tenants {
		keep := k.retentionOf(t)
		if keep <= 0 {
			continue
		}
		st, err := k.purgeTenant(ctx, t.ID, now.Add(-keep))
		total.Add(st)
		if err != nil {
			return total, fmt.Errorf("retention of tenant %s: %w", t.ID, err)
		}
	}
	return total, nil
}

// purgeTenant deletes the tenant's executions that ended before cutoff.
func (k *Kernel) purgeTenant(ctx context.Context, tenant string, cutoff time.Time) (PurgeStats, error) {
	var total PurgeStats
	before := idFloor(cutoff)
	const page = 256
	for {
		var got []*Execution
		err := k.store.View(ctx, func(tx ReadTx) error {
			var err error
			got, err = tx.ListExecutions(tenant, ExecutionFilter{Before: before, Limit: page})
			return err
		})
		if err != nil {
			return total, err
		}
		var doomed []string
		for _, e := range got {
			if e.Status.Terminal() && !e.UpdatedAt.After(cutoff) {
				doomed = append(doomed, e.ID)
			}
		}
		for len(doomed) > 0 {
			st, n, err := k.purgeBatch(ctx, tenant, doomed, cutoff)
			total.Add(st)
			if err != nil {
				return total, err
			}
			doomed = doomed[n:]
			// Let step traffic have the writer.
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(k.cfg.RetentionPause):
			}
		}
		if len(got) < page {
			return total, nil
		}
		before = got[len(got)-1].ID
	}
}

// purgeBatch deletes, in one transaction of at most RetentionBatch
// records, the executions of ids that are still terminal and ended before
// cutoff, in order, and returns what it deleted and how many of ids it is
// done with (an execution too large for what is left of the batch is
// begun, and finished by the next calls).
func (k *Kernel) purgeBatch(ctx context.Context, tenant string, ids []string, cutoff time.Time) (PurgeStats, int, error) {
	var st PurgeStats
	var n int
	_, err := k.update(ctx, func(r *rec) error {
		st, n = PurgeStats{}, 0
		budget := k.cfg.RetentionBatch
		for n < len(ids) && budget > 0 {
			e, err := r.tx.Execution(tenant, ids[n])
			if errors.Is(err, ErrNotFound) {
				n++
				continue
			}
			if err != nil {
				return err
			}
			if !e.Status.Terminal() || e.UpdatedAt.After(cutoff) {
				n++
				continue
			}
			d, done, err := r.tx.DeleteExecution(tenant, e.ID, budget)
			if err != nil {
				return err
			}
			st.Add(d)
			budget -= d.records()
			if !done {
				if d.records() == 0 {
					return fmt.Errorf("delete execution %s: nothing deleted with a budget of %d", e.ID, budget)
				}
				break
			}
			n++
		}
		return nil
	})
	if err != nil {
		return PurgeStats{}, 0, err
	}
	if st.Executions > 0 {
		k.ownersMu.Lock()
		for _, id := range ids[:n] {
			delete(k.owners, id)
		}
		k.ownersMu.Unlock()
	}
	if st.records() > 0 {
		if obs := k.cfg.Observer; obs != nil {
			obs.Purged(st)
		}
	}
	return st, n, nil
}
