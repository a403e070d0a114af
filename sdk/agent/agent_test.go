package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// testRules is the policy of the decision tests, in the native format.
const testRules = `default_action: allow
rules:
  - id: no-delete
    priority: 1
    when: {target: delete}
    then: {decision: deny, reason: deletes are denied}
  - id: limited
    priority: 2
    when: {target: limited}
    then:
      decision: allow
      rate_limit: {max_calls: 2, window: 1m, per: execution}
  - id: deploy
    priority: 3
    when: {target: deploy}
    then: {decision: require_approval, reason: deploys need a human}
  - id: no-forbidden-model
    priority: 4
    when: {step_kind: llm_call, target: "forbidden-*"}
    then: {decision: deny, reason: model not allowed}
  - id: slow-model
    priority: 5
    when: {step_kind: llm_call, target: "limited-*"}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 1m, per: execution}
  - id: approve-model
    priority: 6
    when: {step_kind: llm_call, target: "approve-*"}
    then: {decision: require_approval, reason: this model needs a human}
`

const secret = "sdk-test-secret-0123456789"

// harness is a real kernel (bbolt in a temp dir, real HTTP on loopback)
// with the rules engine, and an admin client of it.
type harness struct {
	t     *testing.T
	env   *testkit.Env
	admin *client.Client
}

func start(t *testing.T, cfg kernel.Config) *harness {
	t.Helper()
	env := testkit.Start(t, testkit.Options{Config: cfg, Engines: []plugins.Engine{rules.New()}})
	return &harness{t: t, env: env, admin: client.New(env.URL, client.WithAPIKey(testkit.AdminKey))}
}

// fast is a kernel config for tests that wait on lease expiry.
func fast() kernel.Config {
	return kernel.Config{LeaseTimeout: 500 * time.Millisecond, DispatchTimeout: 200 * time.Millisecond,
		ReapInterval: 20 * time.Millisecond, DispatchBackoff: 20 * time.Millisecond, DispatchBackoffMax: 100 * time.Millisecond}
}

// signWebhook signs a webhook request as the kernel does for a v1 agent:
// the dispatch headers from the payload, then Wicket-Signature at time at.
func signWebhook(req *http.Request, secret, body []byte, at time.Time) {
	var p wire.WebhookPayload
	if json.Unmarshal(body, &p) == nil && p.DispatchID != "" {
		req.Header.Set(wire.HeaderDispatchID, p.DispatchID)
		req.Header.Set(wire.HeaderDispatchAttempt, fmt.Sprint(p.DispatchAttempt))
	}
	wire.SignRequest(req, secret, body, at)
}

// serve starts an SDK agent on loopback and returns it with its webhook URL.
func (h *harness) serve(id string, hb time.Duration, handler agent.Handler) (*agent.Agent, string) {
	h.t.Helper()
	return h.serveWith(id, hb, nil, handler)
}

// serveWith is serve with the agent's log (at debug level) written to logs.
func (h *harness) serveWith(id string, hb time.Duration, logs io.Writer, handler agent.Handler) (*agent.Agent, string) {
	h.t.Helper()
	var logger *slog.Logger
	if logs != nil {
		logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	a, err := agent.New(agent.Config{ID: id, Secret: []byte(secret), KernelURL: h.env.URL, Handler: handler, HeartbeatInterval: hb, Logger: logger})
	if err != nil {
		h.t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	h.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
		srv.Close()
	})
	return a, srv.URL + "/webhook"
}

// register upserts agent id with webhook url (and the test policy if policy).
func (h *harness) register(id, url string, policy bool) {
	h.t.Helper()
	ctx := context.Background()
	if _, err := h.admin.PutAgent(ctx, wire.AgentRequest{ID: id, WebhookURL: url, Secret: secret}); err != nil {
		h.t.Fatalf("register %s: %v", id, err)
	}
	if policy {
		if _, err := h.admin.SetPolicy(ctx, id, testRules); err != nil {
			h.t.Fatalf("policy of %s: %v", id, err)
		}
	}
}

func (h *harness) create(agentID string, input any) string {
	h.t.Helper()
	raw, _ := json.Marshal(input)
	x, err := h.admin.CreateExecution(context.Background(), wire.CreateExecutionRequest{AgentID: agentID, Input: raw}, "")
	if err != nil {
		h.t.Fatalf("create: %v", err)
	}
	return x.ID
}

func (h *harness) status(id string, want kernel.ExecStatus) kernel.Execution {
	h.t.Helper()
	return h.env.WaitStatus(id, 20*time.Second, func(s kernel.ExecStatus) bool { return s == want || (s.Terminal() && want.Terminal()) })
}

// checkLog asserts the docs/durability.md invariants on the execution's log.
func (h *harness) checkLog(id string) []kernel.Event {
	h.t.Helper()
	evs := h.env.Events(id)
	if err := testkit.CheckLog(evs); err != nil {
		h.t.Fatalf("log of %s: %v", id, err)
	}
	return evs
}

// counter counts tool-body runs by name.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) inc(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[name]++
}

func (c *counter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func TestWebhookRequests(t *testing.T) {
	h := start(t, kernel.Config{})
	var runs atomic.Int64
	a, url := h.serve("hook", 0, agent.HandlerFunc(func(ctx context.Context, in json.RawMessage) (any, error) {
		runs.Add(1)
		return map[string]any{"got": in}, nil
	}))
	h.register("hook", url, false)
	id := h.create("hook", map[string]string{"x": "y"})
	x := h.status(id, kernel.ExecCompleted)
	if x.Status != kernel.ExecCompleted || string(x.Output) != `{"got":{"x":"y"}}` {
		t.Fatalf("execution: %s %s", x.Status, x.Output)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}

	good := []byte(fmt.Sprintf(`{"execution_id":%q,"dispatch_id":"d","dispatch_attempt":1}`, id))
	big := append([]byte(`{"execution_id":"`), bytes.Repeat([]byte("x"), 70<<10)...)
	v1 := func(sec string, at time.Duration) func(*http.Request, []byte) {
		return func(req *http.Request, body []byte) { signWebhook(req, []byte(sec), body, time.Now().Add(at)) }
	}
	for name, tc := range map[string]struct {
		method string
		body   []byte
		sign   func(*http.Request, []byte)
		status int
		code   string
	}{
		"GET":                     {"GET", nil, nil, 405, wire.CodeMethodNotAllowed},
		"no signature":            {"POST", good, nil, 401, wire.CodeUnauthenticated},
		"wrong secret":            {"POST", good, v1("another-secret-0123456789", 0), 401, wire.CodeUnauthenticated},
		"signature of other body": {"POST", good, func(r *http.Request, _ []byte) { v1(secret, 0)(r, []byte("{}")) }, 401, wire.CodeUnauthenticated},
		"signature of other path": {"POST", good, func(r *http.Request, b []byte) {
			signWebhook(r, []byte(secret), b, time.Now())
			r.URL.Path = "/other"
		}, 401, wire.CodeUnauthenticated},
		"body scheme":    {"POST", good, func(r *http.Request, b []byte) { r.Header.Set(wire.HeaderSignature, wire.Sign([]byte(secret), b)) }, 401, wire.CodeUnauthenticated},
		"301 s old":      {"POST", good, v1(secret, -301*time.Second), 401, wire.CodeUnauthenticated},
		"301 s ahead":    {"POST", good, v1(secret, 301*time.Second), 401, wire.CodeUnauthenticated},
		"malformed sig":  {"POST", good, func(r *http.Request, _ []byte) { r.Header.Set(wire.HeaderWicketSignature, "t=1,v1=zz") }, 401, wire.CodeUnauthenticated},
		"not JSON":       {"POST", []byte("nope"), v1(secret, 0), 400, wire.CodeValidation},
		"missing fields": {"POST", []byte(`{"execution_id":"e"}`), v1(secret, 0), 400, wire.CodeValidation},
		"attempt zero":   {"POST", []byte(`{"execution_id":"e","dispatch_id":"d","dispatch_attempt":0}`), v1(secret, 0), 400, wire.CodeValidation},
		"headers name another lease": {"POST", good, func(r *http.Request, b []byte) {
			r.Header.Set(wire.HeaderDispatchAttempt, "2")
			wire.SignRequest(r, []byte(secret), b, time.Now())
		}, 400, wire.CodeValidation},
		"oversized": {"POST", big, v1(secret, 0), 413, wire.CodeTooLarge},
	} {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, url, bytes.NewReader(tc.body))
			if tc.sign != nil {
				tc.sign(req, tc.body)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var eb wire.ErrorBody
			_ = json.NewDecoder(resp.Body).Decode(&eb)
			if resp.StatusCode != tc.status || eb.Code != tc.code {
				t.Fatalf("got %d %q (%s), want %d %q", resp.StatusCode, eb.Code, eb.Message, tc.status, tc.code)
			}
		})
	}
	if runs.Load() != 1 {
		t.Fatalf("a refused webhook ran the handler: %d runs", runs.Load())
	}
	// A stale or duplicate delivery of a finished execution is acknowledged
	// and changes nothing.
	req, _ := http.NewRequest("POST", url, bytes.NewReader(good))
	signWebhook(req, []byte(secret), good, time.Now())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("valid webhook: %d", resp.StatusCode)
	}
	before := len(h.checkLog(id))
	// Gate: the webhook was registered as a run before its 202; the run has
	// read the execution and given up once none is running.
	waitIdle(t, a)
	if after := len(h.checkLog(id)); after != before || runs.Load() != 1 {
		t.Fatalf("a webhook for a completed execution changed it: %d → %d events, %d runs", before, after, runs.Load())
	}
}

type greetIn struct {
	Name string `json:"name"`
}
type greetOut struct {
	Greeting string `json:"greeting"`
}

func TestToolsAndLocalSteps(t *testing.T) {
	h := start(t, kernel.Config{})
	var c counter
	var bodyIDs []string
	greet := agent.NewTool("greet", func(ctx context.Context, in greetIn) (greetOut, error) {
		c.inc("greet")
		sid, _ := agent.StepID(ctx)
		bodyIDs = append(bodyIDs, sid)
		return greetOut{Greeting: "hello " + in.Name}, nil
	}, agent.WithEffect(agent.ReadOnly))
	var leases []agent.Lease
	var mu sync.Mutex
	_, url := h.serve("tools", 0, agent.Typed(func(ctx context.Context, in greetIn) (map[string]any, error) {
		ex, err := agent.FromContext(ctx)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		leases = append(leases, ex.Lease)
		mu.Unlock()
		now, err := agent.Now(ctx)
		if err != nil {
			return nil, err
		}
		nid, err := agent.NewID(ctx)
		if err != nil {
			return nil, err
		}
		g1, err := greet.Call(ctx, in)
		if err != nil {
			return nil, err
		}
		g2, err := greet.Call(ctx, in) // the same call again: occurrence 1, runs again
		if err != nil {
			return nil, err
		}
		n, err := agent.Step(ctx, "dice", func(context.Context) (int, error) { return 4, nil })
		if err != nil {
			return nil, err
		}
		return map[string]any{"now": now, "id": nid, "g1": g1.Greeting, "g2": g2.Greeting, "dice": n}, nil
	}))
	h.register("tools", url, false)
	id := h.create("tools", greetIn{Name: "Ada"})
	x := h.status(id, kernel.ExecCompleted)
	var out struct {
		Now  time.Time `json:"now"`
		ID   string    `json:"id"`
		G1   string    `json:"g1"`
		G2   string    `json:"g2"`
		Dice int       `json:"dice"`
	}
	if err := json.Unmarshal(x.Output, &out); err != nil {
		t.Fatal(err)
	}
	if out.G1 != "hello Ada" || out.G2 != "hello Ada" || out.Dice != 4 || len(out.ID) != 36 || time.Since(out.Now) > time.Minute {
		t.Fatalf("output %s", x.Output)
	}
	if c.get("greet") != 2 {
		t.Fatalf("greet ran %d times, want 2", c.get("greet"))
	}
	if len(leases) != 1 || leases[0].DispatchID == "" || leases[0].Attempt != 1 {
		t.Fatalf("leases %+v", leases)
	}
	steps, err := h.admin.Steps(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	var greetIDs []string
	for _, s := range steps {
		if s.Target == "greet" {
			greetIDs = append(greetIDs, s.ID)
		}
		kinds[s.Kind+":"+s.Target]++
		if s.Status != "succeeded" {
			t.Fatalf("step %s %s", s.Target, s.Status)
		}
		if s.Target == "greet" && s.Effect != agent.ReadOnly {
			t.Fatalf("greet effect %q", s.Effect)
		}
	}
	if fmt.Sprint(bodyIDs) != fmt.Sprint(greetIDs) && fmt.Sprint(bodyIDs) != fmt.Sprint([]string{greetIDs[1], greetIDs[0]}) {
		t.Fatalf("tool bodies saw step ids %v, the kernel recorded %v", bodyIDs, greetIDs)
	}
	want := map[string]int{"local:wicket.now": 1, "local:wicket.new_id": 1, "tool_call:greet": 2, "local:dice": 1}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("steps %v, want %v", kinds, want)
	}
	h.checkLog(id)
}

// A re-delivered dispatch replays every recorded step; a newer attempt
// arriving at the same agent cancels the handler of the older one.
func TestRedeliveryReplaysAndCancelsOlderAttempt(t *testing.T) {
	h := start(t, fast())
	var c counter
	tool := agent.NewTool("fetch", func(ctx context.Context, in string) (string, error) {
		c.inc("fetch")
		return "page:" + in, nil
	})
	causes := make(chan error, 4)
	_, url := h.serve("redo", time.Hour, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		ex, _ := agent.FromContext(ctx)
		page, err := tool.Call(ctx, "a")
		if err != nil {
			return nil, err
		}
		if ex.Lease.Attempt == 1 {
			<-ctx.Done() // no heartbeat: the lease expires and the kernel re-delivers
			causes <- context.Cause(ctx)
			_, err := tool.Call(ctx, "b") // the old attempt may change nothing more
			return nil, err
		}
		return map[string]any{"page": page, "attempt": ex.Lease.Attempt}, nil
	}))
	h.register("redo", url, false)
	id := h.create("redo", nil)
	x := h.status(id, kernel.ExecCompleted)
	var ls *agent.LeaseSuperseded
	select {
	case cause := <-causes:
		if !errors.As(cause, &ls) || ls.Attempt != 1 {
			t.Fatalf("old handler's cause: %v", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first attempt's handler was never cancelled")
	}
	if c.get("fetch") != 1 {
		t.Fatalf("fetch ran %d times, want 1 (replayed on attempt 2)", c.get("fetch"))
	}
	if !strings.Contains(string(x.Output), `"page":"page:a"`) || !strings.Contains(string(x.Output), `"attempt":2`) {
		t.Fatalf("output %s", x.Output)
	}
	evs := h.checkLog(id)
	for _, ev := range evs {
		if ev.Type == kernel.EvStepProposed && strings.Contains(string(ev.Payload), `"target":"b"`) {
			t.Fatalf("the superseded attempt submitted a step: %s", ev.Payload)
		}
	}
}

// Heartbeats keep a lease alive past its timeout.
func TestHeartbeatsKeepTheLease(t *testing.T) {
	h := start(t, fast())
	_, url := h.serve("beat", 50*time.Millisecond, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		select {
		case <-time.After(1500 * time.Millisecond): // three lease timeouts
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		return "done", nil
	}))
	h.register("beat", url, false)
	id := h.create("beat", nil)
	x := h.status(id, kernel.ExecCompleted)
	if x.Status != kernel.ExecCompleted {
		t.Fatalf("status %s", x.Status)
	}
	if n := testkit.Count(h.checkLog(id), kernel.EvDispatchClaimed); n != 1 {
		t.Fatalf("%d dispatch claims, want 1 (the lease never expired)", n)
	}
}

// A handler whose lease was taken over by another agent process learns it
// from its next heartbeat: its context is cancelled with LeaseSuperseded.
func TestHeartbeatSupersededCancelsHandler(t *testing.T) {
	h := start(t, fast())
	started := make(chan struct{})
	cause, causeB := make(chan error, 1), make(chan error, 1)
	var once sync.Once
	// Agent A beats too slowly to keep a 500ms lease.
	_, urlA := h.serve("pair", 1500*time.Millisecond, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		once.Do(func() { close(started) })
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return "A", nil // ignored: the dispatch has ended
	}))
	// B holds on until A has learnt it lost the lease (a completed
	// execution would answer A's heartbeat with Terminated instead).
	_, urlB := h.serve("pair", 100*time.Millisecond, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		var c error
		select {
		case c = <-cause:
		case <-time.After(10 * time.Second):
			c = errors.New("A was never cancelled")
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		select {
		case causeB <- c:
		default:
		}
		return "B", nil
	}))
	h.register("pair", urlA, false)
	id := h.create("pair", nil)
	<-started
	h.register("pair", urlB, false) // the re-delivery goes to B
	x := h.status(id, kernel.ExecCompleted)
	if string(x.Output) != `"B"` {
		t.Fatalf("output %s, want B's", x.Output)
	}
	var ls *agent.LeaseSuperseded
	if c := <-causeB; !errors.As(c, &ls) || ls.Attempt != 1 {
		t.Fatalf("A's cause %v, want LeaseSuperseded of attempt 1", c)
	}
	h.checkLog(id)
}

// Cancelling an execution reaches the running handler through its next
// heartbeat, and the dispatch ends without another verdict.
func TestCancelledExecutionTerminatesHandler(t *testing.T) {
	h := start(t, kernel.Config{})
	started := make(chan struct{})
	got := make(chan error, 2)
	tool := agent.NewTool("t", func(ctx context.Context, in int) (int, error) { return in, nil })
	_, url := h.serve("cancel", 50*time.Millisecond, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		close(started)
		<-ctx.Done()
		got <- context.Cause(ctx)
		_, err := tool.Call(context.WithoutCancel(ctx), 1)
		got <- err
		return nil, errors.New("swallowed")
	}))
	h.register("cancel", url, false)
	id := h.create("cancel", nil)
	<-started
	if err := h.admin.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		select {
		case err := <-got:
			var term *agent.Terminated
			if !errors.As(err, &term) {
				t.Fatalf("got %v, want Terminated", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the handler never learnt of the cancellation")
		}
	}
	x := h.status(id, kernel.ExecCancelled)
	if x.Status != kernel.ExecCancelled {
		t.Fatalf("status %s", x.Status)
	}
	h.checkLog(id)
}

// An execution cancelled while a tool's body runs, before any heartbeat
// shows it: the body's result comes too late to be recorded, and the call
// returns *Terminated (not the kernel's 409 conflict), remembered on the
// execution so that the dispatch ends without a verdict.
func TestCancelledDuringBodyTerminates(t *testing.T) {
	h := start(t, kernel.Config{})
	started, release := make(chan struct{}), make(chan struct{})
	got := make(chan error, 2)
	tool := agent.NewTool("slow", func(ctx context.Context, in int) (int, error) {
		close(started)
		<-release
		return in, nil
	})
	failing := agent.NewTool("failing", func(ctx context.Context, in int) (int, error) { return 0, errors.New("too late") })
	_, url := h.serve("late", time.Hour, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		_, err := tool.Call(ctx, 1)
		got <- err
		ex, _ := agent.FromContext(ctx)
		got <- ex.Unwinding()
		_, err = failing.Call(ctx, 2) // refused before it is submitted: the dispatch is over
		return nil, err
	}))
	h.register("late", url, false)
	id := h.create("late", nil)
	<-started
	if err := h.admin.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	close(release)
	for i := 0; i < 2; i++ {
		var term *agent.Terminated
		if err := <-got; !errors.As(err, &term) {
			t.Fatalf("got %T %v, want *agent.Terminated", err, err)
		}
	}
	x := h.status(id, kernel.ExecCancelled)
	if x.Status != kernel.ExecCancelled {
		t.Fatalf("status %s", x.Status)
	}
	steps, err := h.admin.Steps(context.Background(), id)
	if err != nil || len(steps) != 1 || steps[0].Status != "cancelled" {
		t.Fatalf("steps %+v %v, want the one step cancelled", steps, err)
	}
	h.checkLog(id)
}

// Every decision maps to its typed error; Blocked is remembered even when
// the handler swallows it, and the approval resumes the execution.
func TestDecisionsAndApproval(t *testing.T) {
	h := start(t, kernel.Config{})
	var c counter
	mk := func(name string) *agent.Tool[string, string] {
		return agent.NewTool(name, func(ctx context.Context, in string) (string, error) {
			c.inc(name)
			return name + ":" + in, nil
		})
	}
	read, del, limited, deploy := mk("read"), mk("delete"), mk("limited"), mk("deploy")
	type seen struct {
		denied  *agent.PolicyError
		limited *agent.RateLimited
		blocked error
		after   error
	}
	runs := make(chan seen, 4)
	_, url := h.serve("dec", 0, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		var s seen
		if _, err := read.Call(ctx, "x"); err != nil {
			return nil, err
		}
		_, err := del.Call(ctx, "x")
		errors.As(err, &s.denied)
		for i := 0; i < 3; i++ {
			if _, err := limited.Call(ctx, "x"); err != nil {
				errors.As(err, &s.limited)
			}
		}
		out, err := deploy.Call(ctx, "prod")
		s.blocked = err
		if err != nil {
			// Swallow it, and try to carry on: the SDK must still unwind.
			_, s.after = read.Call(ctx, "y")
			runs <- s
			return "carried on", nil
		}
		runs <- s
		return out, nil
	}))
	h.register("dec", url, true)
	id := h.create("dec", nil)

	s := <-runs
	if s.denied == nil || s.denied.RuleID != "no-delete" || s.denied.Reason != "deletes are denied" {
		t.Fatalf("denied: %+v", s.denied)
	}
	if s.limited == nil || !strings.HasSuffix(s.limited.RuleID, "limited") {
		t.Fatalf("rate limited: %+v", s.limited)
	}
	var b *agent.Blocked
	if !errors.As(s.blocked, &b) || b.ApprovalID == "" || b.Execution {
		t.Fatalf("deploy: %v", s.blocked)
	}
	if !errors.As(s.after, new(*agent.Blocked)) {
		t.Fatalf("a step after Blocked: %v, want Blocked again", s.after)
	}
	x := h.status(id, kernel.ExecBlocked)
	if x.Status != kernel.ExecBlocked {
		t.Fatalf("status %s: a swallowed Blocked must not complete the execution", x.Status)
	}
	if _, err := h.admin.Grant(context.Background(), b.ApprovalID, wire.ResolveApprovalRequest{DecidedBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	s = <-runs
	if s.blocked != nil || s.denied == nil || s.limited == nil {
		t.Fatalf("second run: %+v", s)
	}
	x = h.status(id, kernel.ExecCompleted)
	if x.Status != kernel.ExecCompleted || string(x.Output) != `"deploy:prod"` {
		t.Fatalf("execution %s %s", x.Status, x.Output)
	}
	for name, want := range map[string]int{"read": 1, "delete": 0, "limited": 2, "deploy": 1} {
		if got := c.get(name); got != want {
			t.Errorf("%s ran %d times, want %d", name, got, want)
		}
	}
	h.checkLog(id)
}

type failingErr struct{}

func (failingErr) Error() string { return "disk full" }
func (failingErr) Code() string  { return "ENOSPC" }

func TestHandlerAndToolFailures(t *testing.T) {
	h := start(t, kernel.Config{})
	broken := agent.NewTool("broken", func(ctx context.Context, in int) (int, error) { return 0, failingErr{} })
	panicky := agent.NewTool("panicky", func(ctx context.Context, in int) (int, error) { panic("tool bug") })
	handlers := map[string]agent.HandlerFunc{
		"error":  func(ctx context.Context, _ json.RawMessage) (any, error) { return nil, errors.New("no luck") },
		"panic":  func(ctx context.Context, _ json.RawMessage) (any, error) { panic("boom") },
		"output": func(ctx context.Context, _ json.RawMessage) (any, error) { return make(chan int), nil },
		"tool": func(ctx context.Context, _ json.RawMessage) (any, error) {
			_, err := broken.Call(ctx, 1)
			return nil, err
		},
		"toolpan": func(ctx context.Context, _ json.RawMessage) (any, error) {
			_, err := panicky.Call(ctx, 1)
			return nil, err
		},
		// A step under a context whose deadline has passed returns that
		// deadline, not a KernelError (which would end the dispatch
		// quietly and have the kernel deliver it again).
		"deadline": func(ctx context.Context, _ json.RawMessage) (any, error) {
			dctx, cancel := context.WithDeadline(ctx, time.Now())
			defer cancel()
			_, err := agent.Step(dctx, "late", func(context.Context) (int, error) { return 1, nil })
			if errors.As(err, new(*agent.KernelError)) || !errors.Is(err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("want the context's deadline, got %T", err)
			}
			return nil, err
		},
		"args": func(ctx context.Context, _ json.RawMessage) (any, error) {
			_, err := agent.Invoke(ctx, agent.KindToolCall, "x", func() {}, agent.StepOptions{}, nil)
			var ae *agent.ArgsError
			if !errors.As(err, &ae) {
				return nil, fmt.Errorf("want ArgsError, got %v", err)
			}
			return nil, err
		},
	}
	want := map[string]string{
		"error":    "no luck",
		"panic":    "panic: boom",
		"output":   "output is not JSON-serialisable",
		"tool":     "disk full",
		"toolpan":  "panic: tool bug",
		"args":     "not JSON-serialisable",
		"deadline": "agent: submit step: context deadline exceeded",
	}
	for name, fn := range handlers {
		t.Run(name, func(t *testing.T) {
			_, url := h.serve(name, 0, fn)
			h.register(name, url, false)
			id := h.create(name, nil)
			x := h.status(id, kernel.ExecFailed)
			if x.Status != kernel.ExecFailed || !strings.Contains(string(x.Error), want[name]) {
				t.Fatalf("execution %s error %s, want it to mention %q", x.Status, x.Error, want[name])
			}
			evs := h.checkLog(id)
			if name == "tool" {
				steps, _ := h.admin.Steps(context.Background(), id)
				if len(steps) != 1 || steps[0].Status != "failed" || !strings.Contains(string(steps[0].Error), `"code":"ENOSPC"`) {
					t.Fatalf("steps %+v", steps)
				}
			}
			if name == "args" && testkit.Count(evs, kernel.EvStepProposed) != 0 {
				t.Fatal("unserialisable args were submitted")
			}
		})
	}
}

func TestOutsideAnExecution(t *testing.T) {
	ctx := context.Background()
	if _, err := agent.FromContext(ctx); !errors.Is(err, agent.ErrNoExecution) {
		t.Fatalf("FromContext: %v", err)
	}
	tool := agent.NewTool("t", func(ctx context.Context, in int) (int, error) { t.Fatal("body ran"); return 0, nil })
	if _, err := tool.Call(ctx, 1); !errors.Is(err, agent.ErrNoExecution) {
		t.Fatalf("Tool.Call: %v", err)
	}
	if _, err := agent.Now(ctx); !errors.Is(err, agent.ErrNoExecution) {
		t.Fatalf("Now: %v", err)
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://127.0.0.1:1/v1/chat", strings.NewReader(`{"model":"m"}`))
	if _, err := agent.NewHTTPClient(nil).Do(req); !errors.Is(err, agent.ErrNoExecution) {
		t.Fatalf("LLM request: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	h := agent.HandlerFunc(func(context.Context, json.RawMessage) (any, error) { return nil, nil })
	for name, cfg := range map[string]agent.Config{
		"no id":      {Secret: []byte("s"), KernelURL: "http://x", Handler: h},
		"no secret":  {ID: "a", KernelURL: "http://x", Handler: h},
		"no handler": {ID: "a", Secret: []byte("s"), KernelURL: "http://x"},
		"bad url":    {ID: "a", Secret: []byte("s"), KernelURL: "x:y", Handler: h},
		"negative":   {ID: "a", Secret: []byte("s"), KernelURL: "http://x", Handler: h, HeartbeatInterval: -1},
	} {
		if _, err := agent.New(cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// Serve serves webhooks until its context ends, lets a running handler
// finish, and returns nil.
func TestServe(t *testing.T) {
	h := start(t, kernel.Config{})
	release := make(chan struct{})
	a, err := agent.New(agent.Config{ID: "served", Secret: []byte(secret), KernelURL: h.env.URL,
		Handler: agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
			<-release
			return "served", nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.register("served", "http://"+ln.Addr().String()+"/any/path", false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ln) }()
	id := h.create("served", nil)
	for a.Running() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel() // shut down while the handler runs: it gets to finish
	// Gate: Serve is shutting down (new webhooks get 503) while the handler
	// is still held.
	probe := []byte(`{"execution_id":"no-such-execution","dispatch_id":"d","dispatch_attempt":1}`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/any/path", bytes.NewReader(probe))
		signWebhook(req, []byte(secret), probe, time.Now())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("Serve stopped listening before its handler finished: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("webhooks still answered %d after Serve's context ended", resp.StatusCode)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve returned (%v) before its running handler finished", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if x := h.status(id, kernel.ExecCompleted); string(x.Output) != `"served"` {
		t.Fatalf("output %s", x.Output)
	}
	if _, err := http.Post("http://"+ln.Addr().String()+"/any/path", "application/json", nil); err == nil {
		t.Fatal("still serving after Serve returned")
	}
}

func TestShutdownRefusesNewWebhooks(t *testing.T) {
	h := start(t, kernel.Config{})
	a, url := h.serve("shut", 0, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) { return 1, nil }))
	if err := a.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"execution_id":"e","dispatch_id":"d","dispatch_attempt":1}`)
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	signWebhook(req, []byte(secret), body, time.Now())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("after Shutdown: %d", resp.StatusCode)
	}
}

// lockedLog is a log destination a test reads while the agent writes.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A heartbeat interval longer than the kernel's lease is reported: here
// the steps keep the lease alive, but a slow body would lose it. The body
// steps until the first heartbeat has warned (a deadline ends it if none
// does). The lease is 2 s, not fast()'s 500 ms: a run stalled that long by
// a loaded machine lost it, ran the handler again and warned twice.
func TestHeartbeatLongerThanLeaseWarns(t *testing.T) {
	h := start(t, kernel.Config{LeaseTimeout: 2 * time.Second, DispatchTimeout: time.Second, ReapInterval: 20 * time.Millisecond})
	const warning = "heartbeat interval is longer than the kernel's lease"
	var logs lockedLog
	tick := agent.NewTool("tick", func(ctx context.Context, i int) (int, error) { return i, nil })
	a, err := agent.New(agent.Config{ID: "slowbeat", Secret: []byte(secret), KernelURL: h.env.URL, HeartbeatInterval: 2500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Handler: agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
			deadline := time.Now().Add(15 * time.Second)
			for i := 0; !strings.Contains(logs.String(), warning); i++ { // a step every 25ms renews the lease
				if time.Now().After(deadline) {
					return nil, errors.New("no warning after 15 s of steps")
				}
				if _, err := tick.Call(ctx, i); err != nil {
					return nil, err
				}
				time.Sleep(25 * time.Millisecond)
			}
			return "ok", nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	defer srv.Close()
	h.register("slowbeat", srv.URL, false)
	id := h.create("slowbeat", nil)
	h.status(id, kernel.ExecCompleted)
	if !strings.Contains(logs.String(), warning) {
		t.Fatalf("no warning in the log:\n%s", logs.String())
	}
	if strings.Count(logs.String(), warning) != 1 {
		t.Fatalf("the warning should come once:\n%s", logs.String())
	}
}

// A heartbeat interval longer than the whole lease is warned about when the
// handler starts: no beat would get through to show it (the lease lapses
// first), and a handler that makes no step would lose its lease silently.
func TestHeartbeatLongerThanLeaseWarnsAtStart(t *testing.T) {
	h := start(t, kernel.Config{LeaseTimeout: 2 * time.Second, DispatchTimeout: time.Second, ReapInterval: 20 * time.Millisecond})
	const warning = "heartbeat interval is longer than the kernel's lease"
	var logs lockedLog
	a, err := agent.New(agent.Config{ID: "nobeat", Secret: []byte(secret), KernelURL: h.env.URL, HeartbeatInterval: time.Hour,
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
		Handler: agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) { return "ok", nil })})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	defer srv.Close()
	h.register("nobeat", srv.URL, false)
	id := h.create("nobeat", nil)
	h.status(id, kernel.ExecCompleted)
	// The run posts the execution's output only after its heartbeat
	// goroutine has ended, so the log is complete by now.
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Fatalf("the warning came %d times, want once:\n%s", n, logs.String())
	}
}

// A webhook whose lease is not the execution's current one (a late or
// replayed delivery of another dispatch) neither runs the handler nor
// disturbs the handler that holds the lease.
func TestStaleWebhookIgnored(t *testing.T) {
	h := start(t, kernel.Config{})
	var runs atomic.Int64
	release := make(chan struct{})
	causes := make(chan error, 2)
	var logs lockedLog
	a, url := h.serveWith("stale", 0, &logs, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		runs.Add(1)
		select {
		case <-release:
			return "finished", nil
		case <-ctx.Done():
			causes <- context.Cause(ctx)
			return nil, context.Cause(ctx)
		}
	}))
	h.register("stale", url, false)
	id := h.create("stale", nil)
	for a.Running() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	for _, p := range []wire.WebhookPayload{
		{ExecutionID: id, DispatchID: "another-dispatch", DispatchAttempt: 1},
		{ExecutionID: id, DispatchID: "another-dispatch", DispatchAttempt: 7},
	} {
		body, _ := json.Marshal(p)
		req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
		signWebhook(req, []byte(secret), body, time.Now())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("stale webhook: %d", resp.StatusCode)
		}
	}
	// Gate: both stale runs read the execution and gave up (they log it).
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(logs.String(), "stale webhook") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the stale webhooks were not both ignored:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case c := <-causes:
		t.Fatalf("a stale webhook cancelled the running handler: %v", c)
	default:
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	close(release)
	if x := h.status(id, kernel.ExecCompleted); string(x.Output) != `"finished"` {
		t.Fatalf("output %s", x.Output)
	}
	h.checkLog(id)
}

// An input that does not decode into the typed handler's input fails the
// execution with the decoding error, before the handler runs.
func TestTypedInputMismatchFails(t *testing.T) {
	h := start(t, kernel.Config{})
	var ran atomic.Bool
	_, url := h.serve("typed", 0, agent.Typed(func(ctx context.Context, in struct{ N int }) (int, error) {
		ran.Store(true)
		return in.N, nil
	}))
	h.register("typed", url, false)
	id := h.create("typed", map[string]string{"N": "not a number"})
	x := h.status(id, kernel.ExecFailed)
	if x.Status != kernel.ExecFailed || !strings.Contains(string(x.Error), "decode input") || ran.Load() {
		t.Fatalf("execution %s %s (handler ran: %v)", x.Status, x.Error, ran.Load())
	}
	h.checkLog(id)
}

// waitIdle waits until the agent runs no dispatch.
func waitIdle(t *testing.T, a *agent.Agent) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.Running() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d dispatches still running", a.Running())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// flakyKernel is a proxy in front of the kernel that fails the first
// fails step requests whose path ends with suffix (the first drops the
// connection, the others answer 503), then forwards everything.
type flakyKernel struct {
	suffix string
	fails  int
	// down, while set, answers every request 503 (a kernel that is away).
	down atomic.Bool

	mu   sync.Mutex
	seen int
}

func (f *flakyKernel) handler(kernelURL string) http.Handler {
	u, _ := url.Parse(kernelURL)
	proxy := httputil.NewSingleHostReverseProxy(u)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.down.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"code":"unavailable","message":"the kernel is stopping"}`)
			return
		}
		if f.suffix != "" && strings.Contains(r.URL.Path, "/steps/") && strings.HasSuffix(r.URL.Path, f.suffix) {
			f.mu.Lock()
			f.seen++
			n := f.seen
			f.mu.Unlock()
			switch {
			case n == 1 && f.fails >= 1:
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					_ = conn.Close()
				}
				return
			case n <= f.fails:
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, `{"code":"unavailable","message":"the kernel is starting"}`)
				return
			}
		}
		proxy.ServeHTTP(w, r)
	})
}

func (f *flakyKernel) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen
}

// TestStepOutcomeSurvivesKernelOutage: a tool whose effect has happened
// while the kernel cannot be reached (a restart: the connection drops,
// then 503 while it starts) still gets its result recorded, in the same
// dispatch: the body runs once and the step is not left to become an
// indeterminate orphan.
func TestStepOutcomeSurvivesKernelOutage(t *testing.T) {
	for _, tc := range []struct{ name, suffix string }{{"complete", "/complete"}, {"fail", "/fail"}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fast()
			cfg.LeaseTimeout = 5 * time.Second // the outage is shorter than the lease
			h := start(t, cfg)
			flaky := &flakyKernel{suffix: tc.suffix, fails: 3}
			proxy := httptest.NewServer(flaky.handler(h.env.URL))
			t.Cleanup(proxy.Close)
			var runs counter
			charge := agent.NewTool("charge", func(ctx context.Context, in int) (int, error) {
				runs.inc("charge")
				if tc.name == "fail" {
					return 0, errors.New("card declined")
				}
				return in * 2, nil
			})
			a, err := agent.New(agent.Config{ID: "flaky-" + tc.name, Secret: []byte(secret), KernelURL: proxy.URL,
				HeartbeatInterval: 100 * time.Millisecond,
				Handler: agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
					v, err := charge.Call(ctx, 21)
					var te *agent.ToolError
					if errors.As(err, &te) && !te.Replayed && te.Message() == "card declined" {
						return "declined", nil
					}
					return v, err
				})})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(a)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = a.Shutdown(ctx)
				srv.Close()
			})
			h.register("flaky-"+tc.name, srv.URL+"/webhook", false)
			id := h.create("flaky-"+tc.name, nil)
			x := h.status(id, kernel.ExecCompleted)
			want := map[string]string{"complete": "42", "fail": `"declined"`}[tc.name]
			if x.Status != kernel.ExecCompleted || string(x.Output) != want {
				t.Fatalf("execution %s output %s error %s, want completed with %s", x.Status, x.Output, x.Error, want)
			}
			if n := runs.get("charge"); n != 1 {
				t.Fatalf("the effect ran %d times, want 1", n)
			}
			evs := h.checkLog(id)
			if n := testkit.Count(evs, kernel.EvDispatchClaimed); n != 1 {
				t.Fatalf("%d dispatch attempts, want 1 (the outcome was dropped and the dispatch delivered again)", n)
			}
			if n := flaky.requests(); n != 4 {
				t.Fatalf("the kernel saw %d %s requests, want 4 (one dropped, two 503, one answered)", n, tc.suffix)
			}
		})
	}
}

// TestStepOutcomeRetriesStopWithTheLease: a kernel away for longer than the
// lease (heartbeats fail too) is not waited for past the lease's end: the
// outcome's tries stop, the call returns *KernelError, and the dispatch
// ends, so that the kernel delivers the execution again once it is back
// (the step, in flight, replays as indeterminate).
func TestStepOutcomeRetriesStopWithTheLease(t *testing.T) {
	h := start(t, fast()) // a 500 ms lease
	flaky := &flakyKernel{}
	proxy := httptest.NewServer(flaky.handler(h.env.URL))
	t.Cleanup(proxy.Close)
	got := make(chan error, 1)
	var runs counter
	charge := agent.NewTool("charge", func(ctx context.Context, in int) (int, error) {
		runs.inc("charge")
		flaky.down.Store(true) // the kernel goes away while the effect runs
		return in, nil
	})
	a, err := agent.New(agent.Config{ID: "away", Secret: []byte(secret), KernelURL: proxy.URL, HeartbeatInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
			v, err := charge.Call(ctx, 7)
			ex, _ := agent.FromContext(ctx)
			if ex.Lease.Attempt == 1 {
				got <- err
			}
			var te *agent.ToolError
			if errors.As(err, &te) && te.Indeterminate() {
				return "indeterminate", nil
			}
			return v, err
		})})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
		srv.Close()
	})
	h.register("away", srv.URL+"/webhook", false)
	id := h.create("away", nil)
	select {
	case err := <-got:
		if !errors.As(err, new(*agent.KernelError)) {
			t.Fatalf("the first attempt's call returned %T %v, want *agent.KernelError", err, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the outcome was still being retried 20 s after a 500 ms lease")
	}
	flaky.down.Store(false)
	x := h.status(id, kernel.ExecCompleted)
	if x.Status != kernel.ExecCompleted || string(x.Output) != `"indeterminate"` || runs.get("charge") != 1 {
		t.Fatalf("execution %s output %s; the effect ran %d times", x.Status, x.Output, runs.get("charge"))
	}
}
