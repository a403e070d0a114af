package policy

import (
	"encoding/json"
	"fmt"
)

// Allow returns an allow decision with the given reason.
func Allow(reason string) *Decision { return &Decision{Decision: ActionAllow, Reason: reason} }

// Deny returns a deny decision with the given reason.
func Deny(reason string) *Decision { return &Decision{Decision: ActionDeny, Reason: reason} }

// RequireApproval returns a require_approval decision with the given reason.
func RequireApproval(reason string) *Decision {
	return &Decision{Decision: ActionRequireApproval, Reason: reason}
}

// Abort returns an abort decision (the execution fails with policy_abort).
func Abort(reason string) *Decision { return &Decision{Decision: ActionAbort, Reason: reason} }

// WithRule sets the decision's rule_id and returns d.
func (d *Decision) WithRule(id string) *Decision {
	d.RuleID = id
	return d
}

// WithApproval sets the approval configuration and returns d.
func (d *Decision) WithApproval(a Approval) *Decision {
	d.Approval = &a
	return d
}

// WithRateLimit attaches a rate limit and returns d.
func (d *Decision) WithRateLimit(rl RateLimit) *Decision {
	d.RateLimit = &rl
	return d
}

// Arg returns the raw JSON value of the argument key when Args is an object
// that has it.
func (s *Step) Arg(key string) (json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(s.Args, &m); err != nil {
		return nil, false
	}
	v, ok := m[key]
	return v, ok
}

// StringArg returns the argument key when it is a JSON string, and "" with
// false otherwise.
func (s *Step) StringArg(key string) (string, bool) {
	raw, ok := s.Arg(key)
	if !ok || len(raw) == 0 || raw[0] != '"' { // null, numbers, objects… are not strings
		return "", false
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", false
	}
	return v, true
}

// DecodeArgs unmarshals Args into v.
func (s *Step) DecodeArgs(v any) error {
	if len(s.Args) == 0 {
		return fmt.Errorf("step has no args")
	}
	if err := json.Unmarshal(s.Args, v); err != nil {
		return fmt.Errorf("decode step args: %w", err)
	}
	return nil
}
