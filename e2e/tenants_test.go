package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
)

// TestTenantIsolation: two tenants with the same agent id, each with its own
// keys, bundle and approval; neither can see or touch the other's on any
// route, and agents sign only for their own tenant.
func TestTenantIsolation(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast(), Engines: []plugins.Engine{rules.New()}})
	if _, err := env.Admin("POST", "/v0/tenants", map[string]any{"id": "acme"}, nil); err != nil {
		t.Fatal(err)
	}
	key := func(tenant string) string {
		var k struct{ Key string }
		if _, err := env.Admin("POST", "/v0/tenants/"+tenant+"/keys", map[string]any{"role": "tenant-admin", "principal": tenant + "-ops"}, &k); err != nil {
			t.Fatal(err)
		}
		return k.Key
	}
	keys := map[string]string{"default": key("default"), "acme": key("acme")}
	gate := "default_action: allow\nrules:\n  - id: gate\n    priority: 1\n    when: {target: deploy}\n    then: {decision: require_approval}\n"
	execs, approvals := map[string]string{}, map[string]string{}
	for _, tenant := range []string{"default", "acme"} {
		secret := tenant + "-agent-secret-0123456789"
		a := testkit.NewAgent("bot", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
			_, err := r.Step(ctx, "tool_call", "deploy", nil, testkit.StepOpts{}, func() (any, error) { return "ok", nil })
			return nil, err
		})
		defer a.Close()
		k := keys[tenant]
		if _, err := env.As(k, "POST", "/v0/agents", map[string]any{"id": "bot", "webhook_url": a.WebhookURL(), "secret": secret}, nil); err != nil {
			t.Fatalf("%s: register: %v", tenant, err)
		}
		if _, err := env.As(k, "POST", "/v0/policies/bot", map[string]any{"bundle": gate}, nil); err != nil {
			t.Fatalf("%s: policy: %v", tenant, err)
		}
		var x kernel.Execution
		if _, err := env.As(k, "POST", "/v0/executions", map[string]any{"agent_id": "bot"}, &x); err != nil {
			t.Fatal(err)
		}
		if x.Tenant != tenant {
			t.Fatalf("execution tenant %q, want %q", x.Tenant, tenant)
		}
		execs[tenant] = x.ID
		deadline := time.Now().Add(10 * time.Second)
		for approvals[tenant] == "" {
			var list struct{ Approvals []kernel.Approval }
			if _, err := env.As(k, "GET", "/v0/approvals?status=pending", nil, &list); err != nil {
				t.Fatal(err)
			}
			for _, ap := range list.Approvals {
				if ap.ExecutionID == x.ID {
					approvals[tenant] = ap.ID
				}
				if ap.Tenant != tenant {
					t.Fatalf("%s lists an approval of %s", tenant, ap.Tenant)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no approval", tenant)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	other := map[string]string{"default": "acme", "acme": "default"}
	for tenant, k := range keys {
		o := other[tenant]
		for _, c := range []struct{ method, path string }{
			{"GET", "/v0/executions/" + execs[o]},
			{"GET", "/v0/executions/" + execs[o] + "/events"},
			{"GET", "/v0/executions/" + execs[o] + "/steps"},
			{"POST", "/v0/executions/" + execs[o] + "/cancel"},
			{"GET", "/v0/approvals/" + approvals[o]},
			{"POST", "/v0/approvals/" + approvals[o] + "/grant"},
			{"POST", "/v0/approvals/" + approvals[o] + "/deny"},
		} {
			st, err := env.As(k, c.method, c.path, map[string]any{"decided_by": "mallory"}, nil)
			if st != 404 {
				t.Errorf("%s key: %s %s (%s's) = %d %v, want 404", tenant, c.method, c.path, o, st, err)
			}
		}
		// Same names, own records: each sees its own agent and bundle only.
		var bundles struct{ Bundles []kernel.BundleRecord }
		if _, err := env.As(k, "GET", "/v0/bundles", nil, &bundles); err != nil || len(bundles.Bundles) != 1 || bundles.Bundles[0].Tenant != tenant {
			t.Errorf("%s bundles: %+v %v", tenant, bundles, err)
		}
		var list struct{ Executions []kernel.Execution }
		if _, err := env.As(k, "GET", "/v0/executions", nil, &list); err != nil || len(list.Executions) != 1 || list.Executions[0].ID != execs[tenant] {
			t.Errorf("%s executions: %+v %v", tenant, list, err)
		}
	}
	// An agent signs for its own tenant only: acme's bot cannot act on the
	// default tenant's execution of the agent with the same id.
	acmeBot := &testkit.Client{BaseURL: env.URL, AgentID: "bot", Secret: []byte("acme-agent-secret-0123456789")}
	var ae *testkit.APIError
	err := acmeBot.Do(context.Background(), "GET", "/v0/executions/"+execs["default"], nil, nil, nil)
	if !errors.As(err, &ae) || ae.Status != 401 {
		t.Errorf("acme's agent reading default's execution: %v, want 401", err)
	}
	// Each tenant resolves its own approval; the executions finish apart.
	for tenant, k := range keys {
		if _, err := env.As(k, "POST", "/v0/approvals/"+approvals[tenant]+"/grant", map[string]any{"decided_by": tenant + "-ops"}, nil); err != nil {
			t.Fatalf("%s grant: %v", tenant, err)
		}
	}
	for tenant, id := range execs {
		var x kernel.Execution
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := env.As(keys[tenant], "GET", "/v0/executions/"+id, nil, &x); err != nil {
				t.Fatal(err)
			}
			if x.Status.Terminal() || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if x.Status != kernel.ExecCompleted {
			t.Errorf("%s execution: %s", tenant, x.Status)
		}
	}
}
