package e2e

import (
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
)

// TestRateLimitClockGoesBack: a rate-limit window is not emptied when the
// kernel's clock reads a time before the window its counter is in (a
// clock stepped back across a restart, or a replica whose clock is behind
// another's at a window's turn): the later window stays the current one
// until the clock reaches it. Before, the counter was reset to the earlier
// window and the limit's calls were all available again. A counter more
// than a window ahead (a clock that was set wrong, then put right) starts
// afresh rather than holding the limit shut until then.
func TestRateLimitClockGoesBack(t *testing.T) {
	turn := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC) // a window's start: windows are aligned to the epoch
	clk := newTestClock(turn.Add(time.Second))
	cfg := kernel.Config{Clock: clk, ReapInterval: time.Hour, LeaseTimeout: 24 * time.Hour}
	env := testkit.Start(t, testkit.Options{Config: cfg, Engines: []plugins.Engine{rules.New()}})
	policy := `default_action: allow
rules:
  - id: fixed
    when: {target: fixed}
    then: {decision: allow, rate_limit: {max_calls: 2, window: 1m, per: agent, algorithm: fixed}}
  - id: sliding
    when: {target: sliding}
    then: {decision: allow, rate_limit: {max_calls: 2, window: 1m, per: agent}}
`
	if _, err := env.Admin("POST", "/v0/agents", map[string]any{"id": "caller", "secret": secret}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Admin("POST", "/v0/policies/caller", map[string]any{"bundle": policy}, nil); err != nil {
		t.Fatal(err)
	}
	s := beginSession(t, env, "caller")
	n := 0
	want := func(target, decision string) {
		t.Helper()
		n++
		if d := s.step(target, map[string]any{"n": n}); d.Decision != decision {
			t.Fatalf("call %d to %s at %s: %s (%s), want %s", n, target, clk.Now().Format(time.TimeOnly), d.Decision, d.Reason, decision)
		}
	}
	for _, target := range []string{"fixed", "sliding"} {
		clk.set(turn.Add(time.Second))
		want(target, "proceed")
		want(target, "proceed")
		want(target, "rate_limited")
		// Two seconds back, into the previous window: still the same count.
		clk.set(turn.Add(-time.Second))
		want(target, "rate_limited")
		clk.set(turn.Add(2 * time.Second))
		want(target, "rate_limited")
	}
	// The fixed window turns when the clock reaches the next one.
	clk.set(turn.Add(time.Minute))
	want("fixed", "proceed")
	// A counter more than a window ahead of the clock (it was set an hour
	// ahead, then put right) is not held against the calls of now.
	clk.set(turn.Add(time.Hour))
	want("fixed", "proceed")
	want("fixed", "proceed")
	want("fixed", "rate_limited")
	clk.set(turn.Add(2 * time.Minute))
	want("fixed", "proceed")
}
