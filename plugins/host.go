// Package plugins is the policy engine host: it loads bundles, compiles
// them with the engine their manifest names, swaps revisions in atomically,
// and decides steps for the kernel (it implements kernel.Policy and
// kernel.BundleLoader).
//
// # Basics
//
//	host := plugins.NewHost(plugins.Options{}, rules.New(), rego.New(), wasm.New(cfg))
//	k, err := kernel.New(store, deliverer, host, host, kernel.Config{})
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
	"strings"
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

// tenantKey carries the tenant of a Compile to the engine.
type tenantKey struct{}

// WithTenant returns ctx carrying the tenant a bundle is compiled for. The
// host sets it in Compile; engines that isolate tenants from each other
// (plugins/worker) read it with [TenantFrom].
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// TenantFrom returns the tenant set by [WithTenant], or "" when none is.
func TenantFrom(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

// Options configure a Host.
type Options struct {
	// DefaultPolicy applies to agents bound to no bundle: "allow" (default),
	// "deny", or the name of a bundle of the agent's tenant.
	DefaultPolicy string
	// BundleKeys are the kernel's bundle verification keys
	// (--bundle-verification-key); a tenant's own keys come with each bundle
	// to compile (kernel.BundleSource.TenantKeys). With any key, an unsigned
	// or tampered bundle is refused; with none, signatures are not checked.
	BundleKeys []bundle.Key
	// Limits are the kernel's ceilings on what a manifest may ask for; give
	// the engines the same value. A bundle over a ceiling is refused at
	// Compile, and so is a wasm bundle that would take its tenant's
	// reserved wasm memory past Limits.TenantMemory (zero: the defaults of
	// bundle.Limits).
	Limits bundle.Limits
}

// Host implements kernel.Policy and kernel.BundleLoader.
type Host struct {
	engines map[string]Engine
	opts    Options

	mu   sync.RWMutex
	live map[string]*loaded // tenant\x00name
	// open holds every compiled revision not closed yet (live, about to
	// be activated, or replaced with evaluations in flight), by tenant: the
	// wasm memory they reserve is what Limits.TenantMemory bounds.
	open map[string]map[*loaded]struct{}
	// failed holds why a stored bundle did not load at boot, until it is
	// replaced or removed (tenant\x00name).
	failed map[string]string
}

var (
	_ kernel.Policy       = (*Host)(nil)
	_ kernel.BundleLoader = (*Host)(nil)
)

// loaded is one live bundle revision.
type loaded struct {
	*Prepared
	ref policy.BundleRef

	// tenant and reserved (wasm memory: cap × pool size) are for the
	// tenant's memory account.
	tenant   string
	reserved int64
	host     *Host

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

// verificationKeys are the keys that verify a tenant's bundles: the
// kernel's and the tenant's own. A tenant key may not reuse a kernel key's
// id: its bundles are then refused with an error saying so, rather than
// verified against the wrong key.
func verificationKeys(kernelKeys []bundle.Key, tenant string, tenantKeys []kernel.BundleKey) ([]bundle.Key, error) {
	keys := append([]bundle.Key(nil), kernelKeys...)
	for _, k := range tenantKeys {
		for _, kk := range kernelKeys {
			if kk.ID == k.ID {
				return nil, fmt.Errorf("tenant %s has a bundle key with id %q, which is also a kernel key's id: rename one", tenant, k.ID)
			}
		}
		keys = append(keys, bundle.Key{ID: k.ID, Algorithm: k.Algorithm, Key: k.Key, Scope: k.Scope})
	}
	return keys, nil
}

// NewHost builds a host with the given engines. A duplicate engine name panics.
func NewHost(opts Options, engines ...Engine) *Host {
	opts.Limits = opts.Limits.WithDefaults()
	h := &Host{engines: map[string]Engine{}, opts: opts, live: map[string]*loaded{}, open: map[string]map[*loaded]struct{}{}, failed: map[string]string{}}
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

// Compile implements kernel.BundleLoader. Besides the engine's checks it
// refuses a manifest over the kernel's Limits and a wasm bundle that would
// take its tenant's reserved wasm memory past Limits.TenantMemory (the
// revision it replaces does not count); both errors match
// bundle.ErrCeiling.
func (h *Host) Compile(ctx context.Context, tenant string, src kernel.BundleSource) (*kernel.CompiledBundle, error) {
	var b *bundle.Bundle
	var err error
	opts := bundle.Options{Name: src.Name}
	if opts.Keys, err = verificationKeys(h.opts.BundleKeys, tenant, src.TenantKeys); err != nil {
		return nil, err
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
	l := &loaded{ref: b.Ref(), tenant: tenant, host: h}
	// The tenant's memory is reserved once the sandbox values are known
	// and before the engine compiles (and a wasm pool allocates).
	reserve := func(eff bundle.Effective) error {
		l.reserved = eff.Reserved()
		return h.reserve(l)
	}
	p, err := h.prepare(WithTenant(ctx, tenant), b, reserve)
	if err != nil {
		h.release(l) // a no-op when reserve did not run or refused
		return nil, err
	}
	l.Prepared = p
	archive, err := b.TarGz()
	if err != nil {
		l.close()
		return nil, fmt.Errorf("bundle %q: archive: %w", b.Manifest.Name, err)
	}
	var size int64
	for _, f := range b.Files {
		size += int64(len(f))
	}
	return &kernel.CompiledBundle{Ref: l.ref, Archive: archive, Size: size, Handle: l}, nil
}

// reserve opens l in its tenant's memory account, or refuses it when the
// tenant's open revisions, but those of the same name (which l replaces),
// reserve too much with it.
func (h *Host) reserve(l *loaded) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var others int64
	for o := range h.open[l.tenant] {
		if o.ref.Name != l.ref.Name {
			others += o.reserved
		}
	}
	if l.reserved > 0 && others+l.reserved > h.opts.Limits.TenantMemory {
		return bundle.CeilingError(fmt.Sprintf("bundle %q reserves %s of wasm memory (memory cap × pool size); with the tenant's other bundles (%s) that exceeds the kernel's ceiling of %s per tenant (serve --wasm-tenant-memory)",
			l.ref.Name, bundle.BytesString(l.reserved), bundle.BytesString(others), bundle.BytesString(h.opts.Limits.TenantMemory)))
	}
	if h.open[l.tenant] == nil {
		h.open[l.tenant] = map[*loaded]struct{}{}
	}
	h.open[l.tenant][l] = struct{}{}
	return nil
}

// release takes l out of its tenant's memory account.
func (h *Host) release(l *loaded) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.open[l.tenant], l)
	if len(h.open[l.tenant]) == 0 {
		delete(h.open, l.tenant)
	}
}

// TenantMemory returns the wasm memory a tenant's compiled revisions
// reserve (memory cap × pool size of each, including revisions being
// replaced), and the ceiling.
func (h *Host) TenantMemory(tenant string) (reserved, ceiling int64) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for o := range h.open[tenant] {
		reserved += o.reserved
	}
	return reserved, h.opts.Limits.TenantMemory
}

// Discard implements kernel.BundleLoader: a compiled bundle that will not
// be activated is closed and its memory reservation released.
func (h *Host) Discard(cb *kernel.CompiledBundle) {
	if l, ok := cb.Handle.(*loaded); ok {
		go h.retire(l)
	}
}

// Failed implements kernel.BundleLoader: a stored bundle that did not load
// at boot is remembered with the reason, which the steps of agents bound to
// it are denied with, until the bundle is replaced or removed.
func (h *Host) Failed(tenant, name string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed[tenant+"\x00"+name] = err.Error()
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
	delete(h.failed, key)
	h.mu.Unlock()
	if old != nil && old != l {
		go h.retire(old)
	}
}

// Remove implements kernel.BundleLoader.
func (h *Host) Remove(tenant, name string) {
	key := tenant + "\x00" + name
	h.mu.Lock()
	old := h.live[key]
	delete(h.live, key)
	delete(h.failed, key)
	h.mu.Unlock()
	if old != nil {
		go h.retire(old)
	}
}

// cachePruner is implemented by engines that keep compiled artifacts on
// disk (the wasm engine): PruneCache removes those no compiled bundle uses.
type cachePruner interface{ PruneCache() error }

// retire closes a revision that was replaced, removed or discarded (after
// its last evaluation) and lets the engines drop what only it used.
func (h *Host) retire(l *loaded) {
	l.close()
	for _, e := range h.engines {
		if p, ok := e.(cachePruner); ok {
			_ = p.PruneCache() // best effort: the cache is an optimisation
		}
	}
}

// close closes the evaluator once its evaluations are done and releases
// the memory reservation.
func (l *loaded) close() {
	l.use.Lock()
	defer l.use.Unlock()
	if !l.closed {
		l.closed = true
		if l.Prepared != nil {
			_ = l.Prepared.Close()
		}
		l.host.release(l)
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

// Decide implements kernel.Policy: the tenant's guards, then the agent's
// bundle, composed with policy.Combine; nothing matched means the agent
// bundle's default_action (or the kernel default when the agent has no
// bundle). A bundle that is not loaded or fails to answer denies the step.
func (h *Host) Decide(ctx context.Context, req *kernel.PolicyRequest) (kernel.Verdict, error) {
	start := time.Now()
	in := req.Input
	def := kernel.DefaultPolicy{Action: policy.Action(orAllow(h.opts.DefaultPolicy))}
	agentBundle := req.Bundle
	if agentBundle == "" {
		switch h.opts.DefaultPolicy {
		case "", "allow", "deny":
			if len(req.Guards) == 0 {
				v := def.Verdict(in.Step.Kind)
				v.EvalTime = time.Since(start)
				return v, nil
			}
		default:
			agentBundle = h.opts.DefaultPolicy
		}
	}
	var answers []*policy.Answer
	var refs []policy.BundleRef
	var limits []kernel.RateLimitRule
	onInterrupted := "" // approval when an evaluated bundle asks for it
	// eval evaluates one bundle; it returns the bundle, or the fail-closed
	// verdict when the bundle cannot answer.
	eval := func(name string) (*loaded, *kernel.Verdict) {
		l, done := h.get(in.Tenant, name)
		defer done()
		if l == nil {
			reason := fmt.Sprintf("bundle %q is not loaded (fail closed)", name)
			h.mu.RLock()
			if why, ok := h.failed[in.Tenant+"\x00"+name]; ok {
				reason = fmt.Sprintf("bundle %q did not load at boot (fail closed): %s", name, why)
			}
			h.mu.RUnlock()
			v := failClosed(policy.BundleRef{Name: name}, reason, start)
			return nil, &v
		}
		a, err := l.evaluate(ctx, in)
		if err != nil {
			v := failClosed(l.ref, engineFailure(l.ref, err), start)
			return nil, &v
		}
		if l.Bundle.Manifest.OnInterrupted == bundle.OnInterruptedApproval {
			onInterrupted = kernel.OnInterruptedApproval
		}
		answers = append(answers, a)
		refs = append(refs, l.ref)
		limits = append(limits, l.declared(in)...)
		return l, nil
	}
	for _, g := range req.Guards {
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
	var v kernel.Verdict
	switch i := policy.Strictest(answers); {
	case i >= 0:
		v = kernel.VerdictOf(answers[i], refs[i])
		if rl := answers[i].RateLimit; rl != nil {
			limits = append([]kernel.RateLimitRule{{ID: refs[i].Name + "/" + orRule(answers[i].RuleID), RateLimit: *rl}}, limits...)
		}
	case agentLoaded != nil:
		v = kernel.VerdictOf(policy.ApplyDefault(nil, agentLoaded.def, in.Step.Kind), agentLoaded.ref)
	default: // only guards, none matched: the kernel default applies
		v = def.Verdict(in.Step.Kind)
	}
	v.RateLimits = limits
	v.OnInterrupted = onInterrupted
	v.EvalTime = time.Since(start)
	return v, nil
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

// engineFailure is the reason of the denial the kernel records when a
// bundle's engine fails to answer.
func engineFailure(ref policy.BundleRef, err error) string {
	return fmt.Sprintf("%s bundle %q failed (fail closed): %v", ref.Engine, ref.Name, err)
}

func failClosed(ref policy.BundleRef, reason string, start time.Time) kernel.Verdict {
	if len(reason) > policy.MaxReasonBytes { // an engine's error may quote what it was given
		reason = strings.ToValidUTF8(reason[:policy.MaxReasonBytes-len("…")], "") + "…"
	}
	return kernel.Verdict{Action: policy.Deny, Reason: reason, RuleID: "engine_error", Bundle: ref, EvalTime: time.Since(start)}
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

// DeniesOutright reports whether the policy of req (the tenant's guards and
// the agent's bundle, composed as Decide composes them) denies a step like
// req.Input (its arguments ignored) whatever its arguments are: one of them
// denying outright is enough. Bundles whose engine cannot tell count as not
// denying. It implements kernel.OutrightDenier.
func (h *Host) DeniesOutright(ctx context.Context, req *kernel.PolicyRequest) (bool, error) {
	in := req.Input
	agentBundle := req.Bundle
	if agentBundle == "" {
		switch h.opts.DefaultPolicy {
		case "", "allow", "deny":
			if len(req.Guards) == 0 {
				v := kernel.DefaultPolicy{Action: policy.Action(orAllow(h.opts.DefaultPolicy))}.Verdict(in.Step.Kind)
				return v.Action.Rank() >= policy.Deny.Rank(), nil
			}
		default:
			agentBundle = h.opts.DefaultPolicy
		}
	}
	denies := func(name string, agent bool) bool {
		l, done := h.get(in.Tenant, name)
		defer done()
		if l == nil {
			return true // a bundle that is not loaded fails closed
		}
		var def policy.Action // a guard's default does not apply
		if agent {
			def = l.def
		}
		od, ok := l.ev.(outrightDenier)
		return ok && od.DeniesOutright(in, def)
	}
	for _, g := range req.Guards {
		if denies(g, false) {
			return true, nil
		}
	}
	return agentBundle != "" && denies(agentBundle, true), nil
}
