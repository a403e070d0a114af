package policy

import (
	"encoding/json"
	"time"
)

// Action is what a policy answers for a step.
type Action string

// The actions a policy may answer, from least to most restrictive.
const (
	ActionAllow           Action = "allow"
	ActionRequireApproval Action = "require_approval"
	ActionDeny            Action = "deny"
	ActionAbort           Action = "abort"
)

// Step kinds.
const (
	KindToolCall = "tool_call"
	KindLLMCall  = "llm_call"
	KindLocal    = "local"
)

// Side-effect classes an agent may declare for a step.
const (
	EffectReadOnly       = "read_only"
	EffectLocalMutation  = "local_mutation"
	EffectRemoteMutation = "remote_mutation"
	EffectDestructive    = "destructive"
)

// Rate-limit scopes.
const (
	PerExecution = "execution"
	PerAgent     = "agent"
	PerTenant    = "tenant"
)

// Input is the document a policy evaluates (docs/policy.md).
type Input struct {
	Tenant      string    `json:"tenant"`
	AgentID     string    `json:"agent_id"`
	ExecutionID string    `json:"execution_id"`
	Step        Step      `json:"step"`
	Execution   Execution `json:"execution"`
}

// Step is the step being decided.
type Step struct {
	// Kind is tool_call, llm_call or local.
	Kind string `json:"kind"`
	// Target is the tool name, model id or local name.
	Target string `json:"target"`
	// Args are the step's arguments as JSON (usually an object).
	Args json.RawMessage `json:"args"`
	// ArgsHash is the hash of the canonical arguments.
	ArgsHash string `json:"args_hash"`
	// Idempotency is the agent's idempotency key, if any.
	Idempotency string `json:"idempotency"`
	// Effect is the declared side-effect class (EffectReadOnly …), or empty.
	Effect string `json:"effect"`
	// Occurrence counts identical steps within the execution (1 for the first).
	Occurrence int `json:"occurrence"`
}

// Totals are the running totals of an execution.
type Totals struct {
	Steps    int64   `json:"steps"`
	LLMCalls int64   `json:"llm_calls"`
	Tokens   int64   `json:"tokens"`
	CostUSD  float64 `json:"cost_usd"`
}

// Execution is the read-only view of the execution a policy sees.
type Execution struct {
	Status    string            `json:"status"`
	Labels    map[string]string `json:"labels"`
	Totals    Totals            `json:"totals"`
	CreatedAt time.Time         `json:"created_at"`
}

// Approval configures a require_approval answer.
type Approval struct {
	// Approvers, when set, lists who may grant or deny.
	Approvers []string `json:"approvers,omitempty"`
	// Timeout is a Go duration string ("15m"); empty means the kernel default.
	Timeout string `json:"timeout,omitempty"`
	// Message is shown to the approver.
	Message string `json:"message,omitempty"`
}

// RateLimit attaches a durable rate limit to an answer.
type RateLimit struct {
	// MaxCalls is how many calls the window admits (> 0).
	MaxCalls int `json:"max_calls"`
	// Window is a Go duration string ("1m").
	Window string `json:"window"`
	// Per is execution (default), agent or tenant.
	Per string `json:"per,omitempty"`
	// Algorithm is "sliding" (default) or "fixed".
	Algorithm string `json:"algorithm,omitempty"`
	// OnLimiterError is "fail_closed" (default) or "fail_open".
	OnLimiterError string `json:"on_limiter_error,omitempty"`
}

// Decision is a policy's answer. A nil *Decision means no match.
type Decision struct {
	Decision  Action     `json:"decision"`
	Reason    string     `json:"reason,omitempty"`
	RuleID    string     `json:"rule_id,omitempty"`
	Approval  *Approval  `json:"approval,omitempty"`
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
}
