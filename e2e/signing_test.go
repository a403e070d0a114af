package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/server/wire"
)

// captured is one agent request as an observer of the traffic saw it:
// method, target, headers and body, to be sent again verbatim or altered.
type captured struct {
	method, target string
	header         http.Header
	body           []byte
}

// send sends c to the kernel at base and returns the status and body.
func (c captured) send(t *testing.T, base string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(c.method, base+c.target, bytes.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = c.header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// agentRequest builds a request of agent id signed under scheme at time
// at, as an agent would send it.
func agentRequest(id, secret, scheme, method, target string, lease *kernel.Lease, body []byte, at time.Time) captured {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(wire.HeaderAgentID, id)
	m := wire.SignedRequest{Method: method, Target: target, Body: body}
	if lease != nil {
		m.DispatchID, m.DispatchAttempt = lease.DispatchID, strconv.Itoa(lease.Attempt)
		h.Set(wire.HeaderDispatchID, m.DispatchID)
		h.Set(wire.HeaderDispatchAttempt, m.DispatchAttempt)
	}
	if scheme == kernel.SigningBody {
		h.Set(wire.HeaderSignature, wire.Sign([]byte(secret), body))
	} else {
		h.Set(wire.HeaderWicketSignature, wire.SignV1([]byte(secret), at, m))
	}
	return captured{method: method, target: target, header: h, body: body}
}

// parkedAgent is an agent whose handler waits until the test releases it,
// so the test holds a live lease to attack.
func parkedAgent(t *testing.T, id, scheme, kernelURL string) (*testkit.Agent, chan *testkit.Run, chan struct{}) {
	t.Helper()
	leases := make(chan *testkit.Run, 4)
	release := make(chan struct{})
	a := testkit.NewAgent(id, secret, kernelURL, func(ctx context.Context, r *testkit.Run) (any, error) {
		leases <- r
		select {
		case <-release:
		case <-ctx.Done():
		}
		return "released", nil
	})
	if scheme != "" {
		a.SetSigning(scheme)
	}
	t.Cleanup(a.Close)
	return a, leases, release
}

func register(t *testing.T, base string, a *testkit.Agent) {
	t.Helper()
	body := map[string]any{"id": a.ID, "webhook_url": a.WebhookURL(), "secret": string(a.Secret)}
	if a.Signing != "" {
		body["signing"] = a.Signing
	}
	if _, err := testkit.Bearer(base, testkit.AdminKey, "POST", "/v0/agents", body, nil); err != nil {
		t.Fatal(err)
	}
}

func execution(t *testing.T, base, id string) kernel.Execution {
	t.Helper()
	var x kernel.Execution
	if _, err := testkit.Bearer(base, testkit.AdminKey, "GET", "/v0/executions/"+id, nil, &x); err != nil {
		t.Fatal(err)
	}
	return x
}

// TestAgentSignaturesBindTheRequest attacks agent signatures as an observer
// of agent traffic would, against a real `wicket serve`: a captured v1
// signature works only for the request it was made for, within 300 s; an
// agent registered with one scheme is refused the other.
func TestAgentSignaturesBindTheRequest(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t))
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()

	bot, leases, release := parkedAgent(t, "bot", "", p.url)
	register(t, p.url, bot)
	var x1, x2 kernel.Execution
	for _, x := range []*kernel.Execution{&x1, &x2} {
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/executions", map[string]any{"agent_id": "bot", "input": 1}, x); err != nil {
			t.Fatal(err)
		}
	}
	var run *testkit.Run
	for run == nil || run.ExecutionID != x1.ID {
		select {
		case run = <-leases:
		case <-time.After(30 * time.Second):
			t.Fatal("no dispatch of x1")
		}
	}
	lease := run.Lease
	now := time.Now()
	status := func(c captured) int { st, _ := c.send(t, p.url); return st }

	// The signature of an empty-body GET reads that execution only.
	read := agentRequest("bot", secret, kernel.SigningV1, "GET", "/v0/executions/"+x1.ID, nil, nil, now)
	if st, body := read.send(t, p.url); st != http.StatusOK {
		t.Fatalf("the agent's own read: %d %s", st, body)
	}
	for _, target := range []string{
		"/v0/executions/" + x2.ID,                     // another execution of the same agent
		"/v0/executions/" + x1.ID + "/steps",          // its steps
		"/v0/executions/" + x1.ID + "/events",         // its events
		"/v0/executions/" + x1.ID + "?tenant=default", // another query
	} {
		reused := read
		reused.target = target
		if st := status(reused); st != http.StatusUnauthorized {
			t.Errorf("GET signature reused on %s: %d, want 401", target, st)
		}
	}
	// ... and not after 300 s: the same GET signed 301 s ago (a capture
	// replayed later) or 302 s ahead. (A v1 timestamp is in whole seconds:
	// one signed 301 s ahead of a clock at x.9 s carries x+301, which is
	// 300.1 s ahead of that clock, and inside the tolerance of the
	// kernel's once 0.1 s has passed. Behind, truncation only adds.)
	for _, skew := range []time.Duration{-301 * time.Second, 302 * time.Second} {
		if st, body := agentRequest("bot", secret, kernel.SigningV1, "GET", "/v0/executions/"+x1.ID, nil, nil, now.Add(skew)).send(t, p.url); st != http.StatusUnauthorized || !strings.Contains(body, "tolerance") {
			t.Errorf("GET signed %s from now: %d %s, want 401 naming the tolerance", skew, st, body)
		}
	}

	// A heartbeat's {} signature cannot complete or fail the execution,
	// nor heartbeat another attempt.
	hb := agentRequest("bot", secret, kernel.SigningV1, "POST", "/v0/executions/"+x1.ID+"/heartbeat", &lease, []byte("{}"), now)
	if st, body := hb.send(t, p.url); st != http.StatusOK {
		t.Fatalf("heartbeat: %d %s", st, body)
	}
	for _, target := range []string{"/v0/executions/" + x1.ID + "/complete", "/v0/executions/" + x1.ID + "/fail"} {
		forged := hb
		forged.target = target
		if st := status(forged); st != http.StatusUnauthorized {
			t.Errorf("heartbeat signature on %s: %d, want 401", target, st)
		}
	}
	other := hb
	other.header = hb.header.Clone()
	other.header.Set(wire.HeaderDispatchAttempt, strconv.Itoa(lease.Attempt+1))
	if st := status(other); st != http.StatusUnauthorized {
		t.Errorf("heartbeat signature with another attempt: %d, want 401", st)
	}
	if x := execution(t, p.url, x1.ID); x.Status != kernel.ExecRunning {
		t.Fatalf("after the forgeries the execution is %s, want running", x.Status)
	}

	// The body scheme is refused for a v1 agent, whatever it signs.
	bodyRead := agentRequest("bot", secret, kernel.SigningBody, "GET", "/v0/executions/"+x1.ID, nil, nil, now)
	if st, body := bodyRead.send(t, p.url); st != http.StatusUnauthorized || !strings.Contains(body, "signing scheme") {
		t.Errorf("a body-signed read by a v1 agent: %d %s", st, body)
	}

	// A body agent: its own scheme works, v1 is refused.
	seeds, seedLeases, seedRelease := parkedAgent(t, "seeds", kernel.SigningBody, p.url)
	register(t, p.url, seeds)
	var xs kernel.Execution
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/executions", map[string]any{"agent_id": "seeds", "input": 1}, &xs); err != nil {
		t.Fatal(err)
	}
	select {
	case <-seedLeases:
	case <-time.After(30 * time.Second):
		t.Fatal("the body-signed agent got no webhook (or refused it)")
	}
	if st := status(agentRequest("seeds", secret, kernel.SigningBody, "GET", "/v0/executions/"+xs.ID, nil, nil, now)); st != http.StatusOK {
		t.Errorf("a body agent's body-signed read: %d", st)
	}
	if st, body := agentRequest("seeds", secret, kernel.SigningV1, "GET", "/v0/executions/"+xs.ID, nil, nil, now).send(t, p.url); st != http.StatusUnauthorized || !strings.Contains(body, "signing scheme") {
		t.Errorf("a v1-signed read by a body agent: %d %s", st, body)
	}
	var seedsView wire.Agent
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "GET", "/v0/agents/seeds", nil, &seedsView); err != nil || seedsView.Signing != kernel.SigningBody {
		t.Errorf("GET /v0/agents/seeds: %+v %v", seedsView, err)
	}

	close(release)
	close(seedRelease)
	for _, id := range []string{x1.ID, xs.ID} {
		deadline := time.Now().Add(30 * time.Second)
		for execution(t, p.url, id).Status != kernel.ExecCompleted {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not complete", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if n := bot.BadSigs.Load() + seeds.BadSigs.Load(); n != 0 {
		t.Errorf("agents refused %d webhooks of the kernel", n)
	}
}

// TestStepIDDivergence: a submission whose Rebuno-Step-Id is not the
// kernel's id is 409 step_id_divergence and records nothing (no event, no
// step, no occurrence consumed); the right id proceeds as occurrence 0.
func TestStepIDDivergence(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t))
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	bot, leases, release := parkedAgent(t, "bot", "", p.url)
	defer close(release)
	register(t, p.url, bot)
	var x kernel.Execution
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/executions", map[string]any{"agent_id": "bot"}, &x); err != nil {
		t.Fatal(err)
	}
	var run *testkit.Run
	select {
	case run = <-leases:
	case <-time.After(30 * time.Second):
		t.Fatal("no dispatch")
	}
	waitEvent(t, p, x.ID, string(kernel.EvDispatchAcked)) // the log is quiet from here on
	before, err := testkit.AllEvents(p.url, testkit.AdminKey, x.ID)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"kind":"tool_call","target":"send_email","args":{"to":"a@example.com","n":1.50}}`)
	_, argsHash, err := canon.ArgsHash([]byte(`{"to":"a@example.com","n":1.50}`))
	if err != nil {
		t.Fatal(err)
	}
	right := canon.StepID(x.ID, "tool_call", "send_email", argsHash, 0)
	for _, wrong := range []string{
		canon.StepID(x.ID, "tool_call", "send_email", argsHash, 1),                                             // another occurrence
		canon.StepID(x.ID, "tool_call", "send_email", canon.Hash([]byte(`{"n":1.5,"to":"a@example.com"}`)), 0), // a float round trip
		"not-even-hex",
	} {
		req := agentRequest("bot", secret, kernel.SigningV1, "POST", "/v0/executions/"+x.ID+"/steps", &run.Lease, body, time.Now())
		req.header.Set(wire.HeaderStepID, wrong)
		st, resp := req.send(t, p.url)
		var eb wire.ErrorBody
		_ = json.Unmarshal([]byte(resp), &eb)
		if st != http.StatusConflict || eb.Code != wire.CodeStepIDDivergence || eb.Details["step_id"] != right {
			t.Fatalf("step id %s: %d %s, want 409 step_id_divergence naming the kernel's id", wrong, st, resp)
		}
	}
	after, err := testkit.AllEvents(p.url, testkit.AdminKey, x.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("refused submissions appended events: %v → %v", testkit.Types(before), testkit.Types(after))
	}
	var steps wire.StepList
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "GET", "/v0/executions/"+x.ID+"/steps", nil, &steps); err != nil || len(steps.Steps) != 0 {
		t.Fatalf("steps after refused submissions: %+v %v", steps, err)
	}
	req := agentRequest("bot", secret, kernel.SigningV1, "POST", "/v0/executions/"+x.ID+"/steps", &run.Lease, body, time.Now())
	req.header.Set(wire.HeaderStepID, right)
	st, resp := req.send(t, p.url)
	var d wire.StepDecision
	if err := json.Unmarshal([]byte(resp), &d); err != nil || st != http.StatusOK || d.Decision != wire.DecisionProceed || d.StepID != right || d.Occurrence != 0 {
		t.Fatalf("the right step id: %d %s", st, resp)
	}
}

// TestSignatureToleranceFlag: with --signature-tolerance 1s, a captured
// request that worked stops working once the window has passed.
func TestSignatureToleranceFlag(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t), "--signature-tolerance", "1s")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	bot, leases, release := parkedAgent(t, "bot", "", p.url)
	defer close(release)
	register(t, p.url, bot)
	var x kernel.Execution
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/executions", map[string]any{"agent_id": "bot"}, &x); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leases:
	case <-time.After(30 * time.Second):
		t.Fatal("no dispatch")
	}
	c := agentRequest("bot", secret, kernel.SigningV1, "GET", "/v0/executions/"+x.ID, nil, nil, time.Now())
	if st, body := c.send(t, p.url); st != http.StatusOK {
		t.Fatalf("fresh: %d %s", st, body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, body := c.send(t, p.url)
		if st == http.StatusUnauthorized && strings.Contains(body, "tolerance 1s") {
			return
		}
		if st != http.StatusOK || time.Now().After(deadline) {
			t.Fatalf("replayed capture: %d %s, want 200 until the window passes, then 401", st, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
