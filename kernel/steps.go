package kernel

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/kernel/policy"
)

// Decision is the kernel's answer to a step submission
// (docs/protocol.md#decisions).
type Decision string

// Decisions answered to a step submission.
const (
	// DecisionProceed: a new step, allowed; run it, then complete or fail it.
	DecisionProceed Decision = "proceed"
	// DecisionReplay: the step is terminal; its recorded result or error is returned.
	DecisionReplay Decision = "replay"
	// DecisionDenied: refused by policy, a limit, or a denied or expired approval.
	DecisionDenied Decision = "denied"
	// DecisionRateLimited: over a rate limit.
	DecisionRateLimited Decision = "rate_limited"
	// DecisionBlocked: an approval is pending for this step.
	DecisionBlocked Decision = "blocked"
	// DecisionExecutionBlocked: the execution waits on another step's approval.
	DecisionExecutionBlocked Decision = "execution_blocked"
	// DecisionExecutionTerminal: the execution is completed, failed or cancelled.
	DecisionExecutionTerminal Decision = "execution_terminal"
	// DecisionInterrupted: the step was in flight when an earlier attempt
	// ended, and the submitter said it can reconcile it: it answers with
	// POST …/steps/{step_id}/reconcile.
	DecisionInterrupted Decision = "interrupted"
)

// MaxTargetLen bounds a step target.
const MaxTargetLen = 512

// StepRequest is a step submission.
type StepRequest struct {
	AgentCall
	Kind        string
	Target      string
	Args        json.RawMessage
	Idempotency Idempotency
	Effect      string
	// ClaimedStepID is the step id the agent computed itself
	// (Rebuno-Step-Id), or "". When it differs from the kernel's id the
	// submission is refused with CodeStepIDDivergence before anything is
	// recorded: an agent that would complete a step under another id must
	// not run the effect.
	ClaimedStepID string
	// Reconcile says the submitter can reconcile the step should it be
	// found interrupted (an at_most_once step in flight when its attempt
	// ended): it is then answered DecisionInterrupted instead of the
	// agent's on_interrupted behaviour.
	Reconcile bool
	// Value is a local step's value, submitted with it (nil: none). A
	// local step allowed to run is then recorded succeeded with it in the
	// decision's own commit, and answered DecisionReplay with the value:
	// one commit for the step instead of two. A step already recorded
	// answers its recorded value, as always.
	Value json.RawMessage
}

// StepDecision is the kernel's answer to a submission.
type StepDecision struct {
	Decision   Decision        `json:"decision"`
	StepID     string          `json:"step_id,omitempty"`
	Occurrence int             `json:"occurrence"`
	Result     json.RawMessage `json:"result,omitempty"`
	Error      json.RawMessage `json:"error,omitempty"`
	Reason     string          `json:"reason,omitempty"`
	RuleID     string          `json:"rule_id,omitempty"`
	ApprovalID string          `json:"approval_id,omitempty"`
}

// errRetry asks SubmitStep to read again: state changed between the read
// and the write.
var errRetry = errors.New("state changed; retry")

// errRetryRaced asks SubmitStep to read again because another submission
// of the same call was recorded in between (its occurrence was taken):
// the racing submissions are making progress.
var errRetryRaced = fmt.Errorf("%w: the occurrence was taken", errRetry)

// maxSubmitTries bounds SubmitStep's read-decide-write rounds that lost to
// a change other than a racing submission of the same call; rounds lost to
// those (errRetryRaced) are bounded by maxSubmitRounds only, since each
// means another of them was recorded. (Eight rounds in all were fewer than
// an agent's goroutines may race: 9 through three replicas sometimes got
// unavailable.) A round costs one read and one policy evaluation.
const (
	maxSubmitTries  = 8
	maxSubmitRounds = 256
)

// validateStep checks and normalises a submission.
func validateStep(req *StepRequest) error {
	switch req.Kind {
	case policy.KindToolCall, policy.KindLLMCall, policy.KindLocal:
	case "":
		return Errorf(CodeValidation, "kind is required (tool_call, llm_call or local)")
	default:
		return Errorf(CodeValidation, "kind %q is invalid (want tool_call, llm_call or local)", req.Kind)
	}
	if req.Target == "" {
		return Errorf(CodeValidation, "target is required")
	}
	if len(req.Target) > MaxTargetLen {
		return Errorf(CodeValidation, "target is longer than %d bytes", MaxTargetLen)
	}
	switch req.Idempotency {
	case "":
		req.Idempotency = Idempotency(policy.DefaultIdempotency(req.Kind))
	case SafeToRetry, AtMostOnce:
	default:
		return Errorf(CodeValidation, "idempotency %q is invalid (want safe_to_retry or at_most_once)", req.Idempotency)
	}
	if !policy.ValidEffect(req.Effect) {
		return Errorf(CodeValidation, "effect %q is invalid (want read_only, local_mutation, remote_mutation or destructive)", req.Effect)
	}
	return nil
}

// submission is a validated step submission: the request with its args in
// canonical form, their hash and the key of its occurrence counter.
type submission struct {
	StepRequest
	argsHash string
	occKey   string
	// pre and out are SubmitStep's read and answer of the current try,
	// kept here rather than in variables its closures would move to the
	// heap, one allocation each.
	pre preread
	out *StepDecision
}

// newSubmission validates req and canonicalises its args.
func newSubmission(req StepRequest) (*submission, error) {
	if err := validateStep(&req); err != nil {
		return nil, err
	}
	if len(req.Args) == 0 {
		req.Args = json.RawMessage("null")
	}
	args, argsHash, err := canonArgs(req.Args)
	if err != nil {
		return nil, Errorf(CodeValidation, "args: %v", err)
	}
	req.Args = args
	if req.Value != nil {
		if req.Kind != policy.KindLocal {
			return nil, Errorf(CodeValidation, "result is accepted with a step only for kind local (a value recorded with its submission), not %s", req.Kind)
		}
		if req.Value, err = canonicalOrNull(req.Value, "result"); err != nil {
			return nil, err
		}
	}
	return &submission{StepRequest: req, argsHash: argsHash,
		occKey: canon.StepID(req.ExecutionID, req.Kind, req.Target, argsHash, 0)}, nil
}

// The occurrence counter of a (kind, target, args_hash) triple in an
// execution is keyed by the id of the triple's first step (occurrence 0):
// a store may keep a new step and its counter in one record.

// legacyOccKey is the key a counter had before (kind␀args_hash␀target).
// It is still read when the counter is missing under its key, so that an
// attempt in flight across the upgrade keeps counting.
func legacyOccKey(kind, target, argsHash string) string {
	return kind + "\x00" + argsHash + "\x00" + target
}

// occurrence returns the counter of sub's triple in e (see legacyOccKey).
func (sub *submission) occurrence(tx ReadTx, e *Execution) (Occurrence, error) {
	oc, err := tx.Occurrence(e.Tenant, e.ID, sub.occKey)
	if err != nil || oc != (Occurrence{}) {
		return oc, err
	}
	return tx.Occurrence(e.Tenant, e.ID, legacyOccKey(sub.Kind, sub.Target, sub.argsHash))
}

// newStep is the record of a step submitted for the first time.
func (sub *submission) newStep(e *Execution, id string, occurrence int, now time.Time) *Step {
	return &Step{ID: id, ExecutionID: e.ID, Tenant: e.Tenant, Kind: sub.Kind, Target: sub.Target,
		Args: sub.Args, ArgsHash: sub.argsHash, Occurrence: occurrence, Idempotency: sub.Idempotency,
		Effect: sub.Effect, CreatedAt: now, Seq: e.LastSeq + 1}
}

// preread is what SubmitStep saw before deciding.
type preread struct {
	// exec is the execution as read, without its input when the store
	// offers ExecutionHead (checkCallHead): it is compared against, never
	// written back (writeStep reads the execution again).
	exec   *Execution
	occ    int
	stepID string
	step   *Step // nil when new
	// decision is set when the answer needs no write.
	decision *StepDecision
	// failures is the execution's count of consecutive failed steps (read
	// only when max_consecutive_failures is set).
	failures int64
	// policy is what the policy layer needs for a step it must decide:
	// the agent's bundle and the tenant's guards (nil when no policy runs).
	policy *PolicyRequest
}

// SubmitStep decides a step: replay when recorded, otherwise limits, policy,
// rate limits and approvals (docs/policy.md), and records the decision with
// its events in one transaction. On proceed, step.executing is durable
// before this returns.
//
// It reads (one read transaction), evaluates policy outside any
// transaction, then writes and re-checks what it read; when something
// changed in between it starts over: as long as racing submissions of the
// same call are being recorded, else at most maxSubmitTries times (then
// unavailable).
func (k *Kernel) SubmitStep(ctx context.Context, req StepRequest) (*StepDecision, error) {
	sub, err := newSubmission(req)
	if err != nil {
		return nil, err
	}
	pre := &sub.pre
	for tries, rounds := 0, 0; tries < maxSubmitTries && rounds < maxSubmitRounds; rounds++ {
		*pre = preread{}
		err := k.store.View(ctx, func(tx ReadTx) error {
			return k.preread(tx, sub, pre)
		})
		if err != nil {
			return nil, err
		}
		if pre.decision != nil {
			return pre.decision, nil
		}
		var v *Verdict
		if pre.policy != nil {
			if v = k.checkLimits(pre.exec, sub, pre); v == nil {
				if v, err = k.decide(ctx, pre.policy); err != nil {
					return nil, err
				}
			}
		}
		sub.out = nil
		_, err = k.update(ctx, func(r *rec) error {
			d, err := k.writeStep(r, sub, pre, v)
			sub.out = d
			return err
		})
		if errors.Is(err, errRetryRaced) {
			continue
		}
		if errors.Is(err, errRetry) {
			tries++
			continue
		}
		if err != nil {
			return nil, err
		}
		return sub.out, nil
	}
	return nil, Errorf(CodeUnavailable, "step submission kept racing with concurrent changes; retry")
}

// preread reads what the decision depends on; it sets pre.decision when the
// answer needs no write.
func (k *Kernel) preread(tx ReadTx, sub *submission, pre *preread) error {
	// Without the execution's input: nothing here reads it.
	e, err := checkCallHead(tx, sub.AgentCall)
	if err != nil {
		return err
	}
	pre.exec = e
	if e.Status.Terminal() {
		pre.decision = &StepDecision{Decision: DecisionExecutionTerminal, Reason: "execution is " + string(e.Status)}
		return nil
	}
	// A dispatch parked on an approval keeps its lease for the step that
	// waits; anything else under a lease that is not live waits too.
	parked := !leaseLive(e)
	if parked && e.Status != ExecBlocked {
		pre.decision = &StepDecision{Decision: DecisionExecutionBlocked, ApprovalID: e.BlockedOn, Reason: "the execution waits on an approval"}
		return nil
	}
	oc, err := sub.occurrence(tx, e)
	if err != nil {
		return fmt.Errorf("read occurrence: %w", err)
	}
	if oc.Lease == e.Lease {
		pre.occ = oc.Count
	}
	pre.stepID = sub.occKey // the step id of occurrence 0
	if pre.occ != 0 {
		pre.stepID = canon.StepID(e.ID, sub.Kind, sub.Target, sub.argsHash, pre.occ)
	}
	if sub.ClaimedStepID != "" && sub.ClaimedStepID != pre.stepID {
		return (&Error{Code: CodeStepIDDivergence, Message: fmt.Sprintf(
			"the agent's step id %.16s… is not the kernel's %.16s… (occurrence %d, args_hash %.16s…): the agent computes step ids differently; nothing was recorded",
			sub.ClaimedStepID, pre.stepID, pre.occ, sub.argsHash)}).WithDetails(map[string]any{
			"step_id": pre.stepID, "sent_step_id": sub.ClaimedStepID, "occurrence": pre.occ, "args_hash": sub.argsHash})
	}
	s, err := tx.Step(e.Tenant, e.ID, pre.stepID)
	switch {
	case err == nil:
		pre.step = s
	case errors.Is(err, ErrNotFound):
	default:
		return fmt.Errorf("read step %s: %w", pre.stepID, err)
	}
	if e.Status == ExecBlocked && (pre.step == nil || pre.step.ApprovalID != e.BlockedOn) {
		// A session keeps its lease while blocked: only the step that waits
		// is answered (blocked until its approval is resolved).
		pre.decision = &StepDecision{Decision: DecisionExecutionBlocked, ApprovalID: e.BlockedOn, Reason: "the execution waits on an approval"}
		return nil
	}
	if parked {
		// The step that waits, submitted again under the lease its attempt
		// was parked with (an agent whose blocked answer was lost): blocked
		// again, as a session's holder is answered, and nothing is written
		// (a blocked answer consumes no occurrence).
		a, err := tx.Approval(e.Tenant, e.BlockedOn)
		if err != nil {
			return fmt.Errorf("read approval %s: %w", e.BlockedOn, err)
		}
		pre.decision = &StepDecision{Decision: DecisionBlocked, StepID: pre.stepID, Occurrence: pre.occ,
			ApprovalID: a.ID, Reason: a.Reason, RuleID: a.RuleID}
		return nil
	}
	if !needsPolicy(pre.step) {
		return nil
	}
	if e.Limits.MaxConsecutiveFailures > 0 {
		if pre.failures, err = readFailures(tx, e); err != nil {
			return err
		}
	}
	pre.policy, err = policyRequest(tx, e.Tenant, e.AgentID)
	if err != nil {
		return err
	}
	pre.policy.Input = &policy.Input{
		Tenant: e.Tenant, AgentID: e.AgentID, ExecutionID: e.ID,
		Step: policy.Step{Kind: sub.Kind, Target: sub.Target, Args: sub.Args, ArgsHash: sub.argsHash,
			Idempotency: string(sub.Idempotency), Effect: sub.Effect, Occurrence: pre.occ},
		Execution: policy.Execution{Status: string(e.Status), Labels: policy.LabelsOrNone(e.Labels), Totals: e.Totals, CreatedAt: e.CreatedAt},
	}
	return nil
}

// policyRequest reads the bundles that decide an agent's steps: the agent's
// own and its tenant's guards. The caller fills in the input document.
func policyRequest(tx ReadTx, tenant, agentID string) (*PolicyRequest, error) {
	a, err := tx.Agent(tenant, agentID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, Errorf(CodeNotFound, "agent %s not found", agentID)
		}
		return nil, fmt.Errorf("read agent %s: %w", agentID, err)
	}
	req := &PolicyRequest{Bundle: a.Bundle}
	t, err := tx.Tenant(tenant)
	switch {
	case err == nil:
		req.Guards = t.Guards
	case errors.Is(err, ErrNotFound): // the default tenant has no record until configured
	default:
		return nil, fmt.Errorf("read tenant %s: %w", tenant, err)
	}
	return req, nil
}

// needsPolicy reports whether a step in this state is decided by policy.
func needsPolicy(s *Step) bool {
	return s == nil || s.Status == StepRateLimited || (s.Status == StepDenied && s.ApprovalID == "")
}

// limitsBundle names the execution limits in the verdicts they produce.
var limitsBundle = policy.BundleRef{Name: "kernel-limits", Revision: "1", Engine: "builtin"}

// checkLimits applies the execution's limits (docs/policy.md, step 2); it
// returns the deny verdict of the first limit reached, or nil.
func (k *Kernel) checkLimits(e *Execution, sub *submission, pre *preread) *Verdict {
	occurrence := pre.occ
	l := e.Limits
	deny := func(rule, reason string) *Verdict {
		return &Verdict{Action: policy.Deny, RuleID: rule, Reason: reason, Bundle: limitsBundle}
	}
	switch {
	case l.MaxSteps > 0 && e.Totals.Steps >= l.MaxSteps:
		return deny("limit_steps", fmt.Sprintf("limit_steps: the execution has run %d of %d steps", e.Totals.Steps, l.MaxSteps))
	case sub.Kind == policy.KindLLMCall && l.MaxLLMCalls > 0 && e.Totals.LLMCalls >= l.MaxLLMCalls:
		return deny("limit_llm_calls", fmt.Sprintf("limit_llm_calls: the execution has made %d of %d LLM calls", e.Totals.LLMCalls, l.MaxLLMCalls))
	case l.MaxTotalTokens > 0 && e.Totals.Tokens >= l.MaxTotalTokens:
		return deny("limit_tokens", fmt.Sprintf("limit_tokens: %d of %d tokens used", e.Totals.Tokens, l.MaxTotalTokens))
	case l.MaxCostUSD > 0 && e.Totals.CostUSD >= l.MaxCostUSD:
		return deny("limit_cost", fmt.Sprintf("limit_cost: %.4f of %.4f USD spent", e.Totals.CostUSD, l.MaxCostUSD))
	case l.MaxLoopRepetitions > 0 && int64(occurrence) >= l.MaxLoopRepetitions:
		// The same call (kind, target, args) repeated within one attempt.
		return deny("limit_loop", fmt.Sprintf("limit_loop: the same call was already made %d times in this attempt (max %d)", occurrence, l.MaxLoopRepetitions))
	case l.MaxConsecutiveFailures > 0 && pre.failures >= l.MaxConsecutiveFailures:
		return deny("limit_consecutive_failures", fmt.Sprintf("limit_consecutive_failures: the last %d steps failed (max %d)", pre.failures, l.MaxConsecutiveFailures))
	}
	if sub.Kind == policy.KindLLMCall && l.MaxOutputTokensPerCall > 0 {
		if why := outputCapOver(sub.Args, l.MaxOutputTokensPerCall); why != "" {
			return deny("limit_output_tokens", "limit_output_tokens: "+why)
		}
	}
	return timeLimits(e, k.now())
}

// timeLimits returns the deny verdict of the execution's max_duration or
// deadline when it has passed at now, or nil: the limits that can be
// reached while the execution waits on an approval, and are checked again
// when the granted step is submitted.
func timeLimits(e *Execution, now time.Time) *Verdict {
	deny := func(rule, reason string) *Verdict {
		return &Verdict{Action: policy.Deny, RuleID: rule, Reason: reason, Bundle: limitsBundle}
	}
	if e.Limits.MaxDuration != "" {
		if d, err := time.ParseDuration(e.Limits.MaxDuration); err == nil && now.Sub(e.CreatedAt) > d {
			return deny("limit_duration", fmt.Sprintf("limit_duration: the execution is older than %s", d))
		}
	}
	if e.Deadline != nil && now.After(*e.Deadline) {
		return deny("limit_deadline", "limit_deadline: the execution's deadline has passed")
	}
	return nil
}

// decide asks the policy layer for a verdict (outside any transaction).
func (k *Kernel) decide(ctx context.Context, req *PolicyRequest) (*Verdict, error) {
	start := time.Now()
	v, err := k.policy.Decide(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if v.EvalTime == 0 {
		v.EvalTime = time.Since(start)
	}
	if !v.Action.Valid() {
		v.Reason = fmt.Sprintf("policy answered unknown action %q", v.Action)
		v.Action = policy.Deny
	}
	return &v, nil
}

// writeStep re-checks what preread saw and records the decision. v is the
// verdict for a step that needs policy (nil otherwise).
func (k *Kernel) writeStep(r *rec, sub *submission, pre *preread, v *Verdict) (*StepDecision, error) {
	e, err := checkCall(r.tx, sub.AgentCall)
	if err != nil {
		return nil, err
	}
	if e.Status.Terminal() || !leaseLive(e) || e.LastSeq != pre.exec.LastSeq && !sameStepState(e, pre) {
		return nil, errRetry
	}
	oc, err := sub.occurrence(r.tx, e)
	if err != nil {
		return nil, err
	}
	n := 0
	if oc.Lease == e.Lease {
		n = oc.Count
	}
	if n != pre.occ {
		return nil, errRetryRaced
	}
	s := pre.step
	if s != nil {
		// Re-read the step in this transaction: preread's copy may be stale.
		cur, err := r.tx.Step(e.Tenant, e.ID, s.ID)
		if err != nil {
			return nil, err
		}
		if cur.Status != s.Status {
			return nil, errRetry
		}
		s = cur
	}
	base := &StepDecision{StepID: pre.stepID, Occurrence: n}
	var d *StepDecision
	switch {
	case s != nil && s.Status.Terminal():
		d = replayOf(base, s)
	case s != nil && s.Status == StepDenied && s.ApprovalID != "":
		d = base
		d.Decision, d.ApprovalID = DecisionDenied, s.ApprovalID
		if s.Verdict != nil {
			d.Reason, d.RuleID = s.Verdict.Reason, s.Verdict.RuleID
		}
	case s != nil && (s.Status == StepExecuting || s.Status == StepInterrupted):
		d, err = k.orphan(r, e, s, base, sub.Reconcile)
	case s != nil && s.Status == StepAwaitingApproval:
		d, err = k.afterApproval(r, e, s, base)
	default:
		if s == nil {
			s = sub.newStep(e, pre.stepID, n, r.now)
		}
		d, err = k.newDecision(r, e, s, base, v)
	}
	if err != nil {
		return nil, err
	}
	if sub.Value != nil && d.Decision == DecisionProceed {
		// A local step with its value: it ends in the commit that lets it run.
		if err := k.recordOutcome(r, e, s, StepSucceeded, sub.Value, nil, nil); err != nil {
			return nil, err
		}
		d = replayOf(d, s)
	}
	if d.Decision != DecisionBlocked {
		// A blocked answer consumes no occurrence: a session's holder,
		// which keeps its lease, proposes the step again under the same id
		// once the approval is resolved (an agent's attempt ends here).
		if err := r.tx.PutOccurrence(e.Tenant, e.ID, sub.occKey, Occurrence{Lease: e.Lease, Count: n + 1}); err != nil {
			return nil, fmt.Errorf("put occurrence: %w", err)
		}
	}
	if !e.Status.Terminal() {
		k.renew(r, e)
	}
	if err := r.tx.PutExecution(e); err != nil {
		return nil, fmt.Errorf("put execution: %w", err)
	}
	return d, nil
}

// sameStepState is true when nothing preread depended on changed.
func sameStepState(e *Execution, pre *preread) bool {
	if e.Status != pre.exec.Status || e.Lease != pre.exec.Lease || e.Dispatch.State != pre.exec.Dispatch.State {
		return false
	}
	// Totals feed limits and the policy input; a changed total only matters
	// for limits, which are re-evaluated cheaply on retry.
	if e.Totals != pre.exec.Totals && (e.Limits != Limits{}) {
		return false
	}
	return true
}

func replayOf(base *StepDecision, s *Step) *StepDecision {
	d := base
	d.Decision = DecisionReplay
	d.Result = s.Result
	d.Error = s.Error
	if s.Status == StepFailed && (len(s.Error) == 0 || string(s.Error) == "null") {
		// A failure recorded without an error (FailStep took a null one
		// before it needed an error) replays as a failure, not as a
		// success with no result.
		d.Error = json.RawMessage(`{}`)
	}
	return d
}

// proceed marks s executing under e's current lease and records
// step.executing: the one place a step is told to run. A step that runs for
// the first time under this execution's totals (a new allowed step, or one
// whose approval was granted) counts toward them; an orphan re-run does not.
func (r *rec) proceed(e *Execution, s *Step, p executingPayload, count bool) error {
	s.Status = StepExecuting
	s.Lease = e.Lease
	if err := r.tx.PutStep(s); err != nil {
		return err
	}
	p.stepRef = refOf(s)
	p.DispatchID, p.DispatchAttempt = e.Lease.DispatchID, e.Lease.Attempt
	if err := r.event(e, EvStepExecuting, p); err != nil {
		return err
	}
	if count {
		e.Totals.Steps++
		if s.Kind == policy.KindLLMCall {
			e.Totals.LLMCalls++
		}
	}
	return nil
}

// orphan handles a step found executing (or interrupted) under an older
// attempt (docs/durability.md#orphaned-steps). A safe_to_retry step
// proceeds again. An at_most_once step may or may not have happened:
// answered interrupted when the submitter can reconcile it, else it
// raises an interrupted_side_effect approval when the agent or a bundle
// that allowed it asked for one, else it fails indeterminate.
func (k *Kernel) orphan(r *rec, e *Execution, s *Step, base *StepDecision, reconcile bool) (*StepDecision, error) {
	prev := s.Lease
	if s.Idempotency == AtMostOnce {
		if reconcile {
			s.Status = StepInterrupted
			s.Lease = e.Lease
			if err := r.tx.PutStep(s); err != nil {
				return nil, err
			}
			if err := r.event(e, EvStepInterrupted, stepPayload(s, map[string]any{"orphaned_from": prev, "reconcile": true,
				"dispatch_id": e.Lease.DispatchID, "dispatch_attempt": e.Lease.Attempt})); err != nil {
				return nil, err
			}
			base.Decision = DecisionInterrupted
			base.Reason = "the step was in flight when an earlier attempt ended; reconcile it"
			return base, nil
		}
		mode, err := k.onInterrupted(r, e, s)
		if err != nil {
			return nil, err
		}
		if mode == OnInterruptedApproval {
			return k.interruptApproval(r, e, s, base, prev)
		}
		s.Status = StepFailed
		s.Error = json.RawMessage(`{"code":"indeterminate","message":"the step was in flight when its dispatch attempt ended; it may or may not have run"}`)
		t := r.now
		s.CompletedAt = &t
		if err := r.tx.PutStep(s); err != nil {
			return nil, err
		}
		if err := r.event(e, EvStepFailed, stepPayload(s, map[string]any{"error": s.Error, "orphaned_from": prev})); err != nil {
			return nil, err
		}
		return replayOf(base, s), nil
	}
	if err := r.proceed(e, s, executingPayload{OrphanedFrom: &prev}, false); err != nil {
		return nil, err
	}
	base.Decision = DecisionProceed
	return base, nil
}

// afterApproval handles the re-submission of a step that waited on an approval.
func (k *Kernel) afterApproval(r *rec, e *Execution, s *Step, base *StepDecision) (*StepDecision, error) {
	a, err := r.tx.Approval(e.Tenant, s.ApprovalID)
	if err != nil {
		return nil, fmt.Errorf("read approval %s: %w", s.ApprovalID, err)
	}
	base.ApprovalID = a.ID
	switch a.Status {
	case ApprovalPending:
		base.Decision = DecisionBlocked
		base.Reason, base.RuleID = a.Reason, a.RuleID
		return base, nil
	case ApprovalGranted:
		if v := timeLimits(e, r.now); v != nil && a.Type != ApprovalInterrupted {
			// The deadline passed while the step waited: it does not run.
			s.Status = StepDenied
			s.Verdict = v.record()
			if err := r.tx.PutStep(s); err != nil {
				return nil, err
			}
			p := verdictOf(s, v)
			p.ApprovalID = a.ID
			base.Decision, base.Reason, base.RuleID = DecisionDenied, v.Reason, v.RuleID
			return base, r.event(e, EvStepDenied, p)
		}
		// A retried interrupted step was counted when it first ran.
		if err := r.proceed(e, s, executingPayload{ApprovalID: a.ID}, a.Type != ApprovalInterrupted); err != nil {
			return nil, err
		}
		base.Decision = DecisionProceed
		return base, nil
	default: // denied or expired: normally already recorded when resolved
		base.Decision = DecisionDenied
		base.Reason = "approval " + string(a.Status)
		return base, nil
	}
}

// newDecision records the verdict for a new or re-decided step s: rate
// limits, then allow (proceed), require_approval (blocked), abort (the
// execution fails) or deny.
func (k *Kernel) newDecision(r *rec, e *Execution, s *Step, base *StepDecision, v *Verdict) (*StepDecision, error) {
	if err := r.event(e, EvStepProposed, proposedPayload{stepRef: refOf(s), ArgsHash: s.ArgsHash, Occurrence: base.Occurrence,
		Idempotency: s.Idempotency, Effect: s.Effect, DispatchID: e.Lease.DispatchID, DispatchAttempt: e.Lease.Attempt}); err != nil {
		return nil, err
	}
	s.Verdict = v.record()
	s.OnInterrupted = v.OnInterrupted
	base.Reason, base.RuleID = v.Reason, v.RuleID
	if v.Action == policy.Allow || v.Action == policy.RequireApproval {
		if limited, reason, ruleID, err := k.rateLimit(r, e, v.RateLimits); err != nil {
			return nil, err
		} else if limited {
			s.Status = StepRateLimited
			base.Decision, base.Reason, base.RuleID = DecisionRateLimited, reason, ruleID
			if err := r.tx.PutStep(s); err != nil {
				return nil, err
			}
			p := verdictOf(s, v)
			p.Reason, p.RateLimitID = reason, ruleID
			return base, r.event(e, EvStepRateLimited, p)
		}
	}
	switch v.Action {
	case policy.Allow:
		if err := r.event(e, EvStepAllowed, verdictOf(s, v)); err != nil {
			return nil, err
		}
		if err := r.proceed(e, s, executingPayload{}, true); err != nil {
			return nil, err
		}
		base.Decision = DecisionProceed
		return base, nil
	case policy.RequireApproval:
		return k.requestApproval(r, e, s, base, v)
	case policy.Abort:
		s.Status = StepDenied
		if err := r.tx.PutStep(s); err != nil {
			return nil, err
		}
		if err := r.event(e, EvStepDenied, verdictOf(s, v)); err != nil {
			return nil, err
		}
		if err := k.finish(r, e, ExecFailed, "policy_abort", nil, mustJSON(map[string]any{"code": "policy_abort", "message": v.Reason, "rule_id": v.RuleID, "step_id": s.ID}), nil); err != nil {
			return nil, err
		}
		base.Decision = DecisionExecutionTerminal
		base.Reason = "policy_abort: " + v.Reason
		return base, nil
	default:
		s.Status = StepDenied
		if err := r.tx.PutStep(s); err != nil {
			return nil, err
		}
		base.Decision = DecisionDenied
		return base, r.event(e, EvStepDenied, verdictOf(s, v))
	}
}

// requestApproval creates a hash-bound approval and parks the dispatch.
func (k *Kernel) requestApproval(r *rec, e *Execution, s *Step, base *StepDecision, v *Verdict) (*StepDecision, error) {
	timeout := k.cfg.ApprovalTimeout
	a := &Approval{ID: k.ids.next(r.now), Tenant: e.Tenant, ExecutionID: e.ID, AgentID: e.AgentID, StepID: s.ID,
		Kind: s.Kind, Target: s.Target, Args: s.Args, RequestHash: RequestHash(s.ID, s.Args), Status: ApprovalPending,
		Reason: v.Reason, RuleID: v.RuleID, CreatedAt: r.now}
	if t, err := r.tx.Tenant(e.Tenant); err == nil && slices.Contains(t.Guards, v.Bundle.Name) {
		a.Guard = v.Bundle.Name
	} else if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("read tenant %s: %w", e.Tenant, err)
	}
	if cfg := v.Approval; cfg != nil {
		a.Approvers = cfg.Approvers
		a.Message = cfg.Message
		if cfg.Timeout != "" {
			if d, err := time.ParseDuration(cfg.Timeout); err == nil && d > 0 {
				timeout = d
			}
		}
	}
	a.ExpiresAt = r.now.Add(timeout)
	if err := r.tx.PutApproval(a); err != nil {
		return nil, fmt.Errorf("put approval: %w", err)
	}
	s.Status = StepAwaitingApproval
	s.ApprovalID = a.ID
	if err := r.tx.PutStep(s); err != nil {
		return nil, err
	}
	payload := verdictOf(s, v)
	payload.ApprovalID = a.ID
	if err := r.event(e, EvStepAwaitingApproval, payload); err != nil {
		return nil, err
	}
	requested := map[string]any{"approval_id": a.ID, "step_id": s.ID, "request_hash": a.RequestHash,
		"approvers": a.Approvers, "expires_at": a.ExpiresAt, "message": a.Message}
	if a.Guard != "" {
		requested["guard"] = a.Guard
	}
	if err := r.event(e, EvApprovalRequested, requested); err != nil {
		return nil, err
	}
	if err := r.blockOn(e, a, s.ID); err != nil {
		return nil, err
	}
	base.Decision = DecisionBlocked
	base.ApprovalID = a.ID
	return base, nil
}

// RequestHash binds an approval to the exact request: sha256 over the step
// id and the canonical args.
func RequestHash(stepID string, canonicalArgs []byte) string {
	h := sha256.New()
	h.Write([]byte(stepID))
	h.Write([]byte{0})
	h.Write(canonicalArgs)
	return hex.EncodeToString(h.Sum(nil))
}

// stepPayload builds a step.* payload: step_id, kind, target, plus extra.
func stepPayload(s *Step, extra map[string]any) map[string]any {
	m := map[string]any{"step_id": s.ID, "kind": s.Kind, "target": s.Target}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// StepOutcome is an agent's report of a step it ran.
type StepOutcome struct {
	AgentCall
	StepID string
	// Result (complete) or Error (fail).
	Result json.RawMessage
	Error  json.RawMessage
	Usage  *Usage
}

// CompleteStep records a step's result. Completing a step again with the
// same result is idempotent; with a different result it is a conflict and
// the first result stands.
func (k *Kernel) CompleteStep(ctx context.Context, o StepOutcome) (*Step, error) {
	res, err := canonicalOrNull(o.Result, "result")
	if err != nil {
		return nil, err
	}
	o.Result = res
	return k.endStep(ctx, o, StepSucceeded)
}

// FailStep records a step's error, with the same rules as CompleteStep.
// The error is required and not null: a failure recorded with a null
// error would replay as "error": null, which clients (the Go SDK among
// them) read as no error, that is as a success with a null result.
func (k *Kernel) FailStep(ctx context.Context, o StepOutcome) (*Step, error) {
	ev, err := canonicalOrNull(o.Error, "error")
	if err != nil {
		return nil, err
	}
	if string(ev) == "null" {
		return nil, Errorf(CodeValidation, "error is required and must not be null: it is what the step's replay answers (a null error reads as a success)")
	}
	o.Error = ev
	return k.endStep(ctx, o, StepFailed)
}

func (k *Kernel) endStep(ctx context.Context, o StepOutcome, st StepStatus) (*Step, error) {
	if o.Usage != nil && (o.Usage.InputTokens < 0 || o.Usage.OutputTokens < 0 || o.Usage.TotalTokens < 0 || o.Usage.CostUSD < 0) {
		return nil, Errorf(CodeValidation, "usage values must not be negative")
	}
	var out *Step
	_, err := k.update(ctx, func(r *rec) error {
		out = nil
		e, err := checkCall(r.tx, o.AgentCall)
		if err != nil {
			return err
		}
		s, err := stepOf(r.tx, e.Tenant, e.ID, o.StepID)
		if err != nil {
			return err
		}
		if s.Status.Terminal() {
			if s.Status == st && bytes.Equal(s.Result, o.Result) && bytes.Equal(s.Error, o.Error) {
				out = s
				return nil
			}
			return (&Error{Code: CodeConflict, Message: fmt.Sprintf("step %s is already %s; the recorded outcome stands", s.ID, s.Status)}).
				WithDetails(map[string]any{"status": s.Status})
		}
		if e.Status.Terminal() {
			return Errorf(CodeConflict, "execution %s is %s", e.ID, e.Status)
		}
		if s.Status != StepExecuting {
			return Errorf(CodeConflict, "step %s is %s, not executing", s.ID, s.Status)
		}
		if s.Lease != e.Lease {
			return Errorf(CodeLeaseSuperseded, "step %s was proceeded under another dispatch attempt", s.ID)
		}
		if err := k.recordOutcome(r, e, s, st, o.Result, o.Error, o.Usage); err != nil {
			return err
		}
		k.renew(r, e)
		out = s
		return r.tx.PutExecution(e)
	})
	return out, err
}

// recordOutcome ends the executing step s with status st (succeeded or
// failed), its result or error and usage: the step, its event, the
// execution's totals and its count of consecutive failures. The caller
// renews the lease and writes e.
func (k *Kernel) recordOutcome(r *rec, e *Execution, s *Step, st StepStatus, result, errv json.RawMessage, usage *Usage) error {
	t := r.now
	s.Status, s.Result, s.Error, s.Usage, s.CompletedAt = st, result, errv, usage, &t
	if err := r.tx.PutStep(s); err != nil {
		return err
	}
	payload := outcomePayload{stepRef: refOf(s), Usage: usage}
	typ := EvStepSucceeded
	if st == StepFailed {
		typ = EvStepFailed
		payload.Error = errv
	}
	if usage != nil {
		if usage.TotalTokens != 0 {
			e.Totals.Tokens = addTokens(e.Totals.Tokens, usage.TotalTokens)
		} else {
			e.Totals.Tokens = addTokens(addTokens(e.Totals.Tokens, usage.InputTokens), usage.OutputTokens)
		}
		e.Totals.CostUSD = addCost(e.Totals.CostUSD, usage.CostUSD)
	}
	if err := r.event(e, typ, payload); err != nil {
		return err
	}
	if e.Limits.MaxConsecutiveFailures > 0 {
		return countFailure(r.tx, e, st == StepFailed)
	}
	return nil
}

// addTokens adds n (not negative: endStep refuses that) to a token total,
// stopping at the largest int64 rather than wrapping negative.
func addTokens(total, n int64) int64 {
	if n > math.MaxInt64-total {
		return math.MaxInt64
	}
	return total + n
}

// addCost adds c (finite, not negative) to a cost total, stopping at the
// largest float64: a sum of finite costs may overflow to +Inf, which JSON
// cannot carry, and every answer and policy input holding the
// execution's totals would then fail to encode.
func addCost(total, c float64) float64 {
	if sum := total + c; sum <= math.MaxFloat64 {
		return sum
	}
	return math.MaxFloat64
}

// GetStep returns one step of an execution.
func (k *Kernel) GetStep(ctx context.Context, tenant, executionID, stepID string) (*Step, error) {
	var s *Step
	err := k.store.View(ctx, func(tx ReadTx) error {
		if _, err := loadExec(tx, tenant, executionID); err != nil {
			return err
		}
		var err error
		s, err = stepOf(tx, tenant, executionID, stepID)
		return err
	})
	return s, err
}

// MaxStepsPageBytes bounds the stored records one page of ListSteps
// reads: a step holds up to a request body of arguments and another of
// result, so a page of a thousand could otherwise be gigabytes.
const MaxStepsPageBytes = 8 << 20

// ListSteps lists an execution's steps in order, a page at a time: those
// after afterSeq (0: from the first), at most limit, and fewer once their
// records take MaxStepsPageBytes (never none). terminalOnly keeps the
// succeeded, failed and cancelled ones of the page. next is the afterSeq
// of the following page, 0 when this one is the last.
func (k *Kernel) ListSteps(ctx context.Context, tenant, executionID string, terminalOnly bool, afterSeq uint64, limit int) ([]*Step, uint64, error) {
	var out []*Step
	var next uint64
	err := k.store.View(ctx, func(tx ReadTx) error {
		if _, err := loadExec(tx, tenant, executionID); err != nil {
			return err
		}
		page, more, err := tx.StepsPage(tenant, executionID, afterSeq, limit, MaxStepsPageBytes)
		if err != nil {
			return err
		}
		if more && len(page) > 0 {
			next = page[len(page)-1].Seq
		}
		for _, s := range page {
			if !terminalOnly || s.Status.Terminal() {
				out = append(out, s)
			}
		}
		return nil
	})
	return out, next, err
}

// canonArgs canonicalises step args and hashes them (docs/identity.md).
func canonArgs(raw json.RawMessage) (json.RawMessage, string, error) {
	c, h, err := canon.ArgsHash(raw)
	return c, h, err
}

// failuresKey is the counter of an execution's consecutive failed steps.
func failuresKey(e *Execution) string { return "consecutive_failures\x00" + e.ID }

func readFailures(tx ReadTx, e *Execution) (int64, error) {
	raw, err := tx.Counter(e.Tenant, failuresKey(e))
	if err != nil || len(raw) == 0 {
		return 0, err
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("consecutive failures counter: %w", err)
	}
	return n, nil
}

// countFailure adds one failure to the counter, or resets it on a success.
func countFailure(tx Tx, e *Execution, failed bool) error {
	n := int64(0)
	if failed {
		var err error
		if n, err = readFailures(tx, e); err != nil {
			return err
		}
		n++
	}
	return tx.PutCounter(e.Tenant, failuresKey(e), strconv.AppendInt(nil, n, 10))
}

// blockOn blocks execution e on approval a for step stepID: an agent's
// dispatch is parked (a new one comes once it is decided); a session's
// holder keeps its lease and heartbeats while it waits.
func (r *rec) blockOn(e *Execution, a *Approval, stepID string) error {
	e.Status = ExecBlocked
	e.BlockedOn = a.ID
	if !e.Session() {
		e.Dispatch.State = DispatchParked
		e.Dispatch.LeaseUntil = time.Time{}
	}
	return r.event(e, EvExecutionBlocked, map[string]any{"approval_id": a.ID, "step_id": stepID})
}

// stepOf reads one step of an execution; a missing one is CodeNotFound,
// named.
func stepOf(tx ReadTx, tenant, executionID, stepID string) (*Step, error) {
	s, err := tx.Step(tenant, executionID, stepID)
	if errors.Is(err, ErrNotFound) {
		return nil, Errorf(CodeNotFound, "step %s not found in execution %s", stepID, executionID)
	}
	return s, err
}

// outputCapOver says why an llm_call's own output cap (max_tokens,
// max_output_tokens, max_completion_tokens) does not fit under max, or ""
// when each is absent, null (no cap: the gateway gives the call max as
// its cap) or a number no larger than max. A cap that is not a number
// (a string, say, which a lenient provider reads as one) does not fit: a
// limit enforced before the call cannot trust what the provider will make
// of it. A call asking for n choices (OpenAI's "n") may use its cap once
// per choice, so n times its cap must fit, and n must be a whole number
// from 1 to max (each choice is at least one token; the gateway gives an
// uncapped call max/n per choice).
func outputCapOver(args json.RawMessage, max int64) string {
	var req map[string]json.RawMessage
	if json.Unmarshal(args, &req) != nil {
		return ""
	}
	choices, why := ChoicesOf(req["n"], max)
	if why != "" {
		return why
	}
	for _, f := range []string{"max_tokens", "max_output_tokens", "max_completion_tokens"} {
		raw := bytes.TrimSpace(req[f])
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
			return fmt.Sprintf("the call's %s is %.32s, not a number of output tokens (max %d per call)", f, raw, max)
		}
		n, err := strconv.ParseFloat(string(raw), 64)
		switch {
		case err != nil || n > float64(max):
			return fmt.Sprintf("the call asks for %.32s output tokens (max %d per call)", raw, max)
		case n*float64(choices) > float64(max):
			return fmt.Sprintf("the call asks for %d choices of up to %.32s output tokens each (max %d per call)", choices, raw, max)
		}
	}
	return ""
}

// ChoicesOf reads an LLM request's "n" (how many choices it asks for) under
// a per-call output cap of max: 1 when absent or null, else a whole number
// from 1 to max, or why it is not one. The gateway divides an uncapped
// call's cap by it.
func ChoicesOf(raw json.RawMessage, max int64) (int64, string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 1, ""
	}
	n, ok := policy.IntegerNumber(string(raw))
	if !ok || n < 1 {
		return 0, fmt.Sprintf("the call's n is %.32s, not a number of choices (max %d output tokens per call)", raw, max)
	}
	if int64(n) > max {
		return 0, fmt.Sprintf("the call asks for %.32s choices of at least one output token each (max %d per call)", raw, max)
	}
	return int64(n), ""
}
