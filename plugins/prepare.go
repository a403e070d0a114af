package plugins

import (
	"context"
	"fmt"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// Prepared is a loaded bundle checked against the host's ceilings and
// compiled by its engine, with the rate limits its manifest declares: a
// bundle as the kernel takes it in. [Host.Prepare] makes one.
type Prepared struct {
	// Bundle is the loaded bundle.
	Bundle *bundle.Bundle
	// Sandbox is what the bundle runs with under the host's Limits: its
	// manifest's sandbox values, the defaults filled in.
	Sandbox bundle.Effective

	ev     policy.Evaluator
	def    policy.Action
	limits []declaredLimit
}

// Prepare checks a loaded bundle's manifest against the host's Limits,
// compiles the bundle with the engine its manifest names and compiles its
// manifest's rate limits. It is the one check every way a bundle comes in
// shares after the loader ([bundle.Options.LoadFiles] and its siblings):
// uploads, the provisioning manifest and pulled downloads (through
// [Host.Compile], which also reserves the tenant's wasm memory), and
// `wicket policy build`, `inspect`, `eval` and `test`. So a bundle the CLI
// accepts is a bundle a kernel with the same ceilings accepts.
//
// Engines report every problem they find (a [bundle.Errors] when there are
// several). Close the result when done.
func (h *Host) Prepare(ctx context.Context, b *bundle.Bundle) (*Prepared, error) {
	return h.prepare(ctx, b, nil)
}

// prepare is [Host.Prepare]; admit, when set, is called with the bundle's
// sandbox values before the engine compiles it, and refuses the bundle by
// returning an error (Compile reserves the tenant's memory there). When a
// later step fails, prepare has already closed what it compiled, and the
// caller undoes what admit did.
func (h *Host) prepare(ctx context.Context, b *bundle.Bundle, admit func(bundle.Effective) error) (*Prepared, error) {
	eff, err := h.opts.Limits.Apply(&b.Manifest)
	if err != nil {
		return nil, err
	}
	p := &Prepared{Bundle: b, Sandbox: eff, def: b.DefaultAction()}
	for _, ml := range b.Manifest.RateLimits {
		dl := declaredLimit{rule: kernel.RateLimitRule{ID: b.Manifest.Name + "/" + ml.ID, RateLimit: ml.RateLimit}, kind: ml.StepKind}
		for _, t := range ml.Targets {
			g, err := bundle.CompileGlob(t)
			if err != nil {
				return nil, fmt.Errorf("bundle %q: rate_limits %s: %w", b.Manifest.Name, ml.ID, err)
			}
			dl.targets = append(dl.targets, g)
		}
		p.limits = append(p.limits, dl)
	}
	if admit != nil {
		if err := admit(eff); err != nil {
			return nil, err
		}
	}
	if p.ev, err = h.CompileBundle(ctx, b); err != nil {
		return nil, err
	}
	return p, nil
}

// Close releases the compiled bundle.
func (p *Prepared) Close() error { return p.ev.Close() }

// Evaluator returns the engine's evaluator of the bundle.
func (p *Prepared) Evaluator() policy.Evaluator { return p.ev }

// evaluate is the engine's answer, checked: nil when nothing matched.
func (p *Prepared) evaluate(ctx context.Context, in *policy.Input) (*policy.Answer, error) {
	a, err := p.ev.Evaluate(ctx, in)
	if err == nil {
		err = a.Validate()
	}
	if err != nil {
		return nil, err
	}
	return a, nil
}

// declared returns the manifest's rate limits that apply to in.
func (p *Prepared) declared(in *policy.Input) []kernel.RateLimitRule {
	var out []kernel.RateLimitRule
	for _, dl := range p.limits {
		if dl.matches(in) {
			out = append(out, dl.rule)
		}
	}
	return out
}

// Outcome is what a bundle alone decides for an input: what the kernel
// decides for an agent bound to the bundle, with no tenant guard.
type Outcome struct {
	// Answer is the answer after default_action; when Err is set, the
	// denial the kernel records (rule_id engine_error).
	Answer policy.Answer
	// Matched reports whether the engine answered (a rule matched); when
	// false, Answer is the default action's.
	Matched bool
	// RateLimits are the limits the step would be counted against, ids
	// prefixed with the bundle name: the answer's own first (bundle/rule_id),
	// then the manifest's that match the step (bundle/id).
	RateLimits []kernel.RateLimitRule
	// Err is why the engine failed to answer.
	Err error
}

// Decide evaluates in as the kernel does for an agent bound to the bundle.
func (p *Prepared) Decide(ctx context.Context, in *policy.Input) Outcome {
	ref := p.Bundle.Ref()
	a, err := p.evaluate(ctx, in)
	if err != nil {
		return Outcome{Answer: policy.Answer{Action: policy.Deny, Reason: engineFailure(ref, err), RuleID: "engine_error"}, Err: err}
	}
	o := Outcome{Matched: a != nil}
	if a != nil && a.RateLimit != nil {
		o.RateLimits = append(o.RateLimits, kernel.RateLimitRule{ID: ref.Name + "/" + orRule(a.RuleID), RateLimit: *a.RateLimit})
	}
	o.RateLimits = append(o.RateLimits, p.declared(in)...)
	o.Answer = *policy.ApplyDefault(a, p.def, in.Step.Kind)
	return o
}
