package policy

import "testing"

func TestCombine(t *testing.T) {
	a := &Decision{Decision: Allow, RuleID: "a"}
	r := &Decision{Decision: RequireApproval, RuleID: "r"}
	d := &Decision{Decision: Deny, RuleID: "d"}
	x := &Decision{Decision: Abort, RuleID: "x"}
	for _, tc := range []struct {
		in   []*Decision
		want string
	}{
		{nil, ""},
		{[]*Decision{nil, nil}, ""},
		{[]*Decision{a}, "a"},
		{[]*Decision{a, r}, "r"},
		{[]*Decision{r, d, a}, "d"},
		{[]*Decision{d, x, r}, "x"},
		{[]*Decision{a, {Decision: Allow, RuleID: "a2"}}, "a"},  // first of equals wins
		{[]*Decision{a, {Decision: "maybe", RuleID: "m"}}, "m"}, // unknown ranks as deny
	} {
		got := Combine(tc.in...)
		if (got == nil && tc.want != "") || (got != nil && got.RuleID != tc.want) {
			t.Errorf("Combine(%v) = %+v, want %q", tc.in, got, tc.want)
		}
	}
}

func TestApplyDefault(t *testing.T) {
	for _, tc := range []struct {
		d    *Decision
		def  Action
		kind string
		want Action
	}{
		{nil, Deny, KindToolCall, Deny},
		{nil, "", KindToolCall, Deny},
		{nil, Allow, KindLLMCall, Allow},
		{nil, Deny, KindLocal, Allow}, // unmatched local steps are always allowed
		{&Decision{Decision: Deny}, Allow, KindLocal, Deny},
	} {
		if got := ApplyDefault(tc.d, tc.def, tc.kind); got.Decision != tc.want {
			t.Errorf("ApplyDefault(%+v, %s, %s) = %s, want %s", tc.d, tc.def, tc.kind, got.Decision, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    *Decision
		ok   bool
	}{
		{"nil", nil, true},
		{"allow", &Decision{Decision: Allow}, true},
		{"unknown decision", &Decision{Decision: "maybe"}, false},
		{"bad approval timeout", &Decision{Decision: RequireApproval, Approval: &Approval{Timeout: "soon"}}, false},
		{"good rate limit", &Decision{Decision: Allow, RateLimit: &RateLimit{MaxCalls: 3, Window: "1m", Per: PerAgent, Algorithm: "fixed", OnLimiterError: "fail_open"}}, true},
		{"zero max calls", &Decision{Decision: Allow, RateLimit: &RateLimit{MaxCalls: 0, Window: "1m"}}, false},
		{"negative window", &Decision{Decision: Allow, RateLimit: &RateLimit{MaxCalls: 1, Window: "-1m"}}, false},
		{"bad scope", &Decision{Decision: Allow, RateLimit: &RateLimit{MaxCalls: 1, Window: "1m", Per: "planet"}}, false},
		{"bad algorithm", &Decision{Decision: Allow, RateLimit: &RateLimit{MaxCalls: 1, Window: "1m", Algorithm: "leaky"}}, false},
		{"bad limiter error mode", &Decision{Decision: Allow, RateLimit: &RateLimit{MaxCalls: 1, Window: "1m", OnLimiterError: "shrug"}}, false},
	} {
		if err := tc.d.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
