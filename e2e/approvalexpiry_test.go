package e2e

import (
	"errors"
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
