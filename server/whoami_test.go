package server_test

import (
	"slices"
	"testing"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/server/wire"
)

// TestWhoami: GET /v0/whoami names the key and lists exactly the routes
// its role is admitted to, as the routes themselves answer.
func TestWhoami(t *testing.T) {
	env := testkit.Start(t, testkit.Options{})
	mk := func(role string) string {
		var k wire.CreatedKey
		if _, err := env.Admin("POST", "/v0/tenants/default/keys", map[string]any{"role": role, "principal": role + "-person"}, &k); err != nil {
			t.Fatal(err)
		}
		return k.Key
	}
	for _, c := range []struct {
		role     string
		may, not []string
	}{
		{"approver", []string{"GET /v0/approvals", "POST /v0/approvals/{approval_id}/grant", "GET /v0/executions", "GET /v0/whoami"},
			[]string{"POST /v0/executions", "POST /v0/executions/{id}/cancel", "GET /v0/bundles", "GET /v0/tenants/{tenant}/keys"}},
		{"client", []string{"POST /v0/executions", "POST /v0/executions/{id}/cancel", "GET /v0/executions"},
			[]string{"GET /v0/approvals", "POST /v0/approvals/{approval_id}/grant", "GET /v0/bundles"}},
		{"tenant-admin", []string{"GET /v0/bundles", "GET /v0/agents", "GET /v0/tenants/{tenant}/keys", "GET /v0/approvals"},
			[]string{"GET /v0/tenants", "POST /v0/tenants"}},
	} {
		key := mk(c.role)
		var who wire.Whoami
		if _, err := env.As(key, "GET", "/v0/whoami", nil, &who); err != nil {
			t.Fatal(err)
		}
		if who.Role != c.role || who.Principal != c.role+"-person" || who.Tenant != "default" || who.KeyID == "" {
			t.Errorf("%s: %+v", c.role, who)
		}
		for _, r := range c.may {
			if !slices.Contains(who.Routes, r) {
				t.Errorf("%s may call %s; whoami does not list it", c.role, r)
			}
		}
		for _, r := range c.not {
			if slices.Contains(who.Routes, r) {
				t.Errorf("%s may not call %s; whoami lists it", c.role, r)
			}
		}
		// The list is the routes' own answer: a listed read works, an
		// unlisted one is 403.
		if st, _ := env.As(key, "GET", "/v0/bundles", nil, nil); (st == 403) == slices.Contains(who.Routes, "GET /v0/bundles") {
			t.Errorf("%s: GET /v0/bundles answered %d against the list", c.role, st)
		}
	}
	var who wire.Whoami
	if st, _ := env.Admin("GET", "/v0/whoami?tenant=acme", nil, nil); st != 404 {
		t.Errorf("admin ?tenant=acme before acme exists: %d, want 404", st)
	}
	if _, err := env.Admin("POST", "/v0/tenants", map[string]any{"id": "acme"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Admin("GET", "/v0/whoami?tenant=acme", nil, &who); err != nil || who.Role != "admin" || who.Tenant != "acme" || who.KeyTenant != "default" {
		t.Errorf("admin ?tenant=acme: %+v %v", who, err)
	}
	if st, _ := env.As("", "GET", "/v0/whoami", nil, nil); st != 401 {
		t.Errorf("no key: %d", st)
	}
}
