package e2e

import (
	"bytes"
	"context"
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

// TestBadInput sends every kind of bad request an agent can make to a live
// execution and checks each gets a precise error and changes nothing.
func TestBadInput(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast()})
	held := make(chan *testkit.Run, 1)
	release := make(chan struct{})
	var stepID string
	agent := testkit.NewAgent("owner", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		if _, err := r.Step(ctx, "tool_call", "done", map[string]int{"n": 1}, testkit.StepOpts{}, func() (any, error) { return "first", nil }); err != nil {
			return nil, err
		}
		stepID = r.Decisions[0].StepID
		held <- r
		<-release
		return "ok", nil
	})
	agent.HeartbeatEvery = 50 * time.Millisecond
	defer agent.Close()
	env.RegisterAgent(agent, "")
	other := testkit.NewAgent("intruder", "intruder-secret-0123456789", env.URL, nil)
	defer other.Close()
	env.RegisterAgent(other, "")
	id := env.CreateExecution("owner", nil)
	r := <-held
	before := env.Events(id)

	// signWith in a header map asks raw to sign the request (v1) with the
	// secret it names, once method and path are known.
	const signWith = "X-Test-Sign-With"
	raw := func(method, path string, body []byte, headers map[string]string) (int, string) {
		req, _ := http.NewRequest(method, env.URL+path, bytes.NewReader(body))
		for k, v := range headers {
			if k != signWith {
				req.Header.Set(k, v)
			}
		}
		if sec, ok := headers[signWith]; ok {
			wire.SignRequest(req, []byte(sec), body, time.Now())
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	signed := func(agentID string, secret []byte, body []byte, lease *kernel.Lease) map[string]string {
		h := map[string]string{wire.HeaderAgentID: agentID, signWith: string(secret), "Content-Type": "application/json"}
		if lease != nil {
			h[wire.HeaderDispatchID] = lease.DispatchID
			h[wire.HeaderDispatchAttempt] = "1"
		}
		return h
	}
	steps := "/v0/executions/" + id + "/steps"
	sec := []byte(secret)
	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   string
		hdr    func(body []byte) map[string]string
		status int
		want   string
	}{
		{"malformed JSON", "POST", steps, `{"kind":"tool_call",`, func(b []byte) map[string]string { return signed("owner", sec, b, &r.Lease) }, 400, "validation"},
		{"body not an object", "POST", steps, `[1,2]`, func(b []byte) map[string]string { return signed("owner", sec, b, &r.Lease) }, 400, "validation"},
		{"args with duplicate keys", "POST", steps, `{"kind":"tool_call","target":"t","args":{"a":1,"a":2}}`, func(b []byte) map[string]string { return signed("owner", sec, b, &r.Lease) }, 400, "duplicate"},
		{"args nested too deep", "POST", steps, `{"kind":"tool_call","target":"t","args":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}`, func(b []byte) map[string]string { return signed("owner", sec, b, &r.Lease) }, 400, "validation"},
		{"unknown kind", "POST", steps, `{"kind":"shell","target":"t"}`, func(b []byte) map[string]string { return signed("owner", sec, b, &r.Lease) }, 400, "kind"},
		{"wrong signature", "POST", steps, `{"kind":"tool_call","target":"t"}`, func(b []byte) map[string]string { return signed("owner", []byte("not-the-secret-0123"), b, &r.Lease) }, 401, "unauthenticated"},
		{"another agent's execution", "POST", steps, `{"kind":"tool_call","target":"t"}`, func(b []byte) map[string]string {
			return signed("intruder", []byte("intruder-secret-0123456789"), b, &r.Lease)
		}, 401, "unauthenticated"},
		{"unknown execution", "POST", "/v0/executions/01a2265a-0000-7000-8000-000000000000/steps", `{"kind":"tool_call","target":"t"}`, func(b []byte) map[string]string { return signed("owner", sec, b, &r.Lease) }, 401, "unauthenticated"},
		{"unknown step", "POST", steps + "/" + strings.Repeat("0", 64) + "/complete", `{"result":1}`, func(b []byte) map[string]string { return signed("owner", sec, b, &r.Lease) }, 404, "not_found"},
		{"unknown dispatch", "POST", steps, `{"kind":"tool_call","target":"t"}`, func(b []byte) map[string]string {
			return signed("owner", sec, b, &kernel.Lease{DispatchID: "01a2265a-0000-7000-8000-00000000dead", Attempt: 1})
		}, 409, "lease_superseded"},
		{"missing lease headers", "POST", steps, `{"kind":"tool_call","target":"t"}`, func(b []byte) map[string]string { return signed("owner", sec, b, nil) }, 400, "validation"},
		{"oversized body", "POST", steps, `{"kind":"tool_call","target":"t","args":"` + strings.Repeat("x", 2<<20) + `"}`, func(b []byte) map[string]string { return signed("owner", sec, b, &r.Lease) }, 413, "too_large"},
		{"completed step completed again differently", "POST", steps + "/" + stepID + "/complete", `{"result":"second"}`, func(b []byte) map[string]string { return signed("owner", sec, b, &r.Lease) }, 409, "conflict"},
		{"no credentials on a client route", "GET", "/v0/executions/" + id, ``, func([]byte) map[string]string { return nil }, 401, "unauthenticated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, body := raw(tc.method, tc.path, []byte(tc.body), tc.hdr([]byte(tc.body)))
			if st != tc.status || !strings.Contains(body, tc.want) {
				t.Errorf("%d %s, want %d containing %q", st, body, tc.status, tc.want)
			}
		})
	}
	after := env.Events(id)
	if len(after) != len(before) {
		t.Errorf("bad requests changed the log: %v -> %v", testkit.Types(before), testkit.Types(after))
	}
	s, err := env.Kernel.GetStep(context.Background(), "default", id, stepID)
	if err != nil || string(s.Result) != `"first"` {
		t.Errorf("the first result must stand: %+v %v", s, err)
	}
	// The same result again is idempotent.
	if err := r.Client().Do(context.Background(), "POST", steps+"/"+stepID+"/complete", &r.Lease, map[string]any{"result": "first"}, nil); err != nil {
		t.Errorf("identical completion: %v", err)
	}
	close(release)
	env.WaitTerminal(id, 5*time.Second)
}

// TestBundlesSurviveRestart: bundles are stored in the store and loaded again
// at boot; the agent binding keeps deciding after a restart.
func TestBundlesSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	opts := testkit.Options{Dir: dir, Config: fast(), Engines: []plugins.Engine{rules.New()}}
	env := testkit.Start(t, opts)
	agent := testkit.NewAgent("kept", secret, env.URL, nil)
	defer agent.Close()
	env.RegisterAgent(agent, "")
	if _, err := env.Admin("POST", "/v0/policies/kept", map[string]any{"bundle": "default_action: deny\nrules:\n  - id: reads\n    priority: 1\n    when: {effect: read_only}\n    then: {decision: allow}\n"}, nil); err != nil {
		t.Fatal(err)
	}
	env.Close()

	opts.DSN = env.DSN // on PostgreSQL: the same database
	env2 := testkit.Start(t, opts)
	ctx := context.Background()
	for effect, want := range map[string]string{"read_only": "allow", "destructive": "deny"} {
		res, err := env2.Kernel.EvalPolicy(ctx, kernel.EvalRequest{Tenant: "default", AgentID: "kept", Kind: "tool_call", Target: "x", Effect: effect})
		if err != nil || string(res.Action) != want || res.Bundle.Name != kernel.AgentPolicyBundle("kept") {
			t.Errorf("%s after restart: %+v %v, want %s from the agent's bundle", effect, res, err, want)
		}
	}
	var list struct {
		Bundles []kernel.BundleRecord `json:"bundles"`
	}
	if _, err := env2.Admin("GET", "/v0/bundles", nil, &list); err != nil || len(list.Bundles) != 1 {
		t.Errorf("bundles after restart: %+v %v", list, err)
	}
	var ae *testkit.APIError
	if _, err := env2.Admin("GET", "/v0/bundles/nope", nil, nil); !errors.As(err, &ae) || ae.Status != 404 {
		t.Errorf("unknown bundle: %v", err)
	}
}
