package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/server/wire"
)

// TestBundleSourceAPI: PUT /v0/bundles/{name}/source downloads the bundle
// at once and keeps it pulled; only admins, or tenant-admins of a tenant an
// admin allowed, may set one; a refused address or a failing first
// download registers nothing; DELETE stops pulling and keeps the revision.
func TestBundleSourceAPI(t *testing.T) {
	var mu sync.Mutex
	body := opaDirArchive(t, opaAuthzDir)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != "/authz.tar.gz" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("If-None-Match") == `"v1"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", `"v1"`)
		_, _ = w.Write(body)
	}))
	defer srv.Close()

	env := testkit.Start(t, testkit.Options{Config: fast(), Engines: []plugins.Engine{rego.New()}})
	ctx := context.Background()
	if _, err := env.Kernel.CreateTenant(ctx, kernel.Tenant{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	const acmeAdmin = "acme-admin-key-0123456789"
	if _, _, err := env.Kernel.CreateKey(ctx, "acme", kernel.RoleTenantAdmin, "ops", acmeAdmin); err != nil {
		t.Fatal(err)
	}
	src := wire.BundleSource{URL: srv.URL + "/authz.tar.gz", MinDelay: "1h", MaxDelay: "2h"}

	var b wire.Bundle
	if code, err := env.Admin("PUT", "/v0/bundles/authz/source", src, &b); err != nil || code != 200 {
		t.Fatalf("admin sets a source: %d %v", code, err)
	}
	if b.Revision != "2026-12-01.1" || b.Source == nil || b.Source.URL != src.URL {
		t.Fatalf("bundle %+v", b)
	}
	if st, ok := env.Puller.Status("default", "authz"); !ok || st.Activations != 1 {
		t.Fatalf("puller status %+v %v", st, ok)
	}

	// A tenant-admin of a tenant not allowed to: 403; allowed: 200.
	code, err := testkit.Bearer(env.URL, acmeAdmin, "PUT", "/v0/bundles/authz/source", src, nil)
	if code != http.StatusForbidden || err == nil || !strings.Contains(err.Error(), "allow_bundle_sources") {
		t.Fatalf("tenant-admin without the ceiling: %d %v", code, err)
	}
	if err := env.Kernel.SetTenantBundleTrust(ctx, "acme", nil, true); err != nil {
		t.Fatal(err)
	}
	if code, err := testkit.Bearer(env.URL, acmeAdmin, "PUT", "/v0/bundles/authz/source", src, &b); err != nil || code != 200 || b.Tenant != "acme" {
		t.Fatalf("tenant-admin with the ceiling: %d %v %+v", code, err, b)
	}

	// A bundle the admin pointed at a server is the admin's: the tenant
	// may neither repoint nor stop it.
	if code, err := env.Admin("PUT", "/v0/bundles/owned/source?tenant=acme", src, &b); err != nil || code != 200 || b.Owner != "admin" {
		t.Fatalf("admin sets a source for acme: %d %v %+v", code, err, b)
	}
	for _, method := range []string{"PUT", "DELETE"} {
		code, err := testkit.Bearer(env.URL, acmeAdmin, method, "/v0/bundles/owned/source", src, nil)
		if code != http.StatusForbidden || err == nil {
			t.Errorf("tenant-admin %s on an admin-owned source: %d %v, want 403", method, code, err)
		}
	}

	for name, bad := range map[string]wire.BundleSource{
		"metadata address":   {URL: "http://169.254.169.254/latest/meta-data/"},
		"first download 404": {URL: srv.URL + "/missing.tar.gz"},
		"not http":           {URL: "file:///etc/passwd"},
		"delay too short":    {URL: src.URL, MinDelay: "1ms"},
	} {
		code, err := env.Admin("PUT", "/v0/bundles/other/source", bad, nil)
		if code != http.StatusBadRequest || err == nil {
			t.Errorf("%s: %d %v, want 400", name, code, err)
		}
		if _, ok := env.Puller.Status("default", "other"); ok {
			t.Errorf("%s: a source was registered", name)
		}
	}

	var after wire.Bundle
	if code, err := env.Admin("DELETE", "/v0/bundles/authz/source", nil, &after); err != nil || code != 200 || after.Source != nil || after.Revision != "2026-12-01.1" {
		t.Fatalf("delete source: %d %v %+v", code, err, after)
	}
	if _, ok := env.Puller.Status("default", "authz"); ok {
		t.Errorf("still polling after DELETE")
	}
	recs, err := env.Kernel.BundleSources(ctx)
	if err != nil || len(recs) != 2 || recs[0].Tenant != "acme" || recs[1].Tenant != "acme" {
		t.Fatalf("stored sources: %+v %v", recs, err)
	}
}
