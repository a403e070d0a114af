package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/server/wire"
)

// TestApprovalGrantedAfterItsExpiry: a decision sent once an approval's
// expires_at has passed, before the reaper has recorded the expiry, is
// refused (409) and records the expiry, as the reaper would: the step does
// not run. Before, such a grant (up to a ReapInterval late, longer when the
// reaper lagged) was taken and the step proceeded. One sent a moment
// before the expiry is taken.
func TestApprovalGrantedAfterItsExpiry(t *testing.T) {
	clk := newTestClock(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	// The reaper never runs within the test: only the decision can see the expiry.
	cfg := kernel.Config{Clock: clk, ReapInterval: time.Hour, LeaseTimeout: 24 * time.Hour}
	env := testkit.Start(t, testkit.Options{Config: cfg, Engines: []plugins.Engine{rules.New()}})
	if _, err := env.Admin("POST", "/v0/agents", map[string]any{"id": "payer", "secret": secret}, nil); err != nil {
		t.Fatal(err)
	}
	policy := `default_action: allow
rules:
  - id: wire
    when: {target: wire}
    then: {decision: require_approval, reason: money moves, approval_config: {timeout: 10m}}
`
	if _, err := env.Admin("POST", "/v0/policies/payer", map[string]any{"bundle": policy}, nil); err != nil {
		t.Fatal(err)
	}
	decide := func(id string) (wire.Approval, error) {
		var a wire.Approval
		_, err := env.Admin("POST", "/v0/approvals/"+id+"/grant", map[string]any{"decided_by": "alice"}, &a)
		return a, err
	}

	// Granted 1 ms before it expires: taken, the step proceeds.
	early := beginSession(t, env, "payer")
	d := early.step("wire", map[string]any{"usd": 1})
	if d.Decision != "blocked" {
		t.Fatalf("wire: %+v", d)
	}
	clk.add(10*time.Minute - time.Millisecond)
	if a, err := decide(d.ApprovalID); err != nil || a.Status != "granted" {
		t.Fatalf("grant before the expiry: %+v %v", a, err)
	}
	if d := early.step("wire", map[string]any{"usd": 1}); d.Decision != "proceed" {
		t.Fatalf("after the grant: %+v", d)
	}

	// Granted at its expiry: refused, and recorded expired.
	late := beginSession(t, env, "payer")
	d = late.step("wire", map[string]any{"usd": 2})
	if d.Decision != "blocked" {
		t.Fatalf("wire: %+v", d)
	}
	clk.add(10 * time.Minute)
	_, err := decide(d.ApprovalID)
	var ae *testkit.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(ae.Message, "expired at") {
		t.Fatalf("grant at the expiry: %v, want 409 naming the expiry", err)
	}
	var a wire.Approval
	if _, err := env.Admin("GET", "/v0/approvals/"+d.ApprovalID, nil, &a); err != nil || a.Status != "expired" {
		t.Fatalf("approval after a late grant: %+v %v", a, err)
	}
	x := env.Execution(late.id)
	if x.Status != kernel.ExecFailed || x.Reason != "approval_expired" {
		t.Fatalf("execution after a late grant: %s %s", x.Status, x.Reason)
	}
	if d := late.step("wire", map[string]any{"usd": 2}); d.Decision != "execution_terminal" {
		t.Fatalf("the expired step was answered %+v", d)
	}
	evs := mustCheckLog(t, env, late.id)
	if testkit.Count(evs, kernel.EvApprovalGranted) != 0 || testkit.Count(evs, kernel.EvApprovalExpired) != 1 || testkit.Count(evs, kernel.EvStepExecuting) != 0 {
		t.Fatalf("log: %v", testkit.Types(evs))
	}
	// A second try is told the approval is expired.
	if _, err := decide(d.ApprovalID); !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(ae.Message, "already expired") {
		t.Fatalf("second grant: %v", err)
	}
}

// TestGrantedAfterTheDeadline: a step whose approval is granted once its
// execution's deadline (or max_duration) has passed is denied limit_*,
// as any step submitted then: the limits of docs/policy.md's step 2 hold
// for a step that waited on an approval too. Before, the granted step
// proceeded after the deadline (the next step was then denied).
func TestGrantedAfterTheDeadline(t *testing.T) {
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clk := newTestClock(start)
	cfg := kernel.Config{Clock: clk, ReapInterval: time.Hour, LeaseTimeout: 24 * time.Hour}
	env := testkit.Start(t, testkit.Options{Config: cfg, Engines: []plugins.Engine{rules.New()}})
	if _, err := env.Admin("POST", "/v0/agents", map[string]any{"id": "payer", "secret": secret}, nil); err != nil {
		t.Fatal(err)
	}
	policy := "default_action: allow\nrules:\n  - {id: wire, when: {target: wire}, then: {decision: require_approval}}\n"
	if _, err := env.Admin("POST", "/v0/policies/payer", map[string]any{"bundle": policy}, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rule string
		body map[string]any
	}{
		{"limit_deadline", map[string]any{"deadline": start.Add(time.Minute).Format(time.RFC3339)}},
		{"limit_duration", map[string]any{"limits": map[string]any{"max_duration": "1m"}}},
	} {
		clk.set(start)
		var ss wire.Session
		body := map[string]any{"agent_id": "payer"}
		for k, v := range c.body {
			body[k] = v
		}
		if _, err := env.Admin("POST", "/v0/sessions", body, &ss); err != nil {
			t.Fatal(err)
		}
		s := &gateSession{t: t, env: env, id: ss.Execution.ID,
			lease: map[string]string{wire.HeaderDispatchID: ss.DispatchID, wire.HeaderDispatchAttempt: "1"}}
		d := s.step("wire", map[string]any{"usd": 1})
		if d.Decision != "blocked" {
			t.Fatalf("%s: wire: %+v", c.rule, d)
		}
		clk.add(2 * time.Minute)
		if _, err := env.Admin("POST", "/v0/approvals/"+d.ApprovalID+"/grant", map[string]any{"decided_by": "alice"}, nil); err != nil {
			t.Fatalf("%s: grant: %v", c.rule, err)
		}
		if got := s.step("wire", map[string]any{"usd": 1}); got.Decision != "denied" || got.RuleID != c.rule || got.StepID != d.StepID {
			t.Fatalf("%s: the granted step after the limit: %+v", c.rule, got)
		}
		// Under a new lease the step is answered from its record.
		if _, err := testkit.BearerWithHeaders(env.URL, testkit.AdminKey, "POST", "/v0/executions/"+s.id+"/detach", s.lease, nil, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := env.Admin("POST", "/v0/executions/"+s.id+"/attach", nil, &ss); err != nil {
			t.Fatal(err)
		}
		s.lease = map[string]string{wire.HeaderDispatchID: ss.DispatchID, wire.HeaderDispatchAttempt: fmt.Sprint(ss.DispatchAttempt)}
		if got := s.step("wire", map[string]any{"usd": 1}); got.Decision != "denied" || got.RuleID != c.rule || got.StepID != d.StepID {
			t.Fatalf("%s: the step replayed: %+v", c.rule, got)
		}
		evs := mustCheckLog(t, env, s.id)
		if testkit.Count(evs, kernel.EvStepExecuting) != 0 || testkit.Count(evs, kernel.EvStepDenied) != 1 {
			t.Fatalf("%s: log %v", c.rule, testkit.Types(evs))
		}
	}
}
