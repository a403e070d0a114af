package agent_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// gateOnly registers a gate-only agent with the test rules and returns a
// session config holding a fresh client key.
func (h *harness) gateOnly(id string) agent.SessionConfig {
	h.t.Helper()
	ctx := context.Background()
	if _, err := h.admin.PutAgent(ctx, wire.AgentRequest{ID: id, Secret: secret}); err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.admin.SetPolicy(ctx, id, testRules); err != nil {
		h.t.Fatal(err)
	}
	k, err := h.admin.CreateKey(ctx, "default", wire.KeyRequest{Role: "client", Principal: "loop-" + id})
	if err != nil {
		h.t.Fatal(err)
	}
	return agent.SessionConfig{KernelURL: h.env.URL, APIKey: k.Key, HeartbeatInterval: 200 * time.Millisecond}
}

type readIn struct {
	Path string `json:"path"`
}

// TestSession: a Go program's own loop with no webhook gets policy and
// replay: tools and Step run through the session's context; a denial, an
// approval waited for and then granted; detached, attached again by
// "another process", whose calls replay without running anything.
func TestSession(t *testing.T) {
	h := start(t, kernel.Config{LeaseTimeout: 5 * time.Second, ReapInterval: 20 * time.Millisecond})
	cfg := h.gateOnly("desk")
	ctx := context.Background()

	var reads, deploys atomic.Int32
	read := agent.NewTool("read", func(_ context.Context, in readIn) (string, error) {
		reads.Add(1)
		return "content of " + in.Path, nil
	}, agent.WithEffect(agent.ReadOnly))
	deploy := agent.NewTool("deploy", func(context.Context, struct{}) (string, error) {
		deploys.Add(1)
		return "deployed", nil
	})
	del := agent.NewTool("delete", func(context.Context, struct{}) (string, error) { t.Error("a denied tool ran"); return "", nil })

	// loop is the program's own loop; it runs the same way in both
	// processes.
	loop := func(s *agent.Session, grant func(approvalID string)) (string, time.Time) {
		t.Helper()
		sctx := s.Context(ctx)
		a, err := read.Call(sctx, readIn{Path: "a.txt"})
		if err != nil || a != "content of a.txt" {
			t.Fatalf("read: %q %v", a, err)
		}
		at, err := agent.Now(sctx)
		if err != nil {
			t.Fatal(err)
		}
		var pe *agent.PolicyError
		if _, err := del.Call(sctx, struct{}{}); !errors.As(err, &pe) || pe.RuleID != "no-delete" {
			t.Fatalf("delete: %v", err)
		}
		d, err := deploy.Call(sctx, struct{}{})
		var b *agent.Blocked
		if errors.As(err, &b) {
			grant(b.ApprovalID)
			if err := s.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			d, err = deploy.Call(sctx, struct{}{})
		}
		if err != nil || d != "deployed" {
			t.Fatalf("deploy: %q %v", d, err)
		}
		return a, at
	}

	s1, err := agent.Begin(ctx, cfg, client.SessionRequest{AgentID: "desk", Input: []byte(`{"task":"ship"}`)})
	if err != nil {
		t.Fatal(err)
	}
	granted := 0
	_, at1 := loop(s1, func(id string) {
		granted++
		if _, err := h.admin.Grant(ctx, id, wire.ResolveApprovalRequest{}); err != nil {
			t.Fatal(err)
		}
	})
	if granted != 1 || reads.Load() != 1 || deploys.Load() != 1 {
		t.Fatalf("granted %d, reads %d, deploys %d", granted, reads.Load(), deploys.Load())
	}
	// Another process cannot take it while the lease is live.
	if _, err := agent.Attach(ctx, cfg, s1.ID()); !client.IsCode(err, wire.CodeExecutionLeased) {
		t.Fatalf("attach while leased: %v", err)
	}
	if err := s1.Detach(ctx); err != nil {
		t.Fatal(err)
	}

	s2, err := agent.Attach(ctx, cfg, s1.ID())
	if err != nil {
		t.Fatal(err)
	}
	if s2.DispatchAttempt != 2 || string(s2.Execution().Input) != `{"task":"ship"}` {
		t.Fatalf("attached %+v", s2.Session)
	}
	_, at2 := loop(s2, func(string) { t.Error("a recorded approval was asked again") })
	if !at2.Equal(at1) || reads.Load() != 1 || deploys.Load() != 1 {
		t.Fatalf("replay ran effects again: reads %d deploys %d, time %v vs %v", reads.Load(), deploys.Load(), at2, at1)
	}
	// The first holder's lease is gone.
	if _, err := s1.Heartbeat(ctx); !errors.As(err, new(*agent.LeaseSuperseded)) {
		t.Fatalf("old holder's heartbeat: %v", err)
	}
	x, err := s2.Complete(ctx, map[string]any{"ok": true})
	if err != nil || x.Status != "completed" {
		t.Fatalf("complete: %+v %v", x, err)
	}
	h.checkLog(s1.ID())
}

type chargeIn struct {
	Amount int `json:"amount"`
}

// TestSessionReconcile: a tool's Reconcile is asked what became of a call
// that was in flight when its holder died, and its answer is recorded
// without an operator; conflict fails the execution reconcile_conflict.
func TestSessionReconcile(t *testing.T) {
	h := start(t, kernel.Config{LeaseTimeout: 5 * time.Second, ReapInterval: 20 * time.Millisecond})
	cfg := h.gateOnly("till")
	ctx := context.Background()

	for _, tc := range []struct {
		outcome string
		check   func(t *testing.T, s *agent.Session, out string, err error)
	}{
		{agent.ReconcileCompleted, func(t *testing.T, s *agent.Session, out string, err error) {
			if err != nil || out != "ch_from_ledger" {
				t.Fatalf("completed: %q %v", out, err)
			}
		}},
		{agent.ReconcileContinue, func(t *testing.T, s *agent.Session, out string, err error) {
			if err != nil || out != "ch_new" {
				t.Fatalf("continue: %q %v", out, err)
			}
		}},
		{agent.ReconcileConflict, func(t *testing.T, s *agent.Session, out string, err error) {
			if !errors.As(err, new(*agent.Terminated)) {
				t.Fatalf("conflict: %v", err)
			}
			x := h.env.Execution(s.ID())
			if x.Status != kernel.ExecFailed || x.Reason != "reconcile_conflict" {
				t.Fatalf("conflict: %+v", x)
			}
		}},
	} {
		t.Run(tc.outcome, func(t *testing.T) {
			s1, err := agent.Begin(ctx, cfg, client.SessionRequest{AgentID: "till"})
			if err != nil {
				t.Fatal(err)
			}
			// The holder proposes the charge, is told to proceed, and dies
			// before it records the outcome.
			d, err := s1.Execution().Submit(ctx, wire.StepSubmitRequest{Kind: agent.KindToolCall, Target: "charge", Args: []byte(`{"amount":5}`)})
			if err != nil || d.Decision != wire.DecisionProceed {
				t.Fatalf("submit: %+v %v", d, err)
			}
			if err := s1.Detach(ctx); err != nil {
				t.Fatal(err)
			}

			var asked, ran atomic.Int32
			charge := agent.NewTool("charge", func(context.Context, chargeIn) (string, error) {
				ran.Add(1)
				return "ch_new", nil
			}).WithReconcile(func(ctx context.Context, in chargeIn) (agent.Reconciled[string], error) {
				asked.Add(1)
				if id, ok := agent.StepID(ctx); !ok || id != d.StepID || in.Amount != 5 {
					t.Errorf("reconcile of %q %+v, want %s", id, in, d.StepID)
				}
				return agent.Reconciled[string]{Outcome: tc.outcome, Result: "ch_from_ledger", Detail: "checked the ledger"}, nil
			})
			s2, err := agent.Attach(ctx, cfg, s1.ID())
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			out, err := charge.Call(s2.Context(ctx), chargeIn{Amount: 5})
			if asked.Load() != 1 {
				t.Fatalf("reconcile asked %d times", asked.Load())
			}
			if want := int32(0); tc.outcome == agent.ReconcileContinue {
				want = 1
				if ran.Load() != want {
					t.Fatalf("continue ran the body %d times", ran.Load())
				}
			} else if ran.Load() != want {
				t.Fatalf("%s ran the body", tc.outcome)
			}
			tc.check(t, s2, out, err)
			evs := h.env.Events(s1.ID())
			var rec *kernel.Event
			for i := range evs {
				if evs[i].Type == kernel.EvStepReconciled {
					rec = &evs[i]
				}
			}
			if rec == nil {
				t.Fatal("no step.reconciled")
			}
		})
	}
}

// kernelOutage is a proxy in front of the kernel that, while down, refuses
// the reads of one execution (the first refusal drops the connection, the
// next ones answer 503, as a kernel that restarts does) and says so on
// refused.
type kernelOutage struct {
	path    string
	down    atomic.Bool
	count   atomic.Int32
	refused chan struct{}
}

func (o *kernelOutage) handler(kernelURL string) http.Handler {
	u, _ := url.Parse(kernelURL)
	proxy := httputil.NewSingleHostReverseProxy(u)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o.down.Load() && r.Method == http.MethodGet && r.URL.Path == o.path { // path is set before down
			if o.count.Add(1) == 1 {
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					_ = conn.Close()
				}
			} else {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, `{"code":"unavailable","message":"the kernel is starting"}`)
			}
			select {
			case o.refused <- struct{}{}:
			default:
			}
			return
		}
		proxy.ServeHTTP(w, r)
	})
}

// TestSessionWaitSurvivesKernelOutage: a kernel restarting while a session
// waits for an approval (reads of the execution dropped, then 503) is
// waited for; once it answers and the approval is granted, Wait returns
// and the call proceeds.
func TestSessionWaitSurvivesKernelOutage(t *testing.T) {
	h := start(t, kernel.Config{LeaseTimeout: 5 * time.Second, ReapInterval: 20 * time.Millisecond})
	cfg := h.gateOnly("waiter")
	outage := &kernelOutage{refused: make(chan struct{}, 1)}
	proxy := httptest.NewServer(outage.handler(h.env.URL))
	defer proxy.Close()
	cfg.KernelURL = proxy.URL
	ctx := context.Background()
	var deploys atomic.Int32
	deploy := agent.NewTool("deploy", func(context.Context, struct{}) (string, error) {
		deploys.Add(1)
		return "deployed", nil
	})
	s, err := agent.Begin(ctx, cfg, client.SessionRequest{AgentID: "waiter"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sctx := s.Context(ctx)
	var b *agent.Blocked
	if _, err := deploy.Call(sctx, struct{}{}); !errors.As(err, &b) {
		t.Fatalf("deploy: %v, want *agent.Blocked", err)
	}
	outage.path = "/v0/executions/" + s.ID()
	outage.down.Store(true)
	waited := make(chan error, 1)
	go func() { waited <- s.Wait(ctx) }()
	for i := 0; i < 2; i++ { // a dropped connection, then a 503
		select {
		case <-outage.refused:
		case err := <-waited:
			t.Fatalf("Wait returned %v while the kernel was down", err)
		}
	}
	if _, err := h.admin.Grant(ctx, b.ApprovalID, wire.ResolveApprovalRequest{}); err != nil {
		t.Fatal(err)
	}
	outage.down.Store(false)
	if err := <-waited; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if d, err := deploy.Call(sctx, struct{}{}); err != nil || d != "deployed" || deploys.Load() != 1 {
		t.Fatalf("deploy after the approval: %q %v (ran %d times)", d, err, deploys.Load())
	}
}
