package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/server/wire"
	wbolt "github.com/wicket-run/wicket/store/bbolt"
)

const (
	testAdminKey = "test-admin-key-0123456789"
	botSecret    = "bot-secret-0123456789"
	otherSecret  = "other-secret-0123456789"
)

// recDeliverer records deliveries and acknowledges them (returns nil).
type recDeliverer struct {
	mu   sync.Mutex
	got  []kernel.Delivery
	fail func(kernel.Delivery) error
}

func (d *recDeliverer) Deliver(_ context.Context, dl kernel.Delivery) error {
	d.mu.Lock()
	d.got = append(d.got, dl)
	f := d.fail
	d.mu.Unlock()
	if f != nil {
		return f(dl)
	}
	return nil
}

// testPolicy answers by target: wire_money needs alice's approval, limited
// is rate limited to one call per minute, forbidden is denied, anything
// else is allowed.
type testPolicy struct{}

func (testPolicy) Decide(_ context.Context, req *kernel.PolicyRequest) (kernel.Verdict, error) {
	ref := policy.BundleRef{Name: "test-policy", Revision: "1", Engine: "builtin"}
	switch req.Input.Step.Target {
	case "wire_money":
		return kernel.Verdict{Bundle: ref, Action: policy.RequireApproval, RuleID: "needs_human",
			Reason: "money moves need a human", Approval: &policy.Approval{Approvers: []string{"alice"}}}, nil
	case "limited":
		return kernel.Verdict{Bundle: ref, Action: policy.Allow, RuleID: "limited",
			RateLimits: []kernel.RateLimitRule{{ID: "one_per_minute", RateLimit: policy.RateLimit{MaxCalls: 1, Window: "1m"}}}}, nil
	case "careful_send": // a bundle that asks for on_interrupted: approval
		return kernel.Verdict{Bundle: ref, Action: policy.Allow, RuleID: "careful", OnInterrupted: kernel.OnInterruptedApproval}, nil
	case "forbidden":
		return kernel.Verdict{Bundle: ref, Action: policy.Deny, RuleID: "no", Reason: "forbidden tool"}, nil
	}
	return kernel.Verdict{Bundle: ref, Action: policy.Allow, RuleID: "yes"}, nil
}

// fakeLoader is a kernel.BundleLoader that understands just enough of a
// bundle (bundle.yaml's name, revision and engine) to exercise the HTTP
// plumbing; the real engines live in plugins.
type fakeLoader struct {
	mu     sync.Mutex
	active map[string]policy.BundleRef
}

func (l *fakeLoader) Compile(_ context.Context, _ string, src kernel.BundleSource) (*kernel.CompiledBundle, error) {
	files := src.Files
	archive := src.Archive
	var err error
	if archive != nil {
		if files, err = untar(archive); err != nil {
			return nil, err
		}
	} else if archive, err = tarGz(files); err != nil {
		return nil, err
	}
	m, ok := files["bundle.yaml"]
	if !ok {
		return nil, errors.New("bundle.yaml: missing")
	}
	ref := policy.BundleRef{}
	for _, line := range strings.Split(string(m), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		}
		switch k {
		case "name":
			ref.Name = v
		case "revision":
			ref.Revision = v
		case "engine":
			ref.Engine = v
		}
	}
	if ref.Name == "" || ref.Engine == "" {
		return nil, errors.New("bundle.yaml: name and engine are required")
	}
	if bytes.Contains(files["rules.yaml"], []byte("invalid")) {
		return nil, errors.New("rules.yaml: rule 1: when: empty predicate")
	}
	sum := sha256.Sum256(archive)
	ref.Digest = hex.EncodeToString(sum[:])
	return &kernel.CompiledBundle{Ref: ref, Archive: archive}, nil
}

func (l *fakeLoader) Activate(tenant string, cb *kernel.CompiledBundle) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active == nil {
		l.active = map[string]policy.BundleRef{}
	}
	l.active[tenant+"/"+cb.Ref.Name] = cb.Ref
}

func (l *fakeLoader) Discard(*kernel.CompiledBundle) {}

func (l *fakeLoader) Failed(string, string, error) {}

func (l *fakeLoader) Remove(tenant, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.active, tenant+"/"+name)
}

func (l *fakeLoader) RulesBundle(name string, rulesYAML []byte) (kernel.BundleSource, error) {
	return kernel.BundleSource{Files: map[string][]byte{
		"bundle.yaml": []byte("name: " + name + "\nrevision: \"1\"\nengine: rules\n"),
		"rules.yaml":  rulesYAML,
	}}, nil
}

func tarGz(files map[string][]byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func untar(archive []byte) (map[string][]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[h.Name] = b
	}
}

// env is one kernel on a bbolt file in t.TempDir(), served over real HTTP
// on loopback.
type env struct {
	t     *testing.T
	k     *kernel.Kernel
	srv   *Server
	ts    *httptest.Server
	deliv *recDeliverer
}

type envOpts struct {
	kcfg   kernel.Config
	scfg   Config
	pol    kernel.Policy
	loader kernel.BundleLoader
	// noAgents skips registering the default agents.
	noAgents bool
	// store wraps the bbolt store the kernel uses (fault injection).
	store func(kernel.Store) kernel.Store
}

func newEnv(t *testing.T, opt ...func(*envOpts)) *env {
	t.Helper()
	o := envOpts{scfg: Config{AdminKey: testAdminKey}, pol: testPolicy{}}
	for _, f := range opt {
		f(&o)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(&testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	o.kcfg.Logger = logger
	o.scfg.Logger = logger
	st, err := wbolt.Open(filepath.Join(t.TempDir(), "wicket.db"), wbolt.Options{})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	d := &recDeliverer{}
	var ks kernel.Store = st
	if o.store != nil {
		ks = o.store(st)
	}
	var loader kernel.BundleLoader
	if o.loader != nil {
		loader = o.loader
	}
	k, err := kernel.New(ks, d, o.pol, loader, o.kcfg)
	if err != nil {
		t.Fatalf("kernel: %v", err)
	}
	if err := k.Start(context.Background()); err != nil {
		t.Fatalf("start kernel: %v", err)
	}
	srv := New(k, o.scfg)
	// The server as `wicket serve` runs it: its timeouts, connection limit
	// and idle eviction.
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.Config = srv.HTTPServer()
	ts.Listener = srv.Listener(ts.Listener)
	ts.Start()
	e := &env{t: t, k: k, srv: srv, ts: ts, deliv: d}
	t.Cleanup(func() {
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := k.Close(ctx); err != nil {
			t.Errorf("close kernel: %v", err)
		}
		if err := st.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	if !o.noAgents {
		for _, a := range []kernel.Agent{
			{ID: "bot", WebhookURL: "http://127.0.0.1:9/bot", Secret: botSecret},
			{ID: "other", WebhookURL: "http://127.0.0.1:9/other", Secret: otherSecret},
		} {
			if _, err := k.PutAgent(context.Background(), a); err != nil {
				t.Fatalf("put agent: %v", err)
			}
		}
	}
	return e
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// resp is an answered request.
type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (r resp) err(t *testing.T) wire.ErrorBody {
	t.Helper()
	var e wire.ErrorBody
	r.decode(t, &e)
	return e
}

// want fails the test unless the status is st.
func (r resp) want(t *testing.T, st int) resp {
	t.Helper()
	if r.status != st {
		t.Fatalf("status %d, want %d; body %s", r.status, st, r.body)
	}
	return r
}

// wantErr fails the test unless the answer is an error envelope with st and code.
func (r resp) wantErr(t *testing.T, st int, code string) wire.ErrorBody {
	t.Helper()
	r.want(t, st)
	e := r.err(t)
	if e.Code != code || e.Message == "" {
		t.Fatalf("error %+v, want code %s with a message", e, code)
	}
	return e
}

// rawBody marks a body to send as is.
type rawBody []byte

func bodyBytes(t *testing.T, body any) []byte {
	t.Helper()
	switch b := body.(type) {
	case nil:
		return nil
	case rawBody:
		return b
	case string:
		return []byte(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
}

// do sends a request with the given headers.
func (e *env) do(method, path string, body any, hdr map[string]string) resp {
	e.t.Helper()
	b := bodyBytes(e.t, body)
	req, err := http.NewRequest(method, e.ts.URL+path, bytes.NewReader(b))
	if err != nil {
		e.t.Fatal(err)
	}
	if b != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := e.ts.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	rb, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: rb}
}

func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

// admin sends a request with the admin key.
func (e *env) admin(method, path string, body any) resp {
	e.t.Helper()
	return e.do(method, path, body, bearer(testAdminKey))
}

// agentReq is a signed agent request.
type agentReq struct {
	agentID, secret string
	lease           *kernel.Lease // nil: no dispatch headers
	// body signs with the Rebuno body scheme instead of v1.
	body bool
}

func (e *env) agent(a agentReq, method, path string, body any) resp {
	e.t.Helper()
	b := bodyBytes(e.t, body)
	h := map[string]string{wire.HeaderAgentID: a.agentID}
	if a.lease != nil {
		h[wire.HeaderDispatchID] = a.lease.DispatchID
		h[wire.HeaderDispatchAttempt] = strconv.Itoa(a.lease.Attempt)
	}
	if a.body {
		h[wire.HeaderSignature] = wire.Sign([]byte(a.secret), b)
	} else {
		h[wire.HeaderWicketSignature] = signV1(a.secret, method, path, h, b, time.Now())
	}
	return e.do(method, path, rawBody(b), h)
}

// signV1 is the v1 signature of a request to path (the target as sent)
// with the dispatch headers in hdr, at time at.
func signV1(secret, method, path string, hdr map[string]string, body []byte, at time.Time) string {
	return wire.SignV1([]byte(secret), at, wire.SignedRequest{Method: method, Target: path,
		DispatchID: hdr[wire.HeaderDispatchID], DispatchAttempt: hdr[wire.HeaderDispatchAttempt], Body: body})
}

// waitDelivery waits for the delivery of an execution's attempt.
func (e *env) waitDelivery(execID string, attempt int) kernel.Delivery {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		e.deliv.mu.Lock()
		for _, d := range e.deliv.got {
			if d.ExecutionID == execID && d.Attempt == attempt {
				e.deliv.mu.Unlock()
				return d
			}
		}
		e.deliv.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("no delivery of %s attempt %d", execID, attempt)
	return kernel.Delivery{}
}

// waitAcked waits until the kernel recorded the acknowledgement of the
// current attempt (so later events do not race with dispatch.acked).
func (e *env) waitAcked(tenant, execID string) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		x, err := e.k.GetExecution(context.Background(), tenant, execID)
		if err == nil && x.Dispatch.State == kernel.DispatchAcked {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("execution %s was never acked", execID)
}

// running is an execution whose first dispatch the agent holds.
type running struct {
	id    string
	lease kernel.Lease
	as    agentReq // the agent with the lease
}

// start creates an execution of agentID and waits for its first delivery.
func (e *env) start(agentID string) running {
	e.t.Helper()
	var x wire.Execution
	e.admin("POST", "/v0/executions", map[string]any{"agent_id": agentID, "input": map[string]any{"q": "hello"}}).
		want(e.t, http.StatusCreated).decode(e.t, &x)
	d := e.waitDelivery(x.ID, 1)
	e.waitAcked(x.Tenant, x.ID)
	secret := botSecret
	if agentID == "other" {
		secret = otherSecret
	}
	l := kernel.Lease{DispatchID: d.DispatchID, Attempt: d.Attempt}
	return running{id: x.ID, lease: l, as: agentReq{agentID: agentID, secret: secret, lease: &l}}
}

// submit submits a step as the execution's agent and decodes the decision.
func (e *env) submit(r running, kind, target string, args any) wire.StepDecision {
	e.t.Helper()
	var d wire.StepDecision
	e.agent(r.as, "POST", "/v0/executions/"+r.id+"/steps", map[string]any{"kind": kind, "target": target, "args": args}).
		want(e.t, http.StatusOK).decode(e.t, &d)
	return d
}
