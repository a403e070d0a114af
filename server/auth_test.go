package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// createKey issues a key through the API and returns its secret.
func (e *env) createKey(t *testing.T, tenant, role, principal string) string {
	t.Helper()
	var k wire.CreatedKey
	e.admin("POST", "/v0/tenants/"+tenant+"/keys", map[string]any{"role": role, "principal": principal}).
		want(t, http.StatusCreated).decode(t, &k)
	if k.Key == "" || k.KeyID == "" || k.Tenant != tenant || k.Role != role {
		t.Fatalf("created key %+v", k)
	}
	return k.Key
}

func TestBearerAuth(t *testing.T) {
	e := newEnv(t)
	e.admin("POST", "/v0/tenants", map[string]any{"id": "acme"}).want(t, http.StatusCreated)
	client := e.createKey(t, "default", "client", "ci")
	tadmin := e.createKey(t, "default", "tenant-admin", "ops")
	acme := e.createKey(t, "acme", "client", "acme-ci")
	acmeAdmin := e.createKey(t, "acme", "tenant-admin", "acme-ops")
	r := e.start("bot") // an execution of tenant default

	tests := []struct {
		name   string
		method string
		path   string
		hdr    map[string]string
		body   any
		st     int
		code   string
	}{
		{"no key", "GET", "/v0/executions", nil, nil, 401, wire.CodeUnauthenticated},
		{"wrong key", "GET", "/v0/executions", bearer("nope-nope-nope-nope"), nil, 401, wire.CodeUnauthenticated},
		{"not bearer", "GET", "/v0/executions", map[string]string{"Authorization": "Basic " + testAdminKey}, nil, 401, wire.CodeUnauthenticated},
		{"empty bearer", "GET", "/v0/executions", map[string]string{"Authorization": "Bearer "}, nil, 401, wire.CodeUnauthenticated},
		{"admin key prefix", "GET", "/v0/executions", bearer(testAdminKey[:10]), nil, 401, wire.CodeUnauthenticated},
		{"client lists executions", "GET", "/v0/executions", bearer(client), nil, 200, ""},
		{"client reads an execution", "GET", "/v0/executions/" + r.id, bearer(client), nil, 200, ""},
		{"client on admin route", "GET", "/v0/agents", bearer(client), nil, 403, wire.CodeForbidden},
		{"client registers an agent", "POST", "/v0/agents", bearer(client), map[string]any{"id": "x"}, 403, wire.CodeForbidden},
		{"client on tenants route", "GET", "/v0/tenants", bearer(client), nil, 403, wire.CodeForbidden},
		{"tenant-admin on admin route", "GET", "/v0/agents", bearer(tadmin), nil, 200, ""},
		{"tenant-admin on tenants route", "POST", "/v0/tenants", bearer(tadmin), map[string]any{"id": "x"}, 403, wire.CodeForbidden},
		{"tenant-admin names a tenant", "GET", "/v0/agents?tenant=acme", bearer(tadmin), nil, 403, wire.CodeForbidden},
		{"client names its own tenant", "GET", "/v0/executions?tenant=default", bearer(client), nil, 200, ""},
		{"admin names a tenant", "GET", "/v0/agents?tenant=acme", bearer(testAdminKey), nil, 200, ""},
		{"admin names a bad tenant", "GET", "/v0/agents?tenant=a%20b", bearer(testAdminKey), nil, 400, wire.CodeValidation},
		{"admin lists a tenant that does not exist", "GET", "/v0/executions?tenant=nope", bearer(testAdminKey), nil, 404, wire.CodeNotFound},
		{"admin lists the agents of a tenant that does not exist", "GET", "/v0/agents?tenant=nope", bearer(testAdminKey), nil, 404, wire.CodeNotFound},
		{"admin lists the approvals of a tenant that does not exist", "GET", "/v0/approvals?tenant=nope", bearer(testAdminKey), nil, 404, wire.CodeNotFound},
		{"admin names the default tenant", "GET", "/v0/agents?tenant=default", bearer(testAdminKey), nil, 200, ""},
		{"tenant A reads tenant B's execution", "GET", "/v0/executions/" + r.id, bearer(acme), nil, 404, wire.CodeNotFound},
		{"tenant A reads tenant B's steps", "GET", "/v0/executions/" + r.id + "/steps", bearer(acme), nil, 404, wire.CodeNotFound},
		{"tenant A reads tenant B's events", "GET", "/v0/executions/" + r.id + "/events", bearer(acme), nil, 404, wire.CodeNotFound},
		{"tenant A streams tenant B's execution", "GET", "/v0/executions/" + r.id + "/stream", bearer(acme), nil, 404, wire.CodeNotFound},
		{"tenant A cancels tenant B's execution", "POST", "/v0/executions/" + r.id + "/cancel", bearer(acmeAdmin), nil, 404, wire.CodeNotFound},
		{"admin in another tenant", "GET", "/v0/executions/" + r.id + "?tenant=acme", bearer(testAdminKey), nil, 404, wire.CodeNotFound},
		{"bearer on agent route", "POST", "/v0/executions/" + r.id + "/steps", bearer(testAdminKey), map[string]any{"kind": "local", "target": "t"}, 403, wire.CodeForbidden},
		{"nothing on agent route", "POST", "/v0/executions/" + r.id + "/heartbeat", nil, nil, 401, wire.CodeUnauthenticated},
		{"open health", "GET", "/v0/health", nil, nil, 200, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := e.do(tc.method, tc.path, tc.body, tc.hdr)
			if tc.code == "" {
				res.want(t, tc.st)
				return
			}
			res.wantErr(t, tc.st, tc.code)
			if tc.st == 401 && res.header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
}

func TestTenantsAndKeys(t *testing.T) {
	e := newEnv(t)
	var tn wire.Tenant
	// A new tenant has no bundles, so it cannot name guards yet.
	e.admin("POST", "/v0/tenants", map[string]any{"id": "acme", "guards": []string{"no-destructive"}}).
		wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("POST", "/v0/tenants", map[string]any{"id": "acme"}).want(t, http.StatusCreated).decode(t, &tn)
	if tn.ID != "acme" || len(tn.Guards) != 0 {
		t.Fatalf("tenant %+v", tn)
	}
	e.admin("POST", "/v0/tenants", map[string]any{"id": "acme"}).wantErr(t, http.StatusConflict, wire.CodeConflict)
	e.admin("POST", "/v0/tenants", map[string]any{"id": "bad id"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	var tl wire.TenantList
	e.admin("GET", "/v0/tenants", nil).want(t, http.StatusOK).decode(t, &tl)
	if len(tl.Tenants) != 2 || tl.Tenants[0].ID != "default" {
		t.Fatalf("tenants %+v", tl)
	}

	// An acme tenant-admin registers an agent in acme; a client of acme runs it.
	acmeAdmin := e.createKey(t, "acme", "tenant-admin", "ops")
	e.do("POST", "/v0/agents", map[string]any{"id": "bot", "webhook_url": "http://127.0.0.1:9/acme", "secret": "acme-secret-0123456789"}, bearer(acmeAdmin)).
		want(t, http.StatusCreated)
	acmeClient := e.createKey(t, "acme", "client", "ci")
	var x wire.Execution
	e.do("POST", "/v0/executions", map[string]any{"agent_id": "bot"}, bearer(acmeClient)).want(t, http.StatusCreated).decode(t, &x)
	if x.Tenant != "acme" {
		t.Fatalf("execution in %s", x.Tenant)
	}
	// default's client cannot see it; the kernel admin can with ?tenant=.
	defClient := e.createKey(t, "default", "client", "ci")
	e.do("GET", "/v0/executions/"+x.ID, nil, bearer(defClient)).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	e.admin("GET", "/v0/executions/"+x.ID+"?tenant=acme", nil).want(t, http.StatusOK)
	// The agent of acme signs with acme's secret: the execution fixes the tenant.
	e.waitDelivery(x.ID, 1)
	e.agent(agentReq{agentID: "bot", secret: "acme-secret-0123456789"}, "GET", "/v0/executions/"+x.ID, nil).want(t, http.StatusOK)
	e.agent(agentReq{agentID: "bot", secret: botSecret}, "GET", "/v0/executions/"+x.ID, nil).wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)

	// Keys are listed without secrets; deleting one revokes it.
	r := e.admin("GET", "/v0/tenants/acme/keys", nil).want(t, http.StatusOK)
	var kl wire.KeyList
	r.decode(t, &kl)
	if len(kl.Keys) != 2 {
		t.Fatalf("keys %+v", kl)
	}
	if strings.Contains(string(r.body), acmeClient) || strings.Contains(string(r.body), `"hash"`) || strings.Contains(string(r.body), kernel.HashKey(acmeClient)) {
		t.Fatalf("key list leaks secrets: %s", r.body)
	}
	e.admin("GET", "/v0/tenants/ghost/keys", nil).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	e.admin("POST", "/v0/tenants/ghost/keys", map[string]any{"role": "client", "principal": "x"}).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	e.admin("POST", "/v0/tenants/acme/keys", map[string]any{"role": "root", "principal": "x"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	var id string
	for _, k := range kl.Keys {
		if k.Role == "client" {
			id = k.KeyID
		}
	}
	e.admin("DELETE", "/v0/tenants/acme/keys/"+id, nil).want(t, http.StatusNoContent)
	e.admin("DELETE", "/v0/tenants/acme/keys/"+id, nil).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	e.do("GET", "/v0/executions", nil, bearer(acmeClient)).wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)

	// A stored admin key is kernel-wide: it may name ?tenant= and manage tenants.
	root := e.createKey(t, "default", "admin", "root")
	e.do("GET", "/v0/agents?tenant=acme", nil, bearer(root)).want(t, http.StatusOK)
	e.do("GET", "/v0/tenants", nil, bearer(root)).want(t, http.StatusOK)
}

func TestAgentAuth(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	o := e.start("other")
	steps := "/v0/executions/" + r.id + "/steps"
	step := map[string]any{"kind": "tool_call", "target": "search", "args": map[string]any{"q": 1}}
	body := bodyBytes(t, step)
	lease := map[string]string{wire.HeaderDispatchID: r.lease.DispatchID, wire.HeaderDispatchAttempt: "1"}
	with := func(kv ...string) map[string]string {
		h := map[string]string{}
		for k, v := range lease {
			h[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(h, kv[i])
			} else {
				h[kv[i]] = kv[i+1]
			}
		}
		return h
	}
	// signed adds a v1 signature of (method, path, the headers' lease, b)
	// by secret to h: a request the agent really made.
	signed := func(secret, method, path string, b []byte, h map[string]string) map[string]string {
		h[wire.HeaderWicketSignature] = signV1(secret, method, path, h, b, time.Now())
		return h
	}
	sig := signV1(botSecret, "POST", steps, lease, body, time.Now())
	tests := []struct {
		name string
		path string
		body []byte
		hdr  map[string]string
		st   int
		code string
	}{
		{"good", steps, body, with(wire.HeaderAgentID, "bot", wire.HeaderWicketSignature, sig), 200, ""},
		{"no signature", steps, body, with(wire.HeaderAgentID, "bot"), 401, wire.CodeUnauthenticated},
		{"wrong secret", steps, body, signed("wrong-secret-0123456", "POST", steps, body, with(wire.HeaderAgentID, "bot")), 401, wire.CodeUnauthenticated},
		{"signature of another body", steps, body, signed(botSecret, "POST", steps, []byte("{}"), with(wire.HeaderAgentID, "bot")), 401, wire.CodeUnauthenticated},
		{"malformed signature", steps, body, with(wire.HeaderAgentID, "bot", wire.HeaderWicketSignature, "t=1,v1=xyz"), 401, wire.CodeUnauthenticated},
		{"body scheme for a v1 agent", steps, body, with(wire.HeaderAgentID, "bot", wire.HeaderSignature, wire.Sign([]byte(botSecret), body)), 401, wire.CodeUnauthenticated},
		{"both schemes for a v1 agent", steps, body, with(wire.HeaderAgentID, "bot", wire.HeaderWicketSignature, sig, wire.HeaderSignature, wire.Sign([]byte(botSecret), body)), 401, wire.CodeUnauthenticated},
		{"agent of another execution", "/v0/executions/" + o.id + "/steps", body, signed(botSecret, "POST", "/v0/executions/"+o.id+"/steps", body, with(wire.HeaderAgentID, "bot")), 401, wire.CodeUnauthenticated},
		{"other agent, its own secret", steps, body, signed(otherSecret, "POST", steps, body, with(wire.HeaderAgentID, "other")), 401, wire.CodeUnauthenticated},
		{"unknown execution", "/v0/executions/01890000-0000-7000-8000-000000000000/steps", body, with(wire.HeaderAgentID, "bot", wire.HeaderWicketSignature, sig), 401, wire.CodeUnauthenticated},
		{"no dispatch headers", steps, body, signed(botSecret, "POST", steps, body, map[string]string{wire.HeaderAgentID: "bot"}), 400, wire.CodeValidation},
		{"no attempt", steps, body, signed(botSecret, "POST", steps, body, with(wire.HeaderAgentID, "bot", wire.HeaderDispatchAttempt, "")), 400, wire.CodeValidation},
		{"attempt not an integer", steps, body, signed(botSecret, "POST", steps, body, with(wire.HeaderAgentID, "bot", wire.HeaderDispatchAttempt, "one")), 400, wire.CodeValidation},
		{"attempt zero", steps, body, signed(botSecret, "POST", steps, body, with(wire.HeaderAgentID, "bot", wire.HeaderDispatchAttempt, "0")), 400, wire.CodeValidation},
		{"unknown dispatch", steps, body, signed(botSecret, "POST", steps, body, with(wire.HeaderAgentID, "bot", wire.HeaderDispatchID, "nope")), 409, wire.CodeLeaseSuperseded},
		{"the lease headers changed after signing", steps, body, with(wire.HeaderAgentID, "bot", wire.HeaderWicketSignature, sig, wire.HeaderDispatchID, "nope"), 401, wire.CodeUnauthenticated},
		{"agent on a client route", "/v0/executions", bodyBytes(t, map[string]any{"agent_id": "bot"}),
			signed(botSecret, "POST", "/v0/executions", bodyBytes(t, map[string]any{"agent_id": "bot"}), map[string]string{wire.HeaderAgentID: "bot"}), 401, wire.CodeUnauthenticated},
		{"agent reads another execution", "/v0/executions/" + o.id, nil,
			signed(botSecret, "GET", "/v0/executions/"+o.id, nil, map[string]string{wire.HeaderAgentID: "bot"}), 401, wire.CodeUnauthenticated},
		{"agent read, wrong signature", "/v0/executions/" + r.id, nil,
			signed(otherSecret, "GET", "/v0/executions/"+r.id, nil, map[string]string{wire.HeaderAgentID: "bot"}), 401, wire.CodeUnauthenticated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method := "POST"
			if tc.body == nil {
				method = "GET"
			}
			res := e.do(method, tc.path, rawBody(tc.body), tc.hdr)
			if tc.code == "" {
				res.want(t, tc.st)
				return
			}
			res.wantErr(t, tc.st, tc.code)
		})
	}
	// Nothing above may have changed the other execution.
	var l wire.StepList
	e.admin("GET", "/v0/executions/"+o.id+"/steps", nil).want(t, http.StatusOK).decode(t, &l)
	if len(l.Steps) != 0 {
		t.Fatalf("steps appeared on another agent's execution: %+v", l)
	}
}

// TestAgentAuthOneScheme: a request carrying both signature headers is
// refused whatever the agent's scheme and whether each signature is valid
// (docs/security.md, "No downgrade"): the kernel checked only the
// agent's own scheme and ignored the other header.
func TestAgentAuthOneScheme(t *testing.T) {
	e := newEnv(t)
	if _, err := e.k.PutAgent(context.Background(), kernel.Agent{ID: "writer", WebhookURL: "http://127.0.0.1:9/writer",
		Secret: botSecret, Signing: kernel.SigningBody}); err != nil {
		t.Fatal(err)
	}
	r := e.start("bot")
	var w wire.Execution
	e.admin("POST", "/v0/executions", map[string]any{"agent_id": "writer"}).want(t, http.StatusCreated).decode(t, &w)
	for _, tc := range []struct {
		name, agent, id string
	}{{"v1 agent", "bot", r.id}, {"body agent", "writer", w.ID}} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v0/executions/" + tc.id
			h := map[string]string{wire.HeaderAgentID: tc.agent}
			both := map[string]string{wire.HeaderAgentID: tc.agent,
				wire.HeaderWicketSignature: signV1(botSecret, "GET", path, h, nil, time.Now()),
				wire.HeaderSignature:       wire.Sign([]byte(botSecret), nil)}
			// Each header alone: the agent's own scheme reads, the other is refused.
			for _, k := range []string{wire.HeaderWicketSignature, wire.HeaderSignature} {
				one := map[string]string{wire.HeaderAgentID: tc.agent, k: both[k]}
				own := (k == wire.HeaderSignature) == (tc.agent == "writer")
				if res := e.do("GET", path, nil, one); (res.status == http.StatusOK) != own {
					t.Fatalf("%s alone: status %d %s", k, res.status, res.body)
				}
			}
			body := e.do("GET", path, nil, both).wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)
			if !strings.Contains(body.Message, "not both") {
				t.Fatalf("message %q does not say why", body.Message)
			}
		})
	}
}

// manualClock is a kernel clock that moves only when a test says so: a
// lease lapses when the test moves it past, never because a loaded machine
// stalled the test.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func newManualClock() *manualClock { return &manualClock{now: time.Now()} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestLeaseSuperseded(t *testing.T) {
	clk := newManualClock()
	e := newEnv(t, func(o *envOpts) {
		o.kcfg = kernel.Config{LeaseTimeout: 300 * time.Millisecond, ReapInterval: 20 * time.Millisecond, Clock: clk}
	})
	var x wire.Execution
	e.admin("POST", "/v0/executions", map[string]any{"agent_id": "bot"}).want(t, http.StatusCreated).decode(t, &x)
	d1 := e.waitDelivery(x.ID, 1)
	// No heartbeat: the lease expires and attempt 2 is delivered. The
	// clock then stands still, so attempt 2's lease holds however long the
	// rest takes.
	clk.add(time.Second)
	d2 := e.waitDelivery(x.ID, 2)
	if d2.DispatchID != d1.DispatchID {
		t.Fatalf("re-delivery changed the dispatch id")
	}
	old := kernel.Lease{DispatchID: d1.DispatchID, Attempt: d1.Attempt}
	stale := agentReq{agentID: "bot", secret: botSecret, lease: &old}
	for _, c := range []struct{ path, body string }{
		{"/steps", `{"kind":"tool_call","target":"t"}`},
		{"/heartbeat", ``},
		{"/complete", `{"output":1}`},
		{"/fail", `{"error":"x"}`},
	} {
		res := e.agent(stale, "POST", "/v0/executions/"+x.ID+c.path, rawBody(c.body))
		body := res.wantErr(t, http.StatusConflict, wire.CodeLeaseSuperseded)
		if body.Details["dispatch_attempt"] != float64(1) {
			t.Errorf("%s: details %+v", c.path, body.Details)
		}
	}
	// The current attempt works, and nothing the stale one sent was recorded.
	cur := kernel.Lease{DispatchID: d2.DispatchID, Attempt: d2.Attempt}
	var hb wire.HeartbeatResponse
	e.agent(agentReq{agentID: "bot", secret: botSecret, lease: &cur}, "POST", "/v0/executions/"+x.ID+"/heartbeat", nil).
		want(t, http.StatusOK).decode(t, &hb)
	var got wire.Execution
	e.admin("GET", "/v0/executions/"+x.ID, nil).want(t, http.StatusOK).decode(t, &got)
	if got.Status != "running" || got.Totals.Steps != 0 {
		t.Fatalf("execution %+v", got)
	}
}

func TestAuthDisabled(t *testing.T) {
	e := newEnv(t, func(o *envOpts) { o.scfg = Config{AuthDisabled: true} })
	// Bearer-less client and admin requests act as admin.
	e.do("GET", "/v0/executions", nil, nil).want(t, http.StatusOK)
	e.do("GET", "/v0/tenants", nil, nil).want(t, http.StatusOK)
	e.do("POST", "/v0/tenants", map[string]any{"id": "acme"}, nil).want(t, http.StatusCreated)
	e.do("GET", "/v0/agents?tenant=acme", nil, nil).want(t, http.StatusOK)
	var x wire.Execution
	e.do("POST", "/v0/executions", map[string]any{"agent_id": "bot"}, nil).want(t, http.StatusCreated).decode(t, &x)
	// An agent's executions still need its signature (without one the
	// request is a session holder's, and this is no session).
	e.do("POST", "/v0/executions/"+x.ID+"/heartbeat", nil, nil).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("POST", "/v0/executions/"+x.ID+"/heartbeat", nil, map[string]string{wire.HeaderAgentID: "bot", wire.HeaderSignature: "sha256=00"}).
		wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)
	e.do("POST", "/v0/executions/"+x.ID+"/heartbeat", nil, map[string]string{wire.HeaderAgentID: "bot", wire.HeaderWicketSignature: "t=1,v1=00"}).
		wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)
	// An empty admin key never matches.
	e.do("GET", "/v0/executions", nil, map[string]string{"Authorization": "Bearer x"}).wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)
	// Keys issued while auth is off still carry their role.
	var k wire.CreatedKey
	e.do("POST", "/v0/tenants/default/keys", map[string]any{"role": "client", "principal": "ci"}, nil).want(t, http.StatusCreated).decode(t, &k)
	e.do("GET", "/v0/tenants", nil, bearer(k.Key)).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
}

// TestHeaderKeysCanonical: headerValue reads the header map by the key as
// given, so every key the server reads with it must be in the canonical
// form net/http stores request headers under.
func TestHeaderKeysCanonical(t *testing.T) {
	for _, k := range []string{wire.HeaderAgentID, wire.HeaderSignature, wire.HeaderWicketSignature, wire.HeaderDispatchID,
		wire.HeaderDispatchAttempt, wire.HeaderStepID, "Authorization"} {
		if c := http.CanonicalHeaderKey(k); c != k {
			t.Errorf("header key %q is not canonical (%q)", k, c)
		}
	}
	h := http.Header{}
	h.Set("rebuno-agent-id", "a")
	if got := headerValue(h, wire.HeaderAgentID); got != "a" {
		t.Errorf("headerValue = %q, want the value Set stored", got)
	}
}

// TestVerifiersReuse: the server keeps one verifier per secret, and starts
// over once it holds maxVerifiers.
func TestVerifiersReuse(t *testing.T) {
	var vs verifiers
	a := vs.get("secret-a")
	if vs.get("secret-a") != a || vs.get("secret-b") == a {
		t.Fatal("one verifier per secret")
	}
	for i := range maxVerifiers {
		vs.get(fmt.Sprint("s", i))
	}
	if n := len(vs.m); n > maxVerifiers {
		t.Errorf("%d verifiers kept, at most %d", n, maxVerifiers)
	}
}
