package server

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// pendingApproval starts an execution of bot whose step needs alice's
// approval, and returns the approval's id.
func (e *env) pendingApproval(t *testing.T) (running, string) {
	t.Helper()
	r := e.start("bot")
	d := e.submit(r, "tool_call", "wire_money", map[string]any{"to": "x", "amount": 100})
	if d.Decision != wire.DecisionBlocked || d.ApprovalID == "" {
		t.Fatalf("decision %+v", d)
	}
	return r, d.ApprovalID
}

// TestApprovalDecidedByTheKey: the decider of an approval is the key that
// authenticated the decision, not a body field. A key whose principal is
// ops-bot may not grant an approval restricted to alice by writing
// "decided_by": "alice" (it could before, and the record said alice); an
// admin key may decide for a named person, and the record keeps both.
func TestApprovalDecidedByTheKey(t *testing.T) {
	e := newEnv(t)
	opsBot := e.createKey(t, "default", "tenant-admin", "ops-bot")
	_, id := e.pendingApproval(t)
	url := "/v0/approvals/" + id
	// The attack: impersonating an approver.
	e.do("POST", url+"/grant", map[string]any{"decided_by": "alice"}, bearer(opsBot)).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	// Its own name is not among the approvers.
	e.do("POST", url+"/grant", nil, bearer(opsBot)).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("POST", url+"/grant", map[string]any{"decided_by": "ops-bot"}, bearer(opsBot)).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	var a wire.Approval
	e.admin("GET", url, nil).want(t, http.StatusOK).decode(t, &a)
	if a.Status != "pending" {
		t.Fatalf("approval after refused grants: %+v", a)
	}
	// alice's own approver key decides; the record names her key.
	var alice wire.CreatedKey
	e.admin("POST", "/v0/tenants/default/keys", map[string]any{"role": "approver", "principal": "alice"}).want(t, http.StatusCreated).decode(t, &alice)
	e.do("POST", url+"/grant", map[string]any{"rationale": "checked"}, bearer(alice.Key)).want(t, http.StatusOK).decode(t, &a)
	if a.Status != "granted" || a.DecidedBy != "alice" || a.DecidedByKey != alice.KeyID || a.DecidedByPrincipal != "alice" {
		t.Fatalf("granted approval %+v", a)
	}

	// An admin key acts for a named person: recorded as both.
	_, id2 := e.pendingApproval(t)
	e.admin("POST", "/v0/approvals/"+id2+"/deny", map[string]any{"decided_by": "alice", "rationale": "on the phone"}).want(t, http.StatusOK).decode(t, &a)
	if a.Status != "denied" || a.DecidedBy != "alice" || a.DecidedByKey != "admin-key" || a.DecidedByPrincipal != "admin" {
		t.Fatalf("denied for alice by the admin: %+v", a)
	}
	// The event log carries the key too.
	x, err := e.k.GetApproval(t.Context(), "default", id2)
	if err != nil {
		t.Fatal(err)
	}
	evList, err := e.k.Events(t.Context(), "default", x.ExecutionID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range evList {
		if ev.Type == kernel.EvApprovalDenied {
			found = true
			var p map[string]any
			if err := json.Unmarshal(ev.Payload, &p); err != nil {
				t.Fatal(err)
			}
			if p["decided_by"] != "alice" || p["decided_by_key"] != "admin-key" || p["decided_by_principal"] != "admin" {
				t.Errorf("approval.denied payload %s", ev.Payload)
			}
		}
	}
	if !found {
		t.Error("no approval.denied event")
	}
}

// TestApproverRole: an approver key reads and decides approvals and reads
// executions of its tenant, and nothing else.
func TestApproverRole(t *testing.T) {
	e := newEnv(t, func(o *envOpts) { o.loader = &fakeLoader{} })
	r, id := e.pendingApproval(t)
	approver := e.createKey(t, "default", "approver", "alice")
	as := bearer(approver)
	for _, ok := range []struct{ method, path string }{
		{"GET", "/v0/approvals"},
		{"GET", "/v0/approvals?status=pending"},
		{"GET", "/v0/approvals/" + id},
		{"GET", "/v0/executions"},
		{"GET", "/v0/executions/" + r.id},
		{"GET", "/v0/executions/" + r.id + "/events"},
		{"GET", "/v0/executions/" + r.id + "/steps"},
	} {
		e.do(ok.method, ok.path, nil, as).want(t, http.StatusOK)
	}
	st, closeIt := e.openStreamAs(t, "/v0/executions/"+r.id+"/stream", approver)
	closeIt()
	if st != http.StatusOK {
		t.Errorf("approver streaming an execution: %d", st)
	}
	for _, no := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/v0/executions", map[string]any{"agent_id": "bot"}},
		{"POST", "/v0/executions/" + r.id + "/cancel", nil},
		{"GET", "/v0/agents", nil},
		{"POST", "/v0/agents", map[string]any{"id": "x", "webhook_url": "http://127.0.0.1:9/", "secret": "x-secret-0123456789"}},
		{"DELETE", "/v0/agents/bot", nil},
		{"GET", "/v0/bundles", nil},
		{"DELETE", "/v0/bundles/x", nil},
		{"POST", "/v0/policies/bot", map[string]any{"bundle": "rules: []"}},
		{"POST", "/v0/policy/eval", map[string]any{"agent_id": "bot", "step": map[string]any{"kind": "tool_call", "target": "x"}}},
		{"GET", "/v0/tenants", nil},
		{"GET", "/v0/tenants/default/keys", nil},
		{"POST", "/v0/tenants/default/keys", map[string]any{"role": "client", "principal": "x"}},
		{"POST", "/v0/executions/" + r.id + "/steps", map[string]any{"kind": "local", "target": "x"}},
	} {
		e.do(no.method, no.path, no.body, as).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	}
	var a wire.Approval
	e.do("POST", "/v0/approvals/"+id+"/grant", nil, as).want(t, http.StatusOK).decode(t, &a)
	if a.Status != "granted" || a.DecidedBy != "alice" {
		t.Fatalf("approver's grant %+v", a)
	}
}

// TestKeyMinting: a tenant-admin manages the keys of its own tenant but
// never mints an admin key, touches another tenant's keys, or revokes an
// admin key; an admin key belongs to the default tenant only (in any other
// it would be a kernel-wide key listed as the tenant's).
func TestKeyMinting(t *testing.T) {
	e := newEnv(t)
	e.admin("POST", "/v0/tenants", map[string]any{"id": "acme"}).want(t, http.StatusCreated)
	acmeAdmin := bearer(e.createKey(t, "acme", "tenant-admin", "acme-ops"))
	var k wire.CreatedKey
	for _, role := range []string{"client", "approver", "tenant-admin"} {
		e.do("POST", "/v0/tenants/acme/keys", map[string]any{"role": role, "principal": "p-" + role}, acmeAdmin).want(t, http.StatusCreated).decode(t, &k)
		if k.Tenant != "acme" || k.Role != role {
			t.Fatalf("minted %+v", k)
		}
	}
	// The attacks.
	e.do("POST", "/v0/tenants/acme/keys", map[string]any{"role": "admin", "principal": "root"}, acmeAdmin).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("POST", "/v0/tenants/default/keys", map[string]any{"role": "client", "principal": "spy"}, acmeAdmin).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("POST", "/v0/tenants/default/keys", map[string]any{"role": "admin", "principal": "root"}, acmeAdmin).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("GET", "/v0/tenants/default/keys", nil, acmeAdmin).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.admin("POST", "/v0/tenants/acme/keys", map[string]any{"role": "admin", "principal": "root"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	// A tenant-admin key it minted mints too; a client key mints nothing.
	e.do("POST", "/v0/tenants/acme/keys", map[string]any{"role": "client", "principal": "x"}, bearer(k.Key)).want(t, http.StatusCreated)
	var client wire.CreatedKey
	e.admin("POST", "/v0/tenants/acme/keys", map[string]any{"role": "client", "principal": "c"}).want(t, http.StatusCreated).decode(t, &client)
	e.do("POST", "/v0/tenants/acme/keys", map[string]any{"role": "client", "principal": "x"}, bearer(client.Key)).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	// Own tenant: list and revoke.
	var l wire.KeyList
	e.do("GET", "/v0/tenants/acme/keys", nil, acmeAdmin).want(t, http.StatusOK).decode(t, &l)
	if len(l.Keys) < 5 {
		t.Fatalf("acme keys %+v", l)
	}
	e.do("DELETE", "/v0/tenants/acme/keys/"+client.KeyID, nil, acmeAdmin).want(t, http.StatusNoContent)
	e.do("GET", "/v0/executions", nil, bearer(client.Key)).wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)
	// The default tenant's tenant-admin may not revoke an admin key.
	var root wire.CreatedKey
	e.admin("POST", "/v0/tenants/default/keys", map[string]any{"role": "admin", "principal": "root"}).want(t, http.StatusCreated).decode(t, &root)
	defAdmin := bearer(e.createKey(t, "default", "tenant-admin", "def-ops"))
	e.do("DELETE", "/v0/tenants/default/keys/"+root.KeyID, nil, defAdmin).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("GET", "/v0/tenants", nil, bearer(root.Key)).want(t, http.StatusOK)
}
