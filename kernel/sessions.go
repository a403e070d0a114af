package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
)

// Sessions: the gate for a loop the kernel does not own (docs/gate.md).
//
// A session is an execution that no webhook drives. The bearer key that
// begins it (or attaches to it later) holds its lease, the same
// (dispatch_id, dispatch_attempt) pair an agent holds, and drives it with
// the ordinary step, heartbeat, complete and fail calls. Its lease differs
// from a dispatch's in three ways:
//
//   - it is taken by BeginSession and AttachSession, never by a delivery;
//   - when it expires the session is detached (session.detached) and
//     nothing is re-delivered: the next AttachSession takes a new attempt,
//     whose occurrence counters start again, so the holder's loop replays
//     what was recorded;
//   - it keeps running while the session waits on an approval: the holder
//     waits with heartbeats and proposes the step again once the approval
//     is resolved (the blocked answer consumes no occurrence, so the step
//     keeps its id under the same lease).

// BeginSession is a request to begin a session.
type BeginSession struct {
	CreateExecution
	// KeyID and Principal are the bearer key that will hold the lease.
	KeyID     string
	Principal string
}

// BeginSession records a new execution held by req's key: created,
// attached (attempt 1) and started in one transaction. The agent may be
// gate-only (no webhook_url).
func (k *Kernel) BeginSession(ctx context.Context, req BeginSession) (*Execution, error) {
	if req.KeyID == "" {
		return nil, Errorf(CodeValidation, "a session is held by an API key")
	}
	req.IdempotencyKey = ""
	input, err := validateCreate(&req.CreateExecution)
	if err != nil {
		return nil, err
	}
	if _, err := k.Agent(ctx, req.Tenant, req.AgentID); err != nil {
		return nil, err
	}
	id := k.ids.next(k.now())
	dispatchID := k.ids.next(k.now())
	var out *Execution
	_, err = k.update(ctx, func(r *rec) error {
		out = nil
		if _, err := r.tx.Agent(req.Tenant, req.AgentID); err != nil {
			if errors.Is(err, ErrNotFound) {
				return Errorf(CodeNotFound, "agent %s not found", req.AgentID)
			}
			return err
		}
		e := &Execution{
			ID: id, Tenant: req.Tenant, AgentID: req.AgentID, AgentVersion: req.AgentVersion,
			Status: ExecPending, Input: input, Labels: req.Labels, Limits: req.Limits,
			Deadline: req.Deadline, CreatedAt: r.now, UpdatedAt: r.now,
			Holder:   &Holder{KeyID: req.KeyID, Principal: req.Principal},
			Dispatch: DispatchState{ID: dispatchID},
		}
		if err := r.event(e, EvExecutionCreated, map[string]any{"agent_id": e.AgentID, "agent_version": e.AgentVersion,
			"labels": e.Labels, "limits": e.Limits, "session": true}); err != nil {
			return err
		}
		if err := k.attach(r, e, e.Holder); err != nil {
			return err
		}
		out = e
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AttachSession gives the lease of a session whose holder is gone (its
// lease expired or was given up) to the key keyID: a new attempt of the
// session's dispatch. While the lease is live it is refused with
// CodeExecutionLeased, whose details name lease_until.
func (k *Kernel) AttachSession(ctx context.Context, tenant, id, keyID, principal string) (*Execution, error) {
	if keyID == "" {
		return nil, Errorf(CodeValidation, "a session is held by an API key")
	}
	var out *Execution
	_, err := k.update(ctx, func(r *rec) error {
		out = nil
		e, err := loadExec(r.tx, tenant, id)
		if err != nil {
			return err
		}
		if !e.Session() {
			return Errorf(CodeConflict, "execution %s is not a session: its agent's webhook drives it", e.ID)
		}
		if e.Status.Terminal() {
			return Errorf(CodeConflict, "execution %s is %s", e.ID, e.Status)
		}
		if leaseLive(e) {
			if e.Dispatch.LeaseUntil.After(r.now) {
				until := e.Dispatch.LeaseUntil.UTC()
				return (&Error{Code: CodeExecutionLeased, Message: fmt.Sprintf("session %s is leased until %s (attempt %d); attach again once the lease has expired",
					e.ID, until.Format(time.RFC3339Nano), e.Lease.Attempt)}).WithDetails(map[string]any{
					"lease_until": until, "dispatch_attempt": e.Lease.Attempt, "held_by": e.Holder.Principal})
			}
			if err := k.detach(r, e, "lease_expired"); err != nil {
				return err
			}
		}
		if err := k.attach(r, e, &Holder{KeyID: keyID, Principal: principal}); err != nil {
			return err
		}
		out = e
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DetachSession gives up the caller's lease at once, so that the session
// can be attached again without waiting for the lease to expire (a holder
// that shuts down cleanly). It is idempotent for a lease already given up.
func (k *Kernel) DetachSession(ctx context.Context, c AgentCall) error {
	_, err := k.update(ctx, func(r *rec) error {
		e, err := checkCall(r.tx, c)
		if err != nil {
			return err
		}
		if e.Status.Terminal() {
			return nil
		}
		if !e.Session() {
			return Errorf(CodeConflict, "execution %s is not a session", e.ID)
		}
		return k.detach(r, e, "detached")
	})
	return err
}

// attach takes the next attempt of e's dispatch for holder h: the lease
// starts, and a pending session starts running.
func (k *Kernel) attach(r *rec, e *Execution, h *Holder) error {
	e.Holder = h
	e.Dispatch.Attempt++
	e.Dispatch.State = DispatchAcked
	e.Dispatch.DueAt = time.Time{}
	e.Dispatch.LeaseUntil = r.now.Add(k.cfg.LeaseTimeout)
	e.Lease = Lease{DispatchID: e.Dispatch.ID, Attempt: e.Dispatch.Attempt}
	if err := r.event(e, EvSessionAttached, map[string]any{"dispatch_id": e.Lease.DispatchID, "dispatch_attempt": e.Lease.Attempt,
		"lease_until": e.Dispatch.LeaseUntil, "key_id": h.KeyID, "principal": h.Principal}); err != nil {
		return err
	}
	if e.Status == ExecPending {
		e.Status = ExecRunning
		if err := r.event(e, EvExecutionStarted, map[string]any{"dispatch_id": e.Dispatch.ID, "session": true}); err != nil {
			return err
		}
	}
	return r.tx.PutExecution(e)
}

// detach ends a session's lease: its holder's mutations are refused from
// now on (lease_superseded), and the session waits for an attach.
func (k *Kernel) detach(r *rec, e *Execution, reason string) error {
	if err := r.event(e, EvSessionDetached, map[string]any{"dispatch_id": e.Lease.DispatchID, "dispatch_attempt": e.Lease.Attempt,
		"key_id": e.Holder.KeyID, "reason": reason}); err != nil {
		return err
	}
	e.Lease = Lease{}
	e.Dispatch.State = DispatchNone
	e.Dispatch.LeaseUntil = time.Time{}
	return r.tx.PutExecution(e)
}

// CheckHolder reports whether the bearer key keyID may drive execution id
// of tenant: the execution must be a session and keyID its holder. The
// server asks before reading a request's body; the kernel checks again
// inside every mutation's transaction.
func (k *Kernel) CheckHolder(ctx context.Context, tenant, id, keyID string) error {
	return k.store.View(ctx, func(tx ReadTx) error {
		e, err := loadExec(tx, tenant, id)
		if err != nil {
			return err
		}
		if !e.Session() {
			return Errorf(CodeForbidden, "execution %s is not a session: only its agent drives it, with its signature", e.ID)
		}
		if e.Holder.KeyID != keyID {
			return Errorf(CodeForbidden, "the lease of session %s is held by another API key", e.ID)
		}
		return nil
	})
}

// OutrightDenier is implemented by a Policy that can tell, without a
// step's arguments, that it denies the step whatever they are
// (plugins.Host, for the rules engine). Probe uses it.
type OutrightDenier interface {
	DeniesOutright(ctx context.Context, req *PolicyRequest) (bool, error)
}

// ProbeRequest asks whether policy denies a step outright.
type ProbeRequest struct {
	AgentCall
	Kind, Target, Effect, Idempotency string
}

// Probe reports whether the policy deciding the execution's steps denies
// a step of this kind, target and effect whatever its arguments (false
// when the policy cannot tell). Nothing is recorded; the caller is the
// execution's agent or its session's holder (no lease needed). It is what
// `wicket mcp-proxy --hide-denied` asks before listing a tool.
func (k *Kernel) Probe(ctx context.Context, req ProbeRequest) (bool, error) {
	sr := StepRequest{Kind: req.Kind, Target: req.Target, Effect: req.Effect, Idempotency: Idempotency(req.Idempotency)}
	if err := validateStep(&sr); err != nil {
		return false, err
	}
	od, ok := k.policy.(OutrightDenier)
	var e *Execution
	var preq *PolicyRequest
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		if e, err = checkOwner(tx, req.AgentCall); err != nil || !ok {
			return err
		}
		preq, err = policyRequest(tx, e.Tenant, e.AgentID)
		return err
	})
	if err != nil || !ok {
		return false, err
	}
	preq.Input = &policy.Input{Tenant: e.Tenant, AgentID: e.AgentID, ExecutionID: e.ID,
		Step:      policy.Step{Kind: sr.Kind, Target: sr.Target, Args: json.RawMessage("null"), Idempotency: string(sr.Idempotency), Effect: sr.Effect},
		Execution: policy.Execution{Status: string(e.Status), Labels: policy.LabelsOrNone(e.Labels), Totals: e.Totals, CreatedAt: e.CreatedAt}}
	return od.DeniesOutright(ctx, preq)
}
