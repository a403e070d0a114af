package plugins_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rules"
)

// TestPrepareIsTheUploadCheck: a bundle the loader accepts but its engine
// refuses (three problems in rules.yaml, a duplicate id among them) is
// refused alike by an upload (Host.Compile) and by Host.Prepare, which the
// CLI runs, with every problem listed.
func TestPrepareIsTheUploadCheck(t *testing.T) {
	src := rulesSrc("three", "1", `rules:
  - {id: a, then: {decision: allow}}
  - {id: a, then: {decision: allow}}
  - {id: b, then: {decision: maybe}}
  - {id: c, when: {step_kind: teleport}, then: {decision: deny}}
`, "")
	h := plugins.NewHost(plugins.Options{}, rules.New())
	defer h.Close()
	ctx := context.Background()
	_, uploadErr := h.Compile(ctx, "acme", src)
	b, err := bundle.Options{}.LoadFiles(src.Files)
	if err != nil {
		t.Fatalf("the loader refused what only the engine can: %v", err)
	}
	_, prepareErr := h.Prepare(ctx, b)
	if uploadErr == nil || prepareErr == nil || uploadErr.Error() != prepareErr.Error() {
		t.Fatalf("upload: %v\nprepare: %v", uploadErr, prepareErr)
	}
	var es bundle.Errors
	if !errors.As(prepareErr, &es) || len(es) != 3 {
		t.Fatalf("want three problems, got %v", prepareErr)
	}
	want := []string{
		`rules.yaml:3: rule "a": id: duplicate id (also rules[0])`,
		`rules.yaml:4: rule "b": then.decision: unknown decision "maybe"`,
		`rules.yaml:5: rule "c": when.step_kind: unknown step kind "teleport"`,
	}
	for i, w := range want {
		if !strings.HasPrefix(es[i].Error(), w) || es[i].File != "rules.yaml" || es[i].Item == "" || es[i].Field == "" {
			t.Errorf("problem %d = %q (%+v), want %q", i, es[i], es[i], w)
		}
	}
}

// TestPreparedDecide: what a bundle alone decides, as the kernel would: the
// default action, the rate limits that count the step, and the fail-closed
// denial when the engine fails.
func TestPreparedDecide(t *testing.T) {
	src := rulesSrc("ops", "1", `default_action: deny
rules:
  - id: github
    when: {target: "github.*"}
    then: {decision: allow, rate_limit: {max_calls: 5, window: 1h}}
`, "rate_limits:\n  - {id: writes, targets: [\"github.create*\"], max_calls: 3, window: 1m}\n")
	b, err := bundle.Options{}.LoadFiles(src.Files)
	if err != nil {
		t.Fatal(err)
	}
	h := plugins.NewHost(plugins.Options{}, rules.New())
	p, err := h.Prepare(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	a := p.Decide(ctx, input("github.create_issue", ""))
	if !a.Matched || a.Err != nil || a.Answer.Action != policy.Allow || len(a.RateLimits) != 2 || a.RateLimits[0].ID != "ops/github" || a.RateLimits[1].ID != "ops/writes" {
		t.Errorf("github.create_issue: %+v", a)
	}
	a = p.Decide(ctx, input("other", ""))
	if a.Matched || a.Answer.Action != policy.Deny || a.Answer.RuleID != "default_action" || len(a.RateLimits) != 0 {
		t.Errorf("other: %+v", a)
	}

	// An engine that fails to answer: the kernel's fail-closed denial.
	f := plugins.NewHost(plugins.Options{}, failing{})
	fp, err := f.Prepare(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer fp.Close()
	a = fp.Decide(ctx, input("github.x", ""))
	if a.Err == nil || a.Matched || a.Answer.Action != policy.Deny || a.Answer.RuleID != "engine_error" || !strings.Contains(a.Answer.Reason, "broken on purpose") {
		t.Errorf("failing engine: %+v", a)
	}
}

// failing is a rules engine whose evaluator always fails.
type failing struct{}

func (failing) Name() string { return bundle.EngineRules }

func (failing) Compile(context.Context, *bundle.Bundle) (policy.Evaluator, error) {
	return failing{}, nil
}

func (failing) Evaluate(context.Context, *policy.Input) (*policy.Answer, error) {
	return nil, errors.New("broken on purpose")
}

func (failing) Close() error { return nil }

// TestPrepareChecksCeilings: Prepare refuses a manifest over the host's
// Limits exactly as an upload does (so `wicket policy build` refuses what a
// kernel with the same ceilings refuses), reports the sandbox values a
// bundle gets, and an upload whose engine fails after its wasm memory was
// reserved gives the reservation back.
func TestPrepareChecksCeilings(t *testing.T) {
	ctx := context.Background()
	src := rulesSrc("slow", "1", "rules: []\n", "sandbox: {timeout: 1h}\n")
	b, err := bundle.Options{}.LoadFiles(src.Files)
	if err != nil {
		t.Fatalf("the loader refused what only the ceilings can: %v", err)
	}
	h := plugins.NewHost(plugins.Options{}, rules.New())
	defer h.Close()
	_, uploadErr := h.Compile(ctx, "acme", src)
	_, prepareErr := h.Prepare(ctx, b)
	if prepareErr == nil || uploadErr == nil || prepareErr.Error() != uploadErr.Error() || !errors.Is(prepareErr, bundle.ErrCeiling) {
		t.Fatalf("upload: %v\nprepare: %v", uploadErr, prepareErr)
	}
	if !strings.Contains(prepareErr.Error(), "sandbox.timeout: 1h0m0s exceeds the kernel's ceiling of 2s") {
		t.Errorf("prepare: %v", prepareErr)
	}
	// A kernel with a higher ceiling takes it, with that timeout.
	hi := plugins.NewHost(plugins.Options{Limits: bundle.Limits{MaxTimeout: 2 * time.Hour}}, rules.New())
	defer hi.Close()
	p, err := hi.Prepare(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Sandbox.Timeout != time.Hour {
		t.Errorf("sandbox timeout %s, want 1h", p.Sandbox.Timeout)
	}

	// The engine refuses a wasm bundle after the host reserved its memory.
	w := plugins.NewHost(plugins.Options{Limits: bundle.Limits{TenantMemory: 4 << 20}}, refusingWasm{})
	defer w.Close()
	_, err = w.Compile(ctx, "acme", wasmSrc("w", "{memory_pages: 16, pool_size: 2}"))
	if err == nil || !strings.Contains(err.Error(), "refused on purpose") {
		t.Fatalf("compile: %v", err)
	}
	if r, _ := w.TenantMemory("acme"); r != 0 {
		t.Errorf("a refused bundle still reserves %d bytes", r)
	}
}

// refusingWasm is a wasm engine that refuses every bundle.
type refusingWasm struct{}

func (refusingWasm) Name() string { return bundle.EngineWasm }

func (refusingWasm) Compile(context.Context, *bundle.Bundle) (policy.Evaluator, error) {
	return nil, errors.New("refused on purpose")
}
