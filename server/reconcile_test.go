package server

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// nextDelivery waits for a delivery of execID other than the lease it had.
func (e *env) nextDelivery(execID string, after kernel.Lease) running {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		e.deliv.mu.Lock()
		var found *kernel.Delivery
		for i := range e.deliv.got {
			d := e.deliv.got[i]
			l := kernel.Lease{DispatchID: d.DispatchID, Attempt: d.Attempt}
			if d.ExecutionID == execID && l != after && (d.DispatchID != after.DispatchID || d.Attempt > after.Attempt) {
				found = &d
			}
		}
		e.deliv.mu.Unlock()
		if found != nil {
			e.waitAcked("default", execID)
			l := kernel.Lease{DispatchID: found.DispatchID, Attempt: found.Attempt}
			return running{id: execID, lease: l, as: agentReq{agentID: found.AgentID, secret: botSecret, lease: &l}}
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatalf("no delivery of %s after %+v", execID, after)
	return running{}
}

func (e *env) submitWith(r running, body map[string]any) wire.StepDecision {
	e.t.Helper()
	var d wire.StepDecision
	e.agent(r.as, "POST", "/v0/executions/"+r.id+"/steps", body).want(e.t, http.StatusOK).decode(e.t, &d)
	return d
}

func payloadOf(t *testing.T, e *env, execID, typ string) map[string]any {
	t.Helper()
	evs, err := e.k.Events(context.Background(), "default", execID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if string(evs[i].Type) == typ {
			var p map[string]any
			if err := json.Unmarshal(evs[i].Payload, &p); err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	t.Fatalf("no %s in %s", typ, execID)
	return nil
}

// TestInterruptedSideEffect: an agent registered with on_interrupted:
// approval whose at_most_once step was in flight when its lease lapsed is
// answered blocked on an interrupted_side_effect approval; retry, happened
// and deny each do what they say, and name who decided.
func TestInterruptedSideEffect(t *testing.T) {
	e := newEnv(t, func(o *envOpts) {
		o.kcfg = kernel.Config{LeaseTimeout: 2 * time.Second, ReapInterval: 20 * time.Millisecond}
	})
	var ag wire.Agent
	e.admin("POST", "/v0/agents", map[string]any{"id": "bot", "on_interrupted": "approval"}).want(t, http.StatusOK).decode(t, &ag)
	if ag.OnInterrupted != "approval" || ag.WebhookURL == "" {
		t.Fatalf("agent %+v", ag)
	}
	e.admin("POST", "/v0/agents", map[string]any{"id": "bot", "on_interrupted": "sometimes"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	alice := e.key("default", "approver", "alice")

	answers := []string{"retry", "happened", "deny"}
	runs := map[string]running{}
	steps := map[string]string{}
	for _, a := range answers {
		r := e.start("bot")
		d := e.submit(r, "tool_call", "send_mail", map[string]any{"to": a})
		if d.Decision != wire.DecisionProceed {
			t.Fatalf("%s: %+v", a, d)
		}
		runs[a], steps[a] = r, d.StepID
	}
	// The agent dies mid-effect: nothing completes, the leases lapse, and
	// the next attempts find the steps in flight.
	approvals := map[string]string{}
	for _, a := range answers {
		r := e.nextDelivery(runs[a].id, runs[a].lease)
		d := e.submit(r, "tool_call", "send_mail", map[string]any{"to": a})
		if d.Decision != wire.DecisionBlocked || d.ApprovalID == "" || d.StepID != steps[a] {
			t.Fatalf("%s: the interrupted step: %+v", a, d)
		}
		var ap wire.Approval
		e.do("GET", "/v0/approvals/"+d.ApprovalID, nil, bearer(alice)).want(t, http.StatusOK).decode(t, &ap)
		if ap.Type != wire.ApprovalInterrupted || ap.Status != "pending" || ap.StepID != steps[a] || ap.RequestHash != kernel.RequestHash(steps[a], ap.Args) ||
			string(ap.Args) != `{"to":"`+a+`"}` {
			t.Fatalf("%s: approval %+v", a, ap)
		}
		x, _ := e.k.GetExecution(context.Background(), "default", r.id)
		if x.Status != kernel.ExecBlocked || x.BlockedOn != ap.ID {
			t.Fatalf("%s: execution %+v", a, x)
		}
		runs[a], approvals[a] = r, ap.ID
	}
	// An agent left indeterminate: its orphan fails "indeterminate",
	// unless the bundle that allowed the step asked for an approval.
	for target, want := range map[string]string{"plain_send": wire.DecisionReplay, "careful_send": wire.DecisionBlocked} {
		r := e.start("other")
		d := e.submit(r, "tool_call", target, nil)
		r2 := e.nextDelivery(r.id, r.lease)
		r2.as.secret = otherSecret
		d2 := e.submit(r2, "tool_call", target, nil)
		if d2.Decision != want || d2.StepID != d.StepID {
			t.Fatalf("%s: %+v", target, d2)
		}
		if want == wire.DecisionReplay && !json.Valid(d2.Error) {
			t.Fatalf("%s: %+v", target, d2)
		}
	}

	// happened and retry answer only interrupted side effects; a result only
	// with happened.
	e.do("POST", "/v0/approvals/"+approvals["retry"]+"/grant", map[string]any{"result": 1}, bearer(alice)).wantErr(t, http.StatusBadRequest, wire.CodeValidation)

	e.do("POST", "/v0/approvals/"+approvals["retry"]+"/retry", map[string]any{"rationale": "it bounced"}, bearer(alice)).want(t, http.StatusOK)
	e.do("POST", "/v0/approvals/"+approvals["happened"]+"/happened", map[string]any{"result": map[string]any{"message_id": 7}}, bearer(alice)).want(t, http.StatusOK)
	e.do("POST", "/v0/approvals/"+approvals["deny"]+"/deny", map[string]any{}, bearer(alice)).want(t, http.StatusOK)

	// retry: the step proceeds again, same id.
	r := e.nextDelivery(runs["retry"].id, runs["retry"].lease)
	if d := e.submit(r, "tool_call", "send_mail", map[string]any{"to": "retry"}); d.Decision != wire.DecisionProceed || d.StepID != steps["retry"] {
		t.Fatalf("retry: %+v", d)
	}
	// happened: the given result is the step's; replay returns it.
	r = e.nextDelivery(runs["happened"].id, runs["happened"].lease)
	if d := e.submit(r, "tool_call", "send_mail", map[string]any{"to": "happened"}); d.Decision != wire.DecisionReplay || string(d.Result) != `{"message_id":7}` {
		t.Fatalf("happened: %+v", d)
	}
	// deny: the step fails "interrupted".
	r = e.nextDelivery(runs["deny"].id, runs["deny"].lease)
	d := e.submit(r, "tool_call", "send_mail", map[string]any{"to": "deny"})
	var recorded struct{ Code string }
	_ = json.Unmarshal(d.Error, &recorded)
	if d.Decision != wire.DecisionReplay || recorded.Code != "interrupted" {
		t.Fatalf("deny: %+v", d)
	}
	for a, typ := range map[string]string{"retry": "approval.granted", "happened": "approval.happened", "deny": "approval.denied"} {
		p := payloadOf(t, e, runs[a].id, typ)
		if p["decided_by"] != "alice" || p["answer"] != a || p["type"] != wire.ApprovalInterrupted {
			t.Fatalf("%s: %s %v", a, typ, p)
		}
	}

	// A policy's approval is not answered happened or retry.
	pr := e.start("other")
	pd := e.submit(pr, "tool_call", "wire_money", map[string]any{"usd": 1})
	e.do("POST", "/v0/approvals/"+pd.ApprovalID+"/happened", map[string]any{"result": 1}, bearer(alice)).wantErr(t, http.StatusConflict, wire.CodeConflict)
	e.do("POST", "/v0/approvals/"+pd.ApprovalID+"/retry", map[string]any{}, bearer(alice)).wantErr(t, http.StatusConflict, wire.CodeConflict)
}

// TestReconcile: a submitter that can reconcile (reconcile: true) is
// answered interrupted, and its answer (continue, completed, conflict,
// approval) is recorded as step.reconciled naming it.
func TestReconcile(t *testing.T) {
	e := newEnv(t, func(o *envOpts) {
		o.kcfg = kernel.Config{LeaseTimeout: 2 * time.Second, ReapInterval: 20 * time.Millisecond}
	})
	outcomes := []string{"continue", "completed", "conflict", "approval"}
	runs := map[string]running{}
	steps := map[string]string{}
	for _, o := range outcomes {
		r := e.start("bot")
		d := e.submit(r, "tool_call", "charge", map[string]any{"o": o})
		runs[o], steps[o] = r, d.StepID
	}
	for _, o := range outcomes {
		r := e.nextDelivery(runs[o].id, runs[o].lease)
		d := e.submitWith(r, map[string]any{"kind": "tool_call", "target": "charge", "args": map[string]any{"o": o}, "reconcile": true})
		if d.Decision != wire.DecisionInterrupted || d.StepID != steps[o] {
			t.Fatalf("%s: %+v", o, d)
		}
		runs[o] = r
		st, _ := e.k.GetStep(context.Background(), "default", r.id, d.StepID)
		if st.Status != kernel.StepInterrupted {
			t.Fatalf("%s: step %+v", o, st)
		}
	}
	rec := func(o string, body map[string]any) resp {
		return e.agent(runs[o].as, "POST", "/v0/executions/"+runs[o].id+"/steps/"+steps[o]+"/reconcile", body)
	}
	// Bad answers change nothing.
	rec("continue", map[string]any{"outcome": "maybe"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	rec("continue", map[string]any{"outcome": "continue", "result": 1}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)

	var d wire.StepDecision
	rec("continue", map[string]any{"outcome": "continue"}).want(t, http.StatusOK).decode(t, &d)
	if d.Decision != wire.DecisionProceed || d.StepID != steps["continue"] {
		t.Fatalf("continue: %+v", d)
	}
	e.agent(runs["continue"].as, "POST", "/v0/executions/"+runs["continue"].id+"/steps/"+d.StepID+"/complete", map[string]any{"result": "charged"}).want(t, http.StatusOK)

	rec("completed", map[string]any{"outcome": "completed", "result": map[string]any{"charge": "ch_1"}, "detail": "found it in the ledger"}).want(t, http.StatusOK).decode(t, &d)
	if d.Decision != wire.DecisionReplay || string(d.Result) != `{"charge":"ch_1"}` {
		t.Fatalf("completed: %+v", d)
	}
	// A repeated answer is idempotent; another one is a conflict.
	rec("completed", map[string]any{"outcome": "completed", "result": map[string]any{"charge": "ch_1"}}).want(t, http.StatusOK)
	rec("completed", map[string]any{"outcome": "continue"}).wantErr(t, http.StatusConflict, wire.CodeConflict)
	if st, _ := e.k.GetStep(context.Background(), "default", runs["completed"].id, steps["completed"]); st.Status != kernel.StepSucceeded || string(st.Result) != `{"charge":"ch_1"}` {
		t.Fatalf("completed: step %+v", st)
	}

	rec("conflict", map[string]any{"outcome": "conflict", "detail": "charged twice upstream"}).want(t, http.StatusOK).decode(t, &d)
	if d.Decision != wire.DecisionExecutionTerminal {
		t.Fatalf("conflict: %+v", d)
	}
	x, _ := e.k.GetExecution(context.Background(), "default", runs["conflict"].id)
	if x.Status != kernel.ExecFailed || x.Reason != "reconcile_conflict" {
		t.Fatalf("conflict: execution %+v", x)
	}
	// Repeated (its answer was lost), it is answered the same.
	var d2 wire.StepDecision
	rec("conflict", map[string]any{"outcome": "conflict", "detail": "charged twice upstream"}).want(t, http.StatusOK).decode(t, &d2)
	if d2.Decision != wire.DecisionExecutionTerminal || d2.Reason != d.Reason || d2.StepID != steps["conflict"] {
		t.Fatalf("conflict again: %+v, first %+v", d2, d)
	}
	rec("conflict", map[string]any{"outcome": "conflict", "detail": "another story"}).wantErr(t, http.StatusConflict, wire.CodeConflict)

	rec("approval", map[string]any{"outcome": "approval", "detail": "cannot tell"}).want(t, http.StatusOK).decode(t, &d)
	if d.Decision != wire.DecisionBlocked || d.ApprovalID == "" {
		t.Fatalf("approval: %+v", d)
	}
	ap, err := e.k.GetApproval(context.Background(), "default", d.ApprovalID)
	if err != nil || ap.Type != kernel.ApprovalInterrupted {
		t.Fatalf("approval: %+v %v", ap, err)
	}
	rec("approval", map[string]any{"outcome": "approval", "detail": "cannot tell"}).want(t, http.StatusOK).decode(t, &d2)
	if d2.Decision != wire.DecisionBlocked || d2.ApprovalID != d.ApprovalID || d2.StepID != steps["approval"] {
		t.Fatalf("approval again: %+v, first %+v", d2, d)
	}
	rec("approval", map[string]any{"outcome": "continue"}).wantErr(t, http.StatusConflict, wire.CodeConflict)
	for _, o := range outcomes {
		if n := count(e.eventTypes("default", runs[o].id), "step.reconciled"); n != 1 {
			t.Fatalf("%s: %d step.reconciled events", o, n)
		}
		p := payloadOf(t, e, runs[o].id, "step.reconciled")
		if p["outcome"] != o || p["decided_by"] != "agent:bot" || p["step_id"] != steps[o] {
			t.Fatalf("%s: step.reconciled %v", o, p)
		}
	}
}
