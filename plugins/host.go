// Package plugins is the policy engine host: it loads bundles, compiles
// them with the engine their manifest names, swaps revisions in atomically,
// and decides steps for the kernel (it implements kernel.Policy and
// kernel.BundleLoader).
//
// # Basics
//
//	host := plugins.NewHost(plugins.Options{}, rules.New(), rego.New(), wasm.New(cfg))
//	k.SetPolicy(host)
//	k.SetBundleLoader(host)
//
// # Decisions
//
// For a step, the tenant's guard bundles and then the agent's bundle are
// evaluated; the most restrictive answer wins (abort > deny >
// require_approval > allow). When nothing matched, the agent bundle's
// default_action applies (an unmatched local step is always allowed). An
// engine that fails to answer (a trap, a timeout, bad output) denies the
// step with the reason (fail closed); so does a bundle that is not loaded.
package plugins

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// Engine compiles bundles of one kind into evaluators.
type Engine interface {
	// Name is the manifest's engine value (rules, rego, wasm).
	Name() string
	// Compile validates and prepares a bundle; it must not keep b's files
	// beyond what it needs.
	Compile(ctx context.Context, b *bundle.Bundle) (policy.Evaluator, error)
}

// Options configure a Host.
type Options struct {
	// DefaultPolicy applies to agents bound to no bundle: "allow" (default),
	// "deny", or the name of a bundle of the agent's tenant.
	DefaultPolicy string
	// Guards returns a tenant's guard bundles (nil: none).
	Guards func(ctx context.Context, tenant string) ([]string, error)
	// BundleKeys returns the keys that verify a tenant's bundle signatures
	// (the kernel's and the tenant's). With any key, an unsigned or
	// tampered bundle is refused; nil or none: signatures are not checked.
	BundleKeys func(ctx context.Context, tenant string) ([]bundle.Key, error)
}

// Host implements kernel.Policy and kernel.BundleLoader.
type Host struct {
	engines map[string]Engine
	opts    Options

	mu   sync.RWMutex
	live map[string]*loaded // tenant\x00name
}

var (
	_ kernel.Policy       = (*Host)(nil)
	_ kernel.BundleLoader = (*Host)(nil)
)

// loaded is one live bundle revision.
type loaded struct {
	b      *bundle.Bundle
	ev     policy.Evaluator
	ref    policy.BundleRef
	def    policy.Action
	limits []declaredLimit

	// use is held for reading during evaluations and for writing by the
	// closer, so a replaced revision is closed only after its last evaluation.
	use    sync.RWMutex
	closed bool
}

type declaredLimit struct {
	rule    kernel.RateLimitRule
	targets []*bundle.Glob
	kind    string
}

// KernelAndTenantKeys makes an Options.BundleKeys of the kernel's keys and
// each tenant's own (tenant returns them, e.g. Kernel.TenantBundleKeys). A
// tenant key may not reuse a kernel key's id: its bundles are then refused
// with an error saying so, rather than verified against the wrong key.
func KernelAndTenantKeys(kernelKeys []bundle.Key, tenant func(ctx context.Context, tenant string) ([]kernel.BundleKey, error)) func(context.Context, string) ([]bundle.Key, error) {
	return func(ctx context.Context, t string) ([]bundle.Key, error) {
		keys := append([]bundle.Key(nil), kernelKeys...)
		if tenant == nil {
			return keys, nil
		}
		tk, err := tenant(ctx, t)
		if err != nil {
			return nil, err
		}
		for _, k := range tk {
			for _, kk := range kernelKeys {
				if kk.ID == k.ID {
					return nil, fmt.Errorf("tenant %s has a bundle key with id %q, which is also a kernel key's id: rename one", t, k.ID)
				}
			}
			keys = append(keys, bundle.Key{ID: k.ID, Algorithm: k.Algorithm, Key: k.Key, Scope: k.Scope})
		}
		return keys, nil
	}
}

// NewHost builds a host with the given engines. A duplicate engine name panics.
func NewHost(opts Options, engines ...Engine) *Host {
	h := &Host{engines: map[string]Engine{}, opts: opts, live: map[string]*loaded{}}
	for _, e := range engines {
		if _, dup := h.engines[e.Name()]; dup {
			panic("plugins: duplicate engine " + e.Name())
		}
		h.engines[e.Name()] = e
	}
	return h
}

// Engines returns the registered engine names.
func (h *Host) Engines() []string {
	out := make([]string, 0, len(h.engines))
	for n := range h.engines {
		out = append(out, n)
	}
	return out
}

// CompileBundle compiles an already loaded bundle with its engine.
func (h *Host) CompileBundle(ctx context.Context, b *bundle.Bundle) (policy.Evaluator, error) {
	e, ok := h.engines[b.Manifest.Engine]
	if !ok {
		return nil, fmt.Errorf("bundle %q: engine %q is not available in this kernel", b.Manifest.Name, b.Manifest.Engine)
	}
	ev, err := e.Compile(ctx, b)
	if err != nil {
		return nil, fmt.Errorf("bundle %q rev %s: %w", b.Manifest.Name, b.Manifest.Revision, err)
	}
	return ev, nil
}

// Compile implements kernel.BundleLoader.
func (h *Host) Compile(ctx context.Context, tenant string, src kernel.BundleSource) (*kernel.CompiledBundle, error) {
	var b *bundle.Bundle
	var err error
	opts := bundle.Options{Name: src.Name}
	if h.opts.BundleKeys != nil {
		keys, err := h.opts.BundleKeys(ctx, tenant)
		if err != nil {
			return nil, fmt.Errorf("cannot read the bundle verification keys: %w", err)
		}
		opts.Keys = keys
	}
	switch {
	case src.Archive != nil:
		b, err = opts.LoadTarGz(bytes.NewReader(src.Archive))
	case src.Files != nil:
		b, err = opts.LoadFiles(src.Files)
	default:
		return nil, fmt.Errorf("empty bundle")
	}
	if err != nil {
		return nil, err
	}
	ev, err := h.CompileBundle(ctx, b)
	if err != nil {
		return nil, err
	}
	archive, err := b.TarGz()
	if err != nil {
		_ = ev.Close()
		return nil, fmt.Errorf("bundle %q: archive: %w", b.Manifest.Name, err)
	}
	l := &loaded{b: b, ev: ev, ref: b.Ref(), def: b.DefaultAction()}
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
		l.limits = append(l.limits, dl)
	}
	return &kernel.CompiledBundle{Ref: l.ref, Archive: archive, Handle: l}, nil
}

// Activate implements kernel.BundleLoader: the compiled bundle replaces the
// live revision of the same name atomically; the old one is closed after
// its in-flight evaluations finish.
func (h *Host) Activate(tenant string, cb *kernel.CompiledBundle) {
	l := cb.Handle.(*loaded)
	key := tenant + "\x00" + l.ref.Name
	h.mu.Lock()
	old := h.live[key]
	h.live[key] = l
	h.mu.Unlock()
	if old != nil && old != l {
		go old.close()
	}
}

// Remove implements kernel.BundleLoader.
func (h *Host) Remove(tenant, name string) {
	key := tenant + "\x00" + name
	h.mu.Lock()
	old := h.live[key]
	delete(h.live, key)
	h.mu.Unlock()
	if old != nil {
		go old.close()
	}
}

func (l *loaded) close() {
	l.use.Lock()
	defer l.use.Unlock()
	if !l.closed {
		l.closed = true
		_ = l.ev.Close()
	}
}

// Close closes every live bundle.
func (h *Host) Close() {
	h.mu.Lock()
	all := h.live
	h.live = map[string]*loaded{}
	h.mu.Unlock()
	for _, l := range all {
		l.close()
	}
}

// Live returns the identity of a live bundle.
func (h *Host) Live(tenant, name string) (policy.BundleRef, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	l, ok := h.live[tenant+"\x00"+name]
	if !ok {
		return policy.BundleRef{}, false
	}
	return l.ref, true
}

// RulesBundle implements kernel.BundleLoader: native YAML rules become a
// rules bundle whose revision is derived from the rules' content.
func (h *Host) RulesBundle(name string, rulesYAML []byte) (kernel.BundleSource, error) {
	if len(bytes.TrimSpace(rulesYAML)) == 0 {
		return kernel.BundleSource{}, fmt.Errorf("the policy is empty")
	}
	sum := sha256.Sum256(rulesYAML)
	manifest := fmt.Sprintf("name: %s\nrevision: %q\nengine: rules\n", name, hex.EncodeToString(sum[:])[:12])
	return kernel.BundleSource{Files: map[string][]byte{"bundle.yaml": []byte(manifest), "rules.yaml": rulesYAML}}, nil
}

// get returns a live bundle held for evaluation; release it with done.
func (h *Host) get(tenant, name string) (*loaded, func()) {
	for {
		h.mu.RLock()
		l := h.live[tenant+"\x00"+name]
		h.mu.RUnlock()
		if l == nil {
			return nil, func() {}
		}
		l.use.RLock()
		if !l.closed {
			return l, l.use.RUnlock
		}
		l.use.RUnlock() // replaced meanwhile: look again
	}
}

// answer is one bundle's contribution.
type answer struct {
	d   *policy.Decision
	ref policy.BundleRef
}

// Decide implements kernel.Policy.
func (h *Host) Decide(ctx context.Context, agent *kernel.Agent, in *policy.Input) (kernel.PolicyResult, error) {
	start := time.Now()
	var guards []string
	if h.opts.Guards != nil {
		g, err := h.opts.Guards(ctx, in.Tenant)
		if err != nil {
			return failClosed(kernel.DefaultBundleRef, fmt.Sprintf("cannot read the tenant's guard bundles: %v", err), start), nil
		}
		guards = g
	}
	agentBundle := agent.Bundle
	if agentBundle == "" {
		switch h.opts.DefaultPolicy {
		case "", "allow", "deny":
			if len(guards) == 0 {
				res, _ := kernel.DefaultPolicy{Action: policy.Action(orAllow(h.opts.DefaultPolicy))}.Decide(ctx, agent, in)
				res.EvalTime = time.Since(start)
				return res, nil
			}
		default:
			agentBundle = h.opts.DefaultPolicy
		}
	}
	var answers []answer
	var limits []kernel.RateLimitRule
	onInterrupted := "" // approval when an evaluated bundle asks for it
	eval := func(name string) (*loaded, *kernel.PolicyResult) {
		l, done := h.get(in.Tenant, name)
		defer done()
		if l == nil {
			r := failClosed(policy.BundleRef{Name: name}, fmt.Sprintf("bundle %q is not loaded (fail closed)", name), start)
			return nil, &r
		}
		d, err := l.ev.Evaluate(ctx, in)
		if err == nil {
			err = d.Validate()
		}
		if err != nil {
			r := failClosed(l.ref, fmt.Sprintf("%s bundle %q failed (fail closed): %v", l.ref.Engine, name, err), start)
			return nil, &r
		}
		if d != nil {
			answers = append(answers, answer{d: d, ref: l.ref})
		}
		if l.b.Manifest.OnInterrupted == bundle.OnInterruptedApproval {
			onInterrupted = kernel.OnInterruptedApproval
		}
		for _, dl := range l.limits {
			if dl.matches(in) {
				limits = append(limits, dl.rule)
			}
		}
		return l, nil
	}
	for _, g := range guards {
		if _, fail := eval(g); fail != nil {
			return *fail, nil
		}
	}
	var agentLoaded *loaded
	if agentBundle != "" {
		l, fail := eval(agentBundle)
		if fail != nil {
			return *fail, nil
		}
		agentLoaded = l
	}
	var best *answer
	for i := range answers {
		if best == nil || answers[i].d.Decision.Rank() > best.d.Decision.Rank() {
			best = &answers[i]
		}
	}
	res := kernel.PolicyResult{}
	switch {
	case best != nil:
		res.Decision, res.Bundle = *best.d, best.ref
		if rl := best.d.RateLimit; rl != nil {
			limits = append([]kernel.RateLimitRule{{ID: best.ref.Name + "/" + orRule(best.d.RuleID), RateLimit: *rl}}, limits...)
		}
	case agentLoaded != nil:
		res.Decision, res.Bundle = *policy.ApplyDefault(nil, agentLoaded.def, in.Step.Kind), agentLoaded.ref
	default: // only guards, none matched: the kernel default applies
		d, _ := kernel.DefaultPolicy{Action: policy.Action(orAllow(h.opts.DefaultPolicy))}.Decide(ctx, agent, in)
		res.Decision, res.Bundle = d.Decision, d.Bundle
	}
	res.RateLimits = limits
	res.OnInterrupted = onInterrupted
	res.EvalTime = time.Since(start)
	return res, nil
}

func (dl declaredLimit) matches(in *policy.Input) bool {
	if dl.kind != "" && dl.kind != in.Step.Kind {
		return false
	}
	if len(dl.targets) == 0 {
		return true
	}
	for _, g := range dl.targets {
		if g.Match(in.Step.Target) {
			return true
		}
	}
	return false
}

func failClosed(ref policy.BundleRef, reason string, start time.Time) kernel.PolicyResult {
	return kernel.PolicyResult{Decision: policy.Decision{Decision: policy.Deny, Reason: reason, RuleID: "engine_error"}, Bundle: ref, EvalTime: time.Since(start)}
}

func orAllow(s string) string {
	if s == "" {
		return "allow"
	}
	return s
}

func orRule(s string) string {
	if s == "" {
		return "rate_limit"
	}
	return s
}

// outrightDenier is an evaluator that can tell, without the arguments,
// that it denies a step whatever they are (the rules engine can; Rego and
// wasm cannot, and are never said to).
type outrightDenier interface {
	DeniesOutright(in *policy.Input, def policy.Action) bool
}

// DeniesOutright reports whether the policy deciding agent's steps denies
// a step like in (its arguments ignored) whatever its arguments are: the
// tenant's guards and the agent's bundle are composed as Decide composes
// them, so one of them denying outright is enough. Bundles whose engine
// cannot tell count as not denying. It implements kernel.OutrightDenier.
func (h *Host) DeniesOutright(ctx context.Context, agent *kernel.Agent, in *policy.Input) (bool, error) {
	var guards []string
	if h.opts.Guards != nil {
		g, err := h.opts.Guards(ctx, in.Tenant)
		if err != nil {
			return false, err
		}
		guards = g
	}
	agentBundle := agent.Bundle
	if agentBundle == "" {
		switch h.opts.DefaultPolicy {
		case "", "allow", "deny":
			if len(guards) == 0 {
				d := kernel.DefaultPolicy{Action: policy.Action(orAllow(h.opts.DefaultPolicy))}
				res, _ := d.Decide(ctx, agent, in)
				return res.Decision.Decision.Rank() >= policy.Deny.Rank(), nil
			}
		default:
			agentBundle = h.opts.DefaultPolicy
		}
	}
	denies := func(name string, def policy.Action) bool {
		l, done := h.get(in.Tenant, name)
		defer done()
		if l == nil {
			return true // a bundle that is not loaded fails closed
		}
		od, ok := l.ev.(outrightDenier)
		return ok && od.DeniesOutright(in, def)
	}
	for _, g := range guards {
		if denies(g, "") {
			return true, nil
		}
	}
	if agentBundle != "" {
		l, done := h.get(in.Tenant, agentBundle)
		def := policy.Deny
		if l != nil {
			def = l.def
		}
		done()
		return denies(agentBundle, def), nil
	}
	return false, nil
}
