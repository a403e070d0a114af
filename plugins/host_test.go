package plugins_test

import (
	"context"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
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

func TestHostComposition(t *testing.T) {
	guards := map[string][]string{"acme": {"no-destructive"}}
	h := plugins.NewHost(plugins.Options{Guards: func(_ context.Context, tenant string) ([]string, error) { return guards[tenant], nil }}, rules.New())
	defer h.Close()
	load(t, h, "acme", rulesSrc("no-destructive", "1", "rules:\n  - id: no-destructive\n    priority: 1\n    when: {effect: destructive}\n    then: {decision: deny, reason: guard}\n", ""))
	load(t, h, "acme", rulesSrc("agent", "1", "default_action: allow\nrules:\n  - id: approve-deploys\n    priority: 1\n    when: {target: deploy}\n    then: {decision: require_approval}\n  - id: allow-rm\n    priority: 2\n    when: {target: rm}\n    then: {decision: allow}\n",
		"rate_limits:\n  - {id: searches, targets: [\"search*\"], max_calls: 5, window: 1m}\n"))
	agent := &kernel.Agent{ID: "a", Tenant: "acme", Bundle: "agent"}
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
		res, err := h.Decide(ctx, agent, input(tc.target, tc.effect))
		if err != nil {
			t.Fatal(err)
		}
		if res.Decision.Decision != tc.want || res.Decision.RuleID != tc.rule || res.Bundle.Name != tc.bundle || len(res.RateLimits) != tc.limits {
			t.Errorf("%s/%s: %+v from %s limits %v, want %s by %s from %s with %d limits", tc.target, tc.effect, res.Decision, res.Bundle.Name, res.RateLimits, tc.want, tc.rule, tc.bundle, tc.limits)
		}
	}
	if res, _ := h.Decide(ctx, agent, input("search.web", "")); res.RateLimits[0].ID != "agent/searches" {
		t.Errorf("declared limit id %q", res.RateLimits[0].ID)
	}

	// A bound bundle that is not loaded denies (fail closed).
	res, _ := h.Decide(ctx, &kernel.Agent{ID: "b", Tenant: "acme", Bundle: "missing"}, input("x", ""))
	if res.Decision.Decision != policy.Deny || res.Decision.RuleID != "engine_error" || !strings.Contains(res.Decision.Reason, "not loaded") {
		t.Errorf("missing bundle: %+v", res.Decision)
	}
	// Another tenant's bundle of the same name is invisible.
	res, _ = h.Decide(ctx, &kernel.Agent{ID: "c", Tenant: "other", Bundle: "agent"}, &policy.Input{Tenant: "other", Step: policy.Step{Kind: "tool_call", Target: "rm"}})
	if res.Decision.Decision != policy.Deny || !strings.Contains(res.Decision.Reason, "not loaded") {
		t.Errorf("cross-tenant bundle: %+v", res.Decision)
	}
	// No bundle: the kernel default, unless the operator set one.
	res, _ = h.Decide(ctx, &kernel.Agent{ID: "d", Tenant: "nog"}, &policy.Input{Tenant: "nog", Step: policy.Step{Kind: "tool_call", Target: "x"}})
	if res.Decision.Decision != policy.Allow || res.Bundle.Name != "kernel-default" {
		t.Errorf("unbound agent: %+v %s", res.Decision, res.Bundle.Name)
	}
	hd := plugins.NewHost(plugins.Options{DefaultPolicy: "deny"}, rules.New())
	defer hd.Close()
	if res, _ := hd.Decide(ctx, &kernel.Agent{ID: "d"}, &policy.Input{Step: policy.Step{Kind: "tool_call", Target: "x"}}); res.Decision.Decision != policy.Deny {
		t.Errorf("--default-policy deny: %+v", res.Decision)
	}

	// A new revision swaps in atomically.
	load(t, h, "acme", rulesSrc("agent", "2", "default_action: deny\nrules: []\n", ""))
	res, _ = h.Decide(ctx, agent, input("rm", ""))
	if res.Decision.Decision != policy.Deny || res.Bundle.Revision != "2" {
		t.Errorf("after swap: %+v rev %s", res.Decision, res.Bundle.Revision)
	}
	// A broken bundle is refused and changes nothing.
	if _, err := h.Compile(ctx, "acme", rulesSrc("agent", "3", "rules:\n  - id: x\n    when: {arguments: {a: {}}}\n    then: {decision: allow}\n", "")); err == nil {
		t.Error("broken bundle compiled")
	}
	if ref, _ := h.Live("acme", "agent"); ref.Revision != "2" {
		t.Errorf("live revision %s after a refused upload", ref.Revision)
	}
}

// TestHostOnInterrupted: a bundle's on_interrupted: approval reaches the
// result of every step it is evaluated for (a guard's included), so the
// step records it; bundles without it leave the agent's setting alone.
func TestHostOnInterrupted(t *testing.T) {
	guards := map[string][]string{"acme": {"careful"}}
	h := plugins.NewHost(plugins.Options{Guards: func(_ context.Context, tenant string) ([]string, error) { return guards[tenant], nil }}, rules.New())
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
		res, err := h.Decide(ctx, &kernel.Agent{ID: "a", Tenant: tc.tenant, Bundle: tc.bundle}, in)
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
