package kernel

import (
	"context"
	"fmt"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
)

// Observer receives the kernel's measurements as they are committed
// (internal/metrics implements it with Prometheus). Its methods are called
// after the transaction that did the thing commits, never for a rolled-back
// one; they must be cheap and safe for concurrent use. Config.Observer nil
// observes nothing.
type Observer interface {
	// ExecutionsAtStart reports, once from Start, the executions stored by
	// status: the baseline that ExecutionStatus then moves.
	ExecutionsAtStart(counts map[ExecStatus]int)
	// ExecutionStatus reports one execution's committed status change;
	// from is "" for a new execution, to is "" for one deleted by retention.
	ExecutionStatus(from, to ExecStatus)
	// StepDecided reports the policy decision of a new step: the engine of
	// the bundle that decided, the decision and the evaluation time.
	StepDecided(engine string, decision policy.Action, eval time.Duration)
	// Delivery reports one webhook delivery attempt: nil when the agent
	// acknowledged it.
	Delivery(err error)
	// ApprovalResolved reports an approval granted, denied or expired, and
	// how long it was pending.
	ApprovalResolved(status ApprovalStatus, waited time.Duration)
	// Purged reports what one retention batch deleted.
	Purged(p PurgeStats)
}

// observed collects, for one run of an update function, what the Observer
// is told once it commits. A run touches one execution or a few, so the
// notes are short lists searched in order, the first ones held inline: a
// step's commit notes without allocating beyond observed itself.
type observed struct {
	execs     notes[ExecStatus]     // status when first read, and when last written
	apprFrom  notes[ApprovalStatus] // status when first read
	apprTo    notes[*Approval]      // the record last written
	decisions []verdictPayload
	decided   [1]verdictPayload // decisions' first backing array
}

// recordKey names a record of a tenant.
type recordKey struct{ tenant, id string }

// note is what a run noted about one record: its first-read value, its
// last-written value, and which of the two it has.
type note[T any] struct {
	key            recordKey
	from, to       T
	hasFrom, hasTo bool
}

// notes is a short list of notes, the first two inline. Past
// notesScanned of them (a retention batch, an expiry sweep) an index
// finds a key, so that such a run does not search its list per record.
type notes[T any] struct {
	inline [2]note[T]
	more   []note[T]
	n      int
	index  map[recordKey]int
}

// notesScanned is how many notes get searches in order before indexing.
const notesScanned = 8

// get returns the note of k, adding an empty one when there is none.
func (ns *notes[T]) get(k recordKey) *note[T] {
	if ns.index != nil {
		if i, ok := ns.index[k]; ok {
			return ns.at(i)
		}
	} else {
		for i := range ns.n {
			if n := ns.at(i); n.key == k {
				return n
			}
		}
		if ns.n == notesScanned {
			ns.index = make(map[recordKey]int, 2*notesScanned)
			for i := range ns.n {
				ns.index[ns.at(i).key] = i
			}
		}
	}
	if ns.index != nil {
		ns.index[k] = ns.n
	}
	if ns.n < len(ns.inline) {
		ns.inline[ns.n] = note[T]{key: k}
	} else {
		ns.more = append(ns.more, note[T]{key: k})
	}
	ns.n++
	return ns.at(ns.n - 1)
}

func (ns *notes[T]) at(i int) *note[T] {
	if i < len(ns.inline) {
		return &ns.inline[i]
	}
	return &ns.more[i-len(ns.inline)]
}

// observedTx is the Tx an update function sees when the kernel has an
// Observer: it notes the first-read and last-written status of executions
// and approvals.
type observedTx struct {
	Tx
	o *observed
}

// OpenSteps passes OpenStepsLister through to the store's transaction, or
// filters its ListSteps.
func (t *observedTx) OpenSteps(tenant, executionID string) ([]*Step, error) {
	return openSteps(t.Tx, tenant, executionID)
}

func (t *observedTx) Execution(tenant, id string) (*Execution, error) {
	e, err := t.Tx.Execution(tenant, id)
	if err == nil {
		if n := t.o.execs.get(recordKey{tenant, id}); !n.hasFrom {
			n.from, n.hasFrom = e.Status, true
		}
	}
	return e, err
}

func (t *observedTx) PutExecution(e *Execution) error {
	if err := t.Tx.PutExecution(e); err != nil {
		return err
	}
	n := t.o.execs.get(recordKey{e.Tenant, e.ID})
	n.to, n.hasTo = e.Status, true
	return nil
}

func (t *observedTx) DeleteExecution(tenant, id string, limit int) (PurgeStats, bool, error) {
	st, done, err := t.Tx.DeleteExecution(tenant, id, limit)
	if err == nil && done {
		n := t.o.execs.get(recordKey{tenant, id})
		n.to, n.hasTo = "", true // deleted
	}
	return st, done, err
}

func (t *observedTx) Approval(tenant, id string) (*Approval, error) {
	a, err := t.Tx.Approval(tenant, id)
	if err == nil {
		if n := t.o.apprFrom.get(recordKey{tenant, id}); !n.hasFrom {
			n.from, n.hasFrom = a.Status, true
		}
	}
	return a, err
}

func (t *observedTx) PutApproval(a *Approval) error {
	if err := t.Tx.PutApproval(a); err != nil {
		return err
	}
	n := t.o.apprTo.get(recordKey{a.Tenant, a.ID})
	n.to, n.hasTo = a, true
	return nil
}

// observeEvent notes what an event tells the Observer.
func (o *observed) observeEvent(payload any) {
	if d, ok := payload.(verdictPayload); ok {
		if o.decisions == nil {
			o.decisions = o.decided[:0]
		}
		o.decisions = append(o.decisions, d)
	}
}

// report tells obs what a committed run did.
func (o *observed) report(obs Observer, now time.Time) {
	for i := range o.execs.n {
		if n := o.execs.at(i); n.hasTo && n.from != n.to {
			obs.ExecutionStatus(n.from, n.to)
		}
	}
	for i := range o.apprTo.n {
		n := o.apprTo.at(i)
		if !n.hasTo {
			continue
		}
		a := n.to
		if from := o.apprFrom.get(n.key); from.from == ApprovalPending && a.Status != ApprovalPending {
			at := now
			if a.DecidedAt != nil {
				at = *a.DecidedAt
			}
			obs.ApprovalResolved(a.Status, at.Sub(a.CreatedAt))
		}
	}
	for _, d := range o.decisions {
		obs.StepDecided(d.Engine, d.Decision, time.Duration(d.EvalNS))
	}
}

// countExecutions counts the stored executions by status, reading them a
// page at a time.
func (k *Kernel) countExecutions(ctx context.Context) (map[ExecStatus]int, error) {
	counts := map[ExecStatus]int{}
	tenants, err := k.ListTenants(ctx)
	if err != nil {
		return nil, err
	}
	const page = 1000
	for _, t := range tenants {
		before := ""
		for {
			var got []*Execution
			err := k.store.View(ctx, func(tx ReadTx) error {
				var err error
				got, err = tx.ListExecutions(t.ID, ExecutionFilter{Before: before, Limit: page})
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("count executions of %s: %w", t.ID, err)
			}
			for _, e := range got {
				counts[e.Status]++
			}
			if len(got) < page {
				break
			}
			before = got[len(got)-1].ID
		}
	}
	return counts, nil
}

// PendingApprovals returns how many approvals are pending, kernel-wide, and
// when the oldest of them was requested (zero when none is). It reads the
// store's index of pending approvals: metrics call it on every scrape.
// Where the store allows it (PendingApprovalScanner), it reads the index
// listScanChunk entries at a time, one read transaction each.
func (k *Kernel) PendingApprovals(ctx context.Context) (int, time.Time, error) {
	var n int
	var oldest time.Time
	err := k.readInChunks(ctx, "", func(tx ReadTx, after string) (string, error) {
		var refs []ApprovalRef
		resume := ""
		var err error
		if sc, ok := tx.(PendingApprovalScanner); ok {
			refs, resume, err = sc.ScanPendingApprovals(after, listScanChunk)
		} else {
			refs, err = tx.ExpiredApprovals(time.Unix(1<<62, 0), 0)
		}
		if err != nil {
			return "", err
		}
		for _, ref := range refs {
			a, err := tx.Approval(ref.Tenant, ref.ApprovalID)
			if err != nil || a.Status != ApprovalPending {
				continue
			}
			n++
			if oldest.IsZero() || a.CreatedAt.Before(oldest) {
				oldest = a.CreatedAt
			}
		}
		return resume, nil
	})
	return n, oldest, err
}
