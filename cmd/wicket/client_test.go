package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/server/wire"
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
	if out := cli("agent", "get", "cli"); !strings.Contains(out, `"signing": "v1"`) {
		t.Errorf("a new agent's scheme: %s", out)
	}
	if out := cli("agent", "put", "cli-seeds", "--webhook-url", agent.WebhookURL(), "--secret", "cli-secret-0123456789", "--signing", "body"); !strings.Contains(out, `"signing": "body"`) {
		t.Errorf("agent put --signing body: %s", out)
	}
	if out := cli("agent", "ls"); !strings.Contains(out, "\ncli  ") {
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
	if err := json.Unmarshal([]byte(cli("approval", "ls", "--status", "pending", "--json")), &list); err != nil || len(list.Approvals) != 1 {
		t.Fatalf("approval ls: %+v %v", list, err)
	}
	// An approver key decides as itself: no --by needed, and naming someone
	// else is refused.
	var ak struct{ Key string }
	if _, err := env.Admin("POST", "/v0/tenants/default/keys", map[string]any{"role": "approver", "principal": "ops"}, &ak); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, ctx, "approval", "grant", list.Approvals[0].ID, "--by", "someone-else", "--url", env.URL, "--key", ak.Key); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("approval grant --by another person with an approver key: %v", err)
	}
	if out, _, err := runCmd(t, ctx, "approval", "grant", list.Approvals[0].ID, "--rationale", "ok", "--url", env.URL, "--key", ak.Key); err != nil ||
		!strings.Contains(out, `"status": "granted"`) || !strings.Contains(out, `"decided_by": "ops"`) {
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
	// Guards: an admin-owned bundle of the tenant, set and removed.
	if _, err := env.Admin("PUT", "/v0/bundles/no-rm?tenant=acme", map[string]any{"engine": "rules", "files": map[string]string{"rules.yaml": "rules: []\n"}}, nil); err != nil {
		t.Fatal(err)
	}
	if out := cli("tenant", "guards", "acme", "--set", "no-rm"); !strings.Contains(out, `"no-rm"`) {
		t.Errorf("tenant guards --set: %s", out)
	}
	if _, _, err := runCmd(t, ctx, "tenant", "guards", "acme", "--set", "ghost", "--url", env.URL, "--key", testkit.AdminKey); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("tenant guards naming no bundle: %v", err)
	}
	if out := cli("tenant", "guards", "acme", "--set", ""); strings.Contains(out, "no-rm") {
		t.Errorf("tenant guards --set \"\": %s", out)
	}
	var key struct{ KeyID, Key string }
	out := cli("tenant", "key", "create", "acme", "--role", "client", "--principal", "ci")
	if err := json.Unmarshal([]byte(out), &struct {
		KeyID *string `json:"key_id"`
		Key   *string `json:"key"`
	}{&key.KeyID, &key.Key}); err != nil || key.Key == "" {
		t.Fatalf("key create: %s %v", out, err)
	}
	if out := cli("tenant", "key", "create", "acme", "--role", "approver", "--principal", "alice"); !strings.Contains(out, `"role": "approver"`) {
		t.Errorf("approver key: %s", out)
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

// TestExecStreamCommands covers exec create --wait, exec events over more
// than one page, exec watch's line format, --tenant and agent unbinding.
func TestExecStreamCommands(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()},
		Config: kernel.Config{LeaseTimeout: 5 * time.Second, DispatchTimeout: time.Second, ReapInterval: 20 * time.Millisecond}})
	ctx := context.Background()
	cli := func(args ...string) (string, error) {
		t.Helper()
		out, _, err := runCmd(t, ctx, append(args, "--url", env.URL, "--key", testkit.AdminKey)...)
		return out, err
	}
	steps := func(n int) testkit.Handler {
		return func(ctx context.Context, r *testkit.Run) (any, error) {
			for i := range n {
				if _, err := r.Step(ctx, "local", "count", i, testkit.StepOpts{}, func() (any, error) { return i, nil }); err != nil {
					return nil, err
				}
			}
			if n == 0 {
				return nil, errors.New("nothing to do")
			}
			return n, nil
		}
	}
	for id, n := range map[string]int{"long": 260, "short": 2, "broken": 0} {
		a := testkit.NewAgent(id, "cli-secret-0123456789", env.URL, steps(n))
		t.Cleanup(a.Close)
		env.RegisterAgent(a, "")
	}

	// eventLines parses the event lines of watch and create --wait and
	// returns them with what follows them.
	eventLines := func(out string) ([]wire.Event, string) {
		t.Helper()
		var evs []wire.Event
		for strings.HasPrefix(out, `{"execution_id"`) {
			line, rest, _ := strings.Cut(out, "\n")
			var ev wire.Event
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			evs = append(evs, ev)
			out = rest
		}
		return evs, out
	}
	checkLog := func(evs []wire.Event, terminal string) {
		t.Helper()
		for i, ev := range evs {
			if ev.Seq != uint64(i+1) {
				t.Fatalf("event %d has seq %d", i, ev.Seq)
			}
		}
		if len(evs) == 0 || evs[len(evs)-1].Type != terminal {
			t.Fatalf("%d events, want the last to be %s", len(evs), terminal)
		}
	}

	// create --wait: the events, then the final execution.
	out, err := cli("exec", "create", "short", "--input", `{"n":2}`, "--wait")
	if err != nil {
		t.Fatal(err)
	}
	evs, rest := eventLines(out)
	checkLog(evs, "execution.completed")
	var x wire.Execution
	if err := json.Unmarshal([]byte(rest), &x); err != nil || x.Status != "completed" || x.ID != evs[0].ExecutionID || string(x.Output) != "2" {
		t.Fatalf("final execution %q: %v", rest, err)
	}
	if !strings.HasPrefix(rest, `{"id":`) || strings.Count(rest, "\n") != 1 {
		t.Fatalf("the final execution is not one line of JSON: %q", rest)
	}
	out, err = cli("exec", "create", "broken", "--wait")
	if err == nil || !strings.Contains(err.Error(), "failed") {
		t.Fatalf("create --wait of a failing execution: %v", err)
	}
	evs, rest = eventLines(out)
	checkLog(evs, "execution.failed")
	if !strings.Contains(rest, `"status":"failed"`) {
		t.Fatalf("final execution: %s", rest)
	}

	// events: the whole log, past the first 1000.
	out, err = cli("exec", "create", "long", "--wait")
	if err != nil {
		t.Fatal(err)
	}
	watched, _ := eventLines(out)
	checkLog(watched, "execution.completed")
	if len(watched) <= 1000 {
		t.Fatalf("only %d events", len(watched))
	}
	id := watched[0].ExecutionID
	var list wire.EventList
	out, err = cli("exec", "events", id)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	checkLog(list.Events, "execution.completed")
	if len(list.Events) != len(watched) {
		t.Fatalf("events printed %d, watched %d", len(list.Events), len(watched))
	}
	out, err = cli("exec", "events", id, "--after", "1000")
	if err != nil {
		t.Fatal(err)
	}
	list = wire.EventList{}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Events) != len(watched)-1000 || list.Events[0].Seq != 1001 {
		t.Fatalf("events --after 1000: %d events, %v", len(list.Events), err)
	}

	// watch, streaming and polling, from a seq.
	for _, mode := range [][]string{nil, {"--poll"}} {
		out, err := cli(append([]string{"exec", "watch", id, "--after", "5"}, mode...)...)
		if err != nil {
			t.Fatal(err)
		}
		got, rest := eventLines(out)
		if rest != "" || len(got) != len(watched)-5 || got[0].Seq != 6 || got[len(got)-1].Type != "execution.completed" {
			t.Fatalf("watch %v: %d events, rest %q", mode, len(got), rest)
		}
	}
	// --brief: one line per event, seq and type first, same count.
	for _, args := range [][]string{{"exec", "events", id, "--brief"}, {"exec", "watch", id, "--brief"}} {
		out, err := cli(args...)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != len(watched) {
			t.Fatalf("%v: %d lines, want %d", args, len(lines), len(watched))
		}
		for i, l := range lines {
			f := strings.Fields(l)
			if len(f) < 2 || f[0] != fmt.Sprint(watched[i].Seq) || f[1] != watched[i].Type {
				t.Fatalf("%v line %d: %q, want seq %d type %s", args, i, l, watched[i].Seq, watched[i].Type)
			}
		}
		if !strings.Contains(lines[6], "local  count") {
			t.Fatalf("%v: a step line does not name its kind and target: %q", args, lines[6])
		}
	}
	if _, err := cli("exec", "watch", "nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("watch of an unknown execution: %v", err)
	}

	// --tenant: an admin acting in another tenant.
	if _, err := cli("tenant", "create", "acme"); err != nil {
		t.Fatal(err)
	}
	if out, err := cli("agent", "put", "there", "--webhook-url", "http://127.0.0.1:9/", "--secret", "cli-secret-0123456789", "--tenant", "acme"); err != nil || !strings.Contains(out, `"tenant": "acme"`) {
		t.Fatalf("agent put --tenant: %s %v", out, err)
	}
	if out, err := cli("agent", "ls", "--tenant", "acme"); err != nil || !strings.Contains(out, "there ") || strings.Contains(out, "short ") {
		t.Fatalf("agent ls --tenant: %s %v", out, err)
	}
	if out, err := cli("exec", "ls", "--tenant", "acme", "--json"); err != nil || !strings.Contains(out, `"executions": []`) {
		t.Fatalf("exec ls --tenant: %s %v", out, err)
	}

	// agent put --bundle binds, an omitted --bundle keeps, --bundle '' unbinds.
	if _, err := env.Admin("PUT", "/v0/bundles/b", map[string]any{"engine": "rules", "files": map[string]string{"rules.yaml": "default_action: allow\n"}}, nil); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		args []string
		want string
	}{
		{[]string{"--bundle", "b"}, `"bundle": "b"`},
		{nil, `"bundle": "b"`},
		{[]string{"--bundle", ""}, ""},
	} {
		out, err := cli(append([]string{"agent", "put", "short"}, step.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(out, `"bundle"`); got != (step.want != "") || (step.want != "" && !strings.Contains(out, step.want)) {
			t.Fatalf("agent put %v: %s", step.args, out)
		}
	}
}
