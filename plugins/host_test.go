package plugins_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rules"
)

func rulesSrc(name, rev, rulesYAML string, manifestExtra string) kernel.BundleSource {
	return kernel.BundleSource{Files: map[string][]byte{
		"bundle.yaml": []byte("name: " + name + "\nrevision: \"" + rev + "\"\nengine: rules\n" + manifestExtra),
		"rules.yaml":  []byte(rulesYAML),
	}}
}

func load(t *testing.T, h *plugins.Host, tenant string, src kernel.BundleSource) {
	t.Helper()
	cb, err := h.Compile(context.Background(), tenant, src)
	if err != nil {
		t.Fatal(err)
	}
	h.Activate(tenant, cb)
}

func input(target, effect string) *policy.Input {
	return &policy.Input{Tenant: "acme", AgentID: "a", Step: policy.Step{Kind: "tool_call", Target: target, Effect: effect, Args: []byte("null")}}
}

// decide asks h for a verdict on in, for an agent bound to bundle ("" for
// none) in a tenant whose guards are the tenant's in guards.
func decide(t *testing.T, h *plugins.Host, bundle string, in *policy.Input) kernel.Verdict {
	t.Helper()
	guards := map[string][]string{"acme": {"no-destructive"}}
	v, err := h.Decide(context.Background(), &kernel.PolicyRequest{Input: in, Guards: guards[in.Tenant], Bundle: bundle})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestHostComposition(t *testing.T) {
	h := plugins.NewHost(plugins.Options{}, rules.New())
	defer h.Close()
	load(t, h, "acme", rulesSrc("no-destructive", "1", "rules:\n  - id: no-destructive\n    priority: 1\n    when: {effect: destructive}\n    then: {decision: deny, reason: guard}\n", ""))
	load(t, h, "acme", rulesSrc("agent", "1", "default_action: allow\nrules:\n  - id: approve-deploys\n    priority: 1\n    when: {target: deploy}\n    then: {decision: require_approval}\n  - id: allow-rm\n    priority: 2\n    when: {target: rm}\n    then: {decision: allow}\n",
		"rate_limits:\n  - {id: searches, targets: [\"search*\"], max_calls: 5, window: 1m}\n"))
	ctx := context.Background()
	for _, tc := range []struct {
		target, effect string
		want           policy.Action
		rule, bundle   string
		limits         int
	}{
		{"rm", "destructive", policy.Deny, "no-destructive", "no-destructive", 0}, // the guard is more restrictive than the agent's allow
		{"deploy", "", policy.RequireApproval, "approve-deploys", "agent", 0},
		{"rm", "", policy.Allow, "allow-rm", "agent", 0},
		{"search.web", "", policy.Allow, "default_action", "agent", 1}, // manifest limit matches
		{"other", "", policy.Allow, "default_action", "agent", 0},
	} {
		res := decide(t, h, "agent", input(tc.target, tc.effect))
		if res.Action != tc.want || res.RuleID != tc.rule || res.Bundle.Name != tc.bundle || len(res.RateLimits) != tc.limits {
			t.Errorf("%s/%s: %+v from %s limits %v, want %s by %s from %s with %d limits", tc.target, tc.effect, res, res.Bundle.Name, res.RateLimits, tc.want, tc.rule, tc.bundle, tc.limits)
		}
	}
	if res := decide(t, h, "agent", input("search.web", "")); res.RateLimits[0].ID != "agent/searches" {
		t.Errorf("declared limit id %q", res.RateLimits[0].ID)
	}

	// A bound bundle that is not loaded denies (fail closed).
	res := decide(t, h, "missing", input("x", ""))
	if res.Action != policy.Deny || res.RuleID != "engine_error" || !strings.Contains(res.Reason, "not loaded") {
		t.Errorf("missing bundle: %+v", res)
	}
	// Another tenant's bundle of the same name is invisible.
	res = decide(t, h, "agent", &policy.Input{Tenant: "other", Step: policy.Step{Kind: "tool_call", Target: "rm"}})
	if res.Action != policy.Deny || !strings.Contains(res.Reason, "not loaded") {
		t.Errorf("cross-tenant bundle: %+v", res)
	}
	// No bundle: the kernel default, unless the operator set one.
	res = decide(t, h, "", &policy.Input{Tenant: "nog", Step: policy.Step{Kind: "tool_call", Target: "x"}})
	if res.Action != policy.Allow || res.Bundle.Name != "kernel-default" {
		t.Errorf("unbound agent: %+v %s", res, res.Bundle.Name)
	}
	hd := plugins.NewHost(plugins.Options{DefaultPolicy: "deny"}, rules.New())
	defer hd.Close()
	if res := decide(t, hd, "", &policy.Input{Step: policy.Step{Kind: "tool_call", Target: "x"}}); res.Action != policy.Deny {
		t.Errorf("--default-policy deny: %+v", res)
	}

	// A new revision swaps in atomically.
	load(t, h, "acme", rulesSrc("agent", "2", "default_action: deny\nrules: []\n", ""))
	res = decide(t, h, "agent", input("rm", ""))
	if res.Action != policy.Deny || res.Bundle.Revision != "2" {
		t.Errorf("after swap: %+v rev %s", res, res.Bundle.Revision)
	}
	// A broken bundle is refused and changes nothing.
	if _, err := h.Compile(ctx, "acme", rulesSrc("agent", "3", "rules:\n  - id: x\n    when: {arguments: {a: {}}}\n    then: {decision: allow}\n", "")); err == nil {
		t.Error("broken bundle compiled")
	}
	if ref, _ := h.Live("acme", "agent"); ref.Revision != "2" {
		t.Errorf("live revision %s after a refused upload", ref.Revision)
	}
}

// fakeWasm stands in for the wasm engine: the host's accounting depends only
// on the manifest. It counts open evaluators.
type fakeWasm struct{ open atomic.Int64 }

func (*fakeWasm) Name() string { return "wasm" }

func (f *fakeWasm) Compile(context.Context, *bundle.Bundle) (policy.Evaluator, error) {
	f.open.Add(1)
	return fakeEvaluator{f}, nil
}

type fakeEvaluator struct{ f *fakeWasm }

func (fakeEvaluator) Evaluate(context.Context, *policy.Input) (*policy.Answer, error) {
	return nil, nil
}

func (e fakeEvaluator) Close() error { e.f.open.Add(-1); return nil }

func wasmSrc(name, sandbox string) kernel.BundleSource {
	return kernel.BundleSource{Files: map[string][]byte{
		"bundle.yaml": []byte("name: " + name + "\nengine: wasm\nsandbox: " + sandbox + "\n"),
		"policy.wasm": []byte("\x00asm\x01\x00\x00\x00"),
	}}
}

// TestTenantMemory: a tenant's wasm bundles together reserve at most
// Limits.TenantMemory (memory cap × pool size each); the revision an upload
// replaces does not count, other tenants have their own account, and a
// compiled bundle that is discarded or removed gives its share back.
func TestTenantMemory(t *testing.T) {
	eng := &fakeWasm{}
	h := plugins.NewHost(plugins.Options{Limits: bundle.Limits{TenantMemory: 4 << 20}}, eng, rules.New())
	defer h.Close()
	ctx := context.Background()
	two := "{memory_pages: 16, pool_size: 2}" // 2 MiB
	load(t, h, "acme", wasmSrc("a", two))
	load(t, h, "acme", wasmSrc("b", two))
	if r, c := h.TenantMemory("acme"); r != 4<<20 || c != 4<<20 {
		t.Fatalf("acme reserves %d of %d, want 4 MiB of 4 MiB", r, c)
	}
	_, err := h.Compile(ctx, "acme", wasmSrc("c", "{memory_pages: 1, pool_size: 1}"))
	want := `bundle "c" reserves 64 KiB of wasm memory (memory cap × pool size); with the tenant's other bundles (4 MiB) that exceeds the kernel's ceiling of 4 MiB per tenant (serve --wasm-tenant-memory)`
	if err == nil || err.Error() != want {
		t.Fatalf("third bundle: %v\nwant %s", err, want)
	}
	if !errors.Is(err, bundle.ErrCeiling) {
		t.Errorf("%v does not match bundle.ErrCeiling", err)
	}
	// Other engines reserve nothing; another tenant has its own account.
	load(t, h, "acme", rulesSrc("r", "1", "rules: []\n", ""))
	load(t, h, "other", wasmSrc("c", two))
	// A new revision of a replaces it, and may be larger.
	load(t, h, "acme", wasmSrc("a", "{memory_pages: 32, pool_size: 1}"))
	if _, err := h.Compile(ctx, "acme", wasmSrc("a", "{memory_pages: 48, pool_size: 1}")); err == nil {
		t.Error("a revision of 3 MiB next to b's 2 MiB was accepted")
	}
	// Removing b frees its share (once its evaluator is closed).
	h.Remove("acme", "b")
	waitFor(t, func() bool { r, _ := h.TenantMemory("acme"); return r == 2<<20 })
	cb, err := h.Compile(ctx, "acme", wasmSrc("c", two))
	if err != nil {
		t.Fatal(err)
	}
	// A compiled bundle that is discarded (its upload failed) frees its share too.
	h.Discard(cb)
	waitFor(t, func() bool { r, _ := h.TenantMemory("acme"); return r == 2<<20 })
	h.Close()
	waitFor(t, func() bool { return eng.open.Load() == 0 })
}

// TestManifestCeilings: the host refuses a manifest over its limits for
// every engine, before compiling it.
func TestManifestCeilings(t *testing.T) {
	h := plugins.NewHost(plugins.Options{}, rules.New(), &fakeWasm{})
	defer h.Close()
	for _, c := range []struct {
		src  kernel.BundleSource
		want string
	}{
		{rulesSrc("r", "1", "rules: []\n", "sandbox: {timeout: 87600h}\n"), "bundle.yaml: sandbox.timeout: 87600h0m0s exceeds the kernel's ceiling of 2s (serve --sandbox-max-timeout)"},
		{wasmSrc("w", "{memory_pages: 65536}"), "bundle.yaml: sandbox.memory_pages: 65536 exceeds the kernel's ceiling of 1024 pages (64 MiB) (serve --wasm-max-memory)"},
	} {
		_, err := h.Compile(context.Background(), "acme", c.src)
		if err == nil || err.Error() != c.want {
			t.Errorf("got %v\nwant %s", err, c.want)
		}
	}
}

// TestFailedBundleReason: agents bound to a bundle that did not load at
// boot are denied with the reason, until the bundle is replaced.
func TestFailedBundleReason(t *testing.T) {
	h := plugins.NewHost(plugins.Options{}, rules.New())
	defer h.Close()
	h.Failed("acme", "slow", errors.New("did not load within 10s"))
	req := &kernel.PolicyRequest{Input: input("x", ""), Bundle: "slow"}
	v, _ := h.Decide(context.Background(), req)
	if v.Action != policy.Deny || v.RuleID != "engine_error" ||
		v.Reason != `bundle "slow" did not load at boot (fail closed): did not load within 10s` {
		t.Errorf("verdict %+v", v)
	}
	load(t, h, "acme", rulesSrc("slow", "2", "default_action: allow\nrules: []\n", ""))
	if v, _ := h.Decide(context.Background(), req); v.Action != policy.Allow {
		t.Errorf("after the upload: %+v", v)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHostOnInterrupted: a bundle's on_interrupted: approval reaches the
// result of every step it is evaluated for (a guard's included), so the
// step records it; bundles without it leave the agent's setting alone.
func TestHostOnInterrupted(t *testing.T) {
	guards := map[string][]string{"acme": {"careful"}}
	h := plugins.NewHost(plugins.Options{}, rules.New())
	defer h.Close()
	allow := "default_action: allow\nrules: []\n"
	load(t, h, "acme", rulesSrc("careful", "1", allow, "on_interrupted: approval\n"))
	load(t, h, "acme", rulesSrc("plain", "1", allow, ""))
	load(t, h, "other", rulesSrc("plain", "1", allow, "on_interrupted: indeterminate\n"))
	ctx := context.Background()
	for _, tc := range []struct {
		tenant, bundle, want string
	}{
		{"acme", "plain", kernel.OnInterruptedApproval}, // from the guard
		{"other", "plain", ""},
	} {
		in := input("send", "")
		in.Tenant = tc.tenant
		res, err := h.Decide(ctx, &kernel.PolicyRequest{Input: in, Guards: guards[tc.tenant], Bundle: tc.bundle})
		if err != nil {
			t.Fatal(err)
		}
		if res.OnInterrupted != tc.want {
			t.Errorf("%s/%s: on_interrupted %q, want %q", tc.tenant, tc.bundle, res.OnInterrupted, tc.want)
		}
	}
	if _, err := h.Compile(ctx, "acme", rulesSrc("bad", "1", allow, "on_interrupted: sometimes\n")); err == nil || !strings.Contains(err.Error(), "on_interrupted") {
		t.Fatalf("a bad on_interrupted: %v", err)
	}
}
