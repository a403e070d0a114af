package e2e

import (
	"testing"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/server/wire"
)

// wantStatus fails the test unless a request answered st.
func wantStatus(t *testing.T, what string, st int, err error, want int) {
	t.Helper()
	if st != want {
		t.Fatalf("%s: %d %v, want %d", what, st, err, want)
	}
}

// TestGuardCannotBeSwitchedOffByItsTenant attacks a real `wicket serve` as
// a tenant-admin whose tenant is guarded: replacing or deleting the guard
// bundle is refused, and the guard keeps denying.
func TestGuardCannotBeSwitchedOffByItsTenant(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t))
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	admin := func(method, path string, body, out any) (int, error) {
		return testkit.Bearer(p.url, testkit.AdminKey, method, path, body, out)
	}
	st, err := admin("POST", "/v0/tenants", map[string]any{"id": "acme"}, nil)
	wantStatus(t, "create tenant", st, err, 201)
	var k wire.CreatedKey
	st, err = admin("POST", "/v0/tenants/acme/keys", map[string]any{"role": "tenant-admin", "principal": "acme-ops"}, &k)
	wantStatus(t, "tenant-admin key", st, err, 201)
	tenant := func(method, path string, body, out any) (int, error) {
		return testkit.Bearer(p.url, k.Key, method, path, body, out)
	}
	guard := map[string]any{"engine": "rules", "files": map[string]string{
		"rules.yaml": "rules:\n  - id: no-rm\n    priority: 1\n    when: {target: rm}\n    then: {decision: deny, reason: guarded}\n"}}
	st, err = admin("PUT", "/v0/bundles/safe-shell?tenant=acme", guard, nil)
	wantStatus(t, "admin stores the guard", st, err, 200)
	allowAll := map[string]any{"engine": "rules", "files": map[string]string{"rules.yaml": "default_action: allow\nrules: []\n"}}
	st, err = tenant("PUT", "/v0/bundles/mine", allowAll, nil)
	wantStatus(t, "tenant stores its own bundle", st, err, 200)
	st, err = admin("PUT", "/v0/tenants/acme", map[string]any{"guards": []string{"mine"}}, nil)
	wantStatus(t, "a tenant-owned guard", st, err, 400)
	st, err = admin("PUT", "/v0/tenants/acme", map[string]any{"guards": []string{"safe-shell"}}, nil)
	wantStatus(t, "set guards", st, err, 200)

	st, err = tenant("POST", "/v0/agents", map[string]any{"id": "bot", "webhook_url": "http://127.0.0.1:9/hook", "secret": "acme-agent-secret-0123456789", "policy": "mine"}, nil)
	wantStatus(t, "register agent", st, err, 201)
	eval := func() wire.PolicyEvalResponse {
		t.Helper()
		var res wire.PolicyEvalResponse
		st, err := tenant("POST", "/v0/policy/eval", map[string]any{"agent_id": "bot", "step": map[string]any{"kind": "tool_call", "target": "rm"}}, &res)
		wantStatus(t, "eval", st, err, 200)
		return res
	}
	if res := eval(); res.Decision != "deny" || res.Bundle.Name != "safe-shell" {
		t.Fatalf("guarded step: %+v", res)
	}

	// The attack.
	st, err = tenant("PUT", "/v0/bundles/safe-shell", allowAll, nil)
	wantStatus(t, "tenant-admin replaces the guard", st, err, 403)
	st, err = tenant("DELETE", "/v0/bundles/safe-shell", nil, nil)
	wantStatus(t, "tenant-admin deletes the guard", st, err, 403)
	st, err = tenant("PUT", "/v0/tenants/acme", map[string]any{"guards": []string{}}, nil)
	wantStatus(t, "tenant-admin clears the guards", st, err, 403)
	if res := eval(); res.Decision != "deny" || res.Bundle.Name != "safe-shell" {
		t.Fatalf("guarded step after the attack: %+v", res)
	}
	var l wire.BundleList
	st, err = tenant("GET", "/v0/bundles", nil, &l)
	wantStatus(t, "list bundles", st, err, 200)
	for _, b := range l.Bundles {
		if want := map[string]string{"safe-shell": "admin", "mine": "tenant"}[b.Name]; b.Owner != want {
			t.Errorf("bundle %s owner %q, want %q", b.Name, b.Owner, want)
		}
	}
}
