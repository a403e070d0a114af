package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// holder is a session holder: its key and the lease it holds.
type holder struct {
	id    string
	key   string
	lease wire.Lease
}

func (h holder) hdr() map[string]string {
	m := bearer(h.key)
	m[wire.HeaderDispatchID] = h.lease.DispatchID
	m[wire.HeaderDispatchAttempt] = strconv.Itoa(h.lease.Attempt)
	return m
}

// key issues a key of role in tenant.
func (e *env) key(tenant, role, principal string) string {
	e.t.Helper()
	var k wire.CreatedKey
	e.admin("POST", "/v0/tenants/"+tenant+"/keys", map[string]any{"role": role, "principal": principal}).
		want(e.t, http.StatusCreated).decode(e.t, &k)
	return k.Key
}

// begin begins a session of agentID held by key.
func (e *env) begin(key, agentID string) holder {
	e.t.Helper()
	var s wire.Session
	e.do("POST", "/v0/sessions", map[string]any{"agent_id": agentID, "input": map[string]any{"task": "tidy"}}, bearer(key)).
		want(e.t, http.StatusCreated).decode(e.t, &s)
	if s.DispatchID == "" || s.DispatchAttempt != 1 || s.LeaseUntil.IsZero() || s.Execution.Status != "running" {
		e.t.Fatalf("session %+v", s)
	}
	return holder{id: s.Execution.ID, key: key, lease: wire.Lease{DispatchID: s.DispatchID, Attempt: s.DispatchAttempt}}
}

func (e *env) propose(h holder, target string, args any) wire.StepDecision {
	e.t.Helper()
	var d wire.StepDecision
	e.do("POST", "/v0/executions/"+h.id+"/steps", map[string]any{"kind": "tool_call", "target": target, "args": args}, h.hdr()).
		want(e.t, http.StatusOK).decode(e.t, &d)
	return d
}

func (e *env) eventTypes(tenant, id string) []string {
	e.t.Helper()
	evs, err := e.k.Events(context.Background(), tenant, id, 0, 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = string(ev.Type)
	}
	return out
}

func count(types []string, typ string) int {
	n := 0
	for _, t := range types {
		if t == typ {
			n++
		}
	}
	return n
}

// TestSessions drives a session over HTTP with the holder's bearer key:
// begin, propose and complete, replay, who may drive it, attach while
// leased (409), detach and attach by another process, and a gate-only
// agent.
func TestSessions(t *testing.T) {
	e := newEnv(t)
	e.admin("POST", "/v0/tenants", map[string]any{"id": "acme"}).want(t, http.StatusCreated)
	client := e.key("default", "client", "ide")
	client2 := e.key("default", "client", "ci")
	approver := e.key("default", "approver", "alice")
	acme := e.key("acme", "client", "acme-ide")

	// A gate-only agent: no webhook_url; it cannot be dispatched.
	var ag wire.Agent
	e.admin("POST", "/v0/agents", map[string]any{"id": "desk", "secret": "desk-secret-0123456789"}).want(t, http.StatusCreated).decode(t, &ag)
	if !ag.GateOnly || ag.WebhookURL != "" || ag.OnInterrupted != "indeterminate" {
		t.Fatalf("agent %+v", ag)
	}
	e.do("POST", "/v0/executions", map[string]any{"agent_id": "desk"}, bearer(client)).wantErr(t, http.StatusConflict, wire.CodeConflict)
	e.do("POST", "/v0/sessions", map[string]any{"agent_id": "desk"}, bearer(approver)).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("POST", "/v0/sessions", map[string]any{"agent_id": "nobody"}, bearer(client)).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	e.do("POST", "/v0/sessions", map[string]any{"agent_id": "desk"}, bearer(acme)).wantErr(t, http.StatusNotFound, wire.CodeNotFound)

	h := e.begin(client, "desk")
	d := e.propose(h, "fs.read", map[string]any{"path": "a.txt"})
	if d.Decision != wire.DecisionProceed {
		t.Fatalf("decision %+v", d)
	}
	e.do("POST", "/v0/executions/"+h.id+"/steps/"+d.StepID+"/complete", map[string]any{"result": "hello"}, h.hdr()).want(t, http.StatusOK)
	if d2 := e.propose(h, "forbidden", nil); d2.Decision != wire.DecisionDenied || d2.RuleID != "no" {
		t.Fatalf("denied: %+v", d2)
	}
	var hb wire.HeartbeatResponse
	e.do("POST", "/v0/executions/"+h.id+"/heartbeat", nil, h.hdr()).want(t, http.StatusOK).decode(t, &hb)
	if hb.LeaseUntil == nil {
		t.Fatal("heartbeat of a session has no lease_until")
	}

	// Nobody else drives it: another key of the tenant (even with the
	// lease headers), a key of another tenant, the agent's signature, an
	// approver.
	other := h
	other.key = client2
	e.do("POST", "/v0/executions/"+h.id+"/steps", map[string]any{"kind": "local", "target": "x"}, other.hdr()).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("POST", "/v0/executions/"+h.id+"/heartbeat", nil, other.hdr()).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("POST", "/v0/executions/"+h.id+"/complete", map[string]any{"output": 1}, other.hdr()).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	other.key = acme
	e.do("POST", "/v0/executions/"+h.id+"/steps", map[string]any{"kind": "local", "target": "x"}, other.hdr()).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
	other.key = approver
	e.do("POST", "/v0/executions/"+h.id+"/heartbeat", nil, other.hdr()).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	l := kernel.Lease{DispatchID: h.lease.DispatchID, Attempt: h.lease.Attempt}
	e.agent(agentReq{agentID: "desk", secret: "desk-secret-0123456789", lease: &l}, "POST", "/v0/executions/"+h.id+"/heartbeat", nil).
		wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	// A bearer key on a webhook execution is refused too.
	r := e.start("bot")
	e.do("POST", "/v0/executions/"+r.id+"/heartbeat", nil, holder{id: r.id, key: client, lease: wire.Lease{DispatchID: r.lease.DispatchID, Attempt: r.lease.Attempt}}.hdr()).
		wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	e.do("POST", "/v0/executions/"+r.id+"/attach", nil, bearer(client)).wantErr(t, http.StatusConflict, wire.CodeConflict)

	// Attach while the lease is live: 409 naming until when.
	eb := e.do("POST", "/v0/executions/"+h.id+"/attach", nil, bearer(client2)).wantErr(t, http.StatusConflict, wire.CodeExecutionLeased)
	if eb.Details["lease_until"] == nil {
		t.Fatalf("execution_leased without lease_until: %+v", eb)
	}
	e.do("POST", "/v0/executions/"+h.id+"/attach", nil, bearer(acme)).wantErr(t, http.StatusNotFound, wire.CodeNotFound)

	// The holder gives the lease up; another process (another key) attaches.
	e.do("POST", "/v0/executions/"+h.id+"/detach", nil, h.hdr()).want(t, http.StatusNoContent)
	e.do("POST", "/v0/executions/"+h.id+"/steps", map[string]any{"kind": "local", "target": "x"}, h.hdr()).wantErr(t, http.StatusConflict, wire.CodeLeaseSuperseded)
	var s2 wire.Session
	e.do("POST", "/v0/executions/"+h.id+"/attach", nil, bearer(client2)).want(t, http.StatusOK).decode(t, &s2)
	if s2.DispatchAttempt != 2 || s2.DispatchID != h.lease.DispatchID {
		t.Fatalf("attached %+v", s2)
	}
	h2 := holder{id: h.id, key: client2, lease: wire.Lease{DispatchID: s2.DispatchID, Attempt: s2.DispatchAttempt}}
	// The old key cannot drive it now, even with the new lease.
	e.do("POST", "/v0/executions/"+h.id+"/heartbeat", nil, holder{id: h.id, key: client, lease: h2.lease}.hdr()).wantErr(t, http.StatusForbidden, wire.CodeForbidden)
	// The new attempt replays what was recorded: same step id, no new run.
	if d3 := e.propose(h2, "fs.read", map[string]any{"path": "a.txt"}); d3.Decision != wire.DecisionReplay || d3.StepID != d.StepID || string(d3.Result) != `"hello"` {
		t.Fatalf("replay %+v (first %s)", d3, d.StepID)
	}
	var x wire.Execution
	e.do("POST", "/v0/executions/"+h.id+"/complete", map[string]any{"output": map[string]any{"ok": true}}, h2.hdr()).want(t, http.StatusOK).decode(t, &x)
	if x.Status != "completed" {
		t.Fatalf("completed: %+v", x)
	}
	e.do("POST", "/v0/executions/"+h.id+"/attach", nil, bearer(client2)).wantErr(t, http.StatusConflict, wire.CodeConflict)
	types := e.eventTypes("default", h.id)
	if count(types, "session.attached") != 2 || count(types, "session.detached") != 1 || count(types, "dispatch.queued") != 0 {
		t.Fatalf("events %v", types)
	}
}

// TestSessionLabelsAndLimits: a session begins with the labels and limits
// of its request, and its holder's proposals are held to those limits like
// an agent's steps.
func TestSessionLabelsAndLimits(t *testing.T) {
	e := newEnv(t)
	cl := e.key("default", "client", "ide")
	e.admin("POST", "/v0/agents", map[string]any{"id": "desk", "secret": "desk-secret-0123456789"}).want(t, http.StatusCreated)
	var s wire.Session
	e.do("POST", "/v0/sessions", map[string]any{"agent_id": "desk", "labels": map[string]string{"team": "docs"}, "limits": map[string]any{"max_steps": 1}},
		bearer(cl)).want(t, http.StatusCreated).decode(t, &s)
	if s.Execution.Labels["team"] != "docs" || s.Execution.Limits.MaxSteps != 1 {
		t.Fatalf("session %+v", s.Execution)
	}
	h := holder{id: s.Execution.ID, key: cl, lease: wire.Lease{DispatchID: s.DispatchID, Attempt: s.DispatchAttempt}}
	d := e.propose(h, "fs.read", map[string]any{"path": "a.txt"})
	if d.Decision != wire.DecisionProceed {
		t.Fatalf("first step %+v", d)
	}
	e.do("POST", "/v0/executions/"+h.id+"/steps/"+d.StepID+"/complete", map[string]any{"result": "a"}, h.hdr()).want(t, http.StatusOK)
	if d := e.propose(h, "fs.read", map[string]any{"path": "b.txt"}); d.Decision != wire.DecisionDenied || d.Reason == "" || !strings.HasPrefix(d.Reason, "limit_steps") {
		t.Fatalf("a step over max_steps: %+v", d)
	}
	// A malformed limit is refused before anything begins.
	e.do("POST", "/v0/sessions", map[string]any{"agent_id": "desk", "limits": map[string]any{"max_duration": "soon"}}, bearer(cl)).
		wantErr(t, http.StatusBadRequest, wire.CodeValidation)
}

// TestSessionLeaseExpiresAndApprovals: a session's lease runs while it waits
// on an approval (the holder heartbeats), the blocked step keeps its id
// under the same lease, other steps are execution_blocked; a lease that
// lapses detaches the session and lets another attach.
func TestSessionLeaseExpiresAndApprovals(t *testing.T) {
	e := newEnv(t, func(o *envOpts) {
		o.kcfg = kernel.Config{LeaseTimeout: 2 * time.Second, ReapInterval: 20 * time.Millisecond}
	})
	client := e.key("default", "client", "ide")
	alice := e.key("default", "approver", "alice")
	h := e.begin(client, "bot") // an agent with a webhook may be driven by a session too

	d := e.propose(h, "wire_money", map[string]any{"usd": 5})
	if d.Decision != wire.DecisionBlocked || d.ApprovalID == "" {
		t.Fatalf("decision %+v", d)
	}
	if d2 := e.propose(h, "fs.read", nil); d2.Decision != wire.DecisionExecutionBlocked {
		t.Fatalf("other step while blocked: %+v", d2)
	}
	if d2 := e.propose(h, "wire_money", map[string]any{"usd": 5}); d2.Decision != wire.DecisionBlocked || d2.StepID != d.StepID {
		t.Fatalf("the blocked step again: %+v (first %s)", d2, d.StepID)
	}
	var hb wire.HeartbeatResponse
	e.do("POST", "/v0/executions/"+h.id+"/heartbeat", nil, h.hdr()).want(t, http.StatusOK).decode(t, &hb)
	if hb.LeaseUntil == nil {
		t.Fatal("a waiting session holds no timed lease")
	}
	e.do("POST", "/v0/approvals/"+d.ApprovalID+"/grant", map[string]any{}, bearer(alice)).want(t, http.StatusOK)
	d3 := e.propose(h, "wire_money", map[string]any{"usd": 5})
	if d3.Decision != wire.DecisionProceed || d3.StepID != d.StepID {
		t.Fatalf("after the grant: %+v (first %s)", d3, d.StepID)
	}
	e.do("POST", "/v0/executions/"+h.id+"/steps/"+d3.StepID+"/complete", map[string]any{"result": "sent"}, h.hdr()).want(t, http.StatusOK)

	// The holder goes away: the lease lapses and the session is detached.
	deadline := time.Now().Add(30 * time.Second)
	for {
		x, err := e.k.GetExecution(context.Background(), "default", h.id)
		if err != nil {
			t.Fatal(err)
		}
		if x.Lease == (kernel.Lease{}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease never lapsed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.do("POST", "/v0/executions/"+h.id+"/heartbeat", nil, h.hdr()).wantErr(t, http.StatusConflict, wire.CodeLeaseSuperseded)
	var s wire.Session
	e.do("POST", "/v0/executions/"+h.id+"/attach", nil, bearer(client)).want(t, http.StatusOK).decode(t, &s)
	h.lease = wire.Lease{DispatchID: s.DispatchID, Attempt: s.DispatchAttempt}
	if d4 := e.propose(h, "wire_money", map[string]any{"usd": 5}); d4.Decision != wire.DecisionReplay || string(d4.Result) != `"sent"` {
		t.Fatalf("replay after attach: %+v", d4)
	}
	types := e.eventTypes("default", h.id)
	if count(types, "session.detached") != 1 || count(types, "dispatch.claimed") != 0 || count(types, "dispatch.queued") != 0 {
		t.Fatalf("events %v", types)
	}
	var ev []kernel.Event
	ev, _ = e.k.Events(context.Background(), "default", h.id, 0, 1000)
	for _, x := range ev {
		if x.Type == "session.detached" {
			var p map[string]any
			_ = json.Unmarshal(x.Payload, &p)
			if p["reason"] != "lease_expired" {
				t.Fatalf("detached %s", x.Payload)
			}
		}
	}
}

// proposeRec proposes an at_most_once tool call the holder can reconcile.
func (e *env) proposeRec(h holder, target string, args any) wire.StepDecision {
	e.t.Helper()
	var d wire.StepDecision
	e.do("POST", "/v0/executions/"+h.id+"/steps", map[string]any{"kind": "tool_call", "target": target, "args": args,
		"idempotency": "at_most_once", "reconcile": true}, h.hdr()).want(e.t, http.StatusOK).decode(e.t, &d)
	return d
}

// TestSessionReconcileApproval: a session's holder that cannot tell what
// became of an interrupted step hands it to an operator (reconcile
// outcome approval). It keeps its lease while the approval pends, so it
// proposes the same call again under that lease, as for a policy's
// approval: the step keeps its id, pending until answered, then replayed
// (happened: its result; deny: the error interrupted) or run again
// (retry). It is never a new
// occurrence that runs the effect a second time.
func TestSessionReconcileApproval(t *testing.T) {
	e := newEnv(t)
	client := e.key("default", "client", "ide")
	alice := e.key("default", "approver", "alice")
	h := e.begin(client, "bot")
	steps := map[string]string{}
	for _, n := range []string{"a", "b", "c"} {
		d := e.proposeRec(h, "send_"+n, map[string]any{"n": n})
		if d.Decision != wire.DecisionProceed {
			t.Fatalf("%s: %+v", n, d)
		}
		steps[n] = d.StepID
	}
	// The holder crashes with the three in flight; it attaches again.
	e.do("POST", "/v0/executions/"+h.id+"/detach", nil, h.hdr()).want(t, http.StatusNoContent)
	var s wire.Session
	e.do("POST", "/v0/executions/"+h.id+"/attach", nil, bearer(client)).want(t, http.StatusOK).decode(t, &s)
	h.lease = wire.Lease{DispatchID: s.DispatchID, Attempt: s.DispatchAttempt}

	for _, c := range []struct{ n, answer, body, want string }{
		{"a", "happened", `{"result": "sent once"}`, wire.DecisionReplay},
		{"b", "retry", `{}`, wire.DecisionProceed},
		{"c", "deny", `{}`, wire.DecisionReplay}, // of the error {"code": "interrupted"}
	} {
		target, args := "send_"+c.n, map[string]any{"n": c.n}
		if d := e.proposeRec(h, target, args); d.Decision != wire.DecisionInterrupted || d.StepID != steps[c.n] {
			t.Fatalf("%s after attach: %+v", c.n, d)
		}
		var d wire.StepDecision
		e.do("POST", "/v0/executions/"+h.id+"/steps/"+steps[c.n]+"/reconcile", map[string]any{"outcome": "approval"}, h.hdr()).
			want(t, http.StatusOK).decode(t, &d)
		if d.Decision != wire.DecisionBlocked || d.ApprovalID == "" {
			t.Fatalf("%s reconciled: %+v", c.n, d)
		}
		// The holder waits and proposes the call again: still pending.
		if d2 := e.proposeRec(h, target, args); d2.Decision != wire.DecisionBlocked || d2.StepID != steps[c.n] || d2.ApprovalID != d.ApprovalID {
			t.Fatalf("%s proposed again while pending: %+v (step %s)", c.n, d2, steps[c.n])
		}
		e.do("POST", "/v0/approvals/"+d.ApprovalID+"/"+c.answer, json.RawMessage(c.body), bearer(alice)).want(t, http.StatusOK)
		d3 := e.proposeRec(h, target, args)
		if d3.Decision != c.want || d3.StepID != steps[c.n] {
			t.Fatalf("%s after %s: %+v (step %s)", c.n, c.answer, d3, steps[c.n])
		}
		if c.answer == "happened" && string(d3.Result) != `"sent once"` {
			t.Fatalf("happened replays %s", d3.Result)
		}
		if c.answer == "deny" && !strings.Contains(string(d3.Error), `"code":"interrupted"`) {
			t.Fatalf("deny replays %s", d3.Error)
		}
		if c.answer == "retry" {
			e.do("POST", "/v0/executions/"+h.id+"/steps/"+d3.StepID+"/complete", map[string]any{"result": "sent"}, h.hdr()).want(t, http.StatusOK)
		}
		// A second identical call is a new occurrence, as for any step.
		if d4 := e.proposeRec(h, target, args); d4.Decision != wire.DecisionProceed || d4.StepID == steps[c.n] || d4.Occurrence != 1 {
			t.Fatalf("%s called again: %+v", c.n, d4)
		}
	}
}
