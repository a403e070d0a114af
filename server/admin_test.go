package server

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/server/wire"
)

func TestAgents(t *testing.T) {
	e := newEnv(t, func(o *envOpts) { o.noAgents = true; o.loader = &fakeLoader{} })
	const secret = "agent-secret-0123456789"
	r := e.admin("POST", "/v0/agents", map[string]any{"id": "writer", "webhook_url": "http://127.0.0.1:9/w", "secret": secret}).
		want(t, http.StatusCreated)
	if strings.Contains(string(r.body), secret) || strings.Contains(string(r.body), "secret") {
		t.Fatalf("the secret was returned: %s", r.body)
	}
	var a wire.Agent
	r.decode(t, &a)
	if a.ID != "writer" || a.Tenant != "default" || a.WebhookURL != "http://127.0.0.1:9/w" || a.Bundle != "" {
		t.Fatalf("agent %+v", a)
	}
	// A binding to a bundle that does not exist is refused when it is made.
	r = e.admin("POST", "/v0/agents", map[string]any{"id": "writer", "webhook_url": "http://127.0.0.1:9/w2", "policy": "research"})
	r.wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	if !strings.Contains(string(r.body), `bundle \"research\" does not exist`) {
		t.Fatalf("refused binding: %s", r.body)
	}
	e.do("PUT", "/v0/bundles/research", rawBody(`{"engine":"rules","files":{"rules.yaml":"default_action: deny\n"}}`),
		map[string]string{"Authorization": "Bearer " + testAdminKey, "Content-Type": "application/json"}).want(t, http.StatusOK)
	// A bundle of another tenant is no more there.
	e.admin("POST", "/v0/tenants", map[string]any{"id": "other"}).want(t, http.StatusCreated)
	e.do("PUT", "/v0/bundles/theirs?tenant=other", rawBody(`{"engine":"rules","files":{"rules.yaml":"default_action: deny\n"}}`),
		map[string]string{"Authorization": "Bearer " + testAdminKey, "Content-Type": "application/json"}).want(t, http.StatusOK)
	e.admin("POST", "/v0/agents", map[string]any{"id": "writer", "policy": "theirs"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	// An update without a secret keeps it, and binds a policy.
	e.admin("POST", "/v0/agents", map[string]any{"id": "writer", "webhook_url": "http://127.0.0.1:9/w2", "policy": "research"}).
		want(t, http.StatusOK).decode(t, &a)
	if a.WebhookURL != "http://127.0.0.1:9/w2" || a.Bundle != "research" {
		t.Fatalf("updated %+v", a)
	}
	// Omitting the policy keeps the binding; "" unbinds; bundle is an alias.
	e.admin("POST", "/v0/agents", map[string]any{"id": "writer"}).want(t, http.StatusOK).decode(t, &a)
	if a.Bundle != "research" || a.WebhookURL != "http://127.0.0.1:9/w2" {
		t.Fatalf("re-registered %+v", a)
	}
	a = wire.Agent{}
	e.admin("POST", "/v0/agents", map[string]any{"id": "writer", "bundle": ""}).want(t, http.StatusOK).decode(t, &a)
	if a.Bundle != "" {
		t.Fatalf("unbound %+v", a)
	}
	e.admin("POST", "/v0/agents", map[string]any{"id": "writer", "policy": "a", "bundle": "b"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	// The stored secret still signs.
	var x wire.Execution
	e.admin("POST", "/v0/executions", map[string]any{"agent_id": "writer"}).want(t, http.StatusCreated).decode(t, &x)
	e.agent(agentReq{agentID: "writer", secret: secret}, "GET", "/v0/executions/"+x.ID, nil).want(t, http.StatusOK)

	// Signing: a new agent gets v1, an update without the field keeps the
	// scheme, "body" switches it (and a v1 signature is then refused).
	if a.Signing != wire.SigningV1 {
		t.Fatalf("a new agent's signing: %+v", a)
	}
	e.admin("POST", "/v0/agents", map[string]any{"id": "writer", "signing": "body"}).want(t, http.StatusOK).decode(t, &a)
	if a.Signing != wire.SigningBody {
		t.Fatalf("switched to body: %+v", a)
	}
	e.admin("POST", "/v0/agents", map[string]any{"id": "writer"}).want(t, http.StatusOK).decode(t, &a)
	if a.Signing != wire.SigningBody {
		t.Fatalf("re-registered without signing: %+v", a)
	}
	e.agent(agentReq{agentID: "writer", secret: secret}, "GET", "/v0/executions/"+x.ID, nil).wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)
	e.agent(agentReq{agentID: "writer", secret: secret, body: true}, "GET", "/v0/executions/"+x.ID, nil).want(t, http.StatusOK)

	for _, bad := range []map[string]any{
		{"id": "writer", "signing": "hmac"},
		{"id": "bad id", "webhook_url": "http://x", "secret": secret},
		{"id": "new", "webhook_url": "ftp://x", "secret": secret},
		{"id": "new", "webhook_url": "http://x", "secret": "short"},
		{"id": "new", "webhook_url": "http://x"},
	} {
		e.admin("POST", "/v0/agents", bad).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	}

	var l wire.AgentList
	r = e.admin("GET", "/v0/agents", nil).want(t, http.StatusOK)
	r.decode(t, &l)
	if len(l.Agents) != 1 || strings.Contains(string(r.body), secret) {
		t.Fatalf("agents %s", r.body)
	}
	r = e.admin("GET", "/v0/agents/writer", nil).want(t, http.StatusOK)
	if strings.Contains(string(r.body), secret) {
		t.Fatalf("agent %s", r.body)
	}
	e.admin("DELETE", "/v0/agents/writer", nil).want(t, http.StatusNoContent)
	e.admin("GET", "/v0/agents/writer", nil).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	e.admin("DELETE", "/v0/agents/writer", nil).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
}

func TestBundlesWithoutLoader(t *testing.T) {
	e := newEnv(t)
	e.do("PUT", "/v0/bundles/b", rawBody(`{"engine":"rules","files":{"rules.yaml":"x"}}`),
		map[string]string{"Authorization": "Bearer " + testAdminKey, "Content-Type": "application/json"}).
		wantErr(t, http.StatusServiceUnavailable, wire.CodeUnavailable)
}

func TestBundles(t *testing.T) {
	loader := &fakeLoader{}
	e := newEnv(t, func(o *envOpts) { o.loader = loader })
	put := func(name, ct string, body []byte) resp {
		return e.do("PUT", "/v0/bundles/"+name, rawBody(body), map[string]string{"Authorization": "Bearer " + testAdminKey, "Content-Type": ct})
	}

	// JSON form without a manifest: one is made from the name and engine.
	var b wire.Bundle
	put("research", "application/json", []byte(`{"engine":"rules","files":{"rules.yaml":"default_action: deny\n"},"files_base64":{"data.json":"`+
		base64.StdEncoding.EncodeToString([]byte(`{"x":1}`))+`"}}`)).want(t, http.StatusOK).decode(t, &b)
	if b.Name != "research" || b.Engine != "rules" || len(b.Revision) != 12 || len(b.Digest) != 64 || b.Size == 0 {
		t.Fatalf("bundle %+v", b)
	}
	// The made-up revision follows the content: the same files keep it,
	// other files get another.
	var same, other wire.Bundle
	put("research", "application/json", []byte(`{"engine":"rules","files":{"rules.yaml":"default_action: deny\n"},"files_base64":{"data.json":"`+
		base64.StdEncoding.EncodeToString([]byte(`{"x":1}`))+`"}}`)).want(t, http.StatusOK).decode(t, &same)
	put("research", "application/json", []byte(`{"engine":"rules","files":{"rules.yaml":"default_action: allow\n"},"files_base64":{"data.json":"`+
		base64.StdEncoding.EncodeToString([]byte(`{"x":1}`))+`"}}`)).want(t, http.StatusOK).decode(t, &other)
	if same.Revision != b.Revision || other.Revision == b.Revision || len(other.Revision) != 12 {
		t.Fatalf("revisions %q, same files %q, other files %q", b.Revision, same.Revision, other.Revision)
	}
	put("research", "application/json", []byte(`{"engine":"rules","files":{"rules.yaml":"default_action: deny\n"},"files_base64":{"data.json":"`+
		base64.StdEncoding.EncodeToString([]byte(`{"x":1}`))+`"}}`)).want(t, http.StatusOK)
	// The stored archive holds the files, the made-up manifest included.
	r := e.admin("GET", "/v0/bundles/research?archive=1", nil).want(t, http.StatusOK)
	if r.header.Get("Content-Type") != "application/gzip" {
		t.Fatalf("content type %q", r.header.Get("Content-Type"))
	}
	files, err := untar(r.body)
	if err != nil {
		t.Fatal(err)
	}
	if string(files["data.json"]) != `{"x":1}` || !strings.Contains(string(files["bundle.yaml"]), "engine: rules") {
		t.Fatalf("archive files %q", files)
	}

	// A .tar.gz.
	archive, err := tarGz(map[string][]byte{"bundle.yaml": []byte("name: guard\nrevision: \"7\"\nengine: rego\n"), "policy.rego": []byte("package x\n")})
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range []string{"application/gzip", "application/x-gzip", "application/octet-stream"} {
		put("guard", ct, archive).want(t, http.StatusOK).decode(t, &b)
		if b.Name != "guard" || b.Revision != "7" || b.Engine != "rego" {
			t.Fatalf("%s: bundle %+v", ct, b)
		}
	}

	tests := []struct {
		name, bundle, ct string
		body             []byte
		st               int
		code             string
	}{
		{"engine differs from manifest", "guard", "application/json",
			[]byte(`{"engine":"wasm","files":{"bundle.yaml":"name: guard\nengine: rego # the engine\n","policy.rego":"package x"}}`), 400, wire.CodeValidation},
		{"manifest names another bundle", "other", "application/gzip", archive, 400, wire.CodeValidation},
		{"no engine, no manifest", "x", "application/json", []byte(`{"files":{"rules.yaml":"a"}}`), 400, wire.CodeValidation},
		{"bad engine name", "x", "application/json", []byte(`{"engine":"rules\nname: evil","files":{"rules.yaml":"a"}}`), 400, wire.CodeValidation},
		{"no files", "x", "application/json", []byte(`{"engine":"rules"}`), 400, wire.CodeValidation},
		{"path escapes", "x", "application/json", []byte(`{"engine":"rules","files":{"../etc/passwd":"a"}}`), 400, wire.CodeValidation},
		{"absolute path", "x", "application/json", []byte(`{"engine":"rules","files":{"/rules.yaml":"a"}}`), 400, wire.CodeValidation},
		{"same file twice", "x", "application/json", []byte(`{"engine":"rules","files":{"a":"a"},"files_base64":{"a":"YQ=="}}`), 400, wire.CodeValidation},
		{"bad base64", "x", "application/json", []byte(`{"engine":"rules","files_base64":{"p.wasm":"!!"}}`), 400, wire.CodeValidation},
		{"not gzip", "x", "application/gzip", []byte("plain text"), 400, wire.CodeValidation},
		{"unsupported type", "x", "text/plain", []byte("x"), 400, wire.CodeValidation},
		{"loader refuses", "x", "application/json", []byte(`{"engine":"rules","files":{"rules.yaml":"invalid"}}`), 400, wire.CodeValidation},
		{"bad bundle name", "a%20b", "application/json", []byte(`{"engine":"rules","files":{"rules.yaml":"a"}}`), 400, wire.CodeValidation},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			put(tc.bundle, tc.ct, tc.body).wantErr(t, tc.st, tc.code)
		})
	}
	e.do("PUT", "/v0/bundles/x", rawBody(`{}`), map[string]string{"Authorization": "Bearer " + testAdminKey, "Content-Type": ""}).
		wantErr(t, http.StatusBadRequest, wire.CodeValidation)

	var l wire.BundleList
	r = e.admin("GET", "/v0/bundles", nil).want(t, http.StatusOK)
	r.decode(t, &l)
	if len(l.Bundles) != 2 || bytes.Contains(r.body, []byte(`"archive"`)) {
		t.Fatalf("bundles %s", r.body)
	}
	e.admin("GET", "/v0/bundles/guard", nil).want(t, http.StatusOK).decode(t, &b)
	if b.Revision != "7" {
		t.Fatalf("bundle %+v", b)
	}
	e.admin("GET", "/v0/bundles/guard?archive=maybe", nil).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("DELETE", "/v0/bundles/guard", nil).want(t, http.StatusNoContent)
	e.admin("GET", "/v0/bundles/guard", nil).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	e.admin("DELETE", "/v0/bundles/guard", nil).wantErr(t, http.StatusNotFound, wire.CodeNotFound)

	// Bundle bodies may be larger than other bodies.
	bigBody := []byte(`{"engine":"rules","files":{"rules.yaml":"` + strings.Repeat("#", 2<<20) + `"}}`)
	put("big", "application/json", bigBody).want(t, http.StatusOK)

	// POST /v0/policies/{agent}: native rules become the agent's bundle.
	var pr wire.PolicyResponse
	e.admin("POST", "/v0/policies/bot", map[string]any{"bundle": "default_action: deny\nrules: []\n"}).want(t, http.StatusOK).decode(t, &pr)
	if pr.AgentID != "bot" || pr.Bundle.Name != "agent-bot" || pr.Bundle.Engine != "rules" {
		t.Fatalf("policy %+v", pr)
	}
	var a wire.Agent
	e.admin("GET", "/v0/agents/bot", nil).want(t, http.StatusOK).decode(t, &a)
	if a.Bundle != "agent-bot" {
		t.Fatalf("agent not bound: %+v", a)
	}
	e.admin("POST", "/v0/policies/bot", map[string]any{"bundle": ""}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("POST", "/v0/policies/bot", map[string]any{"bundle": "invalid"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("POST", "/v0/policies/ghost", map[string]any{"bundle": "rules: []"}).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
}

func TestPolicyEval(t *testing.T) {
	e := newEnv(t)
	var res wire.PolicyEvalResponse
	e.admin("POST", "/v0/policy/eval", map[string]any{"agent_id": "bot", "step": map[string]any{"kind": "tool_call", "target": "wire_money", "args": map[string]any{"a": 1}}}).
		want(t, http.StatusOK).decode(t, &res)
	if res.Action != "require_approval" || res.RuleID != "needs_human" || res.Bundle.Name != "test-policy" || res.Approval == nil {
		t.Fatalf("eval %+v", res)
	}
	e.admin("POST", "/v0/policy/eval", map[string]any{"agent_id": "bot", "step": map[string]any{"kind": "tool_call", "target": "limited"}}).
		want(t, http.StatusOK).decode(t, &res)
	if res.Action != "allow" || len(res.RateLimits) != 1 || res.RateLimits[0].ID != "one_per_minute" {
		t.Fatalf("eval %+v", res)
	}
	// A dry run records nothing.
	var l wire.ApprovalList
	e.admin("GET", "/v0/approvals", nil).want(t, http.StatusOK).decode(t, &l)
	if len(l.Approvals) != 0 {
		t.Fatalf("approvals %+v", l)
	}
	e.admin("POST", "/v0/policy/eval", map[string]any{"step": map[string]any{"kind": "tool_call", "target": "x"}}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("POST", "/v0/policy/eval", map[string]any{"agent_id": "ghost", "step": map[string]any{"kind": "tool_call", "target": "x"}}).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	e.admin("POST", "/v0/policy/eval", map[string]any{"agent_id": "bot", "step": map[string]any{"kind": "nope", "target": "x"}}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("POST", "/v0/policy/eval", rawBody(`{"agent_id":"bot","step":{"kind":"tool_call","target":"x","args":{"a":1,"a":2}}}`)).
		wantErr(t, http.StatusBadRequest, wire.CodeValidation)
}

// TestTenantRetention: a tenant's retention is set at creation or by PUT,
// shown in the tenant, and refused when it is not a duration of at least a
// minute.
func TestTenantRetention(t *testing.T) {
	e := newEnv(t)
	var tn wire.Tenant
	e.admin("POST", "/v0/tenants", map[string]any{"id": "keep", "retention": "720h"}).want(t, http.StatusCreated).decode(t, &tn)
	if tn.Retention != "720h" {
		t.Fatalf("created %+v", tn)
	}
	e.admin("POST", "/v0/tenants", map[string]any{"id": "bad", "retention": "10s"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("PUT", "/v0/tenants/keep", map[string]any{"retention": "soon"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("PUT", "/v0/tenants/keep", map[string]any{}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("PUT", "/v0/tenants/keep", map[string]any{"retention": "0s"}).want(t, http.StatusOK).decode(t, &tn)
	if tn.Retention != "0s" {
		t.Fatalf("updated %+v", tn)
	}
	e.admin("PUT", "/v0/tenants/nope", map[string]any{"retention": "1h"}).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
}
