package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/server/wire"
)

// TestKeysDecodingAndMetricsServe attacks a real `wicket serve` with the
// smaller holes of the tenant-safety pass: a tenant-admin minting an
// admin key (in its tenant or in default), a body whose field names differ
// only in case, an approver key creating work, and /metrics read without
// --metrics-key. Each is refused, and nothing is created.
func TestKeysDecodingAndMetricsServe(t *testing.T) {
	const metricsKey = "metrics-key-for-the-e2e-0123456789"
	p := startServe(t, t.TempDir(), freeAddr(t), "--metrics-key", metricsKey)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	admin := func(method, path string, body, out any) (int, error) {
		return testkit.Bearer(p.url, testkit.AdminKey, method, path, body, out)
	}
	st, err := admin("POST", "/v0/tenants", map[string]any{"id": "acme"}, nil)
	wantStatus(t, "create tenant", st, err, 201)
	var ta, ap wire.CreatedKey
	st, err = admin("POST", "/v0/tenants/acme/keys", map[string]any{"role": "tenant-admin", "principal": "acme-ops"}, &ta)
	wantStatus(t, "tenant-admin key", st, err, 201)
	st, err = admin("POST", "/v0/tenants/acme/keys", map[string]any{"role": "approver", "principal": "alice"}, &ap)
	wantStatus(t, "approver key", st, err, 201)
	as := func(k wire.CreatedKey, method, path string, body, out any) (int, error) {
		return testkit.Bearer(p.url, k.Key, method, path, body, out)
	}

	// A tenant-admin mints no admin key, in its tenant or another.
	for _, tenant := range []string{"acme", "default"} {
		st, err = as(ta, "POST", "/v0/tenants/"+tenant+"/keys", map[string]any{"role": "admin", "principal": "root"}, nil)
		wantStatus(t, "tenant-admin mints an admin key in "+tenant, st, err, 403)
	}
	var keys wire.KeyList
	st, err = admin("GET", "/v0/tenants/acme/keys", nil, &keys)
	wantStatus(t, "list keys", st, err, 200)
	if len(keys.Keys) != 2 || keys.Keys[0].Role == "admin" || keys.Keys[1].Role == "admin" {
		t.Fatalf("acme's keys: %+v, want the tenant-admin and the approver only", keys.Keys)
	}

	// Field names are matched exactly: a case variant is 400 naming both,
	// and no execution is created.
	st, err = as(ta, "POST", "/v0/agents", map[string]any{"id": "bot", "webhook_url": "http://127.0.0.1:9/hook", "secret": "acme-agent-secret-0123456789"}, nil)
	wantStatus(t, "register agent", st, err, 201)
	st, err = as(ta, "POST", "/v0/executions", []byte(`{"agent_id":"bot","AGENT_ID":"other"}`), nil)
	if st != 400 || err == nil || !strings.Contains(err.Error(), `"AGENT_ID"`) || !strings.Contains(err.Error(), `"agent_id"`) {
		t.Fatalf("case-variant fields: %d %v, want 400 naming both", st, err)
	}

	// An approver reads executions and creates none.
	st, err = as(ap, "POST", "/v0/executions", map[string]any{"agent_id": "bot", "input": map[string]any{}}, nil)
	wantStatus(t, "approver creates an execution", st, err, 403)
	var list wire.ExecutionList
	st, err = as(ap, "GET", "/v0/executions", nil, &list)
	wantStatus(t, "approver lists executions", st, err, 200)
	if len(list.Executions) != 0 {
		t.Fatalf("executions were created: %+v", list.Executions)
	}

	// /metrics needs --metrics-key (or the admin key).
	for _, c := range []struct {
		key  string
		want int
	}{{"", 401}, {ta.Key, 401}, {metricsKey, 200}, {testkit.AdminKey, 200}} {
		req, _ := http.NewRequest("GET", p.url+"/metrics", nil)
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("/metrics with key %.8q: %d, want %d", c.key, resp.StatusCode, c.want)
		}
	}
}
