package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// cannedKernel is an http.RoundTripper that answers a step's submit and
// complete as the kernel does, without a network or a kernel: it measures
// the SDK's own cost per step. It checks each request's v1 signature.
type cannedKernel struct {
	secret []byte
	n      atomic.Int64
	// seen, when set, gets each submission's lease and step id headers.
	seen func(dispatchID, attempt, stepID string)
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
		c.n.Add(1)
		if c.seen != nil {
			c.seen(req.Header.Get(wire.HeaderDispatchID), req.Header.Get(wire.HeaderDispatchAttempt), req.Header.Get(wire.HeaderStepID))
		}
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

// TestSubmitHeadersConcurrent: submissions made at once, each with its
// own args, each carry their own step id and the current lease (the
// pooled submission headers are not shared between requests in flight),
// and a new lease is what the next submissions carry.
func TestSubmitHeadersConcurrent(t *testing.T) {
	sec := []byte("steppath-secret-0123456789")
	ck := &cannedKernel{secret: sec}
	var mu sync.Mutex
	var leases []string
	ck.seen = func(dispatchID, attempt, _ string) {
		mu.Lock()
		leases = append(leases, dispatchID+"/"+attempt)
		mu.Unlock()
	}
	k := client.New("http://127.0.0.1:1", client.WithAgent("a1", sec), client.WithHTTPClient(&http.Client{Transport: ck}))
	ex := &Execution{ID: "ex-concurrent", AgentID: "a1", Lease: Lease{DispatchID: "d-1", Attempt: 1}, k: k}
	submit := func(g, i int) error {
		args := json.RawMessage(`{"g":` + strconv.Itoa(g) + `,"i":` + strconv.Itoa(i) + `}`)
		d, err := ex.Submit(context.Background(), wire.StepSubmitRequest{Kind: KindToolCall, Target: "t", Args: args})
		if err != nil {
			return err
		}
		_, hash, err := canon.ArgsHash(args)
		if err != nil {
			return err
		}
		if want := canon.StepID(ex.ID, KindToolCall, "t", hash, 0); d.StepID != want {
			return fmt.Errorf("%s: step id %s, want %s", args, d.StepID, want)
		}
		return nil
	}
	for round, lease := range []Lease{{DispatchID: "d-1", Attempt: 1}, {DispatchID: "d-2", Attempt: 7}} {
		ex.Lease = lease
		mu.Lock()
		leases = leases[:0]
		mu.Unlock()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 40 {
					if err := submit(g, round*1000+i); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		want := lease.DispatchID + "/" + strconv.Itoa(lease.Attempt)
		mu.Lock()
		for _, l := range leases {
			if l != want {
				t.Fatalf("a submission carried lease %s, want %s", l, want)
			}
		}
		if len(leases) != 8*40 {
			t.Fatalf("%d submissions seen, want %d", len(leases), 8*40)
		}
		mu.Unlock()
	}
}
