package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
)

// TestClientCommands drives exec, agent, approval and tenant commands
// against a real kernel and agent.
func TestClientCommands(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()},
		Config: kernel.Config{LeaseTimeout: 2 * time.Second, DispatchTimeout: time.Second, ReapInterval: 20 * time.Millisecond}})
	ctx := context.Background()
	cli := func(args ...string) string {
		t.Helper()
		out, errOut, err := runCmd(t, ctx, append(args, "--url", env.URL, "--key", testkit.AdminKey)...)
		if err != nil {
			t.Fatalf("wicket %v: %v\n%s", args, err, errOut)
		}
		return out
	}
	agent := testkit.NewAgent("cli", "cli-secret-0123456789", env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		if _, err := r.Step(ctx, "tool_call", "deploy", nil, testkit.StepOpts{}, func() (any, error) { return "shipped", nil }); err != nil {
			return nil, err
		}
		return "done", nil
	})
	defer agent.Close()

	if out := cli("agent", "put", "cli", "--webhook-url", agent.WebhookURL(), "--secret", "cli-secret-0123456789"); !strings.Contains(out, `"id": "cli"`) || strings.Contains(out, "secret") {
		t.Fatalf("agent put: %s", out)
	}
	if _, err := env.Admin("POST", "/v0/policies/cli", map[string]any{"bundle": "default_action: allow\nrules:\n  - id: gate\n    priority: 1\n    when: {target: deploy}\n    then: {decision: require_approval}\n"}, nil); err != nil {
		t.Fatal(err)
	}
	if out := cli("agent", "ls"); !strings.Contains(out, `"cli"`) {
		t.Errorf("agent ls: %s", out)
	}
	var x kernel.Execution
	if err := json.Unmarshal([]byte(cli("exec", "create", "cli", "--input", `{"n":1}`, "--idempotency-key", "k1")), &x); err != nil || x.ID == "" {
		t.Fatalf("exec create: %v", err)
	}
	var again kernel.Execution
	_ = json.Unmarshal([]byte(cli("exec", "create", "cli", "--input", `{"n":1}`, "--idempotency-key", "k1")), &again)
	if again.ID != x.ID {
		t.Errorf("idempotent create gave %s and %s", x.ID, again.ID)
	}
	env.WaitStatus(x.ID, 10*time.Second, func(s kernel.ExecStatus) bool { return s == kernel.ExecBlocked })
	var list struct{ Approvals []kernel.Approval }
	if err := json.Unmarshal([]byte(cli("approval", "ls", "--status", "pending")), &list); err != nil || len(list.Approvals) != 1 {
		t.Fatalf("approval ls: %+v %v", list, err)
	}
	if out := cli("approval", "grant", list.Approvals[0].ID, "--by", "ops", "--rationale", "ok"); !strings.Contains(out, `"status": "granted"`) {
		t.Errorf("grant: %s", out)
	}
	if got := env.WaitTerminal(x.ID, 10*time.Second); got.Status != kernel.ExecCompleted {
		t.Fatalf("after grant: %s", got.Status)
	}
	if out := cli("exec", "get", x.ID); !strings.Contains(out, `"status": "completed"`) {
		t.Errorf("exec get: %s", out)
	}
	if out := cli("exec", "events", x.ID); !strings.Contains(out, "approval.granted") || !strings.Contains(out, "execution.completed") {
		t.Errorf("exec events: %s", out)
	}
	if out := cli("exec", "watch", x.ID); !strings.Contains(out, `"execution.completed"`) {
		t.Errorf("exec watch of a finished execution: %s", out)
	}
	if out := cli("exec", "ls", "--agent", "cli"); !strings.Contains(out, x.ID) {
		t.Errorf("exec ls: %s", out)
	}
	if _, _, err := runCmd(t, ctx, "exec", "cancel", x.ID, "--url", env.URL, "--key", testkit.AdminKey); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("cancel of a completed execution: %v", err)
	}

	cli("tenant", "create", "acme")
	var key struct{ KeyID, Key string }
	out := cli("tenant", "key", "create", "acme", "--role", "client", "--principal", "ci")
	if err := json.Unmarshal([]byte(out), &struct {
		KeyID *string `json:"key_id"`
		Key   *string `json:"key"`
	}{&key.KeyID, &key.Key}); err != nil || key.Key == "" {
		t.Fatalf("key create: %s %v", out, err)
	}
	if out := cli("tenant", "key", "ls", "acme"); !strings.Contains(out, key.KeyID) || strings.Contains(out, key.Key) {
		t.Errorf("key ls must list the key but never its secret: %s", out)
	}
	// The tenant's key sees none of the default tenant's executions.
	if out, _, err := runCmd(t, ctx, "exec", "get", x.ID, "--url", env.URL, "--key", key.Key); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("tenant key reading another tenant's execution: %q %v", out, err)
	}
	cli("tenant", "key", "rm", "acme", key.KeyID)
	if _, _, err := runCmd(t, ctx, "exec", "ls", "--url", env.URL, "--key", key.Key); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("revoked key: %v", err)
	}
	if _, _, err := runCmd(t, ctx, "exec", "create", "cli", "--input", "{nope", "--url", env.URL); err == nil {
		t.Error("bad --input accepted")
	}
	if out := cli("agent", "rm", "cli"); !strings.Contains(out, "deleted cli") {
		t.Errorf("agent rm: %s", out)
	}
}
