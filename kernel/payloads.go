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
	ArgsHash        string `json:"args_hash"`
	Occurrence      int    `json:"occurrence"`
	Idempotency     string `json:"idempotency"`
	Effect          string `json:"effect"`
	DispatchID      string `json:"dispatch_id"`
	DispatchAttempt int    `json:"dispatch_attempt"`
}

// decisionPayload is step.allowed, step.denied, step.rate_limited and
// step.awaiting_approval: the
// decision and what produced it.
type decisionPayload struct {
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

func decisionOf(s *Step, info *StepDecisionInfo) decisionPayload {
	return decisionPayload{stepRef: refOf(s), Decision: info.Action, Reason: info.Reason, RuleID: info.RuleID,
		Bundle: info.Bundle, Engine: info.Bundle.Engine, EvalNS: info.EvalTime.Nanoseconds()}
}

// executingPayload is step.executing on a step's first proceed.
type executingPayload struct {
	stepRef
	DispatchID      string `json:"dispatch_id"`
	DispatchAttempt int    `json:"dispatch_attempt"`
}

// outcomePayload is step.succeeded and step.failed reported by the agent.
type outcomePayload struct {
	stepRef
	Error json.RawMessage `json:"error,omitempty"`
	Usage *Usage          `json:"usage,omitempty"`
}
