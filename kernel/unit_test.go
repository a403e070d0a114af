package kernel

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
)

func TestWindow(t *testing.T) {
	const min = time.Minute
	base := time.Unix(0, 0).Add(1000 * min) // aligned
	for _, tc := range []struct {
		name    string
		w       window
		now     time.Time
		sliding bool
		want    float64
	}{
		{"fixed counts the current window", window{Start: base.UnixNano(), Count: 3, Prev: 9}, base.Add(30 * time.Second), false, 3},
		{"sliding weighs the previous window by overlap", window{Start: base.UnixNano(), Count: 3, Prev: 10}, base.Add(15 * time.Second), true, 3 + 10*0.75},
		{"sliding at the end of the window", window{Start: base.UnixNano(), Count: 2, Prev: 10}, base.Add(min), true, 2},
	} {
		if got := tc.w.estimate(tc.now, min, tc.sliding); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	w := window{Start: base.UnixNano(), Count: 4, Prev: 1}
	if r := w.roll(base.Add(10*time.Second), min); r != w {
		t.Errorf("same window rolled: %+v", r)
	}
	if r := w.roll(base.Add(min+time.Second), min); r.Start != base.Add(min).UnixNano() || r.Count != 0 || r.Prev != 4 {
		t.Errorf("next window: %+v", r)
	}
	if r := w.roll(base.Add(5*min), min); r.Count != 0 || r.Prev != 0 {
		t.Errorf("later window keeps nothing: %+v", r)
	}
}

func TestConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"dispatch timeout >= lease", func(c *Config) { c.DispatchTimeout = c.LeaseTimeout }},
		{"no attempts", func(c *Config) { c.DispatchMaxAttempts = -1 }},
		{"bad expiry", func(c *Config) { c.ApprovalExpiry = "shrug" }},
		{"negative dispatch timeout", func(c *Config) { c.DispatchTimeout = -time.Second }},
		{"negative approval timeout", func(c *Config) { c.ApprovalTimeout = -time.Hour }},
		{"backoff max < base", func(c *Config) { c.DispatchBackoff = time.Minute; c.DispatchBackoffMax = time.Second }},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		if c.Validate() == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	c = DefaultConfig().withDefaults()
	for n, want := range map[int]time.Duration{1: 500 * time.Millisecond, 2: time.Second, 3: 2 * time.Second, 20: time.Minute} {
		if got := c.backoff(n); got != want {
			t.Errorf("backoff(%d) = %s, want %s", n, got, want)
		}
	}
}

var uuid7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestIDsAreOrderedUUIDv7(t *testing.T) {
	var g idGen
	now := time.Now()
	prev := ""
	for i := range 10000 {
		id := g.next(now) // same millisecond: the counter keeps order
		if !uuid7.MatchString(id) {
			t.Fatalf("%q is not a UUIDv7", id)
		}
		if id <= prev {
			t.Fatalf("id %d %s not after %s", i, id, prev)
		}
		prev = id
	}
	if later := g.next(now.Add(-time.Hour)); later <= prev {
		t.Fatalf("a clock step back broke ordering: %s <= %s", later, prev)
	}
}

func TestAgentPolicyBundle(t *testing.T) {
	for id, want := range map[string]string{
		"researcher": "agent-researcher",
		"Bot":        "agent-bot-",
		"a:b":        "agent-a-b-",
	} {
		got := AgentPolicyBundle(id)
		if !strings.HasPrefix(got, want) || !ValidBundleName(got) {
			t.Errorf("%q -> %q, want prefix %q and a valid bundle name", id, got, want)
		}
	}
	if AgentPolicyBundle("Bot") == AgentPolicyBundle("bot") {
		t.Error("ids differing only in case share a bundle")
	}
	long := AgentPolicyBundle(strings.Repeat("x", 128))
	if !ValidBundleName(long) {
		t.Errorf("long id gives invalid name %q", long)
	}
}

func TestValidateStep(t *testing.T) {
	for _, tc := range []struct {
		req     StepRequest
		wantErr string
		wantIdm Idempotency
	}{
		{StepRequest{Kind: "tool_call", Target: "x"}, "", AtMostOnce},
		{StepRequest{Kind: "llm_call", Target: "m"}, "", SafeToRetry},
		{StepRequest{Kind: "local", Target: "now"}, "", SafeToRetry},
		{StepRequest{Kind: "tool_call", Target: "x", Idempotency: "safe_to_retry"}, "", SafeToRetry},
		{StepRequest{Kind: "", Target: "x"}, "kind is required", ""},
		{StepRequest{Kind: "shell", Target: "x"}, "kind \"shell\" is invalid", ""},
		{StepRequest{Kind: "local", Target: ""}, "target is required", ""},
		{StepRequest{Kind: "local", Target: strings.Repeat("t", MaxTargetLen+1)}, "longer than", ""},
		{StepRequest{Kind: "local", Target: "x", Idempotency: "twice"}, "idempotency", ""},
		{StepRequest{Kind: "local", Target: "x", Effect: "spooky"}, "effect", ""},
	} {
		req := tc.req
		err := validateStep(&req)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrValidation) {
				t.Errorf("%+v: %v, want validation error %q", tc.req, err, tc.wantErr)
			}
			continue
		}
		if err != nil || req.Idempotency != tc.wantIdm {
			t.Errorf("%+v: %v idempotency %q, want %q", tc.req, err, req.Idempotency, tc.wantIdm)
		}
	}
}

func TestDefaultPolicy(t *testing.T) {
	for _, tc := range []struct {
		action policy.Action
		kind   string
		want   policy.Action
	}{
		{"", "tool_call", policy.Allow},
		{policy.Deny, "tool_call", policy.Deny},
		{policy.Deny, "local", policy.Allow},
	} {
		res, err := DefaultPolicy{Action: tc.action}.Decide(t.Context(), &PolicyRequest{Input: &policy.Input{Step: policy.Step{Kind: tc.kind}}})
		if err != nil || res.Action != tc.want || res.Bundle.Name != "kernel-default" {
			t.Errorf("%+v: %+v %v", tc, res, err)
		}
	}
}

func TestErrorIsMatchesCode(t *testing.T) {
	err := Errorf(CodeLeaseSuperseded, "attempt %d", 3)
	if !errors.Is(err, ErrLeaseSuperseded) || errors.Is(err, ErrConflict) {
		t.Error("Is must match on the code")
	}
	if CodeOf(errors.New("plain")) != CodeInternal || CodeOf(err) != CodeLeaseSuperseded {
		t.Error("CodeOf")
	}
}

func TestProblemDetails(t *testing.T) {
	one := errors.New("bundle.yaml:1: bad")
	if d := problemDetails(one); d != nil {
		t.Errorf("one problem: %v", d)
	}
	multi := fmt.Errorf("rego: compile: %w", errors.Join(errors.New("a.rego:1: x"), errors.New("a.rego:2: y")))
	d := problemDetails(multi)
	if ps, ok := d["problems"].([]string); !ok || len(ps) != 2 || ps[1] != "a.rego:2: y" {
		t.Errorf("details %v", d)
	}
}
