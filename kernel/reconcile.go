package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/wicket-run/wicket/kernel/canon"
)

// Reconciliation of interrupted side effects (docs/durability.md#orphaned-steps).
//
// An at_most_once step found in flight by a later attempt may or may not
// have happened. The submitter that can tell (it sent reconcile: true) is
// answered interrupted and says what happened with ReconcileStep; without
// one, the agent's or a bundle's on_interrupted decides: indeterminate
// (the step fails) or approval (an interrupted_side_effect approval that an
// operator answers retry, happened with a result, or deny).

// Reconcile outcomes (POST …/steps/{step_id}/reconcile).
const (
	// ReconcileContinue: the effect did not happen; the step runs again.
	ReconcileContinue = "continue"
	// ReconcileCompleted: the effect happened; Result is its result.
	ReconcileCompleted = "completed"
	// ReconcileConflict: the outcome cannot be reconciled; the execution
	// fails reconcile_conflict.
	ReconcileConflict = "conflict"
	// ReconcileApproval: the submitter cannot tell; an operator decides
	// (an interrupted_side_effect approval).
	ReconcileApproval = "approval"
)

// Reconciliation is a submitter's answer for an interrupted step.
type Reconciliation struct {
	AgentCall
	StepID  string
	Outcome string
	// Result is the effect's result (completed).
	Result json.RawMessage
	// Detail says why (any outcome; conflict's reason).
	Detail string
	// By and ByKey name who answered: the agent, or the holder key's
	// principal and id.
	By, ByKey string
}

// maxDetail bounds a reconciliation's detail.
const maxDetail = 4096

// ReconcileStep records the submitter's answer for a step it was told is
// interrupted, and answers like a submission: proceed (continue), replay
// of the result (completed), execution_terminal (conflict) or blocked
// (approval). Every answer is a step.reconciled event naming who gave it.
func (k *Kernel) ReconcileStep(ctx context.Context, rq Reconciliation) (*StepDecision, error) {
	switch rq.Outcome {
	case ReconcileContinue, ReconcileCompleted, ReconcileConflict, ReconcileApproval:
	case "":
		return nil, Errorf(CodeValidation, "outcome is required (continue, completed, conflict or approval)")
	default:
		return nil, Errorf(CodeValidation, "outcome %q is invalid (want continue, completed, conflict or approval)", rq.Outcome)
	}
	if len(rq.Detail) > maxDetail {
		return nil, Errorf(CodeValidation, "detail is longer than %d bytes", maxDetail)
	}
	if rq.Outcome == ReconcileCompleted {
		res, err := canonicalOrNull(rq.Result, "result")
		if err != nil {
			return nil, err
		}
		rq.Result = res
	} else if len(rq.Result) > 0 && string(rq.Result) != "null" {
		return nil, Errorf(CodeValidation, "result is only given with outcome completed")
	}
	if rq.By == "" {
		rq.By = rq.by()
	}
	var out *StepDecision
	_, err := k.update(ctx, func(r *rec) error {
		out = nil
		e, err := checkCall(r.tx, rq.AgentCall)
		if err != nil {
			return err
		}
		s, err := stepOf(r.tx, e.Tenant, e.ID, rq.StepID)
		if err != nil {
			return err
		}
		base := &StepDecision{StepID: s.ID, Occurrence: s.Occurrence}
		d, err := reconciledAlready(r.tx, e, s, &rq, base)
		if err != nil {
			return err
		}
		if d != nil {
			out = d
			return nil
		}
		if e.Status.Terminal() {
			return Errorf(CodeConflict, "execution %s is %s", e.ID, e.Status)
		}
		if s.Status != StepInterrupted {
			return (&Error{Code: CodeConflict, Message: fmt.Sprintf("step %s is %s: only an interrupted step is reconciled", s.ID, s.Status)}).
				WithDetails(map[string]any{"status": s.Status})
		}
		p := stepPayload(s, map[string]any{"outcome": rq.Outcome, "decided_by": rq.By})
		if rq.ByKey != "" {
			p["decided_by_key"] = rq.ByKey
		}
		if rq.Detail != "" {
			p["detail"] = rq.Detail
		}
		if rq.Outcome == ReconcileCompleted {
			p["result"] = rq.Result
		}
		if err := r.event(e, EvStepReconciled, p); err != nil {
			return err
		}
		t := r.now
		switch rq.Outcome {
		case ReconcileContinue:
			s.Status, s.Lease = StepExecuting, e.Lease
			if err := r.tx.PutStep(s); err != nil {
				return err
			}
			if err := r.event(e, EvStepExecuting, stepPayload(s, map[string]any{"dispatch_id": e.Lease.DispatchID,
				"dispatch_attempt": e.Lease.Attempt, "reconciled": true})); err != nil {
				return err
			}
			base.Decision = DecisionProceed
		case ReconcileCompleted:
			s.Status, s.Result, s.CompletedAt = StepSucceeded, rq.Result, &t
			if err := r.tx.PutStep(s); err != nil {
				return err
			}
			if err := r.event(e, EvStepSucceeded, stepPayload(s, map[string]any{"reconciled_by": rq.By})); err != nil {
				return err
			}
			out = replayOf(base, s)
		case ReconcileConflict:
			s.Status, s.CompletedAt = StepFailed, &t
			s.Error = mustJSON(map[string]any{"code": "reconcile_conflict", "message": rq.Detail})
			if err := r.tx.PutStep(s); err != nil {
				return err
			}
			if err := r.event(e, EvStepFailed, stepPayload(s, map[string]any{"error": s.Error, "reconciled_by": rq.By})); err != nil {
				return err
			}
			if err := k.finish(r, e, ExecFailed, "reconcile_conflict", nil, mustJSON(map[string]any{"code": "reconcile_conflict",
				"message": rq.Detail, "step_id": s.ID, "decided_by": rq.By}), nil); err != nil {
				return err
			}
			base.Decision, base.Reason = DecisionExecutionTerminal, "reconcile_conflict: "+rq.Detail
			out = base
			return nil
		case ReconcileApproval:
			d, err := k.interruptApproval(r, e, s, base, s.Lease)
			if err != nil {
				return err
			}
			if err := unconsumeOccurrence(r.tx, e, s); err != nil {
				return err
			}
			base = d
		}
		if out == nil {
			out = base
		}
		k.renew(r, e)
		return r.tx.PutExecution(e)
	})
	return out, err
}

// unconsumeOccurrence gives back the occurrence that the interrupted
// answer consumed under e's lease, now that s is blocked on an approval: a
// blocked answer consumes none, so a session's holder, which keeps its
// lease while the approval pends, proposes the call again under s's id
// (pending, then replayed, run again or refused, as the operator answers)
// rather than as a new occurrence that would run the effect again.
func unconsumeOccurrence(tx Tx, e *Execution, s *Step) error {
	key := canon.StepID(e.ID, string(s.Kind), s.Target, s.ArgsHash, 0)
	oc, err := tx.Occurrence(e.Tenant, e.ID, key)
	if err != nil {
		return fmt.Errorf("read occurrence: %w", err)
	}
	if oc.Lease != e.Lease || oc.Count != s.Occurrence+1 {
		return nil
	}
	if err := tx.PutOccurrence(e.Tenant, e.ID, key, Occurrence{Lease: e.Lease, Count: s.Occurrence}); err != nil {
		return fmt.Errorf("put occurrence: %w", err)
	}
	return nil
}

// reconciledAlready answers a reconciliation repeated after its answer was
// lost: the same outcome finds the step where the first one left it, and
// is answered as the first one was (nil: it is not such a repeat).
func reconciledAlready(tx ReadTx, e *Execution, s *Step, rq *Reconciliation, base *StepDecision) (*StepDecision, error) {
	switch {
	case rq.Outcome == ReconcileCompleted && s.Status == StepSucceeded && bytes.Equal(s.Result, rq.Result):
		return replayOf(base, s), nil
	case rq.Outcome == ReconcileContinue && s.Status == StepExecuting && s.Lease == e.Lease && !e.Status.Terminal():
		base.Decision = DecisionProceed
		return base, nil
	case rq.Outcome == ReconcileConflict && s.Status == StepFailed && e.Status == ExecFailed && e.Reason == "reconcile_conflict" &&
		bytes.Equal(s.Error, mustJSON(map[string]any{"code": "reconcile_conflict", "message": rq.Detail})):
		base.Decision, base.Reason = DecisionExecutionTerminal, "reconcile_conflict: "+rq.Detail
		return base, nil
	case rq.Outcome == ReconcileApproval && s.Status == StepAwaitingApproval && s.ApprovalID != "":
		a, err := tx.Approval(e.Tenant, s.ApprovalID)
		if err != nil {
			return nil, fmt.Errorf("read approval %s: %w", s.ApprovalID, err)
		}
		if a.Type != ApprovalInterrupted || a.Status != ApprovalPending {
			return nil, nil
		}
		base.Decision, base.ApprovalID, base.Reason = DecisionBlocked, a.ID, a.Reason
		return base, nil
	}
	return nil, nil
}

// onInterrupted is what an interrupted at_most_once step s becomes: the
// stricter of its agent's setting and the one recorded on the step when it
// proceeded (from the bundles that allowed it).
func (k *Kernel) onInterrupted(r *rec, e *Execution, s *Step) (string, error) {
	if s.OnInterrupted == OnInterruptedApproval {
		return OnInterruptedApproval, nil
	}
	a, err := r.tx.Agent(e.Tenant, e.AgentID)
	switch {
	case err == nil:
		if a.OnInterrupted == OnInterruptedApproval {
			return OnInterruptedApproval, nil
		}
	case errors.Is(err, ErrNotFound):
	default:
		return "", fmt.Errorf("read agent %s: %w", e.AgentID, err)
	}
	return OnInterruptedIndeterminate, nil
}

// interruptApproval raises an interrupted_side_effect approval for s: it
// shows the exact request and its hash, the execution blocks, and an
// operator answers retry, happened (with the result) or deny.
func (k *Kernel) interruptApproval(r *rec, e *Execution, s *Step, base *StepDecision, prev Lease) (*StepDecision, error) {
	a := &Approval{ID: k.ids.next(r.now), Tenant: e.Tenant, ExecutionID: e.ID, AgentID: e.AgentID, StepID: s.ID,
		Kind: s.Kind, Target: s.Target, Args: s.Args, Type: ApprovalInterrupted, RequestHash: RequestHash(s.ID, s.Args),
		Status: ApprovalPending, RuleID: "on_interrupted",
		Reason:    "the step was in flight when its attempt ended: did it happen? answer retry, happened (with its result) or deny",
		CreatedAt: r.now, ExpiresAt: r.now.Add(k.cfg.ApprovalTimeout)}
	if err := r.tx.PutApproval(a); err != nil {
		return nil, fmt.Errorf("put approval: %w", err)
	}
	s.Status = StepAwaitingApproval
	s.ApprovalID = a.ID
	if err := r.tx.PutStep(s); err != nil {
		return nil, err
	}
	if err := r.event(e, EvStepInterrupted, stepPayload(s, map[string]any{"orphaned_from": prev, "approval_id": a.ID,
		"on_interrupted": OnInterruptedApproval})); err != nil {
		return nil, err
	}
	if err := r.event(e, EvApprovalRequested, map[string]any{"approval_id": a.ID, "step_id": s.ID, "type": a.Type,
		"request_hash": a.RequestHash, "expires_at": a.ExpiresAt, "reason": a.Reason}); err != nil {
		return nil, err
	}
	if err := r.blockOn(e, a, s.ID); err != nil {
		return nil, err
	}
	base.Decision = DecisionBlocked
	base.ApprovalID = a.ID
	base.Reason = a.Reason
	return base, nil
}

// settleInterrupted records an operator's answer to an
// interrupted_side_effect approval on its step: happened records the
// result, deny fails the step "interrupted"; retry leaves it waiting to
// proceed again when it is next proposed.
func (k *Kernel) settleInterrupted(r *rec, e *Execution, a *Approval, res *Resolution) error {
	s, err := r.tx.Step(e.Tenant, e.ID, a.StepID)
	if err != nil {
		return fmt.Errorf("read step %s: %w", a.StepID, err)
	}
	if s.Status != StepAwaitingApproval {
		return nil
	}
	t := r.now
	switch {
	case res.Happened:
		s.Status, s.Result, s.CompletedAt = StepSucceeded, a.Result, &t
		if err := r.tx.PutStep(s); err != nil {
			return err
		}
		return r.event(e, EvStepSucceeded, stepPayload(s, map[string]any{"approval_id": a.ID, "reconciled_by": a.DecidedBy}))
	case !res.Grant:
		return failInterrupted(r, e, s, a, "the interrupted step was denied by "+a.DecidedBy)
	}
	return nil
}

// failInterrupted fails the step of an interrupted_side_effect approval
// that was denied or expired: {"code": "interrupted"}.
func failInterrupted(r *rec, e *Execution, s *Step, a *Approval, msg string) error {
	t := r.now
	s.Status, s.CompletedAt = StepFailed, &t
	s.Error = mustJSON(map[string]any{"code": "interrupted", "message": msg, "approval_id": a.ID})
	if err := r.tx.PutStep(s); err != nil {
		return err
	}
	return r.event(e, EvStepFailed, stepPayload(s, map[string]any{"error": s.Error, "approval_id": a.ID}))
}
