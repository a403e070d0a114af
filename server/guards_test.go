package server

import (
	"net/http"
	"testing"

	"github.com/wicket-run/wicket/server/wire"
)

// TestGuardBundlesOwnedByAdmin: a tenant-admin cannot switch its tenant's
// guard off. Bundles the admin stores into a tenant are admin-owned; the
// tenant-admin may neither replace nor delete them (403); a tenant's guards
// may name only admin-owned bundles of that tenant (400 naming the guard);
// nobody deletes a bundle that is a guard (409); listing shows owners.
func TestGuardBundlesOwnedByAdmin(t *testing.T) {
	e := newEnv(t, func(o *envOpts) { o.loader = &fakeLoader{} })
	e.admin("POST", "/v0/tenants", map[string]any{"id": "acme"}).want(t, http.StatusCreated)
	acmeAdmin := e.createKey(t, "acme", "tenant-admin", "ops")
	put := func(key, path, rules string) resp {
		return e.do("PUT", path, rawBody(`{"engine":"rules","files":{"rules.yaml":"`+rules+`"}}`),
			map[string]string{"Authorization": "Bearer " + key, "Content-Type": "application/json"})
	}
	var b wire.Bundle
	put(testAdminKey, "/v0/bundles/safe-shell?tenant=acme", `default_action: deny\n`).want(t, http.StatusOK).decode(t, &b)
	if b.Owner != wire.BundleOwnerAdmin || b.Tenant != "acme" {
		t.Fatalf("bundle stored by the admin: %+v", b)
	}
	put(acmeAdmin, "/v0/bundles/mine", `default_action: allow\n`).want(t, http.StatusOK).decode(t, &b)
	if b.Owner != wire.BundleOwnerTenant {
		t.Fatalf("bundle stored by the tenant-admin: %+v", b)
	}

	// Guards: only admin-owned bundles of that tenant.
	for name, guards := range map[string][]string{
		"the tenant's own bundle":    {"mine"},
		"a bundle it does not have":  {"ghost"},
		"a bundle of another tenant": {"research"},
		"twice":                      {"safe-shell", "safe-shell"},
		"not a bundle name":          {"a b"},
	} {
		t.Run(name, func(t *testing.T) {
			if name == "a bundle of another tenant" {
				put(testAdminKey, "/v0/bundles/research", `default_action: allow\n`).want(t, http.StatusOK)
			}
			e.admin("PUT", "/v0/tenants/acme", map[string]any{"guards": guards}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
		})
	}
	e.admin("PUT", "/v0/tenants/acme", map[string]any{}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("PUT", "/v0/tenants/ghost", map[string]any{"guards": []string{}}).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	var tn wire.Tenant
	e.admin("PUT", "/v0/tenants/acme", map[string]any{"guards": []string{"safe-shell"}}).want(t, http.StatusOK).decode(t, &tn)
	if tn.ID != "acme" || len(tn.Guards) != 1 || tn.Guards[0] != "safe-shell" {
		t.Fatalf("tenant %+v", tn)
	}
	// Only the admin sets guards.
	e.do("PUT", "/v0/tenants/acme", map[string]any{"guards": []string{}}, bearer(acmeAdmin)).wantErr(t, http.StatusForbidden, wire.CodeForbidden)

	// The attack: the tenant-admin replaces or deletes its guard.
	put(acmeAdmin, "/v0/bundles/safe-shell", `default_action: allow\n`).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("DELETE", "/v0/bundles/safe-shell", nil, bearer(acmeAdmin)).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	// Nor through the agent-policy route, under the name that route writes.
	e.do("POST", "/v0/agents", map[string]any{"id": "bot", "webhook_url": "http://127.0.0.1:9/acme", "secret": "acme-secret-0123456789"}, bearer(acmeAdmin)).
		want(t, http.StatusCreated)
	put(testAdminKey, "/v0/bundles/agent-bot?tenant=acme", `default_action: deny\n`).want(t, http.StatusOK)
	e.do("POST", "/v0/policies/bot", map[string]any{"bundle": "default_action: allow\n"}, bearer(acmeAdmin)).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("GET", "/v0/bundles/safe-shell", nil, bearer(acmeAdmin)).want(t, http.StatusOK).decode(t, &b)
	if b.Owner != wire.BundleOwnerAdmin || b.Engine != "rules" {
		t.Fatalf("the guard after the attack: %+v", b)
	}
	// Its own bundles stay the tenant-admin's to change.
	put(acmeAdmin, "/v0/bundles/mine", `default_action: deny\n`).want(t, http.StatusOK)
	e.do("DELETE", "/v0/bundles/mine", nil, bearer(acmeAdmin)).want(t, http.StatusNoContent)

	// Listing shows the owner of each bundle.
	var l wire.BundleList
	e.do("GET", "/v0/bundles", nil, bearer(acmeAdmin)).want(t, http.StatusOK).decode(t, &l)
	owners := map[string]string{}
	for _, b := range l.Bundles {
		owners[b.Name] = b.Owner
	}
	if len(owners) != 2 || owners["safe-shell"] != wire.BundleOwnerAdmin || owners["agent-bot"] != wire.BundleOwnerAdmin {
		t.Fatalf("listed owners %v", owners)
	}

	// A guard is not deleted from under its tenant, even by the admin;
	// once it is no guard any more, the admin may delete it.
	e.admin("DELETE", "/v0/bundles/safe-shell?tenant=acme", nil).wantErr(t, http.StatusConflict, wire.CodeConflict)
	tn = wire.Tenant{}
	e.admin("PUT", "/v0/tenants/acme", map[string]any{"guards": []string{}}).want(t, http.StatusOK).decode(t, &tn)
	if len(tn.Guards) != 0 {
		t.Fatalf("guards not removed: %+v", tn)
	}
	e.admin("DELETE", "/v0/bundles/safe-shell?tenant=acme", nil).want(t, http.StatusNoContent)

	// The default tenant takes guards too.
	put(testAdminKey, "/v0/bundles/default-guard", `default_action: deny\n`).want(t, http.StatusOK)
	e.admin("PUT", "/v0/tenants/default", map[string]any{"guards": []string{"default-guard"}}).want(t, http.StatusOK).decode(t, &tn)
	if tn.ID != "default" || len(tn.Guards) != 1 {
		t.Fatalf("default tenant %+v", tn)
	}
}
