package kernel

import (
	"encoding/json"
	"strconv"

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

// The payloads above are encoded by hand, byte for byte as encoding/json
// would encode them (TestPayloadEncodingMatchesJSON compares the two):
// four of them are written on every step, and reflection was a visible
// share of a step's CPU. A field that is rare or awkward (a nested lease,
// usage, an error) falls back to encoding/json for that payload.

// appendJSONString appends s as encoding/json quotes it. Strings of
// printable ASCII without characters it escapes are copied; any other is
// left to encoding/json (HTML escapes, control characters, invalid UTF-8).
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func appendField(b []byte, name, v string) []byte {
	b = append(b, name...)
	return appendJSONString(b, v)
}

func (r *stepRef) appendJSON(b []byte) []byte {
	b = appendField(b, `{"step_id":`, r.StepID)
	b = appendField(b, `,"kind":`, r.Kind)
	return appendField(b, `,"target":`, r.Target)
}

func (p *proposedPayload) appendJSON(b []byte) ([]byte, bool) {
	b = p.stepRef.appendJSON(b)
	b = appendField(b, `,"args_hash":`, p.ArgsHash)
	b = strconv.AppendInt(append(b, `,"occurrence":`...), int64(p.Occurrence), 10)
	b = appendField(b, `,"idempotency":`, string(p.Idempotency))
	b = appendField(b, `,"effect":`, p.Effect)
	b = appendField(b, `,"dispatch_id":`, p.DispatchID)
	b = strconv.AppendInt(append(b, `,"dispatch_attempt":`...), int64(p.DispatchAttempt), 10)
	return append(b, '}'), true
}

func (p *verdictPayload) appendJSON(b []byte) ([]byte, bool) {
	b = p.stepRef.appendJSON(b)
	b = appendField(b, `,"decision":`, string(p.Decision))
	b = appendField(b, `,"reason":`, p.Reason)
	b = appendField(b, `,"rule_id":`, p.RuleID)
	b = appendField(b, `,"bundle":{"name":`, p.Bundle.Name)
	b = appendField(b, `,"revision":`, p.Bundle.Revision)
	b = appendField(b, `,"sha256":`, p.Bundle.Digest)
	b = appendField(b, `,"engine":`, p.Bundle.Engine)
	b = appendField(b, `},"engine":`, p.Engine)
	b = strconv.AppendInt(append(b, `,"eval_ns":`...), p.EvalNS, 10)
	if p.RateLimitID != "" {
		b = appendField(b, `,"rate_limit_id":`, p.RateLimitID)
	}
	if p.ApprovalID != "" {
		b = appendField(b, `,"approval_id":`, p.ApprovalID)
	}
	return append(b, '}'), true
}

func (p *executingPayload) appendJSON(b []byte) ([]byte, bool) {
	if p.OrphanedFrom != nil {
		return b, false
	}
	b = p.stepRef.appendJSON(b)
	b = appendField(b, `,"dispatch_id":`, p.DispatchID)
	b = strconv.AppendInt(append(b, `,"dispatch_attempt":`...), int64(p.DispatchAttempt), 10)
	if p.ApprovalID != "" {
		b = appendField(b, `,"approval_id":`, p.ApprovalID)
	}
	return append(b, '}'), true
}

func (p *outcomePayload) appendJSON(b []byte) ([]byte, bool) {
	if len(p.Error) > 0 || p.Usage != nil {
		return b, false
	}
	return append(p.stepRef.appendJSON(b), '}'), true
}

// encodePayload encodes an event payload: by hand for the step payloads,
// with encoding/json for the rest.
func encodePayload(v any) ([]byte, error) {
	b := make([]byte, 0, 256)
	ok := false
	switch p := v.(type) {
	case proposedPayload:
		b, ok = p.appendJSON(b)
	case verdictPayload:
		b, ok = p.appendJSON(b)
	case executingPayload:
		b, ok = p.appendJSON(b)
	case outcomePayload:
		b, ok = p.appendJSON(b)
	}
	if ok {
		return b, nil
	}
	return json.Marshal(v)
}
