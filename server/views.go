package server

import (
	"math"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/server/wire"
)

// The API never sends kernel types as they are: these views fix the wire
// shape and keep secrets (agent secrets, key hashes, bundle archives) out.

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func leaseView(l kernel.Lease) *wire.Lease {
	if l == (kernel.Lease{}) {
		return nil
	}
	return &wire.Lease{DispatchID: l.DispatchID, Attempt: l.Attempt}
}

func limitsView(l kernel.Limits) wire.Limits {
	return wire.Limits{
		MaxSteps: l.MaxSteps, MaxLLMCalls: l.MaxLLMCalls, MaxOutputTokensPerCall: l.MaxOutputTokensPerCall,
		MaxTotalTokens: l.MaxTotalTokens, MaxCostUSD: l.MaxCostUSD, MaxDuration: l.MaxDuration,
		MaxConsecutiveFailures: l.MaxConsecutiveFailures, MaxLoopRepetitions: l.MaxLoopRepetitions,
	}
}

func limitsFromWire(l *wire.Limits) kernel.Limits {
	if l == nil {
		return kernel.Limits{}
	}
	return kernel.Limits{
		MaxSteps: l.MaxSteps, MaxLLMCalls: l.MaxLLMCalls, MaxOutputTokensPerCall: l.MaxOutputTokensPerCall,
		MaxTotalTokens: l.MaxTotalTokens, MaxCostUSD: l.MaxCostUSD, MaxDuration: l.MaxDuration,
		MaxConsecutiveFailures: l.MaxConsecutiveFailures, MaxLoopRepetitions: l.MaxLoopRepetitions,
	}
}

func executionView(e *kernel.Execution) wire.Execution {
	v := wire.Execution{
		ID: e.ID, Tenant: e.Tenant, AgentID: e.AgentID, AgentVersion: e.AgentVersion, Status: string(e.Status),
		Input: e.Input, Output: e.Output, Error: e.Error, Reason: e.Reason, Labels: e.Labels,
		Limits: limitsView(e.Limits),
		// min: a total stored as +Inf before the kernel saturated sums
		// (kernel.addCost) would make the answer unencodable.
		Totals:   wire.Totals{Steps: e.Totals.Steps, LLMCalls: e.Totals.LLMCalls, Tokens: e.Totals.Tokens, CostUSD: min(e.Totals.CostUSD, math.MaxFloat64)},
		Deadline: e.Deadline, IdempotencyKey: e.IdempotencyKey, BlockedOn: e.BlockedOn, LastSeq: e.LastSeq,
		Lease: leaseView(e.Lease), CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt,
	}
	if d := e.Dispatch; d != (kernel.DispatchState{}) {
		v.Dispatch = &wire.Dispatch{ID: d.ID, Attempt: d.Attempt, State: string(d.State), DueAt: timePtr(d.DueAt), LeaseUntil: timePtr(d.LeaseUntil)}
	}
	return v
}

func eventView(e kernel.Event) wire.Event {
	return wire.Event{ExecutionID: e.ExecutionID, Seq: e.Seq, Type: string(e.Type), Time: e.Time, Payload: e.Payload}
}

func bundleRefView(b policy.BundleRef) wire.BundleRef {
	return wire.BundleRef{Name: b.Name, Revision: b.Revision, Digest: b.Digest, Engine: b.Engine}
}

func usageView(u *kernel.Usage) *wire.Usage {
	if u == nil {
		return nil
	}
	return &wire.Usage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, TotalTokens: u.TotalTokens, CostUSD: u.CostUSD}
}

func stepView(s *kernel.Step) wire.Step {
	v := wire.Step{
		ID: s.ID, ExecutionID: s.ExecutionID, Kind: s.Kind, Target: s.Target, Args: s.Args, ArgsHash: s.ArgsHash,
		Occurrence: s.Occurrence, Idempotency: string(s.Idempotency), Effect: s.Effect, Status: string(s.Status),
		Result: s.Result, Error: s.Error, Usage: usageView(s.Usage), Lease: leaseView(s.Lease),
		ApprovalID: s.ApprovalID, Seq: s.Seq, CreatedAt: s.CreatedAt, CompletedAt: s.CompletedAt,
	}
	if d := s.Verdict; d != nil {
		v.Verdict = &wire.StepVerdict{Action: string(d.Action), Reason: d.Reason, RuleID: d.RuleID,
			Bundle: bundleRefView(d.Bundle), EvalTime: d.EvalTime.Nanoseconds()}
	}
	return v
}

func decisionView(d *kernel.StepDecision) wire.StepDecision {
	return wire.StepDecision{Decision: string(d.Decision), StepID: d.StepID, Occurrence: d.Occurrence, Result: d.Result,
		Error: d.Error, Reason: d.Reason, RuleID: d.RuleID, ApprovalID: d.ApprovalID}
}

func agentView(a *kernel.Agent) wire.Agent {
	oi := a.OnInterrupted
	if oi == "" {
		oi = kernel.OnInterruptedIndeterminate
	}
	return wire.Agent{ID: a.ID, Tenant: a.Tenant, WebhookURL: a.WebhookURL, Bundle: a.Bundle, Signing: a.SigningScheme(),
		OnInterrupted: oi, GateOnly: a.GateOnly(), CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}
}

func bundleView(b *kernel.BundleRecord) wire.Bundle {
	v := wire.Bundle{Tenant: b.Tenant, Name: b.Name, Revision: b.Revision, Digest: b.Digest, Engine: b.Engine, Owner: string(b.OwnedBy()),
		Size: len(b.Archive), UpdatedAt: b.UpdatedAt}
	if s := b.Source; s != nil {
		v.Source = &wire.BundleSource{URL: s.URL, MinDelay: s.MinDelay, MaxDelay: s.MaxDelay}
	}
	return v
}

func approvalView(a *kernel.Approval) wire.Approval {
	return wire.Approval{
		ID: a.ID, Tenant: a.Tenant, ExecutionID: a.ExecutionID, AgentID: a.AgentID, StepID: a.StepID, Kind: a.Kind,
		Target: a.Target, Args: a.Args, Type: approvalType(a), RequestHash: a.RequestHash, Status: string(a.Status), Result: a.Result, Approvers: a.Approvers, Guard: a.Guard,
		Message: a.Message, Reason: a.Reason, RuleID: a.RuleID, ExpiresAt: a.ExpiresAt, DecidedBy: a.DecidedBy,
		DecidedByKey: a.DecidedByKey, DecidedByPrincipal: a.DecidedByPrincipal,
		Rationale: a.Rationale, CreatedAt: a.CreatedAt, DecidedAt: a.DecidedAt,
	}
}

// approvalType is an approval's type as the API shows it (stored empty for
// a policy's approval).
func approvalType(a *kernel.Approval) string {
	if a.Type == "" {
		return kernel.ApprovalPolicy
	}
	return a.Type
}

// sessionView is an execution with the lease its caller now holds.
func sessionView(e *kernel.Execution) wire.Session {
	return wire.Session{Execution: executionView(e), DispatchID: e.Lease.DispatchID, DispatchAttempt: e.Lease.Attempt,
		LeaseUntil: e.Dispatch.LeaseUntil.UTC()}
}

func tenantView(t *kernel.Tenant) wire.Tenant {
	return wire.Tenant{ID: t.ID, Guards: t.Guards, Retention: t.Retention, CreatedAt: t.CreatedAt}
}

func keyView(k *kernel.APIKey) wire.Key {
	return wire.Key{KeyID: k.ID, Role: k.Role, Principal: k.Principal, Tenant: k.Tenant, CreatedAt: k.CreatedAt}
}

func evalView(r *kernel.Verdict) wire.PolicyEvalResponse {
	v := wire.PolicyEvalResponse{Action: string(r.Action), Reason: r.Reason, RuleID: r.RuleID,
		Bundle: bundleRefView(r.Bundle), EvalTimeNS: r.EvalTime.Nanoseconds()}
	if a := r.Approval; a != nil {
		v.Approval = &wire.ApprovalConfig{Approvers: a.Approvers, Timeout: a.Timeout, Message: a.Message}
	}
	for _, rl := range r.RateLimits {
		v.RateLimits = append(v.RateLimits, wire.RateLimit{ID: rl.ID, MaxCalls: rl.MaxCalls, Window: rl.Window,
			Per: rl.Per, Algorithm: rl.Algorithm, OnLimiterError: rl.OnLimiterError})
	}
	return v
}

// mapSlice converts a slice of kernel records into views (never nil, so
// lists encode as [] rather than null).
func mapSlice[T, V any](in []T, f func(T) V) []V {
	out := make([]V, 0, len(in))
	for _, x := range in {
		out = append(out, f(x))
	}
	return out
}
