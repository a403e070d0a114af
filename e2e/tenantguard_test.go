package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
	if res := eval(); res.Action != "deny" || res.Bundle.Name != "safe-shell" {
		t.Fatalf("guarded step: %+v", res)
	}

	// The attack.
	st, err = tenant("PUT", "/v0/bundles/safe-shell", allowAll, nil)
	wantStatus(t, "tenant-admin replaces the guard", st, err, 403)
	st, err = tenant("DELETE", "/v0/bundles/safe-shell", nil, nil)
	wantStatus(t, "tenant-admin deletes the guard", st, err, 403)
	st, err = tenant("PUT", "/v0/tenants/acme", map[string]any{"guards": []string{}}, nil)
	wantStatus(t, "tenant-admin clears the guards", st, err, 403)
	if res := eval(); res.Action != "deny" || res.Bundle.Name != "safe-shell" {
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

// TestApprovalDecidedByTheKeyServe attacks a real `wicket serve` with a key
// whose principal is ops-bot, on an approval restricted to alice: writing
// "decided_by": "alice" is refused and the approval stays pending; alice's
// approver key decides (and can do nothing else), and the record names her
// key.
func TestApprovalDecidedByTheKeyServe(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t))
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	key := func(role, principal string) wire.CreatedKey {
		t.Helper()
		var k wire.CreatedKey
		st, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/tenants/default/keys", map[string]any{"role": role, "principal": principal}, &k)
		wantStatus(t, "key "+principal, st, err, 201)
		return k
	}
	opsBot, alice := key("tenant-admin", "ops-bot"), key("approver", "alice")
	as := func(k wire.CreatedKey, method, path string, body, out any) (int, error) {
		return testkit.Bearer(p.url, k.Key, method, path, body, out)
	}
	const secret = "bot-secret-0123456789"
	a := testkit.NewAgent("bot", secret, p.url, func(ctx context.Context, r *testkit.Run) (any, error) {
		return r.Step(ctx, "tool_call", "wire", map[string]any{"amount": 100}, testkit.StepOpts{}, func() (any, error) { return "sent", nil })
	})
	defer a.Close()
	st, err := as(opsBot, "POST", "/v0/agents", map[string]any{"id": "bot", "webhook_url": a.WebhookURL(), "secret": secret}, nil)
	wantStatus(t, "register", st, err, 201)
	st, err = as(opsBot, "POST", "/v0/policies/bot", map[string]any{"bundle": "default_action: allow\nrules:\n  - id: money\n    priority: 1\n    when: {target: wire}\n    then:\n      decision: require_approval\n      approval_config: {approvers: [alice]}\n"}, nil)
	wantStatus(t, "policy", st, err, 200)
	var x wire.Execution
	st, err = as(opsBot, "POST", "/v0/executions", map[string]any{"agent_id": "bot"}, &x)
	wantStatus(t, "create", st, err, 201)
	var id string
	for deadline := time.Now().Add(20 * time.Second); id == ""; {
		var l wire.ApprovalList
		st, err := as(alice, "GET", "/v0/approvals?status=pending", nil, &l)
		wantStatus(t, "approver lists approvals", st, err, 200)
		if len(l.Approvals) > 0 {
			id = l.Approvals[0].ID
		} else if time.Now().After(deadline) {
			t.Fatal("no approval")
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, err = as(opsBot, "POST", "/v0/approvals/"+id+"/grant", map[string]any{"decided_by": "alice"}, nil)
	wantStatus(t, "ops-bot grants as alice", st, err, 403)
	st, err = as(opsBot, "POST", "/v0/approvals/"+id+"/grant", nil, nil)
	wantStatus(t, "ops-bot grants as itself", st, err, 403)
	st, err = as(alice, "POST", "/v0/executions", map[string]any{"agent_id": "bot"}, nil)
	wantStatus(t, "approver creates an execution", st, err, 403)
	st, err = as(alice, "GET", "/v0/agents", nil, nil)
	wantStatus(t, "approver lists agents", st, err, 403)
	st, err = as(alice, "GET", "/v0/executions/"+x.ID+"/events", nil, nil)
	wantStatus(t, "approver reads the events", st, err, 200)
	var ap wire.Approval
	st, err = as(alice, "POST", "/v0/approvals/"+id+"/grant", map[string]any{"rationale": "checked"}, &ap)
	wantStatus(t, "alice grants", st, err, 200)
	if ap.DecidedBy != "alice" || ap.DecidedByKey != alice.KeyID || ap.DecidedByPrincipal != "alice" {
		t.Fatalf("granted approval %+v", ap)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		st, err := as(alice, "GET", "/v0/executions/"+x.ID, nil, &x)
		wantStatus(t, "read execution", st, err, 200)
		if x.Status == "completed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s after the grant", x.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGuardApprovalNotDecidedByTheTenant: an approval a guard asks for is
// the admin's to have decided, like the guard. Approvers are named by
// principal, and a tenant-admin mints keys with any principal it likes:
// against a real `wicket serve`, a tenant-admin of acme whose guard asks
// sec-officer to approve wires minted an approver key for "sec-officer"
// and granted its own agent's wire. Now a key the tenant issued (whatever
// its principal, the tenant-admin's own included) gets 403 naming the
// guard and the approval stays pending; the sec-officer key the admin
// issued decides it, and the execution goes on.
func TestGuardApprovalNotDecidedByTheTenant(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t))
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	admin := tenantAdmins(t, p.url, "acme")["acme"]
	guard := "default_action: allow\nrules:\n  - id: money\n    priority: 1\n    when: {target: wire}\n    then:\n      decision: require_approval\n      approval_config: {approvers: [sec-officer]}\n"
	st, err := testkit.Bearer(p.url, testkit.AdminKey, "PUT", "/v0/bundles/money-guard?tenant=acme", map[string]any{"engine": "rules", "files": map[string]string{"rules.yaml": guard}}, nil)
	wantStatus(t, "the admin's guard bundle", st, err, 200)
	st, err = testkit.Bearer(p.url, testkit.AdminKey, "PUT", "/v0/tenants/acme", map[string]any{"guards": []string{"money-guard"}}, nil)
	wantStatus(t, "set the guard", st, err, 200)
	var officer, fake wire.CreatedKey
	st, err = testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/tenants/acme/keys", map[string]any{"role": "approver", "principal": "sec-officer"}, &officer)
	wantStatus(t, "the admin's sec-officer key", st, err, 201)
	st, err = testkit.Bearer(p.url, admin, "POST", "/v0/tenants/acme/keys", map[string]any{"role": "approver", "principal": "sec-officer"}, &fake)
	wantStatus(t, "the tenant-admin's sec-officer key", st, err, 201)

	const secret = "bot-secret-0123456789"
	a := testkit.NewAgent("bot", secret, p.url, func(ctx context.Context, r *testkit.Run) (any, error) {
		return r.Step(ctx, "tool_call", "wire", map[string]any{"amount": 100}, testkit.StepOpts{}, func() (any, error) { return "sent", nil })
	})
	defer a.Close()
	st, err = testkit.Bearer(p.url, admin, "POST", "/v0/agents", map[string]any{"id": "bot", "webhook_url": a.WebhookURL(), "secret": secret}, nil)
	wantStatus(t, "register", st, err, 201)
	var x wire.Execution
	st, err = testkit.Bearer(p.url, admin, "POST", "/v0/executions", map[string]any{"agent_id": "bot"}, &x)
	wantStatus(t, "create", st, err, 201)
	var id string
	for deadline := time.Now().Add(20 * time.Second); id == ""; {
		var l wire.ApprovalList
		st, err := testkit.Bearer(p.url, officer.Key, "GET", "/v0/approvals?status=pending", nil, &l)
		wantStatus(t, "list approvals", st, err, 200)
		if len(l.Approvals) > 0 {
			id = l.Approvals[0].ID
		} else if time.Now().After(deadline) {
			t.Fatal("no approval")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range []struct {
		what, key string
		body      any
	}{
		{"the tenant's sec-officer key", fake.Key, nil},
		{"the tenant-admin", admin, nil},
		{"the tenant-admin as sec-officer", admin, map[string]any{"decided_by": "sec-officer"}},
	} {
		st, err := testkit.Bearer(p.url, c.key, "POST", "/v0/approvals/"+id+"/grant", c.body, nil)
		wantStatus(t, c.what+" grants", st, err, 403)
		if c.key == fake.Key && !strings.Contains(fmt.Sprint(err), `guard "money-guard"`) {
			t.Errorf("%s: %v, want the refusal to name the guard", c.what, err)
		}
	}
	var ap wire.Approval
	st, err = testkit.Bearer(p.url, officer.Key, "GET", "/v0/approvals/"+id, nil, &ap)
	wantStatus(t, "read the approval", st, err, 200)
	if ap.Status != "pending" || ap.Guard != "money-guard" {
		t.Fatalf("after the tenant's grants the approval is %s of guard %q, want pending of money-guard", ap.Status, ap.Guard)
	}
	st, err = testkit.Bearer(p.url, officer.Key, "POST", "/v0/approvals/"+id+"/grant", nil, &ap)
	wantStatus(t, "the admin's sec-officer grants", st, err, 200)
	if ap.DecidedByKey != officer.KeyID {
		t.Fatalf("granted by %s, want %s", ap.DecidedByKey, officer.KeyID)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		st, err := testkit.Bearer(p.url, admin, "GET", "/v0/executions/"+x.ID, nil, &x)
		wantStatus(t, "read execution", st, err, 200)
		if x.Status == "completed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s after the grant", x.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
