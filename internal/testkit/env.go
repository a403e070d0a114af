// Package testkit is the end-to-end harness: a real kernel on a real bbolt
// file in t.TempDir() (or on a PostgreSQL schema of its own), served over
// real HTTP on loopback, with real agents
// (HTTP servers that verify webhook signatures and speak the protocol), and
// checkers for the event-log invariants of docs/durability.md.
package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/webhook"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/pull"
	"github.com/wicket-run/wicket/server"
	"github.com/wicket-run/wicket/server/llmgw"
	"github.com/wicket-run/wicket/server/wire"
	"github.com/wicket-run/wicket/store/bbolt"
	"github.com/wicket-run/wicket/store/postgres"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
)

// AdminKey is the admin key of every test kernel.
const AdminKey = "test-admin-key-0123456789"

// Options tune a test kernel.
type Options struct {
	Config  kernel.Config
	Engines []plugins.Engine
	// DefaultPolicy for agents bound to no bundle (default allow).
	DefaultPolicy string
	// Dir reuses a data directory (restart tests); default t.TempDir().
	Dir string
	// Store are the bbolt store's options (default: fsync on, group commit).
	Store bbolt.Options
	// BundleKeys verify bundle signatures (as serve --bundle-verification-key);
	// tenants' own keys are added as in serve.
	BundleKeys []bundle.Key
	// Backend is the store: "bbolt" or "postgres" (default DefaultBackend).
	// On "postgres" the test skips without WICKET_TEST_POSTGRES.
	Backend string
	// DSN, on "postgres", is the database to use (a replica of another
	// Env, or a restart); default a new schema of the test's own.
	DSN string
	// LLM, when it has providers, serves the LLM gateway under /llm/ (and
	// gives every dispatch attempt a gateway token). Its Deltas are the
	// server's.
	LLM *llmgw.Config
	// UI is server.Config.UI (the console, server/console).
	UI func(api http.Handler) http.Handler
	// MaxStreamsPerTenant is server.Config.MaxStreamsPerTenant (zero: the
	// server's default).
	MaxStreamsPerTenant int
}

// Store backends.
const (
	Bolt     = "bbolt"
	Postgres = "postgres"
)

// DefaultBackend is the store of an Env whose Options name none. Tests run
// one at a time in a package (no t.Parallel), so a test may switch it for
// the tests it runs (UseBackend).
var DefaultBackend = Bolt

// UseBackend makes backend the default store until t ends.
func UseBackend(t testing.TB, backend string) {
	prev := DefaultBackend
	DefaultBackend = backend
	t.Cleanup(func() { DefaultBackend = prev })
}

// Env is a running test kernel.
type Env struct {
	T   testing.TB
	Dir string
	// Store is the kernel's store; Bolt or PG is the same store, typed.
	Store kernel.Store
	Bolt  *bbolt.Store
	PG    *postgres.Store
	// DSN is the PostgreSQL database of a "postgres" Env.
	DSN string
	// Backend is "bbolt" or "postgres".
	Backend string
	Kernel  *kernel.Kernel
	Host    *plugins.Host
	Puller  *pull.Puller
	Server  *server.Server
	HTTP    *httptest.Server
	URL     string
	closed  bool
}

// Start opens a kernel and serves it; everything is closed and the store
// checked for consistency at the end of the test.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	dir := o.Dir
	if dir == "" {
		dir = t.TempDir()
	}
	e := &Env{T: t, Dir: dir, Backend: o.Backend}
	if e.Backend == "" {
		e.Backend = DefaultBackend
	}
	switch e.Backend {
	case Bolt:
		st, err := bbolt.Open(filepath.Join(dir, "wicket.db"), o.Store)
		if err != nil {
			t.Fatalf("open store: %v", err)
		}
		e.Store, e.Bolt = st, st
	case Postgres:
		e.DSN = o.DSN
		if e.DSN == "" {
			_, e.DSN = pgtest.Schema(t)
		}
		st, err := postgres.Open(context.Background(), e.DSN, postgres.Options{})
		if err != nil {
			t.Fatalf("open store: %v", err)
		}
		e.Store, e.PG = st, st
	default:
		t.Fatalf("testkit: unknown store backend %q", e.Backend)
	}
	st := e.Store
	host := plugins.NewHost(plugins.Options{DefaultPolicy: o.DefaultPolicy, BundleKeys: o.BundleKeys}, o.Engines...)
	cfg := o.Config
	cfg.LLMGatewayTokens = cfg.LLMGatewayTokens || o.LLM != nil
	k, err := kernel.New(st, webhook.New(), host, host, cfg)
	if err != nil {
		t.Fatalf("kernel: %v", err)
	}
	puller := pull.New(pull.KernelActivator(k), pull.Options{Backoff: 10 * time.Millisecond})
	k.SetBundlePuller(puller)
	if err := k.LoadBundles(context.Background()); err != nil {
		t.Fatalf("load bundles: %v", err)
	}
	var srv *server.Server
	scfg := server.Config{AdminKey: AdminKey, UI: o.UI, MaxStreamsPerTenant: o.MaxStreamsPerTenant}
	var gw *llmgw.Gateway
	if o.LLM != nil {
		lc := *o.LLM
		lc.Deltas = func(id string, d wire.StepDeltaEvent) int { return srv.PublishDelta(id, d) }
		if gw, err = llmgw.New(k, lc); err != nil {
			t.Fatalf("llm gateway: %v", err)
		}
		scfg.LLM = gw
	}
	srv = server.New(k, scfg)
	srv.SetReady(true)
	hs := httptest.NewUnstartedServer(srv.Handler())
	hs.Config = srv.HTTPServer() // the limits `wicket serve` runs with
	hs.Listener = srv.Listener(hs.Listener)
	hs.Start()
	if err := k.Start(context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
	e.Kernel, e.Host, e.Puller, e.Server, e.HTTP, e.URL = k, host, puller, srv, hs, hs.URL
	t.Cleanup(e.Close)
	return e
}

// Close stops the kernel, checks the store and closes it (idempotent).
func (e *Env) Close() {
	if e.closed {
		return
	}
	e.closed = true
	e.HTTP.Close()
	e.Puller.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Kernel.Close(ctx); err != nil {
		e.T.Errorf("kernel close: %v", err)
	}
	e.Host.Close()
	if err := e.Check(); err != nil {
		e.T.Errorf("store check: %v", err)
	}
	if err := e.Store.Close(); err != nil {
		e.T.Errorf("store close: %v", err)
	}
}

// Check runs the store's consistency checker.
func (e *Env) Check() error {
	if e.PG != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return e.PG.Check(ctx)
	}
	return e.Bolt.Check()
}

// Admin sends a bearer request with the admin key; see AdminAs.
func (e *Env) Admin(method, path string, body, out any) (int, error) {
	return e.As(AdminKey, method, path, body, out)
}

// As sends a bearer request with key. It returns the status; a non-2xx
// status also returns an *APIError.
func (e *Env) As(key, method, path string, body, out any) (int, error) {
	return Bearer(e.URL, key, method, path, body, out)
}

// Bearer sends a bearer-authenticated JSON request to base.
func Bearer(base, key, method, path string, body, out any) (int, error) {
	return BearerWithHeaders(base, key, method, path, nil, body, out)
}

// BearerWithHeaders is Bearer with extra request headers.
func BearerWithHeaders(base, key, method, path string, headers map[string]string, body, out any) (int, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		ae := &APIError{Status: resp.StatusCode}
		_ = json.Unmarshal(data, ae)
		return resp.StatusCode, ae
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode %s: %w", data, err)
		}
	}
	return resp.StatusCode, nil
}

// RegisterAgent registers a with the kernel (optionally bound to a bundle).
func (e *Env) RegisterAgent(a *Agent, bundle string) {
	e.T.Helper()
	body := map[string]any{"id": a.ID, "webhook_url": a.WebhookURL(), "secret": string(a.Secret)}
	if a.Signing != "" {
		body["signing"] = a.Signing
	}
	if bundle != "" {
		body["policy"] = bundle
	}
	if _, err := e.Admin("POST", "/v0/agents", body, nil); err != nil {
		e.T.Fatalf("register agent %s: %v", a.ID, err)
	}
}

// CreateExecution starts an execution and returns its id.
func (e *Env) CreateExecution(agentID string, input any) string {
	e.T.Helper()
	var x kernel.Execution
	if _, err := e.Admin("POST", "/v0/executions", map[string]any{"agent_id": agentID, "input": input}, &x); err != nil {
		e.T.Fatalf("create execution: %v", err)
	}
	return x.ID
}

// Execution reads an execution.
func (e *Env) Execution(id string) kernel.Execution {
	e.T.Helper()
	var x kernel.Execution
	if _, err := e.Admin("GET", "/v0/executions/"+id, nil, &x); err != nil {
		e.T.Fatalf("get execution %s: %v", id, err)
	}
	return x
}

// WaitStatus polls until the execution's status satisfies ok or the timeout passes.
func (e *Env) WaitStatus(id string, timeout time.Duration, ok func(kernel.ExecStatus) bool) kernel.Execution {
	e.T.Helper()
	deadline := time.Now().Add(timeout)
	for {
		x := e.Execution(id)
		if ok(x.Status) {
			return x
		}
		if time.Now().After(deadline) {
			e.T.Fatalf("execution %s still %s after %s", id, x.Status, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitTerminal waits for a terminal status.
func (e *Env) WaitTerminal(id string, timeout time.Duration) kernel.Execution {
	e.T.Helper()
	return e.WaitStatus(id, timeout, kernel.ExecStatus.Terminal)
}

// Events reads the whole event log of an execution.
func (e *Env) Events(id string) []kernel.Event {
	e.T.Helper()
	evs, err := AllEvents(e.URL, AdminKey, id)
	if err != nil {
		e.T.Fatalf("events of %s: %v", id, err)
	}
	return evs
}

// AllEvents pages through an execution's events over HTTP.
func AllEvents(base, key, id string) ([]kernel.Event, error) {
	var all []kernel.Event
	after := uint64(0)
	for {
		var page struct {
			Events []kernel.Event `json:"events"`
		}
		if _, err := Bearer(base, key, "GET", fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1000", id, after), nil, &page); err != nil {
			return nil, err
		}
		all = append(all, page.Events...)
		if len(page.Events) < 1000 {
			return all, nil
		}
		after = page.Events[len(page.Events)-1].Seq
	}
}
