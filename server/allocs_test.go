package server

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/metrics"
	"github.com/wicket-run/wicket/server/wire"
)

// Allocation ceilings of a step's two signed requests through the whole
// handler (metrics and logging wrapper, routing, signature check, body
// decoding, the kernel and its store, the answer), written to a recorder
// that allocates where net/http's ResponseWriter does (connRecorder).
// They sit a little above what the code does today (see the test's log).
const (
	maxSubmitRequestAllocs   = 244
	maxCompleteRequestAllocs = 169
)

// TestAllocsStepRequests counts the allocations of POST …/steps (a new
// allowed step) and POST …/steps/{id}/complete served by the handler,
// requests built beforehand. It runs without -race (.ci/run reruns
// TestAllocs* so).
func TestAllocsStepRequests(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector are not the program's")
	}
	// Wired as wicket serve wires them: one metrics registry observes the
	// kernel and counts the server's requests.
	reg := metrics.New()
	e := newEnv(t, func(o *envOpts) { o.kcfg.Observer = reg; o.scfg.Metrics = reg })
	r := e.start("bot")
	// At the level wicket serve logs by default (info): -v's debug request
	// log is not what a server pays.
	e.srv.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	h := e.srv.Handler()
	const runs = 100
	signed := func(path string, body []byte) *http.Request {
		hdr := map[string]string{wire.HeaderAgentID: r.as.agentID, wire.HeaderDispatchID: r.lease.DispatchID,
			wire.HeaderDispatchAttempt: strconv.Itoa(r.lease.Attempt)}
		hdr[wire.HeaderWicketSignature] = signV1(r.as.secret, "POST", path, hdr, body, time.Now())
		req := httptest.NewRequest("POST", path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return req
	}
	subs := make([]*http.Request, runs+1)
	for i := range subs {
		subs[i] = signed("/v0/executions/"+r.id+"/steps",
			[]byte(`{"kind":"tool_call","target":"search","args":{"n":`+strconv.Itoa(i)+`,"q":"allocs"}}`))
	}
	recs := make([]*httptest.ResponseRecorder, runs+1)
	for i := range recs {
		recs[i] = newConnRecorder()
	}
	i := 0
	submit := testing.AllocsPerRun(runs, func() {
		h.ServeHTTP(connRecorder{recs[i]}, subs[i])
		i++
	})
	comps := make([]*http.Request, runs+1)
	for i, rec := range recs {
		var d wire.StepDecision
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &d) != nil || d.Decision != wire.DecisionProceed {
			t.Fatalf("submit %d: %d %s", i, rec.Code, rec.Body)
		}
		comps[i] = signed("/v0/executions/"+r.id+"/steps/"+d.StepID+"/complete", []byte(`{"result":{"hits":`+strconv.Itoa(i)+`}}`))
		recs[i] = newConnRecorder()
	}
	i = 0
	complete := testing.AllocsPerRun(runs, func() {
		h.ServeHTTP(connRecorder{recs[i]}, comps[i])
		i++
	})
	for i, rec := range recs {
		if rec.Code != http.StatusOK {
			t.Fatalf("complete %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	t.Logf("allocations per request: submit %.0f (ceiling %d), complete %.0f (ceiling %d)", submit, maxSubmitRequestAllocs, complete, maxCompleteRequestAllocs)
	if submit > maxSubmitRequestAllocs {
		t.Errorf("POST …/steps allocates %.0f times, ceiling %d", submit, maxSubmitRequestAllocs)
	}
	if complete > maxCompleteRequestAllocs {
		t.Errorf("POST …/complete allocates %.0f times, ceiling %d", complete, maxCompleteRequestAllocs)
	}
}

// connRecorder is a ResponseRecorder that answers as net/http's own
// ResponseWriter does where the recorder would allocate for its own
// reasons, so that the guard counts what a served request costs: read
// deadlines are supported (the recorder's http.ErrNotSupported is built
// with fmt.Errorf, twice per request), and the body goes to a buffer
// grown beforehand (net/http copies an answer into the connection's
// pooled buffer). The recorder's WriteHeader copies the header as
// net/http's does.
type connRecorder struct{ *httptest.ResponseRecorder }

// SetReadDeadline is that of a connection: http.ResponseController finds it.
func (connRecorder) SetReadDeadline(time.Time) error { return nil }

func newConnRecorder() *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	rec.Body.Grow(4 << 10)
	return rec
}
