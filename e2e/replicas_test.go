package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
)

// balancer is a round-robin HTTP load balancer in front of kernel replicas,
// as agents and clients would reach them in production. A request goes to
// the next replica; one whose connection is refused (a dead replica) is
// tried on the next, which is safe since it never reached a kernel. A
// request cut after it was sent is answered 502, never resent: it may have
// been committed.
type balancer struct {
	srv      *httptest.Server
	mu       sync.Mutex
	backends []string
	next     int
	// Per backend, the requests it answered.
	served []atomic.Int64
}

func newBalancer(t *testing.T, backends ...string) *balancer {
	b := &balancer{backends: backends, served: make([]atomic.Int64, len(backends))}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		b.mu.Lock()
		start := b.next
		b.next = (b.next + 1) % len(b.backends)
		b.mu.Unlock()
		for i := range b.backends {
			n := (start + i) % len(b.backends)
			req, _ := http.NewRequestWithContext(r.Context(), r.Method, b.backends[n]+r.URL.RequestURI(), bytes.NewReader(body))
			req.Header = r.Header.Clone()
			resp, err := tr.RoundTrip(req)
			if err != nil {
				if errors.Is(err, syscall.ECONNREFUSED) {
					continue // the replica is down; the request never reached it
				}
				http.Error(w, "upstream: "+err.Error(), http.StatusBadGateway)
				return
			}
			b.served[n].Add(1)
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.StatusCode)
			flusher, _ := w.(http.Flusher)
			buf := make([]byte, 32<<10)
			for {
				m, rerr := resp.Body.Read(buf)
				if m > 0 {
					_, _ = w.Write(buf[:m])
					if flusher != nil {
						flusher.Flush()
					}
				}
				if rerr != nil {
					break
				}
			}
			resp.Body.Close()
			return
		}
		http.Error(w, "no replica answers", http.StatusBadGateway)
	}))
	t.Cleanup(func() { b.srv.Close(); tr.CloseIdleConnections() })
	return b
}

func (b *balancer) URL() string { return b.srv.URL }

// replicas starts n kernels sharing one PostgreSQL schema.
func replicas(t *testing.T, n int, o testkit.Options) []*testkit.Env {
	t.Helper()
	pgtest.BaseDSN(t)
	o.Backend = testkit.Postgres
	envs := []*testkit.Env{testkit.Start(t, o)}
	o.DSN = envs[0].DSN
	for len(envs) < n {
		envs = append(envs, testkit.Start(t, o))
	}
	return envs
}

// eventually polls cond until it holds or the deadline passes, and
// returns how long it took.
func eventually(t *testing.T, within time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		ok, state := cond()
		if ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (%s)", what, within, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReplicasShareOneDatabase: two kernels on one PostgreSQL database,
// an agent reaching them through a round-robin balancer. Event streams on
// one replica follow executions written through the other; a bundle
// uploaded to one decides on the other (its digest in the decision
// events); a rate limit counts exactly across both; an approval granted
// through one resumes an execution whose approval was requested through
// the other; every dispatch attempt is claimed once.
func TestReplicasShareOneDatabase(t *testing.T) {
	cfg := fast()
	cfg.LeaseTimeout, cfg.DispatchTimeout = 10*time.Second, 2*time.Second // no lease runs out here
	envs := replicas(t, 2, testkit.Options{Config: cfg, Engines: []plugins.Engine{rules.New()}})
	a, b := envs[0], envs[1]
	lb := newBalancer(t, a.URL, b.URL)
	ctx := context.Background()

	// A bundle uploaded through A decides on B.
	gate := func(rev string) string {
		return "name: agent-shared\nrevision: \"" + rev + "\"\nengine: rules\n"
	}
	rulesYAML := `default_action: allow
rules:
  - id: limited
    priority: 1
    when: {target: call}
    then: {decision: allow, rate_limit: {max_calls: 25, window: 1h, per: agent, algorithm: fixed}}
  - id: gate
    priority: 2
    when: {target: deploy}
    then: {decision: require_approval}
`
	sa := &scriptAgent{decisions: map[string][]string{}}
	agent := testkit.NewAgent("shared", secret, lb.URL(), func(ctx context.Context, r *testkit.Run) (any, error) {
		var in struct{ Calls int }
		_ = json.Unmarshal(r.Input, &in)
		targets := make([]string, in.Calls)
		for i := range targets {
			targets[i] = "call"
		}
		if in.Calls == 0 {
			targets = []string{"deploy"}
		}
		return sa.handler(targets...)(ctx, r)
	})
	defer agent.Close()
	a.RegisterAgent(agent, "")
	var br kernel.BundleRecord
	files := map[string]string{"bundle.yaml": gate("1"), "rules.yaml": rulesYAML}
	if _, err := a.Admin("PUT", "/v0/bundles/agent-shared", map[string]any{"files": files}, &br); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Admin("POST", "/v0/agents", map[string]any{"id": "shared", "webhook_url": agent.WebhookURL(), "secret": secret, "policy": "agent-shared"}, nil); err != nil {
		t.Fatal(err)
	}
	took := eventually(t, 10*time.Second, "B decides with the bundle uploaded to A", func() (bool, string) {
		res, err := b.Kernel.EvalPolicy(ctx, kernel.EvalRequest{Tenant: "default", AgentID: "shared", Kind: "tool_call", Target: "deploy"})
		if err != nil {
			return false, err.Error()
		}
		return res.Bundle.Digest == br.Digest && string(res.Action) == "require_approval", fmt.Sprintf("%+v", res)
	})
	t.Logf("bundle uploaded to A decides on B after %s", took)

	// Executions through both replicas: 10 × 5 calls against a limit of 25.
	var ids []string
	for i := range 10 {
		env := envs[i%2]
		ids = append(ids, env.CreateExecution("shared", map[string]int{"calls": 5}))
	}
	// An event stream on B follows an execution run through A: the agent
	// waits for the stream to be open before it writes anything.
	release := make(chan struct{})
	direct := testkit.NewAgent("direct", secret, a.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		for i := range 3 {
			if _, err := r.Step(ctx, "tool_call", "search", map[string]int{"i": i}, testkit.StepOpts{}, func() (any, error) { return i, nil }); err != nil {
				return nil, err
			}
		}
		return "done", nil
	})
	defer direct.Close()
	a.RegisterAgent(direct, "")
	watched := a.CreateExecution("direct", nil)
	var mu sync.Mutex
	var seen []uint64
	watchDone := make(chan error, 1)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		watchDone <- client.New(b.URL, client.WithAPIKey(testkit.AdminKey)).Watch(wctx, watched, 0, func(it client.StreamItem) error {
			if it.Event != nil {
				mu.Lock()
				seen = append(seen, it.Event.Seq)
				mu.Unlock()
			}
			return nil
		})
	}()
	eventually(t, 10*time.Second, "the stream on B delivers the first event", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0, ""
	})
	close(release)
	if err := <-watchDone; err != nil {
		t.Fatalf("watch through B: %v", err)
	}
	ids = append(ids, watched)
	allowed := 0
	for _, id := range ids {
		x := a.WaitTerminal(id, 30*time.Second)
		if x.Status != kernel.ExecCompleted {
			t.Errorf("execution %s: %s", id, x.Status)
		}
		evs := mustCheckLog(t, a, id)
		allowed += countTarget(evs, kernel.EvStepAllowed, "call")
		checkClaims(t, id, evs)
		if id == watched && len(seen) != len(evs) {
			t.Errorf("the stream on B saw seqs %v, the log has %d events", seen, len(evs))
		}
		for _, ev := range evs {
			if id != watched && ev.Type == kernel.EvStepAllowed && !strings.Contains(string(ev.Payload), br.Digest) {
				t.Errorf("%s: decision without the bundle's digest: %s", id, ev.Payload)
			}
		}
	}
	if allowed != 25 {
		t.Errorf("%d calls allowed across the replicas, want exactly the limit of 25", allowed)
	}

	// Approval: requested through one replica, granted through the other.
	gated := b.CreateExecution("shared", map[string]int{"calls": 0})
	var ap kernel.Approval
	eventually(t, 10*time.Second, "the approval is requested", func() (bool, string) {
		var list struct{ Approvals []kernel.Approval }
		if _, err := a.Admin("GET", "/v0/approvals?status=pending", nil, &list); err != nil {
			return false, err.Error()
		}
		for _, p := range list.Approvals {
			if p.ExecutionID == gated {
				ap = p
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d pending", len(list.Approvals))
	})
	if _, err := a.Admin("POST", "/v0/approvals/"+ap.ID+"/grant", map[string]any{"by": "alice"}, nil); err != nil {
		t.Fatal(err)
	}
	if x := b.WaitTerminal(gated, 30*time.Second); x.Status != kernel.ExecCompleted {
		t.Errorf("gated execution: %s", x.Status)
	}
	checkClaims(t, gated, mustCheckLog(t, b, gated))

	// A new revision uploaded through B reaches A.
	files["bundle.yaml"] = gate("2")
	var br2 kernel.BundleRecord
	if _, err := b.Admin("PUT", "/v0/bundles/agent-shared", map[string]any{"files": files}, &br2); err != nil {
		t.Fatal(err)
	}
	took = eventually(t, 10*time.Second, "A decides with the revision uploaded to B", func() (bool, string) {
		res, err := a.Kernel.EvalPolicy(ctx, kernel.EvalRequest{Tenant: "default", AgentID: "shared", Kind: "tool_call", Target: "x"})
		if err != nil {
			return false, err.Error()
		}
		return res.Bundle.Digest == br2.Digest, res.Bundle.Digest
	})
	t.Logf("revision uploaded to B decides on A after %s", took)
	for i := range lb.served {
		if lb.served[i].Load() == 0 {
			t.Errorf("replica %d answered no request through the balancer", i)
		}
	}
	if errs := agent.Errors(); len(errs) > 0 {
		t.Errorf("agent errors: %v", errs)
	}
}

// countTarget counts the events of typ about steps on target.
func countTarget(evs []kernel.Event, typ kernel.EventType, target string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type != typ {
			continue
		}
		var p struct {
			Target string `json:"target"`
		}
		if json.Unmarshal(ev.Payload, &p) == nil && p.Target == target {
			n++
		}
	}
	return n
}

// checkClaims fails when a dispatch attempt was claimed twice (by two
// replicas): every dispatch.claimed names a new (dispatch, attempt).
func checkClaims(t *testing.T, id string, evs []kernel.Event) {
	t.Helper()
	seen := map[string]bool{}
	for _, ev := range evs {
		if ev.Type != kernel.EvDispatchClaimed {
			continue
		}
		var p struct {
			DispatchID string `json:"dispatch_id"`
			Attempt    int    `json:"dispatch_attempt"`
		}
		_ = json.Unmarshal(ev.Payload, &p)
		k := fmt.Sprintf("%s#%d", p.DispatchID, p.Attempt)
		if seen[k] {
			t.Errorf("execution %s: attempt %s claimed twice", id, k)
		}
		seen[k] = true
	}
}
