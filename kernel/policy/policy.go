// Package policy is the contract between the kernel and policy engines.
//
// # Basics
//
// Every engine (native rules, OPA Rego, wazero modules) receives the same
// [Input] document for a submitted step and gives an optional [Answer]: nil
// means "no rule matched", otherwise the answer's [Action] (allow, deny,
// require_approval, abort) with its reason, rule and settings. The policy
// host composes the answers of several bundles with [Combine] (abort > deny >
// require_approval > allow) and applies the bundle's default_action with
// [ApplyDefault].
//
// # Names
//
// An engine gives an Answer, whose Action is what policy wants. The kernel
// turns the composed answer into a verdict (the action with the bundle and
// rule that produced it) and the verdict into the decision it sends the agent
// (proceed, denied, blocked, ...). The JSON field of an answer's action is
// "decision", as the policy ABI has always called it.
//
// This package imports only the standard library so that the kernel, the
// engines and the SDK copies of these structs can all depend on it.
package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Action is what a policy answers for a step.
type Action string

// The actions a policy may answer, from least to most restrictive.
const (
	Allow           Action = "allow"
	RequireApproval Action = "require_approval"
	Deny            Action = "deny"
	Abort           Action = "abort"
)

// Rank orders actions by restrictiveness; unknown actions rank as Deny so that
// a malformed answer can never be more permissive than a denial.
func (a Action) Rank() int {
	switch a {
	case Allow:
		return 0
	case RequireApproval:
		return 1
	case Deny:
		return 2
	case Abort:
		return 3
	default:
		return 2
	}
}

// Valid reports whether a is one of the four known actions.
func (a Action) Valid() bool {
	switch a {
	case Allow, RequireApproval, Deny, Abort:
		return true
	}
	return false
}

// Step kinds (docs/README.md).
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

// ValidEffect reports whether e is a side-effect class a step may declare
// (or empty: none declared).
func ValidEffect(e string) bool {
	switch e {
	case "", EffectReadOnly, EffectLocalMutation, EffectRemoteMutation, EffectDestructive:
		return true
	}
	return false
}

// Idempotency classes of a step (kernel.Idempotency holds their meaning).
const (
	SafeToRetry = "safe_to_retry"
	AtMostOnce  = "at_most_once"
)

// DefaultIdempotency is the idempotency of a step of this kind submitted
// without one, as the input document shows it: at_most_once for a tool
// call, safe_to_retry otherwise.
func DefaultIdempotency(kind string) string {
	if kind == KindToolCall {
		return AtMostOnce
	}
	return SafeToRetry
}

// NoLabels is the labels of an execution created without any, as the input
// document shows them: {} (not null), so that a policy may count or walk
// them. It is shared: engines only read it.
var NoLabels = map[string]string{}

// LabelsOrNone returns labels, or [NoLabels] when they are nil.
func LabelsOrNone(labels map[string]string) map[string]string {
	if labels == nil {
		return NoLabels
	}
	return labels
}

// Step is the step part of the input document.
type Step struct {
	Kind        string          `json:"kind"`
	Target      string          `json:"target"`
	Args        json.RawMessage `json:"args"`
	ArgsHash    string          `json:"args_hash"`
	Idempotency string          `json:"idempotency"`
	Effect      string          `json:"effect"`
	Occurrence  int             `json:"occurrence"`
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

// Input is the document every engine evaluates (docs/policy.md).
type Input struct {
	Tenant      string    `json:"tenant"`
	AgentID     string    `json:"agent_id"`
	ExecutionID string    `json:"execution_id"`
	Step        Step      `json:"step"`
	Execution   Execution `json:"execution"`
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

// Rate-limit scopes.
const (
	PerExecution = "execution"
	PerAgent     = "agent"
	PerTenant    = "tenant"
)

// RateLimit attaches a durable rate limit to an answer.
type RateLimit struct {
	// MaxCalls is how many calls the window admits (> 0).
	MaxCalls int `json:"max_calls"`
	// Window is a Go duration string ("1m").
	Window string `json:"window"`
	// Per is the scope the counter is kept for: execution (default), agent or tenant.
	Per string `json:"per,omitempty"`
	// Algorithm is "sliding" (default) or "fixed".
	Algorithm string `json:"algorithm,omitempty"`
	// OnLimiterError is "fail_closed" (default) or "fail_open".
	OnLimiterError string `json:"on_limiter_error,omitempty"`
}

// Answer is an engine's answer for one step. A nil *Answer means no match.
type Answer struct {
	Action    Action     `json:"decision"`
	Reason    string     `json:"reason,omitempty"`
	RuleID    string     `json:"rule_id,omitempty"`
	Approval  *Approval  `json:"approval,omitempty"`
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
}

// Ceilings on the text of an answer, which is recorded with every step it
// decides (and answered to the agent): a bundle's answer may not turn a
// small step into a large record.
const (
	// MaxReasonBytes bounds Answer.Reason and Approval.Message.
	MaxReasonBytes = 4096
	// MaxRuleIDBytes bounds Answer.RuleID and each of Approval.Approvers.
	MaxRuleIDBytes = 256
	// MaxApprovers bounds Approval.Approvers.
	MaxApprovers = 100
)

// Validate checks an engine's answer; engines call it on untrusted output.
func (d *Answer) Validate() error {
	if d == nil {
		return nil
	}
	if !d.Action.Valid() {
		return fmt.Errorf("unknown decision %q (want allow, deny, require_approval or abort)", d.Action)
	}
	if len(d.Reason) > MaxReasonBytes {
		return fmt.Errorf("reason is %d bytes; at most %d", len(d.Reason), MaxReasonBytes)
	}
	if len(d.RuleID) > MaxRuleIDBytes {
		return fmt.Errorf("rule_id is %d bytes; at most %d", len(d.RuleID), MaxRuleIDBytes)
	}
	if a := d.Approval; a != nil {
		if len(a.Message) > MaxReasonBytes {
			return fmt.Errorf("approval.message is %d bytes; at most %d", len(a.Message), MaxReasonBytes)
		}
		if len(a.Approvers) > MaxApprovers {
			return fmt.Errorf("approval.approvers lists %d; at most %d", len(a.Approvers), MaxApprovers)
		}
		for i, n := range a.Approvers {
			if len(n) > MaxRuleIDBytes {
				return fmt.Errorf("approval.approvers[%d] is %d bytes; at most %d", i, len(n), MaxRuleIDBytes)
			}
		}
	}
	if d.Approval != nil && d.Approval.Timeout != "" {
		if _, err := time.ParseDuration(d.Approval.Timeout); err != nil {
			return fmt.Errorf("approval.timeout: %w", err)
		}
	}
	if rl := d.RateLimit; rl != nil {
		if rl.MaxCalls <= 0 {
			return fmt.Errorf("rate_limit.max_calls must be > 0")
		}
		w, err := time.ParseDuration(rl.Window)
		if err != nil || w <= 0 {
			return fmt.Errorf("rate_limit.window must be a positive duration, got %q", rl.Window)
		}
		switch rl.Per {
		case "", PerExecution, PerAgent, PerTenant:
		default:
			return fmt.Errorf("rate_limit.per must be execution, agent or tenant, got %q", rl.Per)
		}
		switch rl.Algorithm {
		case "", "sliding", "fixed":
		default:
			return fmt.Errorf("rate_limit.algorithm must be sliding or fixed, got %q", rl.Algorithm)
		}
		switch rl.OnLimiterError {
		case "", "fail_open", "fail_closed":
		default:
			return fmt.Errorf("rate_limit.on_limiter_error must be fail_open or fail_closed, got %q", rl.OnLimiterError)
		}
	}
	return nil
}

// Evaluator is one compiled bundle revision.
//
// Evaluate must be deterministic for a given input and bundle revision, safe
// for concurrent use, and must honour ctx's deadline. It returns (nil, nil)
// when nothing matched. An error means the engine could not answer (a trap, a
// timeout, malformed output); the kernel then denies the step (fail closed)
// with the error's text as the reason.
type Evaluator interface {
	Evaluate(ctx context.Context, in *Input) (*Answer, error)
	// Close releases the evaluator's resources. Evaluate must not be called after.
	Close() error
}

// BundleRef identifies the bundle revision that produced a decision.
type BundleRef struct {
	Name     string `json:"name"`
	Revision string `json:"revision"`
	Digest   string `json:"sha256"`
	Engine   string `json:"engine"`
}

// Combine returns the most restrictive of the given answers (abort > deny >
// require_approval > allow), ignoring nils; it returns nil when all are nil.
// Among equally restrictive answers the first wins. It is the one
// implementation of that rule; [Strictest] gives its index.
func Combine(as ...*Answer) *Answer {
	if i := Strictest(as); i >= 0 {
		return as[i]
	}
	return nil
}

// Strictest returns the index of the answer [Combine] picks, or -1 when every
// answer is nil. Callers that keep something beside each answer (the bundle
// it came from) use the index to find it.
func Strictest(as []*Answer) int {
	best := -1
	for i, a := range as {
		if a == nil {
			continue
		}
		if best < 0 || a.Action.Rank() > as[best].Action.Rank() {
			best = i
		}
	}
	return best
}

// ApplyDefault turns "no match" into the bundle's default action. An
// unmatched local step is always allowed whatever defaultAction says. An empty
// defaultAction means deny.
func ApplyDefault(d *Answer, defaultAction Action, stepKind string) *Answer {
	if d != nil {
		return d
	}
	if stepKind == KindLocal {
		return &Answer{Action: Allow, Reason: "unmatched local step", RuleID: "default_action"}
	}
	if defaultAction == "" {
		defaultAction = Deny
	}
	return &Answer{Action: defaultAction, Reason: "no rule matched: default_action " + string(defaultAction), RuleID: "default_action"}
}
