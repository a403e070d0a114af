package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

// TestHotRoutesAgreeWithRouter sends each request to the server's handler
// (whose hot routes skip the router) and to the router alone, and requires
// the same answer: status, error code and, for a signed submission, the
// decision; and the same route template in the metrics.
func TestHotRoutesAgreeWithRouter(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	viaRouter := e.srv.outer(e.srv.router)
	signed := func(method, path string, body []byte) *http.Request {
		hdr := map[string]string{wire.HeaderAgentID: r.as.agentID, wire.HeaderDispatchID: r.lease.DispatchID,
			wire.HeaderDispatchAttempt: strconv.Itoa(r.lease.Attempt)}
		hdr[wire.HeaderWicketSignature] = signV1(r.as.secret, method, path, hdr, body, time.Now())
		req := httptest.NewRequest(method, path, bytes.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return req
	}
	x := "/v0/executions/" + r.id
	submit := func(n int) []byte {
		return []byte(`{"kind":"tool_call","target":"search","args":{"n":` + strconv.Itoa(n) + `}}`)
	}
	cases := []struct {
		method, path string
		body         []byte
		sign         bool
	}{
		{"POST", x + "/steps", submit(1), true},
		{"POST", x + "/steps", submit(2), false},
		{"POST", x + "/heartbeat", []byte(`{}`), true},
		{"POST", x + "/heartbeat", nil, false},
		{"POST", x + "/steps/nope/complete", []byte(`{"result":1}`), true},
		{"POST", x + "/steps/nope/fail", []byte(`{"error":"x"}`), true},
		{"POST", x + "/steps/", submit(3), true},
		{"POST", x + "//steps", submit(4), true},
		{"POST", "/v0/executions//steps", submit(5), true},
		{"POST", x + "/./steps", submit(6), true},
		{"POST", x + "/steps/../steps", submit(7), true},
		{"POST", x + "/steps/a/b/complete", nil, true},
		{"POST", x + "/steps/a/complete/more", nil, true},
		{"POST", x + "/steps/a/cancel", nil, true},
		{"POST", x + "/heartbeat/", nil, true},
		{"POST", x + "/steps%2Fx", submit(8), true},
		{"POST", "/v0/executions/unknown-execution/steps", submit(9), true},
		{"GET", x + "/steps", nil, false},
		{"PUT", x + "/steps", submit(10), true},
	}
	type answer struct {
		status   int
		code     string
		decision string
	}
	ask := func(h http.Handler, req *http.Request) answer {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var body struct {
			Code     string `json:"code"`
			Decision string `json:"decision"`
		}
		_ = json.Unmarshal(w.Body.Bytes(), &body)
		return answer{status: w.Code, code: body.Code, decision: body.Decision}
	}
	for _, tc := range cases {
		req := func() *http.Request {
			if tc.sign {
				return signed(tc.method, tc.path, tc.body)
			}
			return httptest.NewRequest(tc.method, tc.path, bytes.NewReader(tc.body))
		}
		fast, slow := ask(e.srv.handler, req()), ask(viaRouter, req())
		if fast != slow {
			t.Errorf("%s %s: handler answered %+v, router %+v", tc.method, tc.path, fast, slow)
		}
	}
	if got := ask(e.srv.handler, signed("POST", x+"/steps", submit(11))); got.status != http.StatusOK || got.decision != "proceed" {
		t.Fatalf("a signed submission through the hot route: %+v", got)
	}
	w := httptest.NewRecorder()
	e.srv.handler.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if !bytes.Contains(w.Body.Bytes(), []byte(`route="/v0/executions/{id}/steps"`)) {
		t.Errorf("metrics lack the hot route's template:\n%s", w.Body)
	}
}
