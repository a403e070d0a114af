package plugins

import (
	"context"
	"fmt"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// Prepared is a loaded bundle compiled by its engine, with the rate limits
// its manifest declares: a bundle as the kernel takes it in. [Host.Prepare]
// makes one.
type Prepared struct {
	// Bundle is the loaded bundle.
	Bundle *bundle.Bundle

	ev     policy.Evaluator
	def    policy.Action
	limits []declaredLimit
}

// Prepare compiles a loaded bundle with the engine its manifest names and
// compiles its manifest's rate limits. It is the one check every way a
// bundle comes in shares after the loader ([bundle.Options.LoadFiles] and
// its siblings): uploads, the provisioning manifest and pulled downloads
// (through [Host.Compile]), and `wicket policy build`, `inspect`, `eval`
// and `test`. So a bundle the CLI accepts is a bundle the kernel accepts.
//
// Engines report every problem they find (a [bundle.Errors] when there are
// several). Close the result when done.
func (h *Host) Prepare(ctx context.Context, b *bundle.Bundle) (*Prepared, error) {
	ev, err := h.CompileBundle(ctx, b)
	if err != nil {
		return nil, err
	}
	p := &Prepared{Bundle: b, ev: ev, def: b.DefaultAction()}
	for _, ml := range b.Manifest.RateLimits {
		dl := declaredLimit{rule: kernel.RateLimitRule{ID: b.Manifest.Name + "/" + ml.ID, RateLimit: ml.RateLimit}, kind: ml.StepKind}
		for _, t := range ml.Targets {
			g, err := bundle.CompileGlob(t)
			if err != nil {
				_ = ev.Close()
				return nil, fmt.Errorf("bundle %q: rate_limits %s: %w", b.Manifest.Name, ml.ID, err)
			}
			dl.targets = append(dl.targets, g)
		}
		p.limits = append(p.limits, dl)
	}
	return p, nil
}

// Close releases the compiled bundle.
func (p *Prepared) Close() error { return p.ev.Close() }

// Evaluator returns the engine's evaluator of the bundle.
func (p *Prepared) Evaluator() policy.Evaluator { return p.ev }

// evaluate is the engine's answer, checked: nil when nothing matched.
func (p *Prepared) evaluate(ctx context.Context, in *policy.Input) (*policy.Decision, error) {
	d, err := p.ev.Evaluate(ctx, in)
	if err == nil {
		err = d.Validate()
	}
	if err != nil {
		return nil, err
	}
	return d, nil
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

// Answer is what a bundle alone decides for an input: what the kernel
// decides for an agent bound to the bundle, with no tenant guard.
type Answer struct {
	// Decision is the decision after default_action; when Err is set, the
	// denial the kernel records (rule_id engine_error).
	Decision policy.Decision
	// Matched reports whether the engine answered (a rule matched); when
	// false, Decision is the default action's.
	Matched bool
	// RateLimits are the limits the step would be counted against, ids
	// prefixed with the bundle name: the answer's own first (bundle/rule_id),
	// then the manifest's that match the step (bundle/id).
	RateLimits []kernel.RateLimitRule
	// Err is why the engine failed to answer.
	Err error
}

// Decide evaluates in as the kernel does for an agent bound to the bundle.
func (p *Prepared) Decide(ctx context.Context, in *policy.Input) Answer {
	ref := p.Bundle.Ref()
	d, err := p.evaluate(ctx, in)
	if err != nil {
		return Answer{Decision: failClosedDecision(ref, err), Err: err}
	}
	a := Answer{Matched: d != nil}
	if d != nil && d.RateLimit != nil {
		a.RateLimits = append(a.RateLimits, kernel.RateLimitRule{ID: ref.Name + "/" + orRule(d.RuleID), RateLimit: *d.RateLimit})
	}
	a.RateLimits = append(a.RateLimits, p.declared(in)...)
	a.Decision = *policy.ApplyDefault(d, p.def, in.Step.Kind)
	return a
}
