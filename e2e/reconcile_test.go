package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// eventPayload returns the payload of the last event of type typ.
func eventPayload(t *testing.T, evs []kernel.Event, typ kernel.EventType) map[string]any {
	t.Helper()
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type == typ {
			var p map[string]any
			if err := json.Unmarshal(evs[i].Payload, &p); err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	t.Fatalf("no %s in %v", typ, testkit.Types(evs))
	return nil
}

// An agent process registered with on_interrupted: approval is SIGKILLed
// while an at_most_once charge is in flight. The next process finds the
// charge interrupted and the execution blocks on an approval of type
// interrupted_side_effect showing the exact request; retry runs the charge
// again, happened records the operator's result (the body never runs
// again), deny fails the step "interrupted". Each answer names who gave it.
func TestInterruptedSideEffectOfAKilledAgent(t *testing.T) {
	for _, answer := range []string{"retry", "happened", "deny"} {
		t.Run(answer, func(t *testing.T) {
			r := newSDKRig(t, "payer-"+answer, "")
			ctx := context.Background()
			oi := wire.OnInterruptedApproval
			if _, err := r.admin.PutAgent(ctx, wire.AgentRequest{ID: r.id, OnInterrupted: &oi}); err != nil {
				t.Fatal(err)
			}
			r.start()
			id := r.create(map[string]string{"scenario": "crash", "mode": "amo"})
			r.waitJournal("charge-start")
			r.kill()
			r.start()
			x := r.wait(id, kernel.ExecBlocked)
			ap, err := r.admin.Approval(ctx, x.BlockedOn)
			if err != nil {
				t.Fatal(err)
			}
			steps, err := r.admin.Steps(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			var charge wire.Step
			for _, s := range steps {
				if s.Target == "charge" {
					charge = s
				}
			}
			if ap.Type != wire.ApprovalInterrupted || ap.Status != "pending" || ap.StepID != charge.ID || ap.Target != "charge" ||
				string(ap.Args) != "1250" || ap.RequestHash != kernel.RequestHash(charge.ID, ap.Args) || charge.Status != "awaiting_approval" {
				t.Fatalf("approval %+v, step %+v", ap, charge)
			}
			req := wire.ResolveApprovalRequest{RequestHash: ap.RequestHash, Rationale: "checked the provider"}
			switch answer {
			case "retry":
				_, err = r.admin.Retry(ctx, ap.ID, req)
			case "happened":
				req.Result = json.RawMessage(`"charged 1250 (seen in the provider's dashboard)"`)
				_, err = r.admin.Happened(ctx, ap.ID, req)
			case "deny":
				_, err = r.admin.Deny(ctx, ap.ID, req)
			}
			if err != nil {
				t.Fatal(err)
			}
			x = r.wait(id, kernel.ExecCompleted)
			var out struct{ Page, Charge string }
			if err := json.Unmarshal(x.Output, &out); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"retry": "charged 1250", "happened": "charged 1250 (seen in the provider's dashboard)"}[answer]
			switch {
			case answer == "deny" && !strings.HasPrefix(out.Charge, "interrupted: "):
				t.Fatalf("deny: output %s", x.Output)
			case answer != "deny" && out.Charge != want:
				t.Fatalf("%s: output %s", answer, x.Output)
			}
			starts, dones := map[string]int{"retry": 2}[answer], map[string]int{"retry": 1}[answer]
			if answer != "retry" {
				starts = 1
			}
			if r.count("charge-start") != starts || r.count("charge-done") != dones || r.count("fetch ") != 1 {
				t.Fatalf("%s: journal %q", answer, r.lines())
			}
			evs := r.checkLog(id)
			typ := map[string]kernel.EventType{"retry": kernel.EvApprovalGranted, "happened": kernel.EvApprovalHappened, "deny": kernel.EvApprovalDenied}[answer]
			p := eventPayload(t, evs, typ)
			if p["answer"] != answer || p["decided_by"] != "admin" || p["decided_by_key"] != "admin-key" || p["type"] != wire.ApprovalInterrupted {
				t.Fatalf("%s: %v", typ, p)
			}
			if testkit.Count(evs, kernel.EvStepInterrupted) != 1 {
				t.Fatalf("events %v", testkit.Types(evs))
			}
		})
	}
}

// The same kill, with a Reconcile function on the charge: the next agent
// process is asked what became of it and its answer is recorded without an
// operator (step.reconciled names the agent); conflict fails the execution
// reconcile_conflict.
func TestReconcileFromTheSDKHook(t *testing.T) {
	for _, mode := range []string{"completed", "continue", "conflict"} {
		t.Run(mode, func(t *testing.T) {
			r := newSDKRig(t, "till-"+mode, "")
			r.start()
			id := r.create(map[string]string{"scenario": "reconcile", "mode": mode})
			r.waitJournal("charge-start")
			r.kill()
			r.start()
			want := kernel.ExecCompleted
			if mode == "conflict" {
				want = kernel.ExecFailed
			}
			x := r.wait(id, want)
			if r.count("reconcile 990 "+mode) != 1 {
				t.Fatalf("journal %q", r.lines())
			}
			switch mode {
			case "completed":
				if string(x.Output) != `{"charge":"ledger says charged 990"}` || r.count("charge-start") != 1 {
					t.Fatalf("completed: output %s, journal %q", x.Output, r.lines())
				}
			case "continue":
				if string(x.Output) != `{"charge":"charged 990"}` || r.count("charge-start") != 2 || r.count("charge-done") != 1 {
					t.Fatalf("continue: output %s, journal %q", x.Output, r.lines())
				}
			case "conflict":
				if x.Reason != "reconcile_conflict" || !strings.Contains(string(x.Error), "the ledger and the provider disagree") || r.count("charge-done") != 0 {
					t.Fatalf("conflict: %+v, journal %q", x, r.lines())
				}
			}
			evs := r.checkLog(id)
			p := eventPayload(t, evs, kernel.EvStepReconciled)
			if p["outcome"] != mode || p["decided_by"] != "agent:"+r.id {
				t.Fatalf("step.reconciled %v", p)
			}
			if testkit.Count(evs, kernel.EvApprovalRequested) != 0 {
				t.Fatalf("an operator was asked: %v", testkit.Types(evs))
			}
		})
	}
}
