package server

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

func TestExecutionLifecycle(t *testing.T) {
	e := newEnv(t)

	// Create, and an idempotent retry.
	body := map[string]any{"agent_id": "bot", "input": map[string]any{"q": 1}, "labels": map[string]string{"team": "a"},
		"limits": map[string]any{"max_steps": 10, "max_duration": "1h"}, "agent_version": "v1"}
	idem := map[string]string{"Authorization": "Bearer " + testAdminKey, wire.HeaderIdempotencyKey: "create-1"}
	r := e.do("POST", "/v0/executions", body, idem).want(t, http.StatusCreated)
	var x wire.Execution
	r.decode(t, &x)
	if x.ID == "" || x.AgentID != "bot" || x.Tenant != "default" || x.Labels["team"] != "a" || x.Limits.MaxSteps != 10 || x.AgentVersion != "v1" {
		t.Fatalf("created %+v", x)
	}
	if r.header.Get("Location") != "/v0/executions/"+x.ID {
		t.Fatalf("Location %q", r.header.Get("Location"))
	}
	var again wire.Execution
	e.do("POST", "/v0/executions", body, idem).want(t, http.StatusOK).decode(t, &again)
	if again.ID != x.ID {
		t.Fatalf("retried create made %s, want %s", again.ID, x.ID)
	}
	e.do("POST", "/v0/executions", map[string]any{"agent_id": "bot", "input": 2}, idem).wantErr(t, http.StatusConflict, wire.CodeConflict)

	// The agent gets the dispatch.
	d := e.waitDelivery(x.ID, 1)
	e.waitAcked("default", x.ID)
	lease := kernel.Lease{DispatchID: d.DispatchID, Attempt: d.Attempt}
	bot := agentReq{agentID: "bot", secret: botSecret, lease: &lease}

	// Reads by the client.
	var got wire.Execution
	e.admin("GET", "/v0/executions/"+x.ID, nil).want(t, http.StatusOK).decode(t, &got)
	if got.Status != "running" || got.Lease == nil || got.Lease.DispatchID != d.DispatchID {
		t.Fatalf("get %+v", got)
	}
	// ... and by the agent, signed over the empty body.
	e.agent(agentReq{agentID: "bot", secret: botSecret}, "GET", "/v0/executions/"+x.ID, nil).want(t, http.StatusOK)

	// Steps.
	dec := e.submit(running{id: x.ID, lease: lease, as: bot}, "tool_call", "search", map[string]any{"q": "go", "n": 1})
	if dec.Decision != wire.DecisionProceed || dec.StepID == "" || dec.Occurrence != 0 {
		t.Fatalf("decision %+v", dec)
	}
	var st wire.Step
	e.agent(agentReq{agentID: "bot", secret: botSecret}, "GET", "/v0/executions/"+x.ID+"/steps/"+dec.StepID, nil).
		want(t, http.StatusOK).decode(t, &st)
	if st.Status != "executing" || st.Target != "search" || string(st.Args) != `{"n":1,"q":"go"}` {
		t.Fatalf("step %+v", st)
	}
	var steps wire.StepList
	e.admin("GET", "/v0/executions/"+x.ID+"/steps", nil).want(t, http.StatusOK).decode(t, &steps)
	if len(steps.Steps) != 1 {
		t.Fatalf("steps %+v", steps)
	}
	e.admin("GET", "/v0/executions/"+x.ID+"/steps?status=terminal", nil).want(t, http.StatusOK).decode(t, &steps)
	if len(steps.Steps) != 0 {
		t.Fatalf("terminal steps %+v", steps)
	}
	e.admin("GET", "/v0/executions/"+x.ID+"/steps?status=bogus", nil).wantErr(t, http.StatusBadRequest, wire.CodeValidation)

	// A delta, then the result.
	var acc wire.StreamDeltaAccepted
	e.agent(bot, "POST", "/v0/executions/"+x.ID+"/steps/"+dec.StepID+"/stream", map[string]any{"seq": 0, "data": "par"}).
		want(t, http.StatusAccepted).decode(t, &acc)
	e.agent(bot, "POST", "/v0/executions/"+x.ID+"/steps/"+dec.StepID+"/complete",
		map[string]any{"result": map[string]any{"hits": 3}, "usage": map[string]any{"total_tokens": 7, "cost_usd": 0.01}}).
		want(t, http.StatusOK).decode(t, &st)
	if st.Status != "succeeded" || string(st.Result) != `{"hits":3}` || st.Usage == nil || st.Usage.TotalTokens != 7 {
		t.Fatalf("completed %+v", st)
	}
	// A delta for a finished step is refused.
	e.agent(bot, "POST", "/v0/executions/"+x.ID+"/steps/"+dec.StepID+"/stream", map[string]any{"seq": 1, "data": "x"}).
		wantErr(t, http.StatusConflict, wire.CodeConflict)

	// A failed step.
	dec2 := e.submit(running{id: x.ID, lease: lease, as: bot}, "llm_call", "gpt", map[string]any{"m": "hi"})
	e.agent(bot, "POST", "/v0/executions/"+x.ID+"/steps/"+dec2.StepID+"/fail", map[string]any{"error": map[string]any{"message": "boom"}}).
		want(t, http.StatusOK).decode(t, &st)
	if st.Status != "failed" || !strings.Contains(string(st.Error), "boom") {
		t.Fatalf("failed %+v", st)
	}
	// A denied step is still HTTP 200.
	if d := e.submit(running{id: x.ID, lease: lease, as: bot}, "tool_call", "forbidden", nil); d.Decision != wire.DecisionDenied || d.RuleID != "no" || d.Reason == "" {
		t.Fatalf("denied %+v", d)
	}

	// Heartbeat.
	var hb wire.HeartbeatResponse
	e.agent(bot, "POST", "/v0/executions/"+x.ID+"/heartbeat", nil).want(t, http.StatusOK).decode(t, &hb)
	if hb.LeaseUntil == nil || !hb.LeaseUntil.After(time.Now()) {
		t.Fatalf("heartbeat %+v", hb)
	}

	// Complete; an identical retry is idempotent, a different one a conflict.
	e.agent(bot, "POST", "/v0/executions/"+x.ID+"/complete", map[string]any{"output": "done"}).want(t, http.StatusOK).decode(t, &got)
	if got.Status != "completed" || string(got.Output) != `"done"` {
		t.Fatalf("completed %+v", got)
	}
	e.agent(bot, "POST", "/v0/executions/"+x.ID+"/complete", map[string]any{"output": "done"}).want(t, http.StatusOK)
	e.agent(bot, "POST", "/v0/executions/"+x.ID+"/complete", map[string]any{"output": "other"}).wantErr(t, http.StatusConflict, wire.CodeConflict)
	if d := e.submit(running{id: x.ID, lease: lease, as: bot}, "tool_call", "search", nil); d.Decision != wire.DecisionExecutionTerminal {
		t.Fatalf("after completion %+v", d)
	}

	// Events, paged.
	var evs wire.EventList
	e.admin("GET", "/v0/executions/"+x.ID+"/events", nil).want(t, http.StatusOK).decode(t, &evs)
	if len(evs.Events) < 5 || evs.Events[0].Type != string(kernel.EvExecutionCreated) || evs.Events[len(evs.Events)-1].Type != string(kernel.EvExecutionCompleted) {
		t.Fatalf("events %+v", evs)
	}
	for i, ev := range evs.Events {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
	var page wire.EventList
	e.agent(agentReq{agentID: "bot", secret: botSecret}, "GET", "/v0/executions/"+x.ID+"/events?after_seq=2&limit=2", nil).
		want(t, http.StatusOK).decode(t, &page)
	if len(page.Events) != 2 || page.Events[0].Seq != 3 {
		t.Fatalf("page %+v", page)
	}
	for _, q := range []string{"limit=0", "limit=1001", "limit=x", "after_seq=-1", "after_seq=1.5"} {
		e.admin("GET", "/v0/executions/"+x.ID+"/events?"+q, nil).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	}

	// Fail and cancel on other executions.
	y := e.start("bot")
	e.agent(y.as, "POST", "/v0/executions/"+y.id+"/fail", map[string]any{"error": map[string]any{"code": "x"}}).want(t, http.StatusOK).decode(t, &got)
	if got.Status != "failed" {
		t.Fatalf("failed %+v", got)
	}
	z := e.start("bot")
	r = e.admin("POST", "/v0/executions/"+z.id+"/cancel", nil).want(t, http.StatusNoContent)
	if len(r.body) != 0 {
		t.Fatalf("204 with a body: %s", r.body)
	}
	e.admin("POST", "/v0/executions/"+z.id+"/cancel", nil).wantErr(t, http.StatusConflict, wire.CodeConflict)
	e.admin("GET", "/v0/executions/"+z.id, nil).want(t, http.StatusOK).decode(t, &got)
	if got.Status != "cancelled" {
		t.Fatalf("cancelled %+v", got)
	}
}

func TestListExecutions(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for i := 0; i < 3; i++ {
		var x wire.Execution
		e.admin("POST", "/v0/executions", map[string]any{"agent_id": "bot", "input": i}).want(t, http.StatusCreated).decode(t, &x)
		ids = append(ids, x.ID)
	}
	var x wire.Execution
	e.admin("POST", "/v0/executions", map[string]any{"agent_id": "other"}).want(t, http.StatusCreated).decode(t, &x)

	var l wire.ExecutionList
	e.admin("GET", "/v0/executions?agent_id=bot&limit=2", nil).want(t, http.StatusOK).decode(t, &l)
	if len(l.Executions) != 2 || l.Executions[0].ID != ids[2] || l.Executions[1].ID != ids[1] || l.NextCursor == "" {
		t.Fatalf("page 1 %+v", l)
	}
	e.admin("GET", "/v0/executions?agent_id=bot&limit=2&cursor="+l.NextCursor, nil).want(t, http.StatusOK).decode(t, &l)
	if len(l.Executions) != 1 || l.Executions[0].ID != ids[0] || l.NextCursor != "" {
		t.Fatalf("page 2 %+v", l)
	}
	e.admin("GET", "/v0/executions", nil).want(t, http.StatusOK).decode(t, &l)
	if len(l.Executions) != 4 {
		t.Fatalf("all %+v", l)
	}
	for _, q := range []string{"status=nope", "limit=0", "limit=abc", "limit=1001"} {
		e.admin("GET", "/v0/executions?"+q, nil).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	}
	// Fresh executions are pending or running: none completed.
	e.admin("GET", "/v0/executions?status=completed", nil).want(t, http.StatusOK).decode(t, &l)
	if len(l.Executions) != 0 {
		t.Fatalf("completed %+v", l)
	}
	raw := e.admin("GET", "/v0/executions?status=completed", nil).body
	if !strings.Contains(string(raw), `"executions":[]`) {
		t.Fatalf("an empty list must encode as []: %s", raw)
	}
}

func TestCreateExecutionValidation(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name string
		body any
		st   int
		code string
	}{
		{"no agent", map[string]any{"input": 1}, 400, wire.CodeValidation},
		{"unknown agent", map[string]any{"agent_id": "ghost"}, 404, wire.CodeNotFound},
		{"bad duration", map[string]any{"agent_id": "bot", "limits": map[string]any{"max_duration": "soon"}}, 400, wire.CodeValidation},
		{"negative limit", map[string]any{"agent_id": "bot", "limits": map[string]any{"max_steps": -1}}, 400, wire.CodeValidation},
		{"bad deadline", map[string]any{"agent_id": "bot", "deadline": "tomorrow"}, 400, wire.CodeValidation},
		{"labels not strings", map[string]any{"agent_id": "bot", "labels": map[string]any{"a": 1}}, 400, wire.CodeValidation},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e.admin("POST", "/v0/executions", tc.body).wantErr(t, tc.st, tc.code)
		})
	}
	long := strings.Repeat("k", 300)
	e.do("POST", "/v0/executions", map[string]any{"agent_id": "bot"}, map[string]string{"Authorization": "Bearer " + testAdminKey, wire.HeaderIdempotencyKey: long}).
		wantErr(t, http.StatusBadRequest, wire.CodeValidation)
}

func TestStepCompleteConflict(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	d := e.submit(r, "tool_call", "charge", map[string]any{"amount": 5})
	url := "/v0/executions/" + r.id + "/steps/" + d.StepID
	e.agent(r.as, "POST", url+"/complete", map[string]any{"result": "first"}).want(t, http.StatusOK)
	// The same result again is idempotent.
	e.agent(r.as, "POST", url+"/complete", map[string]any{"result": "first"}).want(t, http.StatusOK)
	// A different result is a conflict, and failing it now too.
	e.agent(r.as, "POST", url+"/complete", map[string]any{"result": "second"}).wantErr(t, http.StatusConflict, wire.CodeConflict)
	e.agent(r.as, "POST", url+"/fail", map[string]any{"error": "late"}).wantErr(t, http.StatusConflict, wire.CodeConflict)
	var st wire.Step
	e.admin("GET", url, nil).want(t, http.StatusOK).decode(t, &st)
	if st.Status != "succeeded" || string(st.Result) != `"first"` {
		t.Fatalf("the first result must stand: %+v", st)
	}
}

// TestStepFailNeedsAnError: failing a step records what failed. A fail
// without an error (or with null) was recorded as a failure whose replay
// answer carries "error": null, which the Go SDK (isSet) and any client
// that reads a null error as none take for a success with a null result:
// the failed effect replayed as done. Now 400, nothing recorded.
func TestStepFailNeedsAnError(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	d := e.submit(r, "tool_call", "charge", map[string]any{"amount": 5})
	url := "/v0/executions/" + r.id + "/steps/" + d.StepID
	for _, body := range []string{``, `{}`, `{"error":null}`, ` {"error" : null } `} {
		msg := e.agent(r.as, "POST", url+"/fail", rawBody([]byte(body))).wantErr(t, http.StatusBadRequest, wire.CodeValidation).Message
		if !strings.Contains(msg, "error") {
			t.Fatalf("%q: message %q does not name the field", body, msg)
		}
	}
	var st wire.Step
	e.admin("GET", url, nil).want(t, http.StatusOK).decode(t, &st)
	if st.Status != "executing" {
		t.Fatalf("a refused fail changed the step: %+v", st)
	}
	// A real error is recorded, and answers its replay as an error.
	e.agent(r.as, "POST", url+"/fail", map[string]any{"error": false}).want(t, http.StatusOK).decode(t, &st)
	if st.Status != "failed" || string(st.Error) != "false" {
		t.Fatalf("failed step: %+v", st)
	}
}

// TestUsageTotalsSaturate: an agent's usage is added to its execution's
// totals; two reports of cost_usd 1.7e308 made the total +Inf, which JSON
// cannot carry, so the execution, and every list of the tenant's
// executions that held it, answered 500 from then on (and tokens
// wrapped negative past MaxInt64). The totals now stop at the largest
// value instead, and every read answers.
func TestUsageTotalsSaturate(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	for i := range 3 {
		d := e.submit(r, "llm_call", "model", map[string]any{"i": i})
		e.agent(r.as, "POST", "/v0/executions/"+r.id+"/steps/"+d.StepID+"/complete",
			rawBody([]byte(`{"result":"ok","usage":{"input_tokens":9223372036854775807,"output_tokens":9223372036854775807,"cost_usd":1.7e308}}`))).
			want(t, http.StatusOK)
	}
	var x wire.Execution
	e.admin("GET", "/v0/executions/"+r.id, nil).want(t, http.StatusOK).decode(t, &x)
	if x.Totals.Tokens != math.MaxInt64 || x.Totals.CostUSD != math.MaxFloat64 || x.Totals.LLMCalls != 3 {
		t.Fatalf("totals %+v", x.Totals)
	}
	e.agent(r.as, "GET", "/v0/executions/"+r.id, nil).want(t, http.StatusOK)
	var l wire.ExecutionList
	e.admin("GET", "/v0/executions", nil).want(t, http.StatusOK).decode(t, &l)
	if len(l.Executions) != 1 {
		t.Fatalf("list %+v", l)
	}
}

func TestNotFound(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	const ghost = "01890000-0000-7000-8000-000000000000"
	tests := []struct {
		name string
		res  func() resp
	}{
		{"unknown execution (bearer)", func() resp { return e.admin("GET", "/v0/executions/"+ghost, nil) }},
		{"unknown execution events", func() resp { return e.admin("GET", "/v0/executions/"+ghost+"/events", nil) }},
		{"unknown execution cancel", func() resp { return e.admin("POST", "/v0/executions/"+ghost+"/cancel", nil) }},
		{"unknown execution stream", func() resp { return e.admin("GET", "/v0/executions/"+ghost+"/stream", nil) }},
		{"unknown step (bearer)", func() resp { return e.admin("GET", "/v0/executions/"+r.id+"/steps/"+strings.Repeat("a", 64), nil) }},
		{"unknown step (agent read)", func() resp {
			return e.agent(agentReq{agentID: "bot", secret: botSecret}, "GET", "/v0/executions/"+r.id+"/steps/nope", nil)
		}},
		{"unknown step complete", func() resp {
			return e.agent(r.as, "POST", "/v0/executions/"+r.id+"/steps/nope/complete", map[string]any{"result": 1})
		}},
		{"unknown step stream", func() resp {
			return e.agent(r.as, "POST", "/v0/executions/"+r.id+"/steps/nope/stream", map[string]any{"seq": 1, "data": "x"})
		}},
		{"unknown agent", func() resp { return e.admin("GET", "/v0/agents/ghost", nil) }},
		{"unknown approval", func() resp { return e.admin("GET", "/v0/approvals/ghost", nil) }},
		{"unknown route", func() resp { return e.admin("GET", "/v0/nothing-here", nil) }},
		{"unknown route, no auth", func() resp { return e.do("GET", "/v1/executions", nil, nil) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.res().wantErr(t, http.StatusNotFound, wire.CodeNotFound)
		})
	}
	t.Run("wrong method", func(t *testing.T) {
		e.admin("DELETE", "/v0/executions", nil).wantErr(t, http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed)
		e.do("PUT", "/v0/health", nil, nil).wantErr(t, http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed)
	})
}

func TestRateLimitedIsHTTP200(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	if d := e.submit(r, "tool_call", "limited", map[string]any{"i": 1}); d.Decision != wire.DecisionProceed {
		t.Fatalf("first %+v", d)
	}
	d := e.submit(r, "tool_call", "limited", map[string]any{"i": 2})
	if d.Decision != wire.DecisionRateLimited || d.Reason == "" {
		t.Fatalf("second %+v", d)
	}
	m := string(e.do("GET", "/metrics", nil, nil).want(t, http.StatusOK).body)
	for _, want := range []string{`wicket_step_submissions_total{decision="proceed"} 1`, `wicket_step_submissions_total{decision="rate_limited"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, m)
		}
	}
}

func TestApprovals(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	d := e.submit(r, "tool_call", "wire_money", map[string]any{"to": "x", "amount": 100})
	if d.Decision != wire.DecisionBlocked || d.ApprovalID == "" {
		t.Fatalf("decision %+v", d)
	}
	// The execution waits: further steps answer execution_blocked.
	if d2 := e.submit(r, "tool_call", "search", nil); d2.Decision != wire.DecisionExecutionBlocked {
		t.Fatalf("while blocked %+v", d2)
	}
	var l wire.ApprovalList
	e.admin("GET", "/v0/approvals?status=pending", nil).want(t, http.StatusOK).decode(t, &l)
	if len(l.Approvals) != 1 || l.Approvals[0].ID != d.ApprovalID {
		t.Fatalf("pending %+v", l)
	}
	e.admin("GET", "/v0/approvals?status=bogus", nil).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	var a wire.Approval
	e.admin("GET", "/v0/approvals/"+d.ApprovalID, nil).want(t, http.StatusOK).decode(t, &a)
	if a.Status != "pending" || a.RequestHash == "" || a.StepID != d.StepID || len(a.Approvers) != 1 {
		t.Fatalf("approval %+v", a)
	}
	url := "/v0/approvals/" + d.ApprovalID
	e.admin("POST", url+"/grant", map[string]any{"decided_by": "mallory"}).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.admin("POST", url+"/grant", map[string]any{"decided_by": "alice", "request_hash": strings.Repeat("0", 64)}).wantErr(t, http.StatusConflict, wire.CodeConflict)
	e.admin("POST", url+"/grant", map[string]any{"decided_by": "alice", "request_hash": a.RequestHash, "rationale": "ok"}).
		want(t, http.StatusOK).decode(t, &a)
	if a.Status != "granted" || a.DecidedBy != "alice" {
		t.Fatalf("granted %+v", a)
	}
	e.admin("POST", url+"/deny", map[string]any{"decided_by": "alice"}).wantErr(t, http.StatusConflict, wire.CodeConflict)

	// Resolving queued a new dispatch; under it the step proceeds.
	var x wire.Execution
	deadline := time.Now().Add(10 * time.Second)
	var nd kernel.Delivery
	for nd.DispatchID == "" && time.Now().Before(deadline) {
		e.deliv.mu.Lock()
		for _, dl := range e.deliv.got {
			if dl.ExecutionID == r.id && dl.DispatchID != r.lease.DispatchID {
				nd = dl
			}
		}
		e.deliv.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	if nd.DispatchID == "" {
		t.Fatal("no new dispatch after the grant")
	}
	e.waitAcked("default", r.id)
	e.admin("GET", "/v0/executions/"+r.id, nil).want(t, http.StatusOK).decode(t, &x)
	nl := kernel.Lease{DispatchID: nd.DispatchID, Attempt: nd.Attempt}
	r2 := running{id: r.id, lease: nl, as: agentReq{agentID: "bot", secret: botSecret, lease: &nl}}
	if d3 := e.submit(r2, "tool_call", "wire_money", map[string]any{"to": "x", "amount": 100}); d3.Decision != wire.DecisionProceed || d3.StepID != d.StepID {
		t.Fatalf("after grant %+v (want proceed of %s)", d3, d.StepID)
	}

	// Deny on another execution; decided_by defaults to the key's principal.
	r3 := e.start("bot")
	d4 := e.submit(r3, "tool_call", "wire_money", map[string]any{"amount": 1})
	e.admin("POST", "/v0/approvals/"+d4.ApprovalID+"/deny", map[string]any{"decided_by": "alice"}).want(t, http.StatusOK).decode(t, &a)
	if a.Status != "denied" {
		t.Fatalf("denied %+v", a)
	}
	// A client key may not resolve approvals.
	key := e.createKey(t, "default", "client", "ci")
	e.do("GET", "/v0/approvals", nil, bearer(key)).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
}

func TestStreamDeltaNeedsCurrentLease(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	d := e.submit(r, "llm_call", "gpt", map[string]any{"p": 1})
	url := "/v0/executions/" + r.id + "/steps/" + d.StepID + "/stream"
	old := kernel.Lease{DispatchID: r.lease.DispatchID, Attempt: r.lease.Attempt + 1}
	e.agent(agentReq{agentID: "bot", secret: botSecret, lease: &old}, "POST", url, map[string]any{"seq": 0, "data": "x"}).
		wantErr(t, http.StatusConflict, wire.CodeLeaseSuperseded)
	e.agent(r.as, "POST", url, map[string]any{"seq": -1, "data": "x"}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.agent(r.as, "POST", url, map[string]any{"seq": 1}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	var acc wire.StreamDeltaAccepted
	e.agent(r.as, "POST", url, map[string]any{"seq": 1, "data": json.RawMessage(`{"delta":"hi"}`)}).want(t, http.StatusAccepted).decode(t, &acc)
	if acc.Subscribers != 0 {
		t.Fatalf("subscribers %d", acc.Subscribers)
	}
}

// TestBlockedStepAgainUnderParkedLease: an agent whose blocked answer was
// lost submits the step again under the same (now parked) lease. It is
// answered blocked on the same approval with the same step id and
// occurrence, as a session's holder is (docs/protocol.md#decisions), its
// identity is still checked, and nothing is recorded; another step is
// execution_blocked.
func TestBlockedStepAgainUnderParkedLease(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	args := map[string]any{"to": "x", "amount": 100}
	d := e.submit(r, "tool_call", "wire_money", args)
	if d.Decision != wire.DecisionBlocked || d.ApprovalID == "" || d.StepID == "" {
		t.Fatalf("first %+v", d)
	}
	var before wire.Execution
	e.admin("GET", "/v0/executions/"+r.id, nil).want(t, http.StatusOK).decode(t, &before)

	again := e.submit(r, "tool_call", "wire_money", args)
	if again.Decision != wire.DecisionBlocked || again.StepID != d.StepID || again.Occurrence != d.Occurrence ||
		again.ApprovalID != d.ApprovalID || again.Reason != d.Reason || again.RuleID != d.RuleID {
		t.Fatalf("again under the parked lease %+v, want the first answer %+v", again, d)
	}

	// The step's identity is checked under the parked lease too.
	body := bodyBytes(t, map[string]any{"kind": "tool_call", "target": "wire_money", "args": args})
	path := "/v0/executions/" + r.id + "/steps"
	h := map[string]string{wire.HeaderAgentID: "bot", wire.HeaderStepID: strings.Repeat("f", 64),
		wire.HeaderDispatchID: r.lease.DispatchID, wire.HeaderDispatchAttempt: strconv.Itoa(r.lease.Attempt)}
	h[wire.HeaderWicketSignature] = signV1(botSecret, "POST", path, h, body, time.Now())
	eb := e.do("POST", path, rawBody(body), h).wantErr(t, http.StatusConflict, wire.CodeStepIDDivergence)
	if eb.Details["step_id"] != d.StepID {
		t.Fatalf("divergence details %+v, want step_id %s", eb.Details, d.StepID)
	}

	if other := e.submit(r, "tool_call", "search", nil); other.Decision != wire.DecisionExecutionBlocked || other.ApprovalID != d.ApprovalID {
		t.Fatalf("another step %+v", other)
	}
	var after wire.Execution
	e.admin("GET", "/v0/executions/"+r.id, nil).want(t, http.StatusOK).decode(t, &after)
	if after.LastSeq != before.LastSeq || after.Status != "blocked" {
		t.Fatalf("after the resubmissions: last_seq %d status %s, want %d blocked (nothing recorded)", after.LastSeq, after.Status, before.LastSeq)
	}
}
