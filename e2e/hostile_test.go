package e2e

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/wasm"
)

// TestHostileWasm runs a misbehaving wasm policy inside a running kernel: a
// module stuck in a loop, one that eats memory and one that panics each get
// the step denied with a reason that says which, the kernel stays healthy
// and the next evaluation is served; a module importing a host function no
// sandbox grants is refused at upload.
func TestHostileWasm(t *testing.T) {
	hostile := buildWasm(t, "hostile-wasm")
	forbidden := buildWasm(t, "forbidden-wasm")
	cfg := fast()
	cfg.LeaseTimeout, cfg.DispatchTimeout = 10*time.Second, time.Second // evaluations may take a while here
	env := testkit.Start(t, testkit.Options{Config: cfg, Engines: []plugins.Engine{wasm.New(wasm.Config{CacheDir: wasmCache, Builtins: rego.NewHostBuiltins()})}})
	upload := func(name string, archive []byte) (int, error) {
		return testkit.BearerWithHeaders(env.URL, testkit.AdminKey, "PUT", "/v0/bundles/"+name, map[string]string{"Content-Type": "application/gzip"}, archive, nil)
	}
	if _, err := upload("hostile", wasmArchive(t, "name: hostile\nrevision: \"1\"\nengine: wasm\ndefault_action: deny\nsandbox: {timeout: 1s, memory_pages: 96}\n", hostile)); err != nil {
		t.Fatalf("upload hostile bundle: %v", err)
	}
	st, err := upload("forbidden", wasmArchive(t, "name: forbidden\nrevision: \"1\"\nengine: wasm\n", forbidden))
	if st != 400 || err == nil || !strings.Contains(err.Error(), "env.http_get") {
		t.Errorf("forbidden import: %d %v, want 400 naming env.http_get", st, err)
	}
	if _, ok := env.Host.Live("default", "forbidden"); ok {
		t.Error("a refused bundle is live")
	}

	type result struct {
		target string
		d      kernel.StepDecision
	}
	results := make(chan result, 8)
	agent := testkit.NewAgent("victim", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		for _, target := range []string{"loop", "fine", "bomb", "fine", "panic", "fine"} {
			_, err := r.Step(ctx, "tool_call", target, nil, testkit.StepOpts{}, func() (any, error) { return "ran", nil })
			var de *testkit.DecisionError
			switch {
			case err == nil:
				results <- result{target, r.Decisions[len(r.Decisions)-1]}
			case errors.As(err, &de):
				results <- result{target, de.Decision}
			default:
				return nil, err
			}
		}
		return "survived", nil
	})
	defer agent.Close()
	env.RegisterAgent(agent, "hostile")
	id := env.CreateExecution("victim", nil)
	want := []struct {
		target   string
		decision kernel.Decision
		reason   string
	}{
		{"loop", "denied", "timed out after 1s"},
		{"fine", "proceed", ""},
		{"bomb", "denied", "memory"},
		{"fine", "proceed", ""},
		{"panic", "denied", "policy bug"},
		{"fine", "proceed", ""},
	}
	for _, w := range want {
		select {
		case got := <-results:
			if got.target != w.target || got.d.Decision != w.decision || !strings.Contains(got.d.Reason, w.reason) {
				t.Errorf("%s: %s %q, want %s with a reason containing %q", got.target, got.d.Decision, got.d.Reason, w.decision, w.reason)
			}
			if w.decision == "denied" && got.d.RuleID != "engine_error" {
				t.Errorf("%s: rule_id %q, want engine_error", got.target, got.d.RuleID)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no decision for %s", w.target)
		}
		resp, err := http.Get(env.URL + "/v0/health")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("kernel unhealthy after %s: %v", w.target, err)
		}
		resp.Body.Close()
	}
	x := env.WaitTerminal(id, 10*time.Second)
	if x.Status != kernel.ExecCompleted {
		t.Fatalf("execution %s", x.Status)
	}
	mustCheckLog(t, env, id)
}
