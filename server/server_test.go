package server

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

func TestOpenRoutes(t *testing.T) {
	e := newEnv(t)
	var s wire.Status
	e.do("GET", "/v0/health", nil, nil).want(t, http.StatusOK).decode(t, &s)
	if s.Status != "ok" {
		t.Fatalf("health %+v", s)
	}
	e.do("GET", "/v0/ready", nil, nil).want(t, http.StatusOK).decode(t, &s)
	if s.Status != "ready" {
		t.Fatalf("ready %+v", s)
	}
	e.srv.SetReady(false)
	e.do("GET", "/v0/ready", nil, nil).wantErr(t, http.StatusServiceUnavailable, wire.CodeUnavailable)
	e.do("GET", "/v0/health", nil, nil).want(t, http.StatusOK)
	e.srv.SetReady(true)
	e.do("GET", "/v0/ready", nil, nil).want(t, http.StatusOK)
}

func TestMetrics(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	e.admin("GET", "/v0/executions/"+r.id, nil).want(t, http.StatusOK)
	e.admin("GET", "/v0/executions/"+r.id, nil).want(t, http.StatusOK)
	e.do("GET", "/v0/executions/"+r.id, nil, nil).want(t, http.StatusUnauthorized)
	e.do("GET", "/nowhere", nil, nil).want(t, http.StatusNotFound)
	e.submit(r, "local", "now", nil)
	res := e.do("GET", "/metrics", nil, nil).want(t, http.StatusOK)
	if ct := res.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Fatalf("content type %q", ct)
	}
	m := string(res.body)
	for _, want := range []string{
		`# TYPE wicket_http_requests_total counter`,
		`wicket_http_requests_total{method="GET",route="/v0/executions/{id}",status="200"} 2`,
		`wicket_http_requests_total{method="GET",route="/v0/executions/{id}",status="401"} 1`,
		`wicket_http_requests_total{method="POST",route="/v0/executions",status="201"} 1`,
		`wicket_http_requests_total{method="GET",route="unmatched",status="404"} 1`,
		`wicket_http_request_duration_seconds_count{method="GET",route="/v0/executions/{id}"} 3`,
		`wicket_http_request_duration_seconds_sum{method="GET",route="/v0/executions/{id}"} `,
		`wicket_step_submissions_total{decision="proceed"} 1`,
		`wicket_ready 1`,
		`wicket_event_streams 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// Every sample line is name{labels} value or name value.
	for _, line := range strings.Split(strings.TrimSpace(m), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || !(strings.HasPrefix(f[0], "wicket_") || strings.HasPrefix(f[0], "go_") || strings.HasPrefix(f[0], "process_") || strings.HasPrefix(f[0], "promhttp_")) {
			t.Errorf("malformed sample %q", line)
		}
	}
	for _, want := range []string{"go_goroutines ", "process_resident_memory_bytes "} {
		if !strings.Contains(m, want) {
			t.Errorf("the standard collectors are missing %q", want)
		}
	}
	if t.Failed() {
		t.Log(m)
	}
}

// TestMetricsKey: with a metrics key, /metrics answers 401 without it and
// 200 with it or the admin key; MetricsElsewhere takes it off the API.
func TestMetricsKey(t *testing.T) {
	const key = "metrics-key-0123456789"
	e := newEnv(t, func(o *envOpts) { o.scfg.MetricsKey = key })
	e.do("GET", "/metrics", nil, nil).wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)
	e.do("GET", "/metrics", nil, map[string]string{"Authorization": "Bearer wrong-key-0123456789"}).wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)
	if b := e.do("GET", "/metrics", nil, map[string]string{"Authorization": "Bearer " + key}).want(t, http.StatusOK).body; !strings.Contains(string(b), "wicket_ready 1") {
		t.Fatalf("metrics: %s", b)
	}
	e.do("GET", "/metrics", nil, map[string]string{"Authorization": "Bearer " + testAdminKey}).want(t, http.StatusOK)

	e2 := newEnv(t, func(o *envOpts) { o.scfg.MetricsElsewhere = true })
	e2.do("GET", "/metrics", nil, nil).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	rec := httptest.NewRecorder()
	e2.srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "wicket_http_requests_total") {
		t.Fatalf("MetricsHandler: %d %s", rec.Code, rec.Body.String())
	}
}

func TestPanicRecovered(t *testing.T) {
	e := newEnv(t)
	e.srv.router.Handle("/v0/test-panic", e.srv.wrap("/v0/test-panic", classOpen, routeOpts{}, func(*call) (int, any, error) {
		panic("database path /secret/wicket.db exploded")
	})).Methods("GET")
	res := e.do("GET", "/v0/test-panic", nil, nil)
	body := res.wantErr(t, http.StatusInternalServerError, wire.CodeInternal)
	if body.Message != "internal error" {
		t.Fatalf("a panic's text leaked: %+v", body)
	}
	// The server still serves.
	e.do("GET", "/v0/health", nil, nil).want(t, http.StatusOK)
}

func TestErrorTable(t *testing.T) {
	tests := []struct {
		err  error
		st   int
		code string
		msg  string
	}{
		{kernel.Errorf(kernel.CodeValidation, "bad x"), 400, wire.CodeValidation, "bad x"},
		{kernel.Errorf(kernel.CodeUnauthenticated, "who"), 401, wire.CodeUnauthenticated, "who"},
		{kernel.Errorf(kernel.CodeForbidden, "no"), 403, wire.CodeForbidden, "no"},
		{kernel.Errorf(kernel.CodeNotFound, "gone"), 404, wire.CodeNotFound, "gone"},
		{kernel.Errorf(kernel.CodeConflict, "clash"), 409, wire.CodeConflict, "clash"},
		{kernel.Errorf(kernel.CodeLeaseSuperseded, "old"), 409, wire.CodeLeaseSuperseded, "old"},
		{kernel.Errorf(kernel.CodeTooLarge, "big"), 413, wire.CodeTooLarge, "big"},
		{kernel.Errorf(kernel.CodeRateLimited, "slow"), 429, wire.CodeRateLimited, "slow"},
		{kernel.Errorf(kernel.CodeUnavailable, "later"), 503, wire.CodeUnavailable, "later"},
		{fmt.Errorf("put step: %w", kernel.ErrNotFound), 404, wire.CodeNotFound, "not found"},
		// Internal errors never show their text.
		{kernel.Errorf(kernel.CodeInternal, "bbolt: page 7 corrupt"), 500, wire.CodeInternal, "internal error"},
		{errors.New("open /var/lib/wicket: permission denied"), 500, wire.CodeInternal, "internal error"},
		{kernel.Errorf("made_up", "?"), 500, wire.CodeInternal, "internal error"},
	}
	for _, tc := range tests {
		t.Run(tc.code+"/"+tc.msg, func(t *testing.T) {
			st, body, _ := errorBody(tc.err)
			if st != tc.st || body.Code != tc.code || body.Message != tc.msg {
				t.Fatalf("got %d %+v, want %d %s %q", st, body, tc.st, tc.code, tc.msg)
			}
		})
	}
}

// The wire package restates the kernel's codes (it may not import the
// kernel); they must agree.
func TestWireCodesMatchKernel(t *testing.T) {
	pairs := [][2]string{
		{wire.CodeValidation, kernel.CodeValidation}, {wire.CodeUnauthenticated, kernel.CodeUnauthenticated},
		{wire.CodeForbidden, kernel.CodeForbidden}, {wire.CodeNotFound, kernel.CodeNotFound},
		{wire.CodeConflict, kernel.CodeConflict}, {wire.CodeLeaseSuperseded, kernel.CodeLeaseSuperseded},
		{wire.CodeTooLarge, kernel.CodeTooLarge}, {wire.CodeRateLimited, kernel.CodeRateLimited},
		{wire.CodeInternal, kernel.CodeInternal}, {wire.CodeUnavailable, kernel.CodeUnavailable},
		{wire.DecisionProceed, string(kernel.DecisionProceed)}, {wire.DecisionReplay, string(kernel.DecisionReplay)},
		{wire.DecisionDenied, string(kernel.DecisionDenied)}, {wire.DecisionRateLimited, string(kernel.DecisionRateLimited)},
		{wire.DecisionBlocked, string(kernel.DecisionBlocked)}, {wire.DecisionExecutionBlocked, string(kernel.DecisionExecutionBlocked)},
		{wire.DecisionExecutionTerminal, string(kernel.DecisionExecutionTerminal)},
		{wire.CodeStepIDDivergence, kernel.CodeStepIDDivergence},
		{wire.RoleAdmin, kernel.RoleAdmin}, {wire.RoleTenantAdmin, kernel.RoleTenantAdmin}, {wire.RoleClient, kernel.RoleClient},
	}
	for _, p := range pairs {
		if p[0] != p[1] {
			t.Errorf("wire %q != kernel %q", p[0], p[1])
		}
	}
	for code := range statuses {
		if statusOf(code) == 0 {
			t.Errorf("no status for %s", code)
		}
	}
}
