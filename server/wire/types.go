package wire

import (
	"encoding/json"
	"time"
)

// Decisions answered to a step submission (docs/protocol.md).
const (
	DecisionProceed           = "proceed"
	DecisionReplay            = "replay"
	DecisionDenied            = "denied"
	DecisionRateLimited       = "rate_limited"
	DecisionBlocked           = "blocked"
	DecisionExecutionBlocked  = "execution_blocked"
	DecisionExecutionTerminal = "execution_terminal"
	// DecisionInterrupted answers a submission that sent reconcile: true
	// for a step found in flight: POST …/steps/{step_id}/reconcile says
	// what happened.
	DecisionInterrupted = "interrupted"
)

// Outcomes of a reconciliation (ReconcileRequest.Outcome).
const (
	ReconcileContinue  = "continue"
	ReconcileCompleted = "completed"
	ReconcileConflict  = "conflict"
	ReconcileApproval  = "approval"
)

// What an interrupted at_most_once step becomes (AgentRequest.OnInterrupted).
const (
	OnInterruptedIndeterminate = "indeterminate"
	OnInterruptedApproval      = "approval"
)

// Approval types (Approval.Type).
const (
	ApprovalPolicy      = "policy"
	ApprovalInterrupted = "interrupted_side_effect"
)

// Owners of a stored bundle: stored with an admin key (a tenant-admin may
// not replace or delete it; only these may be a tenant's guards), or by the
// tenant.
const (
	BundleOwnerAdmin  = "admin"
	BundleOwnerTenant = "tenant"
)

// Roles of API keys.
const (
	RoleAdmin       = "admin"
	RoleTenantAdmin = "tenant-admin"
	RoleClient      = "client"
	RoleApprover    = "approver"
)

// ---- executions ----

// Limits bound an execution; zero fields are unlimited. MaxDuration is a Go
// duration string ("10m").
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

// CreateExecutionRequest is the body of POST /v0/executions. Send the
// Idempotency-Key header to make retries safe.
type CreateExecutionRequest struct {
	AgentID      string            `json:"agent_id"`
	Input        json.RawMessage   `json:"input,omitempty"`
	AgentVersion string            `json:"agent_version,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Limits       *Limits           `json:"limits,omitempty"`
	// Deadline is an RFC 3339 time after which new steps are denied.
	Deadline *time.Time `json:"deadline,omitempty"`
}

// Totals are an execution's running totals.
type Totals struct {
	Steps    int64   `json:"steps"`
	LLMCalls int64   `json:"llm_calls"`
	Tokens   int64   `json:"tokens"`
	CostUSD  float64 `json:"cost_usd"`
}

// Lease is a (dispatch_id, dispatch_attempt) pair.
type Lease struct {
	DispatchID string `json:"dispatch_id"`
	Attempt    int    `json:"dispatch_attempt"`
}

// Dispatch is the delivery state of an execution.
type Dispatch struct {
	ID         string     `json:"id,omitempty"`
	Attempt    int        `json:"attempt"`
	State      string     `json:"state,omitempty"`
	DueAt      *time.Time `json:"due_at,omitempty"`
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
}

// Execution is an execution as the API shows it.
type Execution struct {
	ID             string            `json:"id"`
	Tenant         string            `json:"tenant"`
	AgentID        string            `json:"agent_id"`
	AgentVersion   string            `json:"agent_version,omitempty"`
	Status         string            `json:"status"`
	Input          json.RawMessage   `json:"input"`
	Output         json.RawMessage   `json:"output,omitempty"`
	Error          json.RawMessage   `json:"error,omitempty"`
	Reason         string            `json:"reason,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	Limits         Limits            `json:"limits"`
	Totals         Totals            `json:"totals"`
	Deadline       *time.Time        `json:"deadline,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	BlockedOn      string            `json:"blocked_on,omitempty"`
	LastSeq        uint64            `json:"last_seq"`
	Lease          *Lease            `json:"lease,omitempty"`
	Dispatch       *Dispatch         `json:"dispatch,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	UpdatedAt      time.Time         `json:"updated_at"`
}

// ExecutionList is the answer of GET /v0/executions. NextCursor is empty on
// the last page; pass it as ?cursor= for the next one.
type ExecutionList struct {
	Executions []Execution `json:"executions"`
	NextCursor string      `json:"next_cursor"`
}

// Event is one row of an execution's log.
type Event struct {
	ExecutionID string          `json:"execution_id"`
	Seq         uint64          `json:"seq"`
	Type        string          `json:"type"`
	Time        time.Time       `json:"time"`
	Payload     json.RawMessage `json:"payload"`
}

// EventList is the answer of GET /v0/executions/{id}/events.
type EventList struct {
	Events []Event `json:"events"`
}

// ---- agent routes ----

// StepSubmitRequest is the body of POST /v0/executions/{id}/steps.
type StepSubmitRequest struct {
	// Kind is tool_call, llm_call or local.
	Kind string `json:"kind"`
	// Target is the tool name, model id or local name.
	Target string `json:"target"`
	// Args is any JSON value; it is canonicalised for the step id (docs/identity.md).
	Args json.RawMessage `json:"args,omitempty"`
	// Idempotency is safe_to_retry or at_most_once (default by kind).
	Idempotency string `json:"idempotency,omitempty"`
	// Effect is read_only, local_mutation, remote_mutation, destructive or empty.
	Effect string `json:"effect,omitempty"`
	// Reconcile says the submitter can reconcile the step if it is found
	// interrupted: it is then answered DecisionInterrupted.
	Reconcile bool `json:"reconcile,omitempty"`
	// Result is a local step's value, submitted with it: a step allowed to
	// run is recorded succeeded with it in the same commit and answered
	// replay with the value; a step already recorded answers its recorded
	// value. Refused with any other kind.
	Result json.RawMessage `json:"result,omitempty"`
}

// ReconcileRequest is the body of POST …/steps/{step_id}/reconcile: what
// became of an interrupted step. Outcome is ReconcileContinue (run it
// again), ReconcileCompleted (it happened; Result is its result),
// ReconcileConflict (the execution fails reconcile_conflict, Detail says
// why) or ReconcileApproval (an operator decides).
type ReconcileRequest struct {
	Outcome string          `json:"outcome"`
	Result  json.RawMessage `json:"result,omitempty"`
	Detail  string          `json:"detail,omitempty"`
}

// StepProbeRequest is the body of POST /v0/executions/{id}/probe: a step
// without its arguments.
type StepProbeRequest struct {
	Kind        string `json:"kind"`
	Target      string `json:"target"`
	Effect      string `json:"effect,omitempty"`
	Idempotency string `json:"idempotency,omitempty"`
}

// StepProbe is the answer of a probe: whether policy denies the step
// whatever its arguments (false when the policy cannot tell). Nothing is
// recorded.
type StepProbe struct {
	DeniedOutright bool `json:"denied_outright"`
}

// SessionRequest is the body of POST /v0/sessions: an execution that the
// calling API key's own loop drives (no webhook).
type SessionRequest struct {
	AgentID      string            `json:"agent_id"`
	Input        json.RawMessage   `json:"input,omitempty"`
	AgentVersion string            `json:"agent_version,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Limits       *Limits           `json:"limits,omitempty"`
	Deadline     *time.Time        `json:"deadline,omitempty"`
}

// Session is the answer of POST /v0/sessions and POST
// /v0/executions/{id}/attach: the execution and the lease the caller now
// holds. Send DispatchID and DispatchAttempt as HeaderDispatchID and
// HeaderDispatchAttempt on every mutation, and heartbeat before LeaseUntil.
type Session struct {
	Execution       Execution `json:"execution"`
	DispatchID      string    `json:"dispatch_id"`
	DispatchAttempt int       `json:"dispatch_attempt"`
	LeaseUntil      time.Time `json:"lease_until"`
}

// StepDecision is the answer of a step submission (HTTP 200 for every
// decision, rate_limited included).
type StepDecision struct {
	Decision   string          `json:"decision"`
	StepID     string          `json:"step_id,omitempty"`
	Occurrence int             `json:"occurrence"`
	Result     json.RawMessage `json:"result,omitempty"`
	Error      json.RawMessage `json:"error,omitempty"`
	Reason     string          `json:"reason,omitempty"`
	RuleID     string          `json:"rule_id,omitempty"`
	ApprovalID string          `json:"approval_id,omitempty"`
}

// Usage is what a completed step consumed.
type Usage struct {
	InputTokens  int64   `json:"input_tokens,omitempty"`
	OutputTokens int64   `json:"output_tokens,omitempty"`
	TotalTokens  int64   `json:"total_tokens,omitempty"`
	CostUSD      float64 `json:"cost_usd,omitempty"`
}

// StepCompleteRequest is the body of POST .../steps/{step_id}/complete.
type StepCompleteRequest struct {
	Result json.RawMessage `json:"result,omitempty"`
	Usage  *Usage          `json:"usage,omitempty"`
}

// StepFailRequest is the body of POST .../steps/{step_id}/fail.
type StepFailRequest struct {
	Error json.RawMessage `json:"error,omitempty"`
}

// BundleRef names the bundle revision that produced a decision.
type BundleRef struct {
	Name     string `json:"name"`
	Revision string `json:"revision"`
	Digest   string `json:"sha256"`
	Engine   string `json:"engine"`
}

// StepVerdict is the recorded policy verdict of a step: the action and
// what produced it.
type StepVerdict struct {
	Action   string    `json:"action"`
	Reason   string    `json:"reason,omitempty"`
	RuleID   string    `json:"rule_id,omitempty"`
	Bundle   BundleRef `json:"bundle"`
	EvalTime int64     `json:"eval_ns"`
}

// Step is a step as the API shows it.
type Step struct {
	ID          string          `json:"id"`
	ExecutionID string          `json:"execution_id"`
	Kind        string          `json:"kind"`
	Target      string          `json:"target"`
	Args        json.RawMessage `json:"args"`
	ArgsHash    string          `json:"args_hash"`
	Occurrence  int             `json:"occurrence"`
	Idempotency string          `json:"idempotency"`
	Effect      string          `json:"effect,omitempty"`
	Status      string          `json:"status"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       json.RawMessage `json:"error,omitempty"`
	Usage       *Usage          `json:"usage,omitempty"`
	Lease       *Lease          `json:"lease,omitempty"`
	Verdict     *StepVerdict    `json:"decision,omitempty"`
	ApprovalID  string          `json:"approval_id,omitempty"`
	Seq         uint64          `json:"seq"`
	CreatedAt   time.Time       `json:"created_at"`
	CompletedAt *time.Time      `json:"completed_at,omitempty"`
}

// StepList is the answer of GET /v0/executions/{id}/steps.
type StepList struct {
	Steps []Step `json:"steps"`
	// NextCursor, when set, is the cursor of the next page
	// (GET …/steps?cursor=); empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// StreamDelta is the body of POST .../steps/{step_id}/stream: one ephemeral
// piece of a step's live output, fanned out to the execution's SSE
// subscribers and never stored.
type StreamDelta struct {
	Seq  int64           `json:"seq"`
	Data json.RawMessage `json:"data"`
}

// StreamDeltaAccepted is the answer (202) of a stream delta: how many SSE
// subscribers it was handed to.
type StreamDeltaAccepted struct {
	Subscribers int `json:"subscribers"`
}

// StepDeltaEvent is the data of an SSE "step.delta" event.
type StepDeltaEvent struct {
	ExecutionID string          `json:"execution_id"`
	StepID      string          `json:"step_id"`
	Seq         int64           `json:"seq"`
	Data        json.RawMessage `json:"data"`
}

// HeartbeatResponse is the answer of POST /v0/executions/{id}/heartbeat.
// LeaseUntil is null while the dispatch is parked on an approval (no timer runs).
type HeartbeatResponse struct {
	LeaseUntil *time.Time `json:"lease_until"`
}

// ExecutionCompleteRequest is the body of POST /v0/executions/{id}/complete.
type ExecutionCompleteRequest struct {
	Output json.RawMessage `json:"output,omitempty"`
}

// ExecutionFailRequest is the body of POST /v0/executions/{id}/fail.
type ExecutionFailRequest struct {
	Error json.RawMessage `json:"error,omitempty"`
}

// WebhookPayload is the body of the webhook the kernel POSTs to an agent,
// signed with the agent's secret in HeaderSignature.
type WebhookPayload struct {
	ExecutionID     string `json:"execution_id"`
	DispatchID      string `json:"dispatch_id"`
	DispatchAttempt int    `json:"dispatch_attempt"`
	// LLMGatewayToken authenticates the attempt's model calls to the
	// kernel's LLM gateway (/llm/...): present when the kernel serves it,
	// valid while this attempt holds the lease.
	LLMGatewayToken string `json:"llm_gateway_token,omitempty"`
}

// ---- admin routes ----

// AgentRequest is the body of POST /v0/agents (an upsert). On update an
// omitted Secret keeps the stored one, and an omitted Policy/Bundle keeps
// the current binding; "" unbinds.
type AgentRequest struct {
	ID         string `json:"id"`
	WebhookURL string `json:"webhook_url"`
	Secret     string `json:"secret,omitempty"`
	// Policy names the bundle the agent is bound to; Bundle is an alias.
	Policy *string `json:"policy,omitempty"`
	Bundle *string `json:"bundle,omitempty"`
	// Signing is SigningV1 or SigningBody; empty keeps an existing agent's
	// scheme and gives a new agent SigningV1.
	Signing string `json:"signing,omitempty"`
	// OnInterrupted is OnInterruptedIndeterminate (the default) or
	// OnInterruptedApproval; omitted keeps an existing agent's.
	OnInterrupted *string `json:"on_interrupted,omitempty"`
}

// Agent is an agent as the API shows it: never with its secret.
type Agent struct {
	ID         string `json:"id"`
	Tenant     string `json:"tenant"`
	WebhookURL string `json:"webhook_url"`
	Bundle     string `json:"bundle,omitempty"`
	// Signing is the agent's scheme: SigningV1 or SigningBody.
	Signing string `json:"signing"`
	// OnInterrupted is what an at_most_once step found in flight becomes.
	OnInterrupted string `json:"on_interrupted"`
	// GateOnly is true for an agent without a webhook: its executions are
	// sessions.
	GateOnly  bool      `json:"gate_only,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// AgentList is the answer of GET /v0/agents.
type AgentList struct {
	Agents []Agent `json:"agents"`
}

// PolicyRequest is the body of POST /v0/policies/{agent_id}: native YAML rules.
type PolicyRequest struct {
	Bundle string `json:"bundle"`
}

// PolicyResponse is the answer of POST /v0/policies/{agent_id}.
type PolicyResponse struct {
	AgentID string `json:"agent_id"`
	Bundle  Bundle `json:"bundle"`
}

// BundleFilesRequest is the JSON form of PUT /v0/bundles/{name}: files by
// path, as text (Files) or base64 (FilesBase64, for binaries such as
// policy.wasm). Engine must match bundle.yaml's; without a bundle.yaml a
// minimal one is made from the name and Engine, with a revision derived
// from the files (the first 12 hex digits of a sha256 over them) unless
// .manifest names one. Without bundle.yaml and Engine (an OPA bundle), the
// loader names the bundle after the URL and infers the engine from the files.
type BundleFilesRequest struct {
	Engine      string            `json:"engine,omitempty"`
	Files       map[string]string `json:"files,omitempty"`
	FilesBase64 map[string]string `json:"files_base64,omitempty"`
}

// Bundle is a stored bundle's metadata (GET ?archive=1 returns the .tar.gz).
// Owner is BundleOwnerAdmin or BundleOwnerTenant.
type Bundle struct {
	Tenant    string    `json:"tenant"`
	Name      string    `json:"name"`
	Revision  string    `json:"revision"`
	Digest    string    `json:"sha256"`
	Engine    string    `json:"engine"`
	Owner     string    `json:"owner"`
	Size      int       `json:"size"`
	UpdatedAt time.Time `json:"updated_at"`
	// Source is the bundle server the bundle is pulled from, if any.
	Source *BundleSource `json:"source,omitempty"`
}

// BundleSource is the body of PUT /v0/bundles/{name}/source: a bundle
// server URL (OPA's bundle service protocol) and the random delay between
// polls (Go durations, at least 1s; default 60s and 120s).
type BundleSource struct {
	URL      string `json:"url"`
	MinDelay string `json:"min_delay,omitempty"`
	MaxDelay string `json:"max_delay,omitempty"`
}

// BundleList is the answer of GET /v0/bundles.
type BundleList struct {
	Bundles []Bundle `json:"bundles"`
}

// EvalStep is the step of a policy dry run.
type EvalStep struct {
	Kind        string          `json:"kind"`
	Target      string          `json:"target"`
	Args        json.RawMessage `json:"args,omitempty"`
	Effect      string          `json:"effect,omitempty"`
	Idempotency string          `json:"idempotency,omitempty"`
}

// PolicyEvalRequest is the body of POST /v0/policy/eval.
type PolicyEvalRequest struct {
	AgentID string            `json:"agent_id"`
	Step    EvalStep          `json:"step"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// ApprovalConfig is the approval part of a require_approval answer.
type ApprovalConfig struct {
	Approvers []string `json:"approvers,omitempty"`
	Timeout   string   `json:"timeout,omitempty"`
	Message   string   `json:"message,omitempty"`
}

// RateLimit is a rate limit a decision carries.
type RateLimit struct {
	ID             string `json:"id,omitempty"`
	MaxCalls       int    `json:"max_calls"`
	Window         string `json:"window"`
	Per            string `json:"per,omitempty"`
	Algorithm      string `json:"algorithm,omitempty"`
	OnLimiterError string `json:"on_limiter_error,omitempty"`
}

// PolicyEvalResponse is the answer of a policy dry run: the verdict (the
// action, and which bundle and rule produced it). Nothing is recorded.
type PolicyEvalResponse struct {
	// Action is allow, deny, require_approval or abort.
	Action     string          `json:"decision"`
	Reason     string          `json:"reason,omitempty"`
	RuleID     string          `json:"rule_id,omitempty"`
	Bundle     BundleRef       `json:"bundle"`
	EvalTimeNS int64           `json:"eval_ns"`
	Approval   *ApprovalConfig `json:"approval,omitempty"`
	RateLimits []RateLimit     `json:"rate_limits,omitempty"`
}

// Approval is an approval as the API shows it.
type Approval struct {
	ID          string          `json:"id"`
	Tenant      string          `json:"tenant"`
	ExecutionID string          `json:"execution_id"`
	AgentID     string          `json:"agent_id"`
	StepID      string          `json:"step_id"`
	Kind        string          `json:"kind"`
	Target      string          `json:"target"`
	Args        json.RawMessage `json:"args"`
	// Type is ApprovalPolicy or ApprovalInterrupted.
	Type        string `json:"type"`
	RequestHash string `json:"request_hash"`
	// Status is pending, granted, denied, expired or happened.
	Status string `json:"status"`
	// Result is the result given with "happened".
	Result    json.RawMessage `json:"result,omitempty"`
	Approvers []string        `json:"approvers,omitempty"`
	// Guard names the tenant's guard bundle that asked for the approval;
	// only keys the admin issued decide it.
	Guard     string    `json:"guard,omitempty"`
	Message   string    `json:"message,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	RuleID    string    `json:"rule_id,omitempty"`
	ExpiresAt time.Time `json:"expires_at"`
	// DecidedBy is who decided: the deciding key's principal, or the person
	// an admin key decided for; DecidedByKey and DecidedByPrincipal are the
	// key that decided and its principal.
	DecidedBy          string     `json:"decided_by,omitempty"`
	DecidedByKey       string     `json:"decided_by_key,omitempty"`
	DecidedByPrincipal string     `json:"decided_by_principal,omitempty"`
	Rationale          string     `json:"rationale,omitempty"`
	CreatedAt          time.Time  `json:"created_at"`
	DecidedAt          *time.Time `json:"decided_at,omitempty"`
}

// ApprovalList is the answer of GET /v0/approvals.
type ApprovalList struct {
	Approvals []Approval `json:"approvals"`
	// NextCursor, when set, is the cursor of the next page
	// (GET /v0/approvals?cursor=); empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// ResolveApprovalRequest is the body of POST /v0/approvals/{id}/grant,
// .../deny, and for an interrupted_side_effect approval .../retry (grant)
// and .../happened (with Result, recorded as the step's result). The decider is the key's principal: DecidedBy may be left out;
// naming anyone else is 403, except with an admin key, which decides for
// the person it names (the record keeps both). RequestHash, when given, must
// equal the approval's.
type ResolveApprovalRequest struct {
	DecidedBy   string `json:"decided_by,omitempty"`
	Rationale   string `json:"rationale,omitempty"`
	RequestHash string `json:"request_hash,omitempty"`
	// Result is the effect's result (happened only).
	Result json.RawMessage `json:"result,omitempty"`
}

// ---- tenants ----

// TenantRequest is the body of POST /v0/tenants. Guards must name
// admin-owned bundles of the tenant, which a new tenant does not have yet:
// set them later with PUT /v0/tenants/{id}.
type TenantRequest struct {
	ID     string   `json:"id"`
	Guards []string `json:"guards,omitempty"`
	// Retention is how long the tenant's terminal executions are kept
	// (a Go duration such as "720h"; "0s" forever; omitted: the kernel's).
	Retention string `json:"retention,omitempty"`
}

// TenantUpdateRequest is the body of PUT /v0/tenants/{t}: the tenant's
// guard bundles, which replace the current ones (an empty list removes
// them), and its retention; at least one is required. Each guard must name
// a bundle of that tenant that the admin owns.
type TenantUpdateRequest struct {
	Guards *[]string `json:"guards"`
	// Retention, when present, replaces how long the tenant's ended
	// executions are kept ("720h"; "0s" forever; "" the kernel's).
	Retention *string `json:"retention,omitempty"`
}

// Tenant is a tenant as the API shows it.
type Tenant struct {
	ID        string    `json:"id"`
	Guards    []string  `json:"guards,omitempty"`
	Retention string    `json:"retention,omitempty"`
	CreatedAt time.Time `json:"created_at,omitzero"`
}

// TenantList is the answer of GET /v0/tenants.
type TenantList struct {
	Tenants []Tenant `json:"tenants"`
}

// KeyRequest is the body of POST /v0/tenants/{t}/keys.
type KeyRequest struct {
	Role      string `json:"role"`
	Principal string `json:"principal"`
}

// CreatedKey is the answer of POST /v0/tenants/{t}/keys. Key is the secret:
// it is shown this once and stored only as a hash.
type CreatedKey struct {
	KeyID     string    `json:"key_id"`
	Key       string    `json:"key"`
	Role      string    `json:"role"`
	Principal string    `json:"principal"`
	Tenant    string    `json:"tenant"`
	CreatedAt time.Time `json:"created_at"`
}

// Key is an API key as listed: never its secret or hash.
type Key struct {
	KeyID     string    `json:"key_id"`
	Role      string    `json:"role"`
	Principal string    `json:"principal"`
	Tenant    string    `json:"tenant"`
	CreatedAt time.Time `json:"created_at"`
}

// KeyList is the answer of GET /v0/tenants/{t}/keys.
type KeyList struct {
	Keys []Key `json:"keys"`
}

// ---- open routes ----

// Status is the answer of GET /v0/health ("ok") and GET /v0/ready ("ready").
type Status struct {
	Status string `json:"status"`
}

// Whoami is the answer of GET /v0/whoami: who the key is, the tenant the
// request acts in (an admin key's ?tenant=), and the routes ("METHOD
// /v0/path/{var}") its role may call. Key routes of a tenant-admin are
// further held to its own tenant, and agent routes to the session a key
// holds.
type Whoami struct {
	Role      string   `json:"role"`
	Tenant    string   `json:"tenant"`
	KeyTenant string   `json:"key_tenant"`
	KeyID     string   `json:"key_id"`
	Principal string   `json:"principal"`
	Routes    []string `json:"routes"`
}
