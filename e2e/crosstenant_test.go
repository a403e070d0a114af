package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/server/wire"
)

// TestOtherTenantsIdsTellNothing: against a real `wicket serve`, every
// route that takes an id answers beta's keys (tenant-admin, client,
// approver) the same for alpha's real ids (an execution held at an
// approval, its step, the approval, a key, an agent, its policy bundle) as
// for ids that never existed: same status, same body once the id is
// replaced, and nothing of alpha's changes (its approval stays pending).
func TestOtherTenantsIdsTellNothing(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t))
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	admins := tenantAdmins(t, p.url, "alpha", "beta")
	mk := func(tenant, role string) wire.CreatedKey {
		var k wire.CreatedKey
		st, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/tenants/"+tenant+"/keys", map[string]any{"role": role, "principal": tenant + "-" + role}, &k)
		wantStatus(t, "key", st, err, 201)
		return k
	}
	alphaClient := mk("alpha", "client")
	betaClient, betaApprover := mk("beta", "client"), mk("beta", "approver")
	const secret = "bot-secret-0123456789"
	a := testkit.NewAgent("bot", secret, p.url, func(ctx context.Context, r *testkit.Run) (any, error) {
		return r.Step(ctx, "tool_call", "wire", map[string]any{"amount": 100}, testkit.StepOpts{}, func() (any, error) { return "sent", nil })
	})
	defer a.Close()
	st, err := testkit.Bearer(p.url, admins["alpha"], "POST", "/v0/agents", map[string]any{"id": "bot", "webhook_url": a.WebhookURL(), "secret": secret}, nil)
	wantStatus(t, "register", st, err, 201)
	st, err = testkit.Bearer(p.url, admins["alpha"], "POST", "/v0/policies/bot", map[string]any{"bundle": "default_action: allow\nrules:\n  - id: money\n    priority: 1\n    when: {target: wire}\n    then:\n      decision: require_approval\n"}, nil)
	wantStatus(t, "policy", st, err, 200)
	var x wire.Execution
	st, err = testkit.Bearer(p.url, alphaClient.Key, "POST", "/v0/executions", map[string]any{"agent_id": "bot"}, &x)
	wantStatus(t, "create", st, err, 201)
	var ap wire.Approval
	for deadline := time.Now().Add(20 * time.Second); ap.ID == ""; {
		var l wire.ApprovalList
		testkit.Bearer(p.url, admins["alpha"], "GET", "/v0/approvals?status=pending", nil, &l)
		if len(l.Approvals) > 0 {
			ap = l.Approvals[0]
		} else if time.Now().After(deadline) {
			t.Fatal("no approval")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var keys wire.KeyList
	st, err = testkit.Bearer(p.url, admins["alpha"], "GET", "/v0/tenants/alpha/keys", nil, &keys)
	wantStatus(t, "alpha's keys", st, err, 200)
	fakeExec := "0" + x.ID[1:]
	raw := func(key, method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, p.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 600))
		return resp.StatusCode, string(b)
	}
	type probe struct{ method, path, body string }
	probes := func(exec, step, appr, keyID, agent string) []probe {
		return []probe{
			{"GET", "/v0/executions/" + exec, ""},
			{"GET", "/v0/executions/" + exec + "/events", ""},
			{"GET", "/v0/executions/" + exec + "/stream", ""},
			{"GET", "/v0/executions/" + exec + "/steps", ""},
			{"GET", "/v0/executions/" + exec + "/steps/" + step, ""},
			{"POST", "/v0/executions/" + exec + "/cancel", "{}"},
			{"POST", "/v0/executions/" + exec + "/attach", "{}"},
			{"POST", "/v0/executions/" + exec + "/detach", "{}"},
			{"POST", "/v0/executions/" + exec + "/probe", "{}"},
			{"POST", "/v0/executions/" + exec + "/heartbeat", "{}"},
			{"POST", "/v0/executions/" + exec + "/steps", `{"kind":"tool_call","target":"x"}`},
			{"POST", "/v0/executions/" + exec + "/steps/" + step + "/complete", `{"result":1}`},
			{"GET", "/v0/approvals/" + appr, ""},
			{"POST", "/v0/approvals/" + appr + "/grant", "{}"},
			{"POST", "/v0/approvals/" + appr + "/deny", "{}"},
			{"POST", "/v0/approvals/" + appr + "/retry", "{}"},
			{"POST", "/v0/approvals/" + appr + "/happened", "{}"},
			{"DELETE", "/v0/tenants/beta/keys/" + keyID, ""},
			{"GET", "/v0/agents/" + agent, ""},
			{"DELETE", "/v0/agents/" + agent, ""},
			{"POST", "/v0/policies/" + agent, `{"bundle":"default_action: allow\n"}`},
			{"GET", "/v0/bundles/agent-" + agent, ""},
			{"POST", "/v0/policy/eval", `{"agent_id":"` + agent + `","step":{"kind":"tool_call","target":"x"}}`},
			{"GET", "/v0/executions?agent_id=" + agent, ""},
			{"GET", "/v0/tenants/alpha/keys", ""},
			{"GET", "/v0/executions/" + exec + "/stream?tenant=alpha", ""},
			{"GET", "/v0/executions/" + exec + "?tenant=alpha", ""},
		}
	}
	real := probes(x.ID, ap.StepID, ap.ID, keys.Keys[0].KeyID, "bot")
	fake := probes(fakeExec, "s"+ap.StepID[1:], "0"+ap.ID[1:], "key_00000000000000000000", "nobot")
	for who, key := range map[string]string{"beta-admin": admins["beta"], "beta-client": betaClient.Key, "beta-approver": betaApprover.Key} {
		for i := range real {
			s1, b1 := raw(key, real[i].method, real[i].path, real[i].body)
			s2, b2 := raw(key, fake[i].method, fake[i].path, fake[i].body)
			b1n := strings.NewReplacer(x.ID, "X", ap.ID, "A", ap.StepID, "S", keys.Keys[0].KeyID, "K", "bot", "B").Replace(b1)
			b2n := strings.NewReplacer(fakeExec, "X", "0"+ap.ID[1:], "A", "s"+ap.StepID[1:], "S", "key_00000000000000000000", "K", "nobot", "B").Replace(b2)
			list := strings.HasPrefix(real[i].path, "/v0/executions?")
			if s1 != s2 || b1n != b2n || s1/100 == 2 && !list || s1 == 0 {
				t.Errorf("%s %s %s: %d %q for alpha's id, %d %q for an unknown one", who, real[i].method, real[i].path, s1, b1n, s2, b2n)
			}
		}
	}
	st, err = testkit.Bearer(p.url, admins["alpha"], "GET", "/v0/approvals/"+ap.ID, nil, &ap)
	wantStatus(t, "alpha's approval", st, err, 200)
	if ap.Status != "pending" {
		t.Errorf("alpha's approval is %s after beta's attempts, want pending", ap.Status)
	}
}
