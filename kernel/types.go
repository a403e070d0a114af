package kernel

import (
	"encoding/json"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
)

// DefaultTenant exists from the start; every key is scoped by tenant.
const DefaultTenant = "default"

// ExecStatus is an execution's status (docs/README.md).
type ExecStatus string

// Execution statuses.
const (
	ExecPending   ExecStatus = "pending"
	ExecRunning   ExecStatus = "running"
	ExecBlocked   ExecStatus = "blocked"
	ExecCompleted ExecStatus = "completed"
	ExecFailed    ExecStatus = "failed"
	ExecCancelled ExecStatus = "cancelled"
)

// Terminal reports whether s is completed, failed or cancelled.
func (s ExecStatus) Terminal() bool {
	return s == ExecCompleted || s == ExecFailed || s == ExecCancelled
}

// StepStatus is a step's status.
type StepStatus string

// Step statuses. Succeeded, failed and cancelled are terminal and never
// change again; denied is terminal only when it came from an approval.
const (
	StepExecuting        StepStatus = "executing"
	StepAwaitingApproval StepStatus = "awaiting_approval"
	StepDenied           StepStatus = "denied"
	StepRateLimited      StepStatus = "rate_limited"
	StepSucceeded        StepStatus = "succeeded"
	StepFailed           StepStatus = "failed"
	StepCancelled        StepStatus = "cancelled"
	// StepInterrupted is an at_most_once step found in flight by a later
	// dispatch attempt (or session attach) whose submitter said it can
	// reconcile it: it waits for POST …/steps/{id}/reconcile.
	StepInterrupted StepStatus = "interrupted"
)

// Terminal reports whether the step has a final outcome that replays.
func (s StepStatus) Terminal() bool {
	return s == StepSucceeded || s == StepFailed || s == StepCancelled
}

// Idempotency is what may happen to a step found in flight after its
// dispatch attempt ended (docs/durability.md).
type Idempotency string

// Idempotency modes of a step.
const (
	// SafeToRetry steps proceed again under the new attempt, same step id
	// (default for llm_call and local).
	SafeToRetry Idempotency = policy.SafeToRetry
	// AtMostOnce steps fail "indeterminate" instead (default for tool_call).
	AtMostOnce Idempotency = policy.AtMostOnce
)

// DispatchStatus is where an execution's dispatch stands.
type DispatchStatus string

// Dispatch statuses kept on the execution.
const (
	DispatchNone       DispatchStatus = ""           // no dispatch (terminal, or never queued)
	DispatchQueued     DispatchStatus = "queued"     // waiting in the due index until DueAt
	DispatchDelivering DispatchStatus = "delivering" // claimed; webhook POST in flight; lease held
	DispatchAcked      DispatchStatus = "acked"      // agent acknowledged; lease held
	DispatchParked     DispatchStatus = "parked"     // a step is blocked on an approval; no lease timer
)

// Lease is the (dispatch_id, dispatch_attempt) pair an agent holds.
type Lease struct {
	DispatchID string `json:"dispatch_id"`
	Attempt    int    `json:"dispatch_attempt"`
}

// DispatchState is the delivery state of an execution. An execution has at
// most one dispatch at a time.
type DispatchState struct {
	// ID of the current dispatch (a new one is made on create and on resume).
	ID string `json:"id,omitempty"`
	// Attempt is the number of the last claimed attempt of ID (0: never claimed).
	Attempt int `json:"attempt"`
	// State is one of the Dispatch* statuses.
	State DispatchStatus `json:"state,omitempty"`
	// DueAt is when a queued dispatch may be claimed.
	DueAt time.Time `json:"due_at,omitzero"`
	// LeaseUntil is when a claimed attempt's lease expires.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// Failures counts failed deliveries of ID (for backoff).
	Failures int `json:"failures,omitempty"`
}

// Limits bound an execution (docs/protocol.md); zero means unlimited.
type Limits struct {
	MaxSteps               int64   `json:"max_steps,omitempty"`
	MaxLLMCalls            int64   `json:"max_llm_calls,omitempty"`
	MaxOutputTokensPerCall int64   `json:"max_output_tokens_per_call,omitempty"`
	MaxTotalTokens         int64   `json:"max_total_tokens,omitempty"`
	MaxCostUSD             float64 `json:"max_cost_usd,omitempty"`
	MaxDuration            string  `json:"max_duration,omitempty"`
	MaxConsecutiveFailures int64   `json:"max_consecutive_failures,omitempty"`
	MaxLoopRepetitions     int64   `json:"max_loop_repetitions,omitempty"`
}

// Execution is the projection of one execution.
type Execution struct {
	ID             string            `json:"id"`
	Tenant         string            `json:"tenant"`
	AgentID        string            `json:"agent_id"`
	AgentVersion   string            `json:"agent_version,omitempty"`
	Status         ExecStatus        `json:"status"`
	Input          json.RawMessage   `json:"input"`
	Output         json.RawMessage   `json:"output,omitempty"`
	Error          json.RawMessage   `json:"error,omitempty"`
	Reason         string            `json:"reason,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	Limits         Limits            `json:"limits"`
	Totals         policy.Totals     `json:"totals"`
	Deadline       *time.Time        `json:"deadline,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	UpdatedAt      time.Time         `json:"updated_at"`
	// LastSeq is the seq of the newest event of this execution.
	LastSeq uint64 `json:"last_seq"`
	// Lease is the last claimed (dispatch_id, attempt): the only pair whose
	// mutations are accepted. Zero before the first claim.
	Lease Lease `json:"lease"`
	// Dispatch is the delivery state.
	Dispatch DispatchState `json:"dispatch"`
	// BlockedOn is the approval the execution waits on, when blocked.
	BlockedOn string `json:"blocked_on,omitempty"`
	// Holder is set on a session (POST /v0/sessions): an execution driven
	// by a bearer key's own loop instead of webhook dispatches. It names
	// the key that holds the lease, or last held it.
	Holder *Holder `json:"holder,omitempty"`
}

// Holder is the bearer key that holds (or last held) a session's lease.
type Holder struct {
	KeyID     string `json:"key_id"`
	Principal string `json:"principal"`
}

// Session reports whether e is a session (driven by a lease holder, never
// dispatched to a webhook).
func (e *Execution) Session() bool { return e.Holder != nil }

// StepVerdict is the part of a [Verdict] a step records: the action and
// what produced it.
type StepVerdict struct {
	Action   policy.Action    `json:"action"`
	Reason   string           `json:"reason,omitempty"`
	RuleID   string           `json:"rule_id,omitempty"`
	Bundle   policy.BundleRef `json:"bundle"`
	EvalTime time.Duration    `json:"eval_ns"`
}

// Step is the projection of one step.
type Step struct {
	ID          string          `json:"id"`
	ExecutionID string          `json:"execution_id"`
	Tenant      string          `json:"tenant"`
	Kind        string          `json:"kind"`
	Target      string          `json:"target"`
	Args        json.RawMessage `json:"args"`
	ArgsHash    string          `json:"args_hash"`
	Occurrence  int             `json:"occurrence"`
	Idempotency Idempotency     `json:"idempotency"`
	Effect      string          `json:"effect,omitempty"`
	Status      StepStatus      `json:"status"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       json.RawMessage `json:"error,omitempty"`
	Usage       *Usage          `json:"usage,omitempty"`
	// Lease is the (dispatch_id, attempt) under which the step was last told proceed.
	Lease Lease `json:"lease"`
	// OnInterrupted is what happens when the step is found in flight by a
	// later attempt: OnInterruptedApproval when the agent or a bundle that
	// decided it asked for it when it proceeded, else empty (indeterminate).
	OnInterrupted string `json:"on_interrupted,omitempty"`
	// Verdict is what decided the step: the policy verdict, or the limit
	// that denied it.
	Verdict    *StepVerdict `json:"decision,omitempty"`
	ApprovalID string       `json:"approval_id,omitempty"`
	// Seq is the seq of the step's first event (step.proposed); it orders steps.
	Seq         uint64     `json:"seq"`
	CreatedAt   time.Time  `json:"created_at"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
}

// Usage is what a completed step reports it consumed.
type Usage struct {
	InputTokens  int64   `json:"input_tokens,omitempty"`
	OutputTokens int64   `json:"output_tokens,omitempty"`
	TotalTokens  int64   `json:"total_tokens,omitempty"`
	CostUSD      float64 `json:"cost_usd,omitempty"`
}

// Event is one immutable row of an execution's log.
type Event struct {
	ExecutionID string          `json:"execution_id"`
	Seq         uint64          `json:"seq"`
	Type        EventType       `json:"type"`
	Time        time.Time       `json:"time"`
	Payload     json.RawMessage `json:"payload"`
}

// EventType names what an event records (docs/protocol.md#events).
type EventType string

// Event types.
const (
	EvExecutionCreated   EventType = "execution.created"
	EvExecutionStarted   EventType = "execution.started"
	EvExecutionBlocked   EventType = "execution.blocked"
	EvExecutionResumed   EventType = "execution.resumed"
	EvExecutionCompleted EventType = "execution.completed"
	EvExecutionFailed    EventType = "execution.failed"
	EvExecutionCancelled EventType = "execution.cancelled"

	EvStepProposed         EventType = "step.proposed"
	EvStepAllowed          EventType = "step.allowed"
	EvStepDenied           EventType = "step.denied"
	EvStepRateLimited      EventType = "step.rate_limited"
	EvStepAwaitingApproval EventType = "step.awaiting_approval"
	EvStepExecuting        EventType = "step.executing"
	EvStepSucceeded        EventType = "step.succeeded"
	EvStepFailed           EventType = "step.failed"
	EvStepCancelled        EventType = "step.cancelled"
	EvStepInterrupted      EventType = "step.interrupted"
	EvStepReconciled       EventType = "step.reconciled"

	EvApprovalRequested EventType = "approval.requested"
	EvApprovalGranted   EventType = "approval.granted"
	EvApprovalDenied    EventType = "approval.denied"
	EvApprovalExpired   EventType = "approval.expired"
	EvApprovalHappened  EventType = "approval.happened"

	EvSessionAttached EventType = "session.attached"
	EvSessionDetached EventType = "session.detached"

	EvDispatchQueued     EventType = "dispatch.queued"
	EvDispatchClaimed    EventType = "dispatch.claimed"
	EvDispatchAcked      EventType = "dispatch.acked"
	EvDispatchFailed     EventType = "dispatch.failed"
	EvDispatchSuperseded EventType = "dispatch.superseded"
	EvDispatchDiscarded  EventType = "dispatch.discarded"
)

// Agent is a registered agent. Secret is the HMAC key; it is never returned
// over the API.
type Agent struct {
	ID         string `json:"id"`
	Tenant     string `json:"tenant"`
	WebhookURL string `json:"webhook_url"`
	Secret     string `json:"secret,omitempty"`
	Bundle     string `json:"bundle,omitempty"`
	// Signing is how the agent signs its requests and how its webhooks are
	// signed: SigningV1 or SigningBody. A record without it predates
	// signing schemes and reads as SigningBody (see SigningScheme).
	Signing string `json:"signing,omitempty"`
	// OnInterrupted is what an at_most_once step of the agent found in
	// flight becomes: OnInterruptedIndeterminate (empty: the default) or
	// OnInterruptedApproval.
	OnInterrupted string    `json:"on_interrupted,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// Signing schemes of an agent (Agent.Signing).
const (
	// SigningV1 is the timestamped signature that binds the method, the
	// request target, the lease and the body (Wicket-Signature). The
	// default for new agents.
	SigningV1 = "v1"
	// SigningBody is the Rebuno signature over the body alone
	// (Rebuno-Signature), for SDKs written to that protocol.
	SigningBody = "body"
)

// What an interrupted at_most_once step becomes (Agent.OnInterrupted, a
// bundle's on_interrupted).
const (
	// OnInterruptedIndeterminate fails the step {"code": "indeterminate"}.
	OnInterruptedIndeterminate = "indeterminate"
	// OnInterruptedApproval raises an approval of type
	// ApprovalInterrupted: an operator says whether it happened.
	OnInterruptedApproval = "approval"
)

// GateOnly reports whether the agent has no webhook: its executions are
// sessions only.
func (a *Agent) GateOnly() bool { return a.WebhookURL == "" }

// SigningScheme returns the agent's signing scheme: Signing, or
// SigningBody for a record stored before schemes existed (those agents
// signed their bodies, and keep working unchanged).
func (a *Agent) SigningScheme() string {
	if a.Signing == "" {
		return SigningBody
	}
	return a.Signing
}

// Occurrence is the durable occurrence counter of one (kind, target,
// args_hash) triple within an execution. It is valid only for the lease it
// names: a counter of another attempt reads as zero.
type Occurrence struct {
	Lease Lease `json:"lease"`
	Count int   `json:"count"`
}

// ApprovalStatus is an approval's status.
type ApprovalStatus string

// Approval statuses.
const (
	ApprovalPending ApprovalStatus = "pending"
	ApprovalGranted ApprovalStatus = "granted"
	ApprovalDenied  ApprovalStatus = "denied"
	ApprovalExpired ApprovalStatus = "expired"
	// ApprovalHappened: an interrupted side effect the decider says
	// happened, with its result.
	ApprovalHappened ApprovalStatus = "happened"
)

// Approval types (Approval.Type).
const (
	// ApprovalPolicy is a require_approval verdict (the empty type).
	ApprovalPolicy = "policy"
	// ApprovalInterrupted is raised by the kernel for an at_most_once step
	// found in flight with on_interrupted: approval: did it happen?
	ApprovalInterrupted = "interrupted_side_effect"
)

// Approval is a durable pause on one step, bound to the hash of its request.
type Approval struct {
	ID          string          `json:"id"`
	Tenant      string          `json:"tenant"`
	ExecutionID string          `json:"execution_id"`
	AgentID     string          `json:"agent_id"`
	StepID      string          `json:"step_id"`
	Kind        string          `json:"kind"`
	Target      string          `json:"target"`
	Args        json.RawMessage `json:"args"`
	// Type is ApprovalPolicy (stored empty) or ApprovalInterrupted.
	Type string `json:"type,omitempty"`
	// Result is the step's result a decider gave with "happened".
	Result json.RawMessage `json:"result,omitempty"`
	// RequestHash is sha256 over the step id and canonical args.
	RequestHash string         `json:"request_hash"`
	Status      ApprovalStatus `json:"status"`
	Approvers   []string       `json:"approvers,omitempty"`
	// Guard names the tenant's guard bundle whose answer asked for the
	// approval: only keys the admin issued decide it.
	Guard     string    `json:"guard,omitempty"`
	Message   string    `json:"message,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	RuleID    string    `json:"rule_id,omitempty"`
	ExpiresAt time.Time `json:"expires_at"`
	// DecidedBy is who decided: the deciding key's principal, or the
	// person an admin key named (decided_by) when it acted for them.
	DecidedBy string `json:"decided_by,omitempty"`
	// DecidedByKey is the id of the API key that decided, and
	// DecidedByPrincipal that key's principal.
	DecidedByKey       string     `json:"decided_by_key,omitempty"`
	DecidedByPrincipal string     `json:"decided_by_principal,omitempty"`
	Rationale          string     `json:"rationale,omitempty"`
	CreatedAt          time.Time  `json:"created_at"`
	DecidedAt          *time.Time `json:"decided_at,omitempty"`
}
