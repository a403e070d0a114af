package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// cannedKernel is an http.RoundTripper that answers a step's submit and
// complete as the kernel does, without a network or a kernel: it measures
// the SDK's own cost per step. It checks each request's v1 signature.
type cannedKernel struct {
	secret []byte
	n      int
}

func (c *cannedKernel) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body.Close()
	if err := wire.VerifyV1(c.secret, req.Header.Get(wire.HeaderWicketSignature), wire.SignedRequest{Method: req.Method,
		Target: req.URL.RequestURI(), DispatchID: req.Header.Get(wire.HeaderDispatchID),
		DispatchAttempt: req.Header.Get(wire.HeaderDispatchAttempt), Body: body}, time.Now(), 0); err != nil {
		return canned(req, http.StatusUnauthorized, `{"code":"unauthenticated","message":"`+err.Error()+`"}`), nil
	}
	if strings.HasSuffix(req.URL.Path, "/steps") {
		c.n++
		return canned(req, http.StatusOK, `{"decision":"proceed","step_id":"`+req.Header.Get(wire.HeaderStepID)+`","occurrence":0}`), nil
	}
	return canned(req, http.StatusNoContent, ""), nil
}

func canned(req *http.Request, status int, body string) *http.Response {
	h := http.Header{"Date": {"Tue, 01 Dec 2026 20:00:00 GMT"}, "Content-Length": {strconv.Itoa(len(body))}}
	if body != "" {
		h["Content-Type"] = []string{"application/json"}
	}
	return &http.Response{Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader([]byte(body))), ContentLength: int64(len(body)), Request: req}
}

func cannedExecution(tb testing.TB) *Execution {
	tb.Helper()
	sec := []byte("steppath-secret-0123456789")
	k := client.New("http://127.0.0.1:1", client.WithAgent("a1", sec), client.WithHTTPClient(&http.Client{Transport: &cannedKernel{secret: sec}}))
	return &Execution{ID: "ex-0123456789abcdef", AgentID: "a1", Lease: Lease{DispatchID: "d-0123456789", Attempt: 1}, k: k}
}

// stepOnce is one step as the bench's load does it: a submit with
// distinct args, then a complete.
func stepOnce(tb testing.TB, ex *Execution, n int) {
	ctx := context.Background()
	args := []byte(`{"n":` + strconv.Itoa(n) + `,"q":"bench"}`)
	d, err := ex.Submit(ctx, wire.StepSubmitRequest{Kind: KindToolCall, Target: "search", Args: args})
	if err != nil {
		tb.Fatal(err)
	}
	if d.Decision != wire.DecisionProceed || d.StepID == "" {
		tb.Fatalf("decision %+v", d)
	}
	if err := ex.Complete(ctx, d.StepID, json.RawMessage(`{"n":`+strconv.Itoa(n)+`}`), nil); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkStepPath measures the SDK's CPU and allocations for one step
// (submit and complete, signed), against canned answers: no network and
// no kernel, so only the SDK and net/http's client are measured.
//
//	go test -run '^$' -bench BenchmarkStepPath -benchmem ./sdk/agent/
func BenchmarkStepPath(b *testing.B) {
	ex := cannedExecution(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		stepOnce(b, ex, i)
	}
}
