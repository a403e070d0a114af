package kernel

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
)

// MaxApprovalsPageBytes bounds what one page of ListApprovals holds of
// approvals' arguments, results and texts: an approval carries its step's
// arguments (up to a request body), so a thousand could be gigabytes.
const MaxApprovalsPageBytes = 8 << 20

// ListApprovals lists a page of a tenant's approvals, newest first: those
// whose id is below before ("": from the newest), at most limit of them
// (<= 0: 1000), fewer once they hold MaxApprovalsPageBytes (never none).
// next is the before of the following page ("" when this is the last).
// Where the store allows it (ApprovalScanner), it reads them
// listScanChunk at a time, one read transaction each, so the list is not
// one snapshot; however many there are, it holds one page of them.
func (k *Kernel) ListApprovals(ctx context.Context, tenant string, status ApprovalStatus, before string, limit int) ([]*Approval, string, error) {
	switch status {
	case "", ApprovalPending, ApprovalGranted, ApprovalDenied, ApprovalExpired, ApprovalHappened:
	default:
		return nil, "", Errorf(CodeValidation, "status %q is invalid (want pending, granted, denied, expired or happened)", status)
	}
	if limit <= 0 {
		limit = 1000
	}
	w := approvalWindow{limit: limit, budget: MaxApprovalsPageBytes}
	keep := func(l []*Approval) {
		for _, a := range l {
			if before == "" || a.ID < before {
				w.add(a)
			}
		}
	}
	err := k.readInChunks(ctx, "", func(tx ReadTx, after string) (string, error) {
		if sc, ok := tx.(ApprovalScanner); ok {
			got, resume, err := sc.ScanApprovals(tenant, status, after, listScanChunk)
			keep(got)
			return resume, err
		}
		got, err := tx.ListApprovals(tenant, status)
		keep(got)
		return "", err
	})
	if err != nil {
		return nil, "", err
	}
	out := []*Approval(w.h)
	SortApprovals(out)
	next := ""
	if w.floor != "" && len(out) > 0 {
		next = slices.MinFunc(out, func(a, b *Approval) int { return cmp.Compare(a.ID, b.ID) }).ID
	}
	return out, next, nil
}

// approvalWindow keeps the approvals of the highest ids it is given, at
// most limit of them and budget bytes (but always one), in whatever order
// they come: an approval at or below an id it let go is not kept, so what
// it holds is every approval above the highest id it let go.
type approvalWindow struct {
	h      approvalHeap
	limit  int
	budget int
	size   int
	floor  string // the highest id let go ("": none yet; ids are never empty)
}

func approvalSize(a *Approval) int {
	return 256 + len(a.Args) + len(a.Result) + len(a.Rationale) + len(a.Message) + len(a.Reason)
}

func (w *approvalWindow) add(a *Approval) {
	if a.ID <= w.floor {
		return
	}
	heap.Push(&w.h, a)
	w.size += approvalSize(a)
	for len(w.h) > w.limit || len(w.h) > 1 && w.size > w.budget {
		o := heap.Pop(&w.h).(*Approval)
		w.size -= approvalSize(o)
		// The heap's least, and above every id let go before (add
		// keeps none at or below the floor).
		w.floor = o.ID
	}
}

// approvalHeap is a min-heap of approvals by id (container/heap).
type approvalHeap []*Approval

func (h approvalHeap) Len() int           { return len(h) }
func (h approvalHeap) Less(i, j int) bool { return h[i].ID < h[j].ID }
func (h approvalHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *approvalHeap) Push(x any)        { *h = append(*h, x.(*Approval)) }
func (h *approvalHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	*h = old[:len(old)-1]
	return a
}

// SortApprovals sorts approvals newest first, then by id, highest first:
// the order of ReadTx.ListApprovals.
func SortApprovals(l []*Approval) {
	slices.SortStableFunc(l, func(a, b *Approval) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.ID, a.ID)
	})
}

// GetApproval returns one approval.
func (k *Kernel) GetApproval(ctx context.Context, tenant, id string) (*Approval, error) {
	var a *Approval
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		a, err = tx.Approval(tenant, id)
		if errors.Is(err, ErrNotFound) {
			return Errorf(CodeNotFound, "approval %s not found", id)
		}
		return err
	})
	return a, err
}

// Resolution is a human's answer to an approval.
type Resolution struct {
	Tenant     string
	ApprovalID string
	Grant      bool
	// DecidedBy is who decides (checked against the approval's approvers);
	// KeyID and Principal are the key that authenticated the decision and
	// its principal (the same as DecidedBy unless an admin acts for someone).
	DecidedBy string
	KeyID     string
	Principal string
	// ByAdmin says the deciding key is an admin key or one the admin
	// issued (APIKey.IssuedByAdmin): only such keys decide an approval a
	// guard asked for (Approval.Guard).
	ByAdmin   bool
	Rationale string
	// RequestHash, when set, must equal the approval's (the approver saw this exact request).
	RequestHash string
	// Happened answers an interrupted_side_effect approval: the effect
	// happened, and Result is its result (recorded as the step's). Grant
	// answers it "retry"; neither, "deny".
	Happened bool
	Result   json.RawMessage
}

// ResolveApproval grants or denies a pending approval. Either way the
// execution resumes with a new dispatch: on grant the re-submitted step
// proceeds, on deny it is answered denied.
func (k *Kernel) ResolveApproval(ctx context.Context, res Resolution) (*Approval, error) {
	if res.DecidedBy == "" {
		return nil, Errorf(CodeValidation, "decided_by is required")
	}
	if res.Happened {
		r, err := canonicalOrNull(res.Result, "result")
		if err != nil {
			return nil, err
		}
		res.Result, res.Grant = r, false
	}
	dispatchID := k.ids.next(k.now())
	var out, lapsed *Approval
	_, err := k.update(ctx, func(r *rec) error {
		out, lapsed = nil, nil
		a, err := r.tx.Approval(res.Tenant, res.ApprovalID)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return Errorf(CodeNotFound, "approval %s not found", res.ApprovalID)
			}
			return err
		}
		if a.Status != ApprovalPending {
			return Errorf(CodeConflict, "approval %s is already %s", a.ID, a.Status)
		}
		if a.Guard != "" && !res.ByAdmin {
			return Errorf(CodeForbidden, "approval %s was asked for by the tenant's guard %q: only keys the admin issued decide it (a tenant-admin's keys do not, whatever their principal)", a.ID, a.Guard)
		}
		if !MayDecide(a.Approvers, res.DecidedBy) {
			return Errorf(CodeForbidden, "%q is not among the approvers of approval %s", res.DecidedBy, a.ID)
		}
		if res.RequestHash != "" && res.RequestHash != a.RequestHash {
			return Errorf(CodeConflict, "request_hash does not match approval %s: the request changed", a.ID)
		}
		if !a.ExpiresAt.After(r.now) {
			// Expired, though the reaper has not recorded it yet (it looks
			// every ReapInterval): record it now, as it would, and refuse.
			if err := k.expire(r, a, dispatchID); err != nil {
				return err
			}
			lapsed = a
			return nil
		}
		e, err := loadExec(r.tx, a.Tenant, a.ExecutionID)
		if err != nil {
			return err
		}
		if e.Status.Terminal() {
			return Errorf(CodeConflict, "execution %s is %s", e.ID, e.Status)
		}
		if res.Happened && a.Type != ApprovalInterrupted {
			return Errorf(CodeConflict, "approval %s is not of type %s: only an interrupted side effect is answered happened", a.ID, ApprovalInterrupted)
		}
		st, typ, answer := ApprovalDenied, EvApprovalDenied, "deny"
		switch {
		case res.Happened:
			st, typ, answer = ApprovalHappened, EvApprovalHappened, "happened"
			a.Result = res.Result
		case res.Grant && a.Type == ApprovalInterrupted:
			st, typ, answer = ApprovalGranted, EvApprovalGranted, "retry"
		case res.Grant:
			st, typ, answer = ApprovalGranted, EvApprovalGranted, "grant"
		}
		t := r.now
		a.Status, a.DecidedBy, a.Rationale, a.DecidedAt = st, res.DecidedBy, res.Rationale, &t
		a.DecidedByKey, a.DecidedByPrincipal = res.KeyID, res.Principal
		if err := r.tx.PutApproval(a); err != nil {
			return err
		}
		p := map[string]any{"approval_id": a.ID, "step_id": a.StepID, "decided_by": res.DecidedBy,
			"decided_by_key": res.KeyID, "decided_by_principal": res.Principal, "rationale": res.Rationale, "answer": answer}
		if a.Type != "" {
			p["type"] = a.Type
		}
		if res.Happened {
			p["result"] = a.Result
		}
		if err := r.event(e, typ, p); err != nil {
			return err
		}
		switch {
		case a.Type == ApprovalInterrupted:
			if err := k.settleInterrupted(r, e, a, &res); err != nil {
				return err
			}
		case !res.Grant:
			if err := k.denyApprovedStep(r, e, a, "approval denied by "+res.DecidedBy); err != nil {
				return err
			}
		}
		if err := k.resume(r, e, a, dispatchID); err != nil {
			return err
		}
		out = a
		return nil
	})
	if err == nil && lapsed != nil {
		k.log.Info("approval expired", "tenant", lapsed.Tenant, "approval_id", lapsed.ID, "execution_id", lapsed.ExecutionID,
			"target", lapsed.Target, "waited", lapsed.DecidedAt.Sub(lapsed.CreatedAt).Round(time.Millisecond).String(), "on_expiry", k.cfg.ApprovalExpiry)
		return nil, (&Error{Code: CodeConflict, Message: fmt.Sprintf("approval %s expired at %s: it can no longer be decided",
			lapsed.ID, lapsed.ExpiresAt.UTC().Format(time.RFC3339Nano))}).WithDetails(map[string]any{"status": ApprovalExpired})
	}
	if err == nil {
		k.log.Info("approval decided", "tenant", out.Tenant, "approval_id", out.ID, "status", out.Status,
			"decided_by", out.DecidedBy, "execution_id", out.ExecutionID, "target", out.Target,
			"waited", out.DecidedAt.Sub(out.CreatedAt).Round(time.Millisecond).String())
	}
	return out, err
}

// denyApprovedStep records the step of a denied or expired approval as denied.
func (k *Kernel) denyApprovedStep(r *rec, e *Execution, a *Approval, reason string) error {
	s, err := r.tx.Step(e.Tenant, e.ID, a.StepID)
	if err != nil {
		return fmt.Errorf("read step %s: %w", a.StepID, err)
	}
	if s.Status != StepAwaitingApproval {
		return nil
	}
	s.Status = StepDenied
	v := StepVerdict{Action: policy.Deny, Reason: reason, RuleID: a.RuleID}
	if s.Verdict != nil {
		v.Bundle = s.Verdict.Bundle
	}
	s.Verdict = &v
	if err := r.tx.PutStep(s); err != nil {
		return err
	}
	return r.event(e, EvStepDenied, stepPayload(s, map[string]any{"decision": "deny", "reason": reason, "approval_id": a.ID, "rule_id": a.RuleID}))
}

// expireInterrupted fails the step of an expired interrupted_side_effect
// approval "interrupted", as a denial would.
func expireInterrupted(r *rec, e *Execution, a *Approval) error {
	s, err := r.tx.Step(e.Tenant, e.ID, a.StepID)
	if err != nil {
		return fmt.Errorf("read step %s: %w", a.StepID, err)
	}
	if s.Status != StepAwaitingApproval {
		return nil
	}
	return failInterrupted(r, e, s, a, "the interrupted step's approval expired")
}

// resume unblocks e after its approval was resolved and queues a new dispatch.
func (k *Kernel) resume(r *rec, e *Execution, a *Approval, dispatchID string) error {
	if e.BlockedOn != a.ID {
		return r.tx.PutExecution(e)
	}
	e.Status = ExecRunning
	e.BlockedOn = ""
	if err := r.event(e, EvExecutionResumed, map[string]any{"approval_id": a.ID, "status": a.Status}); err != nil {
		return err
	}
	if e.Session() {
		// The holder (waiting under its lease, or whoever attaches next)
		// proposes the step again; nothing is delivered.
		return r.tx.PutExecution(e)
	}
	if err := k.queueDispatch(r, e, dispatchID, r.now, "approval_"+string(a.Status)); err != nil {
		return err
	}
	return r.tx.PutExecution(e)
}

// expireApprovals handles pending approvals past their expiry.
func (k *Kernel) expireApprovals(ctx context.Context, now time.Time) error {
	var refs []ApprovalRef
	if err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		refs, err = tx.ExpiredApprovals(now, 256)
		return err
	}); err != nil || len(refs) == 0 {
		return err
	}
	ids := make([]string, len(refs))
	for i := range refs {
		ids[i] = k.ids.next(now)
	}
	var expired []*Approval
	_, err := k.update(ctx, func(r *rec) error {
		expired = expired[:0]
		for i, ref := range refs {
			a, err := r.tx.Approval(ref.Tenant, ref.ApprovalID)
			if err != nil || a.Status != ApprovalPending || a.ExpiresAt.After(r.now) {
				continue
			}
			if err := k.expire(r, a, ids[i]); err != nil {
				return err
			}
			expired = append(expired, a)
		}
		return nil
	})
	if err == nil {
		for _, a := range expired {
			k.log.Info("approval expired", "tenant", a.Tenant, "approval_id", a.ID, "execution_id", a.ExecutionID,
				"target", a.Target, "waited", a.DecidedAt.Sub(a.CreatedAt).Round(time.Millisecond).String(), "on_expiry", k.cfg.ApprovalExpiry)
		}
	}
	return err
}

// expire records the expiry of the pending approval a, past its
// ExpiresAt, in r: the approval, and unless its execution already ended,
// approval.expired and what --approval-expiry says (the execution fails
// approval_expired, or the step is denied and the execution resumes with
// the dispatch dispatchID).
func (k *Kernel) expire(r *rec, a *Approval, dispatchID string) error {
	e, err := loadExec(r.tx, a.Tenant, a.ExecutionID)
	if err != nil {
		return err
	}
	t := r.now
	a.Status, a.DecidedAt = ApprovalExpired, &t
	if err := r.tx.PutApproval(a); err != nil {
		return err
	}
	if e.Status.Terminal() {
		return nil
	}
	if err := r.event(e, EvApprovalExpired, map[string]any{"approval_id": a.ID, "step_id": a.StepID, "expired_at": a.ExpiresAt}); err != nil {
		return err
	}
	if k.cfg.ApprovalExpiry == ExpireDeniesStep {
		if a.Type == ApprovalInterrupted {
			err = expireInterrupted(r, e, a)
		} else {
			err = k.denyApprovedStep(r, e, a, "approval expired")
		}
		if err != nil {
			return err
		}
		return k.resume(r, e, a, dispatchID)
	}
	e.BlockedOn = "" // finish must not expire it twice
	return k.finish(r, e, ExecFailed, "approval_expired", nil, mustJSON(map[string]any{"code": "approval_expired", "approval_id": a.ID, "step_id": a.StepID}), nil)
}

// MayDecide reports whether the person named by may decide an approval
// whose approvers are approvers: anyone the route admits when the list is
// empty, otherwise only the people it names. ResolveApproval applies it
// inside its transaction; a UI uses it to offer a decision only to whom
// the kernel will take it from.
func MayDecide(approvers []string, by string) bool {
	return len(approvers) == 0 || slices.Contains(approvers, by)
}
