package kernel

import (
	"encoding/json"

	"github.com/wicket-run/wicket/kernel/policy"
)

// Typed payloads of the events every step writes (the rarer events use
// maps). Each names step_id, kind and target (docs/durability.md).

type stepRef struct {
	StepID string `json:"step_id"`
	Kind   string `json:"kind"`
	Target string `json:"target"`
}

func refOf(s *Step) stepRef { return stepRef{StepID: s.ID, Kind: s.Kind, Target: s.Target} }

// proposedPayload is step.proposed.
type proposedPayload struct {
	stepRef
	ArgsHash        string      `json:"args_hash"`
	Occurrence      int         `json:"occurrence"`
	Idempotency     Idempotency `json:"idempotency"`
	Effect          string      `json:"effect"`
	DispatchID      string      `json:"dispatch_id"`
	DispatchAttempt int         `json:"dispatch_attempt"`
}

// verdictPayload is step.allowed, step.denied, step.rate_limited and
// step.awaiting_approval: the verdict and what produced it.
type verdictPayload struct {
	stepRef
	Decision    policy.Action    `json:"decision"`
	Reason      string           `json:"reason"`
	RuleID      string           `json:"rule_id"`
	Bundle      policy.BundleRef `json:"bundle"`
	Engine      string           `json:"engine"`
	EvalNS      int64            `json:"eval_ns"`
	RateLimitID string           `json:"rate_limit_id,omitempty"`
	ApprovalID  string           `json:"approval_id,omitempty"`
}

func verdictOf(s *Step, v *Verdict) verdictPayload {
	return verdictPayload{stepRef: refOf(s), Decision: v.Action, Reason: v.Reason, RuleID: v.RuleID,
		Bundle: v.Bundle, Engine: v.Bundle.Engine, EvalNS: v.EvalTime.Nanoseconds()}
}

// executingPayload is step.executing: the lease the step runs under, and
// why it runs again when it does (an orphan re-run, a granted approval).
type executingPayload struct {
	stepRef
	DispatchID      string `json:"dispatch_id"`
	DispatchAttempt int    `json:"dispatch_attempt"`
	OrphanedFrom    *Lease `json:"orphaned_from,omitempty"`
	ApprovalID      string `json:"approval_id,omitempty"`
}

// outcomePayload is step.succeeded and step.failed reported by the agent.
type outcomePayload struct {
	stepRef
	Error json.RawMessage `json:"error,omitempty"`
	Usage *Usage          `json:"usage,omitempty"`
}
