package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/server/wire"
)

// testClock is a kernel clock that moves only when a test moves it: an
// approval lapses, or a rate-limit window turns, exactly when the test
// says, never because a loaded machine stalled it.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock(at time.Time) *testClock { return &testClock{now: at} }

// Now implements kernel.Clock.
func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

func (c *testClock) add(d time.Duration) { c.set(c.Now().Add(d)) }

// gateSession is a session of a gate-only agent, driven with the admin key.
type gateSession struct {
	t     *testing.T
	env   *testkit.Env
	id    string
	lease map[string]string
}

// beginSession begins a session of agent.
func beginSession(t *testing.T, env *testkit.Env, agent string) *gateSession {
	t.Helper()
	var s wire.Session
	if _, err := env.Admin("POST", "/v0/sessions", map[string]any{"agent_id": agent}, &s); err != nil {
		t.Fatalf("begin a session of %s: %v", agent, err)
	}
	return &gateSession{t: t, env: env, id: s.Execution.ID,
		lease: map[string]string{wire.HeaderDispatchID: s.DispatchID, wire.HeaderDispatchAttempt: fmt.Sprint(s.DispatchAttempt)}}
}

// step submits a tool call and returns the kernel's answer.
func (s *gateSession) step(target string, args any) wire.StepDecision {
	s.t.Helper()
	var d wire.StepDecision
	if _, err := testkit.BearerWithHeaders(s.env.URL, testkit.AdminKey, "POST", "/v0/executions/"+s.id+"/steps", s.lease,
		map[string]any{"kind": "tool_call", "target": target, "args": args}, &d); err != nil {
		s.t.Fatalf("submit %s: %v", target, err)
	}
	return d
}
