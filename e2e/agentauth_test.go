package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// TestAgentAuthTellsNothingOfOtherTenants: against a real `wicket serve`,
// an agent's credentials on the agent routes say nothing about the
// executions of other tenants. Tenant beta has an agent of the same id as
// the agent of alpha's execution (agent ids are names a tenant picks, so
// they collide), with its own secret; whatever beta's agent sends about
// alpha's execution (a signed read, a signed mutation under alpha's lease,
// the other signing scheme, a malformed or stale signature) is answered
// exactly as the same request about an execution that never existed:
// same status, code, message and connection handling. Nothing is recorded
// on alpha's execution.
func TestAgentAuthTellsNothingOfOtherTenants(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t))
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	for _, tenant := range []string{"alpha", "beta"} {
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/tenants", map[string]any{"id": tenant}, nil); err != nil {
			t.Fatal(err)
		}
	}
	bot, leases, release := parkedAgent(t, "bot", "", p.url)
	defer close(release)
	body := map[string]any{"id": "bot", "webhook_url": bot.WebhookURL(), "secret": string(bot.Secret)}
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/agents?tenant=alpha", body, nil); err != nil {
		t.Fatal(err)
	}
	const betaSecret = "beta-bot-secret-0123456789abcdef"
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/agents?tenant=beta", map[string]any{"id": "bot", "secret": betaSecret}, nil); err != nil {
		t.Fatal(err)
	}
	var x kernel.Execution
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/executions?tenant=alpha", map[string]any{"agent_id": "bot", "input": 1}, &x); err != nil {
		t.Fatal(err)
	}
	var run *testkit.Run
	select {
	case run = <-leases:
	case <-time.After(30 * time.Second):
		t.Fatal("no dispatch")
	}
	lease := run.Lease
	events := func() int {
		var l struct {
			Events []json.RawMessage `json:"events"`
		}
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "GET", "/v0/executions/"+x.ID+"/events?tenant=alpha&limit=1000", nil, &l); err != nil {
			t.Fatal(err)
		}
		return len(l.Events)
	}
	// The webhook's answer is recorded (dispatch.acked) after the agent
	// got the lease: count alpha's events once it is.
	for deadline := time.Now().Add(30 * time.Second); execution(t, p.url, x.ID+"?tenant=alpha").Dispatch.State != kernel.DispatchAcked; {
		if time.Now().After(deadline) {
			t.Fatal("the dispatch was never acknowledged")
		}
		time.Sleep(5 * time.Millisecond)
	}
	n0 := events()

	const unknown = "01a2265a-0000-7000-8000-00000000beef"
	type answer struct {
		status    int
		code, msg string
		closed    bool // the server closes the connection
	}
	ask := func(c captured, id string) answer {
		req, err := http.NewRequest(c.method, p.url+c.target, strings.NewReader(string(c.body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = c.header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e wire.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return answer{resp.StatusCode, e.Code, strings.ReplaceAll(e.Message, id, "ID"), resp.Close}
	}
	now := time.Now()
	for _, tc := range []struct {
		name string
		// req builds the request about the execution id.
		req func(id string) captured
	}{
		{"signed read", func(id string) captured {
			return agentRequest("bot", betaSecret, kernel.SigningV1, "GET", "/v0/executions/"+id, nil, nil, now)
		}},
		{"signed read of the events", func(id string) captured {
			return agentRequest("bot", betaSecret, kernel.SigningV1, "GET", "/v0/executions/"+id+"/events", nil, nil, now)
		}},
		{"signed heartbeat under alpha's lease", func(id string) captured {
			return agentRequest("bot", betaSecret, kernel.SigningV1, "POST", "/v0/executions/"+id+"/heartbeat", &lease, []byte("{}"), now)
		}},
		{"signed completion under alpha's lease", func(id string) captured {
			return agentRequest("bot", betaSecret, kernel.SigningV1, "POST", "/v0/executions/"+id+"/complete", &lease, []byte(`{"output":"forged"}`), now)
		}},
		{"signed step under alpha's lease", func(id string) captured {
			return agentRequest("bot", betaSecret, kernel.SigningV1, "POST", "/v0/executions/"+id+"/steps", &lease, []byte(`{"kind":"local","target":"x","args":{}}`), now)
		}},
		{"the body scheme", func(id string) captured {
			return agentRequest("bot", betaSecret, kernel.SigningBody, "POST", "/v0/executions/"+id+"/heartbeat", &lease, []byte("{}"), now)
		}},
		{"a malformed signature", func(id string) captured {
			c := agentRequest("bot", betaSecret, kernel.SigningV1, "GET", "/v0/executions/"+id, nil, nil, now)
			c.header.Set(wire.HeaderWicketSignature, "x")
			return c
		}},
		{"a stale signature", func(id string) captured {
			return agentRequest("bot", betaSecret, kernel.SigningV1, "GET", "/v0/executions/"+id, nil, nil, now.Add(-time.Hour))
		}},
		{"an agent registered nowhere", func(id string) captured {
			return agentRequest("nobody", betaSecret, kernel.SigningV1, "GET", "/v0/executions/"+id, nil, nil, now)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, want := ask(tc.req(x.ID), x.ID), ask(tc.req(unknown), unknown)
			if got != want {
				t.Errorf("about alpha's execution: %+v\nabout an unknown one:  %+v", got, want)
			}
			if got.status == http.StatusOK || got.status >= 500 {
				t.Errorf("answered %+v", got)
			}
		})
	}
	if n := events(); n != n0 {
		t.Errorf("alpha's execution has %d events after the attacks, %d before", n, n0)
	}
	if got := execution(t, p.url, x.ID+"?tenant=alpha"); got.Status != kernel.ExecRunning {
		t.Errorf("alpha's execution is %s", got.Status)
	}
}
