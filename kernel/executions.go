package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/wicket-run/wicket/kernel/canon"
)

// CreateExecution is a request to start an execution.
type CreateExecution struct {
	Tenant         string
	AgentID        string
	AgentVersion   string
	Input          json.RawMessage
	Labels         map[string]string
	Limits         Limits
	Deadline       *time.Time
	IdempotencyKey string
}

// CreateExecution records a new execution and queues its first dispatch in
// the same transaction. With an idempotency key, a retried create returns
// the first execution and created=false; a different request under the same
// key is a conflict.
func (k *Kernel) CreateExecution(ctx context.Context, req CreateExecution) (e *Execution, created bool, err error) {
	input, err := validateCreate(&req)
	if err != nil {
		return nil, false, err
	}
	if a, err := k.Agent(ctx, req.Tenant, req.AgentID); err != nil {
		return nil, false, err
	} else if a.GateOnly() {
		return nil, false, Errorf(CodeConflict, "agent %s has no webhook_url (gate-only): begin a session with POST /v0/sessions", req.AgentID)
	}
	id := k.ids.next(k.now())
	dispatchID := k.ids.next(k.now())
	_, err = k.update(ctx, func(r *rec) error {
		created = false
		if req.IdempotencyKey != "" {
			prev, err := r.tx.ExecutionByIdempotencyKey(req.Tenant, req.IdempotencyKey)
			if err == nil {
				pe, err := loadExec(r.tx, req.Tenant, prev)
				if err != nil {
					return err
				}
				if pe.AgentID != req.AgentID || !bytes.Equal(pe.Input, input) {
					return Errorf(CodeConflict, "Idempotency-Key %q was used for a different request (execution %s)", req.IdempotencyKey, prev)
				}
				e = pe
				return nil
			} else if !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("idempotency lookup: %w", err)
			}
		}
		if _, err := r.tx.Agent(req.Tenant, req.AgentID); err != nil {
			if errors.Is(err, ErrNotFound) {
				return Errorf(CodeNotFound, "agent %s not found", req.AgentID)
			}
			return err
		}
		n := &Execution{
			ID: id, Tenant: req.Tenant, AgentID: req.AgentID, AgentVersion: req.AgentVersion,
			Status: ExecPending, Input: input, Labels: req.Labels, Limits: req.Limits,
			Deadline: req.Deadline, IdempotencyKey: req.IdempotencyKey,
			CreatedAt: r.now, UpdatedAt: r.now,
		}
		if err := r.event(n, EvExecutionCreated, map[string]any{"agent_id": n.AgentID, "agent_version": n.AgentVersion, "labels": n.Labels, "limits": n.Limits}); err != nil {
			return err
		}
		if err := k.queueDispatch(r, n, dispatchID, r.now, "created"); err != nil {
			return err
		}
		if err := r.tx.PutExecution(n); err != nil {
			return fmt.Errorf("put execution: %w", err)
		}
		e, created = n, true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return e, created, nil
}

// validateCreate checks and normalises what creates an execution or a
// session, and returns the canonical input.
func validateCreate(req *CreateExecution) (json.RawMessage, error) {
	if req.Tenant == "" {
		req.Tenant = DefaultTenant
	}
	if req.AgentID == "" {
		return nil, Errorf(CodeValidation, "agent_id is required")
	}
	if len(req.Input) == 0 {
		req.Input = json.RawMessage("null")
	}
	input, err := canon.Canonical(req.Input)
	if err != nil {
		return nil, Errorf(CodeValidation, "input: %v", err)
	}
	if len(req.IdempotencyKey) > 256 {
		return nil, Errorf(CodeValidation, "Idempotency-Key is longer than 256 bytes")
	}
	if req.Limits.MaxDuration != "" {
		if d, err := time.ParseDuration(req.Limits.MaxDuration); err != nil || d <= 0 {
			return nil, Errorf(CodeValidation, "limits.max_duration %q is not a positive Go duration", req.Limits.MaxDuration)
		}
	}
	for n, v := range map[string]float64{"max_steps": float64(req.Limits.MaxSteps), "max_llm_calls": float64(req.Limits.MaxLLMCalls),
		"max_output_tokens_per_call": float64(req.Limits.MaxOutputTokensPerCall), "max_total_tokens": float64(req.Limits.MaxTotalTokens),
		"max_cost_usd": req.Limits.MaxCostUSD, "max_consecutive_failures": float64(req.Limits.MaxConsecutiveFailures),
		"max_loop_repetitions": float64(req.Limits.MaxLoopRepetitions)} {
		if v < 0 {
			return nil, Errorf(CodeValidation, "limits.%s must not be negative", n)
		}
	}
	return input, nil
}

// queueDispatch starts a new dispatch of e, due at due.
func (k *Kernel) queueDispatch(r *rec, e *Execution, dispatchID string, due time.Time, reason string) error {
	e.Dispatch = DispatchState{ID: dispatchID, State: DispatchQueued, DueAt: due}
	r.queued = true
	if !due.After(r.now) {
		r.dueNow = append(r.dueNow, e)
	}
	return r.event(e, EvDispatchQueued, map[string]any{"dispatch_id": dispatchID, "reason": reason})
}

// GetExecution returns one execution of a tenant.
func (k *Kernel) GetExecution(ctx context.Context, tenant, id string) (*Execution, error) {
	var e *Execution
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		e, err = loadExec(tx, tenant, id)
		return err
	})
	return e, err
}

// listScanChunk is how many records a read that may examine many (a
// filtered ListExecutions, ListApprovals, PendingApprovals) examines in one
// read transaction (see ExecutionScanner).
var listScanChunk = 2000

// readInChunks calls read in one read transaction after another, each
// given the position the last one returned (from, first), until one
// returns "": a long read in bounded pieces, so that no one read
// transaction holds up the store's writer for long (see ExecutionScanner).
func (k *Kernel) readInChunks(ctx context.Context, from string, read func(tx ReadTx, from string) (resume string, err error)) error {
	for {
		resume := ""
		err := k.store.View(ctx, func(tx ReadTx) error {
			var err error
			resume, err = read(tx, from)
			return err
		})
		if err != nil || resume == "" {
			return err
		}
		from = resume
	}
}

// ListExecutions lists a tenant's executions newest first. next is the
// cursor of the following page ("" at the end). A filtered list reads the
// tenant's executions listScanChunk at a time where the store allows it,
// so one page is not one snapshot: an execution created or changed while
// the page is read may be missed or listed as it was.
func (k *Kernel) ListExecutions(ctx context.Context, tenant string, f ExecutionFilter) (out []*Execution, next string, err error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		if f.Limit > 1000 {
			return nil, "", Errorf(CodeValidation, "limit must be at most 1000")
		}
		f.Limit = 50
	}
	want := f.Limit
	f.Limit++
	filtered := f.AgentID != "" || f.Status != ""
	err = k.readInChunks(ctx, f.Before, func(tx ReadTx, before string) (string, error) {
		g := f
		g.Before, g.Limit = before, f.Limit-len(out)
		if g.Limit <= 0 {
			return "", nil // the page is full (a Limit of 0 would mean none)
		}
		if sc, ok := tx.(ExecutionScanner); ok && filtered {
			got, resume, err := sc.ScanExecutions(tenant, g, listScanChunk)
			out = append(out, got...)
			return resume, err
		}
		got, err := tx.ListExecutions(tenant, g)
		out = append(out, got...)
		return "", err
	})
	if err != nil {
		return nil, "", err
	}
	if len(out) > want {
		out = out[:want]
		next = out[want-1].ID
	}
	return out, next, nil
}

// Events returns up to limit events of an execution after afterSeq.
func (k *Kernel) Events(ctx context.Context, tenant, id string, afterSeq uint64, limit int) ([]Event, error) {
	if limit <= 0 {
		limit = 100
	}
	if limit > 1000 {
		return nil, Errorf(CodeValidation, "limit must be at most 1000")
	}
	var evs []Event
	err := k.store.View(ctx, func(tx ReadTx) error {
		if _, err := loadExec(tx, tenant, id); err != nil {
			return err
		}
		var err error
		evs, err = tx.Events(tenant, id, afterSeq, limit)
		return err
	})
	return evs, err
}

// CancelExecution cancels a non-terminal execution: its open steps are
// cancelled, its dispatch discarded, then execution.cancelled is written
// last. Cancelling a terminal execution is a conflict.
func (k *Kernel) CancelExecution(ctx context.Context, tenant, id, by string) error {
	_, err := k.update(ctx, func(r *rec) error {
		e, err := loadExec(r.tx, tenant, id)
		if err != nil {
			return err
		}
		if e.Status.Terminal() {
			return Errorf(CodeConflict, "execution %s is already %s", id, e.Status)
		}
		return k.finish(r, e, ExecCancelled, "operator_cancelled", nil, nil, map[string]any{"by": by})
	})
	return err
}

// openSteps returns the steps of an execution that are not terminal: from
// the store's OpenStepsLister when tx offers one (it need not read every
// step's arguments and results), else from ListSteps.
func openSteps(tx ReadTx, tenant, executionID string) ([]*Step, error) {
	if l, ok := tx.(OpenStepsLister); ok {
		return l.OpenSteps(tenant, executionID)
	}
	all, err := tx.ListSteps(tenant, executionID)
	if err != nil {
		return nil, err
	}
	open := all[:0]
	for _, s := range all {
		if !s.Status.Terminal() {
			open = append(open, s)
		}
	}
	return open, nil
}

// finish moves e to a terminal status: open steps are cancelled, a pending
// approval expires, the dispatch is discarded, and the terminal event is
// the last one written.
func (k *Kernel) finish(r *rec, e *Execution, st ExecStatus, reason string, output, errv json.RawMessage, extra map[string]any) error {
	steps, err := openSteps(r.tx, e.Tenant, e.ID)
	if err != nil {
		return fmt.Errorf("list steps of %s: %w", e.ID, err)
	}
	for _, s := range steps {
		if s.Status != StepExecuting && s.Status != StepAwaitingApproval && s.Status != StepInterrupted {
			continue
		}
		s.Status = StepCancelled
		t := r.now
		s.CompletedAt = &t
		if err := r.tx.PutStep(s); err != nil {
			return err
		}
		if err := r.event(e, EvStepCancelled, stepPayload(s, map[string]any{"reason": reason})); err != nil {
			return err
		}
	}
	if e.BlockedOn != "" {
		if a, err := r.tx.Approval(e.Tenant, e.BlockedOn); err == nil && a.Status == ApprovalPending {
			a.Status = ApprovalExpired
			a.Rationale = "execution " + string(st)
			t := r.now
			a.DecidedAt = &t
			if err := r.tx.PutApproval(a); err != nil {
				return err
			}
			if err := r.event(e, EvApprovalExpired, map[string]any{"approval_id": a.ID, "step_id": a.StepID, "reason": "execution " + string(st)}); err != nil {
				return err
			}
		}
		e.BlockedOn = ""
	}
	if e.Dispatch.State == DispatchQueued { // a delivery that will never happen
		if err := r.event(e, EvDispatchDiscarded, map[string]any{"dispatch_id": e.Dispatch.ID, "dispatch_attempt": e.Dispatch.Attempt, "reason": reason}); err != nil {
			return err
		}
	}
	e.Dispatch = DispatchState{ID: e.Dispatch.ID, Attempt: e.Dispatch.Attempt}
	e.Status = st
	e.Reason = reason
	e.Output = output
	e.Error = errv
	payload := map[string]any{"reason": reason}
	for k, v := range extra {
		payload[k] = v
	}
	if output != nil {
		payload["output"] = output
	}
	if errv != nil {
		payload["error"] = errv
	}
	typ := map[ExecStatus]EventType{ExecCompleted: EvExecutionCompleted, ExecFailed: EvExecutionFailed, ExecCancelled: EvExecutionCancelled}[st]
	if err := r.event(e, typ, payload); err != nil {
		return err
	}
	return r.tx.PutExecution(e)
}

// AgentCall identifies an agent mutation: who, on which execution, under
// which lease. Who is the execution's agent (AgentID, from its signature)
// or, on a session, the bearer key that holds the lease (Holder, its key
// id); exactly one is set.
type AgentCall struct {
	Tenant      string
	ExecutionID string
	AgentID     string
	// Holder is the id of the bearer key driving a session.
	Holder string
	Lease  Lease
}

// by names the caller in events: "agent:<id>" or "key:<key id>".
func (c AgentCall) by() string {
	if c.Holder != "" {
		return "key:" + c.Holder
	}
	return "agent:" + c.AgentID
}

// checkCall loads the execution of an agent call and checks ownership and
// lease. Terminal executions are returned with no lease check so callers
// can answer execution_terminal.
//
// A session is driven only by the key that holds its lease; a webhook
// execution only by its agent's signature.
func checkCall(tx ReadTx, c AgentCall) (*Execution, error) {
	e, err := checkOwner(tx, c)
	if err != nil {
		return nil, err
	}
	return checkLease(e, c)
}

// checkCallHead is checkCall for a caller that does not look at the
// execution's input, read without it when the store can
// (ExecutionHeadReader): the execution it returns must not be written
// back.
func checkCallHead(tx ReadTx, c AgentCall) (*Execution, error) {
	var e *Execution
	var err error
	if h, ok := tx.(ExecutionHeadReader); ok {
		e, err = h.ExecutionHead(c.Tenant, c.ExecutionID)
		err = execReadError(err, c.ExecutionID)
	} else {
		e, err = loadExec(tx, c.Tenant, c.ExecutionID)
	}
	if err != nil {
		return nil, err
	}
	if err := ownerOK(e, c); err != nil {
		return nil, err
	}
	return checkLease(e, c)
}

// checkLease checks the lease of c on e (checkCall), loaded and its owner
// checked.
func checkLease(e *Execution, c AgentCall) (*Execution, error) {
	if e.Status.Terminal() {
		return e, nil
	}
	if c.Lease.DispatchID == "" || c.Lease.Attempt < 1 {
		return nil, Errorf(CodeValidation, "Rebuno-Dispatch-Id and Rebuno-Dispatch-Attempt are required")
	}
	if e.Lease != c.Lease {
		return nil, (&Error{Code: CodeLeaseSuperseded, Message: fmt.Sprintf("dispatch %s attempt %d is not the current lease of execution %s", c.Lease.DispatchID, c.Lease.Attempt, e.ID)}).
			WithDetails(map[string]any{"dispatch_id": c.Lease.DispatchID, "dispatch_attempt": c.Lease.Attempt})
	}
	return e, nil
}

// checkOwner loads the execution of an agent call and checks who may
// drive it (see checkCall), without the lease.
func checkOwner(tx ReadTx, c AgentCall) (*Execution, error) {
	e, err := loadExec(tx, c.Tenant, c.ExecutionID)
	if err != nil {
		return nil, err
	}
	if err := ownerOK(e, c); err != nil {
		return nil, err
	}
	return e, nil
}

// ownerOK checks that c may drive e (checkOwner).
func ownerOK(e *Execution, c AgentCall) error {
	switch {
	case c.Holder != "" && !e.Session():
		return Errorf(CodeForbidden, "execution %s is not a session: only its agent drives it, with its signature", e.ID)
	case c.Holder == "" && e.Session():
		return Errorf(CodeForbidden, "execution %s is a session: only the API key holding its lease drives it", e.ID)
	case c.Holder == "" && e.AgentID != c.AgentID:
		return Errorf(CodeNotFound, "execution %s not found", c.ExecutionID)
	case c.Holder != "" && e.Holder.KeyID != c.Holder:
		return Errorf(CodeForbidden, "the lease of session %s is held by another API key", e.ID)
	}
	return nil
}

// leaseLive reports whether e's dispatch is claimed and not parked.
func leaseLive(e *Execution) bool {
	return e.Dispatch.State == DispatchDelivering || e.Dispatch.State == DispatchAcked
}

// renew extends a live lease. It moves the expiry only once an eighth of
// the lease has passed since the last renewal, so a busy agent does not
// rewrite the lease index on every mutation; a lease therefore never expires
// sooner than 7/8 of LeaseTimeout after the last activity.
func (k *Kernel) renew(r *rec, e *Execution) {
	if !leaseLive(e) {
		return
	}
	// A mutation under the attempt proves the webhook arrived, even if its
	// response has not (a failed response must then not supersede the lease).
	e.Dispatch.State = DispatchAcked
	next := r.now.Add(k.cfg.LeaseTimeout)
	if next.Sub(e.Dispatch.LeaseUntil) >= k.cfg.LeaseTimeout/8 {
		e.Dispatch.LeaseUntil = next
	}
}

// Heartbeat renews the caller's lease and returns when it now expires (zero
// when the dispatch is parked on an approval and holds no timer).
//
// A lease renewed less than an eighth of LeaseTimeout ago (by a heartbeat or
// a mutation) is answered from a read, without a commit: the same rule as a
// mutation's renewal, so a lease never expires sooner than 7/8 of
// LeaseTimeout after the last heartbeat.
func (k *Kernel) Heartbeat(ctx context.Context, c AgentCall) (time.Time, error) {
	var until time.Time
	err := k.store.View(ctx, func(tx ReadTx) error {
		e, err := checkCall(tx, c)
		if err != nil {
			return err
		}
		if !e.Status.Terminal() && e.Dispatch.State == DispatchAcked &&
			e.Dispatch.LeaseUntil.Sub(k.now()) >= k.cfg.LeaseTimeout-k.cfg.LeaseTimeout/8 {
			until = e.Dispatch.LeaseUntil
		}
		return nil
	})
	if err != nil || !until.IsZero() {
		return until, err
	}
	_, err = k.update(ctx, func(r *rec) error {
		e, err := checkCall(r.tx, c)
		if err != nil {
			return err
		}
		if e.Status.Terminal() {
			return Errorf(CodeConflict, "execution %s is %s", e.ID, e.Status)
		}
		if !leaseLive(e) {
			until = time.Time{}
			return nil
		}
		e.Dispatch.State = DispatchAcked
		e.Dispatch.LeaseUntil = r.now.Add(k.cfg.LeaseTimeout) // a heartbeat always renews in full
		until = e.Dispatch.LeaseUntil
		return r.tx.PutExecution(e)
	})
	return until, err
}

// CompleteExecution records the agent's output; the execution ends completed.
func (k *Kernel) CompleteExecution(ctx context.Context, c AgentCall, output json.RawMessage) (*Execution, error) {
	out, err := canonicalOrNull(output, "output")
	if err != nil {
		return nil, err
	}
	return k.endByAgent(ctx, c, ExecCompleted, "completed", out, nil)
}

// FailExecution records the agent's error; the execution ends failed.
func (k *Kernel) FailExecution(ctx context.Context, c AgentCall, errv json.RawMessage) (*Execution, error) {
	ev, err := canonicalOrNull(errv, "error")
	if err != nil {
		return nil, err
	}
	return k.endByAgent(ctx, c, ExecFailed, "agent_failed", nil, ev)
}

func (k *Kernel) endByAgent(ctx context.Context, c AgentCall, st ExecStatus, reason string, out, errv json.RawMessage) (*Execution, error) {
	var res *Execution
	_, err := k.update(ctx, func(r *rec) error {
		e, err := checkCall(r.tx, c)
		if err != nil {
			return err
		}
		if e.Status.Terminal() {
			if e.Status == st && bytes.Equal(e.Output, out) && bytes.Equal(e.Error, errv) {
				res = e // an identical retry is idempotent
				return nil
			}
			return Errorf(CodeConflict, "execution %s is already %s", e.ID, e.Status)
		}
		if err := k.finish(r, e, st, reason, out, errv, map[string]any{"dispatch_id": c.Lease.DispatchID, "dispatch_attempt": c.Lease.Attempt}); err != nil {
			return err
		}
		res = e
		return nil
	})
	return res, err
}

func canonicalOrNull(raw json.RawMessage, field string) (json.RawMessage, error) {
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	c, err := canon.Canonical(raw)
	if err != nil {
		return nil, Errorf(CodeValidation, "%s: %v", field, err)
	}
	return c, nil
}
