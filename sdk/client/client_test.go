package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

const secret = "sdk-client-secret-0123456789"

// start runs a real kernel (bbolt in a temp dir, real HTTP on loopback)
// and returns it with an admin client. The base URL's trailing slash is
// trimmed by New.
func start(t *testing.T) (*testkit.Env, *client.Client) {
	t.Helper()
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()},
		Config: kernel.Config{LeaseTimeout: 5 * time.Second, DispatchTimeout: time.Second, ReapInterval: 20 * time.Millisecond}})
	return env, client.New(env.URL+"/", client.WithAPIKey(testkit.AdminKey))
}

// startAgent starts a real test agent and registers it in the default tenant.
func startAgent(t *testing.T, env *testkit.Env, id string, h testkit.Handler) *testkit.Agent {
	t.Helper()
	a := testkit.NewAgent(id, secret, env.URL, h)
	t.Cleanup(a.Close)
	env.RegisterAgent(a, "")
	return a
}

// steps is an agent that runs n local steps and completes with "done".
func steps(n int) testkit.Handler {
	return func(ctx context.Context, r *testkit.Run) (any, error) {
		for i := range n {
			if _, err := r.Step(ctx, "local", "count", map[string]int{"i": i}, testkit.StepOpts{}, func() (any, error) { return i, nil }); err != nil {
				return nil, err
			}
		}
		return "done", nil
	}
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// watched is what a watch delivered.
type watched struct {
	events []client.Event
	deltas []client.StepDelta
	order  []string // event types and "step.delta", in delivery order
}

func watch(ctx context.Context, c *client.Client, id string, o client.WatchOptions) (*watched, error) {
	w := &watched{}
	err := c.WatchWith(ctx, id, o, func(it client.StreamItem) error {
		switch {
		case it.Event != nil && it.Delta == nil:
			w.events = append(w.events, *it.Event)
			w.order = append(w.order, it.Event.Type)
		case it.Delta != nil && it.Event == nil:
			w.deltas = append(w.deltas, *it.Delta)
			w.order = append(w.order, client.EventStepDelta)
		default:
			return fmt.Errorf("a stream item must have exactly one field: %+v", it)
		}
		return nil
	})
	return w, err
}

// sameEvents fails unless got and want are the same events in the same order.
func sameEvents(t *testing.T, got, want []client.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Type != w.Type || g.ExecutionID != w.ExecutionID || !g.Time.Equal(w.Time) || !bytes.Equal(g.Payload, w.Payload) {
			t.Fatalf("event %d: got %+v, want %+v", i, g, w)
		}
	}
}

// wholeLog checks that evs is a whole log: seqs 1..n, terminal last.
func wholeLog(t *testing.T, evs []client.Event) {
	t.Helper()
	for i, e := range evs {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}
	if len(evs) == 0 || !client.IsTerminalEvent(evs[len(evs)-1].Type) {
		t.Fatalf("the log does not end with a terminal event: %d events", len(evs))
	}
}

func TestExecutions(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	startAgent(t, env, "worker", steps(2))
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Ready(ctx); err != nil {
		t.Fatal(err)
	}

	req := client.CreateExecutionRequest{AgentID: "worker", Input: json.RawMessage(`{"n":1}`), Labels: map[string]string{"team": "a"}}
	x, err := c.CreateExecution(ctx, req, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	if x.ID == "" || x.AgentID != "worker" || x.Tenant != kernel.DefaultTenant || x.IdempotencyKey != "key-1" || string(x.Input) != `{"n":1}` {
		t.Fatalf("created %+v", x)
	}
	again, err := c.CreateExecution(ctx, req, "key-1")
	if err != nil || again.ID != x.ID {
		t.Fatalf("a retried create with the same key: %v, %v (want %s)", again, err, x.ID)
	}
	other, err := c.CreateExecution(ctx, req, "")
	if err != nil || other.ID == x.ID {
		t.Fatalf("a create without a key must start another execution: %v %v", other, err)
	}

	done, err := c.Wait(ctx, x.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != "completed" || string(done.Output) != `"done"` || done.Totals.Steps != 2 {
		t.Fatalf("after Wait: %+v", done)
	}
	// Waiting for a finished execution answers at once.
	if again, err := c.Wait(ctx, x.ID); err != nil || again.Status != "completed" {
		t.Fatalf("Wait again: %v %v", again, err)
	}
	got, err := c.GetExecution(ctx, x.ID)
	if err != nil || got.ID != x.ID || got.LastSeq != done.LastSeq || got.Labels["team"] != "a" {
		t.Fatalf("get: %+v %v", got, err)
	}

	ss, err := c.Steps(ctx, x.ID)
	if err != nil || len(ss) != 2 {
		t.Fatalf("steps: %+v %v", ss, err)
	}
	for _, s := range ss {
		one, err := c.Step(ctx, x.ID, s.ID)
		if err != nil || one.ID != s.ID || one.Status != "succeeded" || one.Kind != "local" {
			t.Fatalf("step %s: %+v %v", s.ID, one, err)
		}
	}
	if _, err := c.Step(ctx, x.ID, "nope"); !client.IsCode(err, wire.CodeNotFound) {
		t.Fatalf("unknown step: %v", err)
	}

	if err := c.Cancel(ctx, x.ID); !client.IsCode(err, wire.CodeConflict) {
		t.Fatalf("cancel of a completed execution: %v", err)
	}
}

func TestCancel(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	// An agent that parks on an approval keeps its execution open.
	a := startAgent(t, env, "gated", func(ctx context.Context, r *testkit.Run) (any, error) {
		_, err := r.Step(ctx, "tool_call", "deploy", nil, testkit.StepOpts{}, func() (any, error) { return "shipped", nil })
		return nil, err
	})
	if _, err := c.SetPolicy(ctx, a.ID, "default_action: allow\nrules:\n  - id: gate\n    priority: 1\n    when: {target: deploy}\n    then: {decision: require_approval}\n"); err != nil {
		t.Fatal(err)
	}
	x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: a.ID}, "")
	if err != nil {
		t.Fatal(err)
	}
	env.WaitStatus(x.ID, 10*time.Second, func(s kernel.ExecStatus) bool { return s == kernel.ExecBlocked })
	waited := make(chan error, 1)
	go func() {
		e, err := c.Wait(ctx, x.ID)
		if err == nil && e.Status != "cancelled" {
			err = fmt.Errorf("status %s", e.Status)
		}
		waited <- err
	}()
	if err := c.Cancel(ctx, x.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("Wait across a cancel: %v", err)
	}
	evs, err := c.AllEvents(ctx, x.ID)
	if err != nil {
		t.Fatal(err)
	}
	wholeLog(t, evs)
	if last := evs[len(evs)-1]; last.Type != client.EventExecutionCancelled {
		t.Fatalf("last event %s", last.Type)
	}
}

func TestListExecutionsPaging(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	startAgent(t, env, "lister", steps(0))
	startAgent(t, env, "bystander", steps(0))
	var created []string
	for i := range 5 {
		x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "lister", Input: json.RawMessage(strconv.Itoa(i))}, "")
		if err != nil {
			t.Fatal(err)
		}
		created = append(created, x.ID)
	}
	by, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "bystander"}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range append(slices.Clone(created), by.ID) {
		if _, err := c.Wait(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name string
		o    client.ListOptions
		want []string // newest first
	}{
		{"pages of 2", client.ListOptions{AgentID: "lister", Limit: 2}, reversed(created)},
		{"one page", client.ListOptions{AgentID: "lister"}, reversed(created)},
		{"status", client.ListOptions{AgentID: "lister", Status: "completed", Limit: 3}, reversed(created)},
		{"no match", client.ListOptions{AgentID: "lister", Status: "running"}, nil},
		{"all agents", client.ListOptions{Limit: 4}, append([]string{by.ID}, reversed(created)...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			pages := 0
			o := tc.o
			for {
				l, err := c.ListExecutions(ctx, o)
				if err != nil {
					t.Fatal(err)
				}
				pages++
				if o.Limit > 0 && len(l.Executions) > o.Limit {
					t.Fatalf("page of %d with limit %d", len(l.Executions), o.Limit)
				}
				for _, x := range l.Executions {
					got = append(got, x.ID)
				}
				if l.NextCursor == "" {
					break
				}
				o.Cursor = l.NextCursor
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			if tc.o.Limit > 0 && pages < len(tc.want)/tc.o.Limit {
				t.Fatalf("%d pages for %d executions of %d", pages, len(tc.want), tc.o.Limit)
			}
		})
	}
}

func reversed(s []string) []string {
	r := slices.Clone(s)
	slices.Reverse(r)
	return r
}

// TestEventsAndWatch follows a long execution (more than one page of
// events) live over SSE, and checks every way of reading its log agrees.
func TestEventsAndWatch(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	startAgent(t, env, "long", steps(260)) // 4 events per step: more than MaxEventsPage
	x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "long"}, "")
	if err != nil {
		t.Fatal(err)
	}
	live, err := watch(ctx, c, x.ID, client.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.AllEvents(ctx, x.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) <= client.MaxEventsPage {
		t.Fatalf("only %d events: the test needs more than one page", len(all))
	}
	wholeLog(t, all)
	if all[len(all)-1].Type != client.EventExecutionCompleted {
		t.Fatalf("last event %s", all[len(all)-1].Type)
	}
	sameEvents(t, live.events, all)
	if len(live.deltas) != 0 {
		t.Fatalf("deltas %+v", live.deltas)
	}

	// Pages of the plain read.
	var paged []client.Event
	for after := uint64(0); ; {
		page, err := c.Events(ctx, x.ID, after, 333)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, page...)
		if len(page) < 333 {
			break
		}
		after = page[len(page)-1].Seq
	}
	sameEvents(t, paged, all)
	if def, err := c.Events(ctx, x.ID, 0, 0); err != nil || len(def) != 100 {
		t.Fatalf("default page: %d events, %v", len(def), err)
	}
	tail, err := c.EventsAfter(ctx, x.ID, 900)
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, tail, all[900:])

	mid := all[len(all)/2].Seq
	tests := []struct {
		name string
		c    *client.Client
		o    client.WatchOptions
		want []client.Event
	}{
		{"sse replay", c, client.WatchOptions{}, all},
		{"sse after seq", c, client.WatchOptions{AfterSeq: mid}, all[mid:]},
		{"sse after the end", c, client.WatchOptions{AfterSeq: uint64(len(all))}, nil},
		{"poll", c, client.WatchOptions{Poll: true, PollInterval: 10 * time.Millisecond}, all},
		{"poll after seq", c, client.WatchOptions{Poll: true, AfterSeq: mid}, all[mid:]},
		{"poll after the end", c, client.WatchOptions{Poll: true, AfterSeq: uint64(len(all))}, nil},
		// A proxy that answers the stream with an error page: Watch polls.
		{"no sse", client.New(env.URL, client.WithAPIKey(testkit.AdminKey),
			client.WithHTTPClient(&http.Client{Transport: &streamTransport{mode: "502"}})), client.WatchOptions{}, all},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := watch(ctx, tc.c, x.ID, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			sameEvents(t, w.events, tc.want)
		})
	}
}

// TestWatchPollLive polls a live execution to its end.
func TestWatchPollLive(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	startAgent(t, env, "slow", func(ctx context.Context, r *testkit.Run) (any, error) {
		for i := range 5 {
			time.Sleep(20 * time.Millisecond)
			if _, err := r.Step(ctx, "local", "tick", i, testkit.StepOpts{}, func() (any, error) { return i, nil }); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "slow"}, "")
	if err != nil {
		t.Fatal(err)
	}
	w, err := watch(ctx, c, x.ID, client.WatchOptions{Poll: true, PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.AllEvents(ctx, x.ID)
	if err != nil {
		t.Fatal(err)
	}
	wholeLog(t, all)
	sameEvents(t, w.events, all)
}

// TestWatchPollsAtTheStreamLimit: a tenant with all its event streams
// open (the server's limit, 429 on one more) can still Watch (and Wait):
// the kernel says to poll the events route, and the watch does.
func TestWatchPollsAtTheStreamLimit(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}, MaxStreamsPerTenant: 1,
		Config: kernel.Config{LeaseTimeout: 5 * time.Second, DispatchTimeout: time.Second, ReapInterval: 20 * time.Millisecond}})
	c := client.New(env.URL, client.WithAPIKey(testkit.AdminKey))
	ctx := testCtx(t)
	hold := make(chan struct{})
	startAgent(t, env, "held", func(ctx context.Context, r *testkit.Run) (any, error) {
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return "released", nil
	})
	startAgent(t, env, "quick", func(ctx context.Context, r *testkit.Run) (any, error) { return "done", nil })
	held, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "held"}, "")
	if err != nil {
		t.Fatal(err)
	}
	// The held execution's watch takes the tenant's only stream.
	streaming := make(chan struct{})
	first := sync.OnceFunc(func() { close(streaming) })
	heldDone := make(chan error, 1)
	go func() {
		heldDone <- c.Watch(ctx, held.ID, 0, func(client.StreamItem) error { first(); return nil })
	}()
	<-streaming
	x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "quick"}, "")
	if err != nil {
		t.Fatal(err)
	}
	w, err := watch(ctx, c, x.ID, client.WatchOptions{PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatalf("Watch at the stream limit: %v", err)
	}
	all, err := c.AllEvents(ctx, x.ID)
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, w.events, all)
	close(hold)
	if err := <-heldDone; err != nil {
		t.Fatalf("the streaming watch: %v", err)
	}
}

// TestWatchDelta watches an agent stream a step's output: the delta
// arrives between the step's executing and succeeded events.
func TestWatchDelta(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	stepSeen := make(chan string, 1)
	startAgent(t, env, "streamer", func(ctx context.Context, r *testkit.Run) (any, error) {
		return r.Step(ctx, "llm_call", "gpt", map[string]string{"p": "hi"}, testkit.StepOpts{}, func() (any, error) {
			var stepID string
			select {
			case stepID = <-stepSeen: // the watcher is subscribed
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			ac := client.New(env.URL, client.WithAgent("streamer", []byte(secret)))
			lease := http.Header{wire.HeaderDispatchID: {r.Lease.DispatchID}, wire.HeaderDispatchAttempt: {strconv.Itoa(r.Lease.Attempt)}}
			for i, tok := range []string{`"hel"`, `"lo"`} {
				var acc wire.StreamDeltaAccepted
				if err := ac.Do(ctx, "POST", "/v0/executions/"+r.ExecutionID+"/steps/"+stepID+"/stream", lease,
					wire.StreamDelta{Seq: int64(i), Data: json.RawMessage(tok)}, &acc); err != nil {
					return nil, err
				}
				if acc.Subscribers != 1 {
					return nil, fmt.Errorf("delta handed to %d subscribers", acc.Subscribers)
				}
			}
			return "hello", nil
		})
	})
	x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "streamer"}, "")
	if err != nil {
		t.Fatal(err)
	}
	var stepID string
	var deltas []client.StepDelta
	var order []string
	err = c.Watch(ctx, x.ID, 0, func(it client.StreamItem) error {
		if it.Delta != nil {
			deltas = append(deltas, *it.Delta)
			order = append(order, client.EventStepDelta)
			return nil
		}
		order = append(order, it.Event.Type)
		if it.Event.Type == string(kernel.EvStepExecuting) {
			var p struct {
				StepID string `json:"step_id"`
			}
			if err := json.Unmarshal(it.Event.Payload, &p); err != nil {
				return err
			}
			stepID = p.StepID
			stepSeen <- p.StepID
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(deltas) != 2 {
		t.Fatalf("deltas %+v (order %v)", deltas, order)
	}
	for i, d := range deltas {
		if d.ExecutionID != x.ID || d.StepID != stepID || d.Seq != int64(i) {
			t.Fatalf("delta %d: %+v", i, d)
		}
	}
	if string(deltas[0].Data) != `"hel"` || string(deltas[1].Data) != `"lo"` {
		t.Fatalf("delta data %s %s", deltas[0].Data, deltas[1].Data)
	}
	// Both deltas come between the step's executing and succeeded events
	// (other events, such as dispatch.acked, may come between them).
	exec, done := slices.Index(order, string(kernel.EvStepExecuting)), slices.Index(order, string(kernel.EvStepSucceeded))
	for i, typ := range order {
		if typ == client.EventStepDelta && (i < exec || i > done) {
			t.Fatalf("a delta outside its step's run: %v", order)
		}
	}
	if order[len(order)-1] != client.EventExecutionCompleted {
		t.Fatalf("the watch must end with the terminal event: %v", order)
	}
}

// streamTransport stands in for a network or proxy between the client and
// the kernel on event-stream requests. Mode "cut" ends the first stream's
// body after `after` bytes as a dropped connection does; "stall" stops it
// sending (a half-open connection) until the request is cancelled; "502"
// answers every stream request with a proxy error page.
type streamTransport struct {
	mode  string
	after int

	mu      sync.Mutex
	streams []http.Header // the request headers of every stream request
}

func (s *streamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(req.URL.Path, "/stream") || req.Method != http.MethodGet {
		return http.DefaultTransport.RoundTrip(req)
	}
	s.mu.Lock()
	n := len(s.streams)
	s.streams = append(s.streams, req.Header.Clone())
	s.mu.Unlock()
	if s.mode == "502" {
		return &http.Response{StatusCode: http.StatusBadGateway, Status: "502 Bad Gateway", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"text/html"}}, Body: io.NopCloser(strings.NewReader("<html>bad gateway</html>")), Request: req}, nil
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || n > 0 {
		return resp, err
	}
	resp.Body = &cutBody{rc: resp.Body, left: s.after, stall: s.mode == "stall", ctx: req.Context()}
	return resp, nil
}

func (s *streamTransport) requests() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.streams)
}

type cutBody struct {
	rc    io.ReadCloser
	left  int
	stall bool
	ctx   context.Context
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		if b.stall {
			<-b.ctx.Done()
			return 0, b.ctx.Err()
		}
		return 0, io.ErrUnexpectedEOF
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= n
	return n, err
}

func (b *cutBody) Close() error { return b.rc.Close() }

// TestWatchReconnect drops the first stream of a live execution in the
// middle of an event; Watch reconnects with Last-Event-ID and delivers every
// event exactly once.
func TestWatchReconnect(t *testing.T) {
	for _, tc := range []struct {
		mode string
		o    client.WatchOptions
	}{
		{"cut", client.WatchOptions{}},
		{"stall", client.WatchOptions{IdleTimeout: 300 * time.Millisecond}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			env, _ := start(t)
			ctx := testCtx(t)
			startAgent(t, env, "agent", steps(20))
			tr := &streamTransport{mode: tc.mode, after: 700}
			c := client.New(env.URL, client.WithAPIKey(testkit.AdminKey), client.WithHTTPClient(&http.Client{Transport: tr}))
			x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "agent"}, "")
			if err != nil {
				t.Fatal(err)
			}
			w, err := watch(ctx, c, x.ID, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			all, err := c.AllEvents(ctx, x.ID)
			if err != nil {
				t.Fatal(err)
			}
			wholeLog(t, all)
			sameEvents(t, w.events, all)
			reqs := tr.requests()
			if len(reqs) < 2 {
				t.Fatalf("%d stream requests: the first was never dropped", len(reqs))
			}
			if reqs[0].Get("Last-Event-ID") != "" {
				t.Fatalf("the first request resumes from %s", reqs[0].Get("Last-Event-ID"))
			}
			lei, err := strconv.ParseUint(reqs[1].Get("Last-Event-ID"), 10, 64)
			if err != nil || lei == 0 || lei >= all[len(all)-1].Seq {
				t.Fatalf("the reconnect resumed from %q (%v)", reqs[1].Get("Last-Event-ID"), err)
			}
		})
	}
}

func TestWatchStops(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	startAgent(t, env, "agent", steps(3))
	x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "agent"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, x.ID); err != nil {
		t.Fatal(err)
	}
	stop := errors.New("enough")
	for _, poll := range []bool{false, true} {
		n := 0
		err := c.WatchWith(ctx, x.ID, client.WatchOptions{Poll: poll}, func(client.StreamItem) error {
			n++
			if n == 2 {
				return stop
			}
			return nil
		})
		if err != stop || n != 2 {
			t.Fatalf("poll %v: fn's error must stop the watch and be returned as is: %v after %d items", poll, err, n)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Watch(cctx, x.ID, 0, func(client.StreamItem) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
	if err := c.Watch(ctx, "0190b3a0-0000-7000-8000-000000000000", 0, func(client.StreamItem) error { return nil }); !client.IsCode(err, wire.CodeNotFound) {
		t.Fatalf("watch of an unknown execution: %v", err)
	}
	if _, err := c.Wait(ctx, "nope"); !client.IsCode(err, wire.CodeNotFound) {
		t.Fatalf("wait for an unknown execution: %v", err)
	}
}

func TestAPIErrors(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	bad := client.New(env.URL, client.WithAPIKey("not-a-key"))
	tests := []struct {
		name   string
		call   func() error
		status int
		code   string
		path   string
	}{
		{"404 execution", func() error { _, err := c.GetExecution(ctx, "missing"); return err }, 404, wire.CodeNotFound, "GET /v0/executions/missing"},
		{"404 agent", func() error { _, err := c.Agent(ctx, "a b/c"); return err }, 404, wire.CodeNotFound, "GET /v0/agents/a%20b%2Fc"},
		{"401 bad key", func() error { _, err := bad.ListExecutions(ctx, client.ListOptions{}); return err }, 401, wire.CodeUnauthenticated, "GET /v0/executions"},
		{"401 no key", func() error { return client.New(env.URL).Cancel(ctx, "x") }, 401, wire.CodeUnauthenticated, "POST /v0/executions/x/cancel"},
		{"400 status", func() error { _, err := c.ListExecutions(ctx, client.ListOptions{Status: "bogus"}); return err }, 400, wire.CodeValidation, "GET /v0/executions?status=bogus"},
		{"400 input", func() error {
			_, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "a", Input: json.RawMessage(`{"a":1,"a":2}`)}, "")
			return err
		}, 400, wire.CodeValidation, "POST /v0/executions"},
		{"400 limit", func() error { _, err := c.Events(ctx, "x", 0, 5000); return err }, 400, wire.CodeValidation, "GET /v0/executions/x/events?limit=5000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var ae *client.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("not an *APIError: %v", err)
			}
			if ae.Status != tc.status || ae.Code != tc.code || ae.Message == "" {
				t.Fatalf("got %+v", ae)
			}
			if !client.IsCode(err, tc.code) || client.IsCode(err, wire.CodeInternal) {
				t.Fatal("IsCode")
			}
			want := tc.path + ": " + strconv.Itoa(tc.status) + " " + tc.code + ": "
			if !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("error %q does not start with %q", err, want)
			}
		})
	}

	// A proxy's error page is not an envelope: no code, the status text and
	// an excerpt of the body.
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream is down", http.StatusBadGateway)
	}))
	defer proxy.Close()
	err := client.New(proxy.URL).Health(ctx)
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 502 || ae.Code != "" || ae.Message != "Bad Gateway: upstream is down" {
		t.Fatalf("proxy error: %#v", err)
	}
	if got := err.Error(); got != "GET /v0/health: 502: Bad Gateway: upstream is down" {
		t.Fatalf("proxy error text %q", got)
	}
	if client.IsCode(err, "") != true || client.IsCode(errors.New("x"), "") {
		t.Fatal("IsCode on non-API errors")
	}
	// A transport error is no APIError but keeps its cause.
	proxy.Close()
	err = client.New(proxy.URL).Health(ctx)
	if err == nil || errors.As(err, &ae) || !strings.HasPrefix(err.Error(), "GET /v0/health: ") {
		t.Fatalf("transport error: %v", err)
	}
}

// TestDo sends raw requests: []byte and json.RawMessage bodies, raw
// answers, extra headers.
func TestDo(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	startAgent(t, env, "raw", steps(0))
	var raw json.RawMessage
	if err := c.Do(ctx, "GET", "/v0/health", nil, nil, &raw); err != nil || string(bytes.TrimSpace(raw)) != `{"status":"ok"}` {
		t.Fatalf("health: %s %v", raw, err)
	}
	var x client.Execution
	h := http.Header{wire.HeaderIdempotencyKey: {"raw-1"}}
	if err := c.Do(ctx, "POST", "/v0/executions", h, []byte(`{"agent_id":"raw","input":[1, 2]}`), &x); err != nil || x.ID == "" {
		t.Fatalf("create: %+v %v", x, err)
	}
	var y client.Execution
	if err := c.Do(ctx, "POST", "/v0/executions", h, json.RawMessage(`{"input": [1,2], "agent_id": "raw"}`), &y); err != nil || y.ID != x.ID || string(y.Input) != "[1,2]" {
		t.Fatalf("idempotent create: %+v %v", y, err)
	}
	var b []byte
	if err := c.Do(ctx, "GET", "/v0/executions/"+x.ID, nil, nil, &b); err != nil || !bytes.Contains(b, []byte(x.ID)) {
		t.Fatalf("raw answer: %s %v", b, err)
	}
	// A bad value body is an encoding error, before anything is sent.
	if err := c.Do(ctx, "POST", "/v0/executions", nil, map[string]any{"f": func() {}}, nil); err == nil || !strings.Contains(err.Error(), "encode body") {
		t.Fatalf("unencodable body: %v", err)
	}
}

// TestApprovals drives require_approval to a grant and to a deny.
func TestApprovals(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	a := startAgent(t, env, "deployer", func(ctx context.Context, r *testkit.Run) (any, error) {
		return r.Step(ctx, "tool_call", "deploy", map[string]string{"env": "prod"}, testkit.StepOpts{}, func() (any, error) { return "shipped", nil })
	})
	pol, err := c.SetPolicy(ctx, a.ID, `default_action: allow
rules:
  - id: gate
    priority: 1
    when: {target: deploy}
    then:
      decision: require_approval
      reason: deploys need a human
      approval_config: {approvers: [ops, alice], message: "deploy?"}
`)
	if err != nil {
		t.Fatal(err)
	}
	if pol.AgentID != a.ID || pol.Bundle.Engine != "rules" || len(pol.Bundle.Digest) != 64 {
		t.Fatalf("policy %+v", pol)
	}

	for _, tc := range []struct {
		name   string
		grant  bool
		status string // the approval's after the decision
		final  string // the execution's
	}{
		{"grant", true, "granted", "completed"},
		{"deny", false, "denied", "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: a.ID}, "")
			if err != nil {
				t.Fatal(err)
			}
			env.WaitStatus(x.ID, 10*time.Second, func(s kernel.ExecStatus) bool { return s == kernel.ExecBlocked })
			pending, err := c.Approvals(ctx, "pending")
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(pending, func(p client.Approval) bool { return p.ExecutionID == x.ID })
			if i < 0 {
				t.Fatalf("no pending approval for %s in %+v", x.ID, pending)
			}
			ap, err := c.Approval(ctx, pending[i].ID)
			if err != nil || ap.Target != "deploy" || ap.Status != "pending" || ap.RuleID != "gate" || ap.Message != "deploy?" {
				t.Fatalf("approval %+v %v", ap, err)
			}
			// Not an approver: 403. A stale request hash: 409.
			if _, err := c.Grant(ctx, ap.ID, client.ResolveApprovalRequest{DecidedBy: "mallory"}); !client.IsCode(err, wire.CodeForbidden) {
				t.Fatalf("grant by a non-approver: %v", err)
			}
			if _, err := c.Deny(ctx, ap.ID, client.ResolveApprovalRequest{DecidedBy: "ops", RequestHash: strings.Repeat("0", 64)}); !client.IsCode(err, wire.CodeConflict) {
				t.Fatalf("deny with a stale hash: %v", err)
			}
			resolve := c.Deny
			if tc.grant {
				resolve = c.Grant
			}
			got, err := resolve(ctx, ap.ID, client.ResolveApprovalRequest{DecidedBy: "ops", Rationale: "looked", RequestHash: ap.RequestHash})
			if err != nil || got.Status != tc.status || got.DecidedBy != "ops" || got.Rationale != "looked" || got.DecidedAt == nil {
				t.Fatalf("resolve: %+v %v", got, err)
			}
			if _, err := c.Grant(ctx, ap.ID, client.ResolveApprovalRequest{DecidedBy: "ops"}); !client.IsCode(err, wire.CodeConflict) {
				t.Fatalf("resolving twice: %v", err)
			}
			done, err := c.Wait(ctx, x.ID)
			if err != nil || done.Status != tc.final {
				t.Fatalf("after %s: %+v %v", tc.name, done, err)
			}
			list, err := c.Approvals(ctx, tc.status)
			if err != nil || !slices.ContainsFunc(list, func(p client.Approval) bool { return p.ID == ap.ID }) {
				t.Fatalf("approvals %s: %+v %v", tc.status, list, err)
			}
		})
	}
	if all, err := c.Approvals(ctx, ""); err != nil || len(all) != 2 {
		t.Fatalf("all approvals: %d %v", len(all), err)
	}
}

func TestAgentsCRUD(t *testing.T) {
	_, c := start(t)
	ctx := testCtx(t)
	a, err := c.PutAgent(ctx, client.AgentRequest{ID: "crud", WebhookURL: "http://127.0.0.1:9/hook", Secret: secret})
	if err != nil || a.ID != "crud" || a.Tenant != kernel.DefaultTenant || a.WebhookURL != "http://127.0.0.1:9/hook" || a.Bundle != "" {
		t.Fatalf("create: %+v %v", a, err)
	}
	// An update without the secret keeps it.
	b, err := c.PutAgent(ctx, client.AgentRequest{ID: "crud", WebhookURL: "http://127.0.0.1:9/v2"})
	if err != nil || b.WebhookURL != "http://127.0.0.1:9/v2" || !b.CreatedAt.Equal(a.CreatedAt) {
		t.Fatalf("update: %+v %v", b, err)
	}
	list, err := c.Agents(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "crud" {
		t.Fatalf("list: %+v %v", list, err)
	}
	got, err := c.Agent(ctx, "crud")
	if err != nil || got.WebhookURL != b.WebhookURL {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := c.PutAgent(ctx, client.AgentRequest{ID: "bad id!", WebhookURL: "http://x", Secret: secret}); !client.IsCode(err, wire.CodeValidation) {
		t.Fatalf("bad id: %v", err)
	}
	if err := c.DeleteAgent(ctx, "crud"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Agent(ctx, "crud"); !client.IsCode(err, wire.CodeNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := c.DeleteAgent(ctx, "crud"); !client.IsCode(err, wire.CodeNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if list, err := c.Agents(ctx); err != nil || len(list) != 0 {
		t.Fatalf("empty list: %+v %v", list, err)
	}
}

const bundleRules = `default_action: deny
rules:
  - id: reads
    priority: 1
    when: {target: "read_*"}
    then: {decision: allow}
  - id: deploys
    priority: 2
    when: {target: deploy}
    then: {decision: require_approval, reason: needs a human}
`

func TestBundlesAndEval(t *testing.T) {
	_, c := start(t)
	ctx := testCtx(t)
	files := client.BundleFilesRequest{Engine: "rules", Files: map[string]string{
		"bundle.yaml": "name: guard\nrevision: \"7\"\nengine: rules\n", "rules.yaml": bundleRules}}
	b, err := c.PutBundleFiles(ctx, "guard", files)
	if err != nil || b.Name != "guard" || b.Revision != "7" || b.Engine != "rules" || len(b.Digest) != 64 || b.Tenant != kernel.DefaultTenant {
		t.Fatalf("put files: %+v %v", b, err)
	}
	// The same bundle as a .tar.gz, under another name.
	bd, err := bundle.LoadFiles(map[string][]byte{"bundle.yaml": []byte("name: packed\nrevision: \"1\"\nengine: rules\n"), "rules.yaml": []byte(bundleRules)})
	if err != nil {
		t.Fatal(err)
	}
	tgz, err := bd.TarGz()
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.PutBundle(ctx, "packed", tgz)
	if err != nil || p.Name != "packed" || p.Engine != "rules" {
		t.Fatalf("put archive: %+v %v", p, err)
	}
	if ar, err := c.BundleArchive(ctx, "packed"); err != nil || len(ar) < 2 || ar[0] != 0x1f || ar[1] != 0x8b {
		t.Fatalf("archive: %d bytes, %v", len(ar), err)
	}
	list, err := c.Bundles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range list {
		names = append(names, x.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"guard", "packed"}) {
		t.Fatalf("bundles %v", names)
	}
	got, err := c.Bundle(ctx, "guard")
	if err != nil || got.Digest != b.Digest {
		t.Fatalf("get: %+v %v", got, err)
	}
	for name, bad := range map[string]func() error{
		"not gzip": func() error { _, err := c.PutBundle(ctx, "x", []byte("plain")); return err },
		"empty":    func() error { _, err := c.PutBundle(ctx, "x", nil); return err },
		"bad rules": func() error {
			_, err := c.PutBundleFiles(ctx, "guard", client.BundleFilesRequest{Engine: "rules", Files: map[string]string{"rules.yaml": "rules: [{}]"}})
			return err
		},
		"name mismatch": func() error { _, err := c.PutBundle(ctx, "other", tgz); return err },
		"engine not inferable": func() error {
			_, err := c.PutBundleFiles(ctx, "x", client.BundleFilesRequest{Files: map[string]string{"README.md": "no policy here"}})
			return err
		},
	} {
		if err := bad(); !client.IsCode(err, wire.CodeValidation) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if again, err := c.Bundle(ctx, "guard"); err != nil || again.Digest != b.Digest {
		t.Fatalf("a refused bundle must leave the running one: %+v %v", again, err)
	}

	guard := "guard"
	if _, err := c.PutAgent(ctx, client.AgentRequest{ID: "bound", WebhookURL: "http://127.0.0.1:9/", Secret: secret, Policy: &guard}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		target, decision, rule string
	}{
		{"read_file", "allow", "reads"},
		{"deploy", "require_approval", "deploys"},
		{"delete", "deny", "default_action"},
	} {
		r, err := c.EvalPolicy(ctx, client.PolicyEvalRequest{AgentID: "bound", Step: wire.EvalStep{Kind: "tool_call", Target: tc.target, Args: json.RawMessage(`{}`)}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Action != tc.decision || r.RuleID != tc.rule || r.Bundle.Name != "guard" || r.Bundle.Digest != b.Digest {
			t.Errorf("eval %s: %+v", tc.target, r)
		}
	}
	if _, err := c.EvalPolicy(ctx, client.PolicyEvalRequest{}); !client.IsCode(err, wire.CodeValidation) {
		t.Fatalf("eval without agent: %v", err)
	}

	if err := c.DeleteBundle(ctx, "packed"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bundle(ctx, "packed"); !client.IsCode(err, wire.CodeNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

// TestTenantsAndKeys: a tenant's client key runs executions in its tenant,
// and nobody outside the tenant sees them.
func TestTenantsAndKeys(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	for _, id := range []string{"acme", "globex"} {
		tn, err := c.CreateTenant(ctx, client.TenantRequest{ID: id})
		if err != nil || tn.ID != id {
			t.Fatalf("create tenant: %+v %v", tn, err)
		}
	}
	if _, err := c.CreateTenant(ctx, client.TenantRequest{ID: "acme"}); !client.IsCode(err, wire.CodeConflict) {
		t.Fatalf("duplicate tenant: %v", err)
	}
	ts, err := c.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, tn := range ts {
		ids = append(ids, tn.ID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"acme", kernel.DefaultTenant, "globex"}) {
		t.Fatalf("tenants %v", ids)
	}
	key, err := c.CreateKey(ctx, "acme", client.KeyRequest{Role: wire.RoleClient, Principal: "ci"})
	if err != nil || key.Key == "" || key.KeyID == "" || key.Tenant != "acme" || key.Role != wire.RoleClient {
		t.Fatalf("create key: %+v %v", key, err)
	}
	gkey, err := c.CreateKey(ctx, "globex", client.KeyRequest{Role: wire.RoleTenantAdmin, Principal: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "acme")
	if err != nil || len(keys) != 1 || keys[0].KeyID != key.KeyID || keys[0].Principal != "ci" {
		t.Fatalf("keys: %+v %v", keys, err)
	}
	if _, err := c.Keys(ctx, "nope"); !client.IsCode(err, wire.CodeNotFound) {
		t.Fatalf("keys of an unknown tenant: %v", err)
	}

	// The admin acts in acme with WithTenant.
	acmeAdmin := client.New(env.URL, client.WithAPIKey(testkit.AdminKey), client.WithTenant("acme"))
	a := testkit.NewAgent("worker", secret, env.URL, steps(1))
	t.Cleanup(a.Close)
	ag, err := acmeAdmin.PutAgent(ctx, client.AgentRequest{ID: "worker", WebhookURL: a.WebhookURL(), Secret: secret})
	if err != nil || ag.Tenant != "acme" {
		t.Fatalf("put agent in acme: %+v %v", ag, err)
	}

	acme := client.New(env.URL, client.WithAPIKey(key.Key))
	x, err := acme.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: "worker"}, "")
	if err != nil || x.Tenant != "acme" {
		t.Fatalf("create in acme: %+v %v", x, err)
	}
	done, err := acme.Wait(ctx, x.ID)
	if err != nil || done.Status != "completed" {
		t.Fatalf("wait in acme: %+v %v", done, err)
	}
	if l, err := acmeAdmin.ListExecutions(ctx, client.ListOptions{}); err != nil || len(l.Executions) != 1 || l.Executions[0].ID != x.ID {
		t.Fatalf("list in acme: %+v %v", l, err)
	}

	globex := client.New(env.URL, client.WithAPIKey(gkey.Key))
	for name, cl := range map[string]*client.Client{"another tenant's key": globex, "the admin in default": c} {
		if _, err := cl.GetExecution(ctx, x.ID); !client.IsCode(err, wire.CodeNotFound) {
			t.Errorf("%s reading acme's execution: %v", name, err)
		}
		if _, err := cl.Events(ctx, x.ID, 0, 0); !client.IsCode(err, wire.CodeNotFound) {
			t.Errorf("%s reading acme's events: %v", name, err)
		}
	}
	if _, err := acme.Agents(ctx); !client.IsCode(err, wire.CodeForbidden) {
		t.Fatalf("a client key on an admin route: %v", err)
	}
	if _, err := client.New(env.URL, client.WithAPIKey(key.Key), client.WithTenant("globex")).ListExecutions(ctx, client.ListOptions{}); !client.IsCode(err, wire.CodeForbidden) {
		t.Fatalf("a client key naming another tenant: %v", err)
	}
	if _, err := acme.Tenants(ctx); !client.IsCode(err, wire.CodeForbidden) {
		t.Fatalf("a client key on a tenant route: %v", err)
	}

	if err := c.DeleteKey(ctx, "acme", key.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, err := acme.GetExecution(ctx, x.ID); !client.IsCode(err, wire.CodeUnauthenticated) {
		t.Fatalf("a revoked key: %v", err)
	}
}

// TestAgentSigning reads an execution as its agent (every request signed
// with the agent's secret).
func TestAgentSigning(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	a := startAgent(t, env, "signer", steps(2))
	startAgent(t, env, "stranger", steps(0))
	x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: a.ID}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, x.ID); err != nil {
		t.Fatal(err)
	}
	all, err := c.AllEvents(ctx, x.ID)
	if err != nil {
		t.Fatal(err)
	}

	as := client.New(env.URL, client.WithAgent(a.ID, []byte(secret)))
	got, err := as.GetExecution(ctx, x.ID)
	if err != nil || got.ID != x.ID || got.Status != "completed" {
		t.Fatalf("signed get: %+v %v", got, err)
	}
	if ss, err := as.Steps(ctx, x.ID); err != nil || len(ss) != 2 {
		t.Fatalf("signed steps: %d %v", len(ss), err)
	}
	// The stream is a client route: an agent's watch polls.
	w, err := watch(ctx, as, x.ID, client.WatchOptions{PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, w.events, all)
	if e, err := as.Wait(ctx, x.ID); err != nil || e.Status != "completed" {
		t.Fatalf("signed wait: %+v %v", e, err)
	}

	for _, tc := range []struct {
		name string
		c    *client.Client
		code string
	}{
		{"wrong secret", client.New(env.URL, client.WithAgent(a.ID, []byte("wrong-secret-0123456789"))), wire.CodeUnauthenticated},
		{"empty secret", client.New(env.URL, client.WithAgent(a.ID, nil)), wire.CodeUnauthenticated},
		{"another agent", client.New(env.URL, client.WithAgent("stranger", []byte(secret))), wire.CodeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.c.GetExecution(ctx, x.ID)
			if !client.IsCode(err, tc.code) {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
			if err := tc.c.Watch(ctx, x.ID, 0, func(client.StreamItem) error { return nil }); !client.IsCode(err, tc.code) {
				t.Fatalf("watch: got %v, want %s", err, tc.code)
			}
		})
	}
	// Agents may not use client routes.
	if _, err := as.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: a.ID}, ""); !client.IsCode(err, wire.CodeUnauthenticated) && !client.IsCode(err, wire.CodeForbidden) {
		t.Fatalf("an agent creating an execution: %v", err)
	}
}

// recorder is a transport that records the requests it passes on.
type recorder struct {
	mu   sync.Mutex
	reqs []*http.Request
	body [][]byte
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var b []byte
	if req.Body != nil {
		var err error
		if b, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	r.mu.Lock()
	r.reqs = append(r.reqs, req.Clone(req.Context()))
	r.body = append(r.body, b)
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

// TestHeaders checks what goes on the wire: credentials, signatures,
// content types, the user agent and ?tenant=.
func TestHeaders(t *testing.T) {
	env, _ := start(t)
	ctx := testCtx(t)
	a := startAgent(t, env, "hdr", steps(0))
	rec := &recorder{}
	hc := &http.Client{Transport: rec}
	admin := client.New(env.URL, client.WithAPIKey(testkit.AdminKey), client.WithHTTPClient(hc), client.WithUserAgent("probe/1"),
		client.WithTenant(kernel.DefaultTenant))
	if admin.BaseURL() != env.URL {
		t.Fatalf("base URL %q", admin.BaseURL())
	}
	x, err := admin.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: a.ID}, "h-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.PutBundle(ctx, "nope", []byte{0x1f, 0x8b, 0}); !client.IsCode(err, wire.CodeValidation) {
		t.Fatalf("broken archive: %v", err)
	}
	agent := client.New(env.URL, client.WithAgent(a.ID, a.Secret), client.WithHTTPClient(hc))
	if _, err := agent.GetExecution(ctx, x.ID); err != nil {
		t.Fatal(err)
	}
	if err := agent.Do(ctx, "POST", "/v0/executions/"+x.ID+"/heartbeat", http.Header{wire.HeaderDispatchID: {"d"}, wire.HeaderDispatchAttempt: {"1"}},
		map[string]any{}, nil); err == nil {
		t.Fatal("a heartbeat under a made-up lease must fail")
	} else if !client.IsCode(err, wire.CodeLeaseSuperseded) && !client.IsCode(err, wire.CodeConflict) {
		t.Fatalf("a heartbeat under a made-up lease: %v", err)
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.reqs) != 4 {
		t.Fatalf("%d requests", len(rec.reqs))
	}
	create, bundleReq, get, hb := rec.reqs[0], rec.reqs[1], rec.reqs[2], rec.reqs[3]
	for name, want := range map[string]string{
		"Authorization": "Bearer " + testkit.AdminKey, "User-Agent": "probe/1", "Content-Type": "application/json",
		"Accept": "application/json", wire.HeaderIdempotencyKey: "h-1", wire.HeaderSignature: "",
	} {
		if got := create.Header.Get(name); got != want {
			t.Errorf("create: %s = %q, want %q", name, got, want)
		}
	}
	if create.URL.RawQuery != "tenant=default" {
		t.Errorf("create query %q", create.URL.RawQuery)
	}
	if got := bundleReq.Header.Get("Content-Type"); got != "application/gzip" {
		t.Errorf("bundle content type %q", got)
	}
	// Signed requests: the empty body of a GET too.
	for i, r := range []*http.Request{get, hb} {
		body := rec.body[2+i]
		if r.Header.Get(wire.HeaderAgentID) != a.ID || r.Header.Get(wire.HeaderSignature) != "" ||
			wire.VerifyV1(a.Secret, r.Header.Get(wire.HeaderWicketSignature), wire.SignedRequestOf(r, body), time.Now(), 0) != nil ||
			r.Header.Get("Authorization") != "" || r.Header.Get("User-Agent") != client.DefaultUserAgent {
			t.Errorf("signed request %d: %v (body %q)", i, r.Header, body)
		}
	}
	if len(rec.body[2]) != 0 || string(rec.body[3]) != "{}" || hb.Header.Get(wire.HeaderDispatchAttempt) != "1" {
		t.Errorf("bodies %q %q, headers %v", rec.body[2], rec.body[3], hb.Header)
	}
}

// TestWatchGivesUp: a kernel that goes away is retried MaxRetries times;
// one that was never reached is not retried.
func TestWatchGivesUp(t *testing.T) {
	env, c := start(t)
	ctx := testCtx(t)
	a := startAgent(t, env, "parked", func(ctx context.Context, r *testkit.Run) (any, error) {
		return r.Step(ctx, "tool_call", "deploy", nil, testkit.StepOpts{}, func() (any, error) { return nil, nil })
	})
	if _, err := c.SetPolicy(ctx, a.ID, "rules:\n  - id: gate\n    priority: 1\n    when: {target: deploy}\n    then: {decision: require_approval}\n"); err != nil {
		t.Fatal(err)
	}
	x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: a.ID}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, poll := range []bool{false, true} {
		t.Run(fmt.Sprint("poll=", poll), func(t *testing.T) {
			blocked := make(chan struct{})
			errc := make(chan error, 1)
			go func() {
				var once sync.Once
				errc <- c.WatchWith(ctx, x.ID, client.WatchOptions{Poll: poll, PollInterval: 5 * time.Millisecond, MaxRetries: 2}, func(it client.StreamItem) error {
					if it.Event != nil && it.Event.Type == string(kernel.EvExecutionBlocked) {
						once.Do(func() { close(blocked) })
					}
					return nil
				})
			}()
			select {
			case <-blocked:
			case err := <-errc:
				t.Fatalf("the watch ended early: %v", err)
			}
			if poll {
				env.Close() // the kernel is gone
			} else {
				env.Server.CloseStreams() // every stream ends at once, as while the kernel shuts down
			}
			err := <-errc
			var ae *client.APIError
			if err == nil || !strings.Contains(err.Error(), "giving up after 3 attempts") || errors.As(err, &ae) {
				t.Fatalf("got %v", err)
			}
			t.Log(err)
		})
	}

	// Never reached: the first error, at once.
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	for _, poll := range []bool{false, true} {
		start := time.Now()
		err := client.New(gone.URL).WatchWith(ctx, "x", client.WatchOptions{Poll: poll}, func(client.StreamItem) error { return nil })
		var ae *client.APIError
		if err == nil || strings.Contains(err.Error(), "giving up") || errors.As(err, &ae) || time.Since(start) > 2*time.Second {
			t.Errorf("poll %v: %v after %s", poll, err, time.Since(start))
		}
		t.Log(err)
	}
}

// WaitReady waits for a kernel that starts late, and gives up with the
// last error when its context ends.
func TestWaitReady(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now

	c := client.New("http://" + addr)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = c.WaitReady(ctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Fatalf("WaitReady with no kernel: %v", err)
	}

	env, _ := start(t)
	// Gate: the kernel comes up only after WaitReady has been refused at
	// least twice (it waits and asks again).
	var refused atomic.Int64
	late := client.New("http://"+addr, client.WithHTTPClient(&http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err != nil {
			refused.Add(1)
		}
		return resp, err
	})}))
	done := make(chan error, 1)
	go func() { done <- late.WaitReady(testCtx(t)) }()
	deadline := time.Now().Add(10 * time.Second)
	for refused.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("WaitReady did not ask twice")
		}
		time.Sleep(time.Millisecond)
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	srv := &http.Server{Handler: env.Server.Handler()}
	go srv.Serve(ln)
	defer srv.Close()
	if err := <-done; err != nil {
		t.Fatalf("WaitReady once the kernel serves: %v", err)
	}
}

// roundTripFunc is an http.RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
