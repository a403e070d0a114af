package policy

import (
	"strings"
	"testing"
)

func TestCombine(t *testing.T) {
	a := &Answer{Action: Allow, RuleID: "a"}
	r := &Answer{Action: RequireApproval, RuleID: "r"}
	d := &Answer{Action: Deny, RuleID: "d"}
	x := &Answer{Action: Abort, RuleID: "x"}
	for _, tc := range []struct {
		in   []*Answer
		want string
	}{
		{nil, ""},
		{[]*Answer{nil, nil}, ""},
		{[]*Answer{a}, "a"},
		{[]*Answer{a, r}, "r"},
		{[]*Answer{r, d, a}, "d"},
		{[]*Answer{d, x, r}, "x"},
		{[]*Answer{a, {Action: Allow, RuleID: "a2"}}, "a"},  // first of equals wins
		{[]*Answer{a, {Action: "maybe", RuleID: "m"}}, "m"}, // unknown ranks as deny
	} {
		got := Combine(tc.in...)
		if (got == nil && tc.want != "") || (got != nil && got.RuleID != tc.want) {
			t.Errorf("Combine(%v) = %+v, want %q", tc.in, got, tc.want)
		}
	}
}

func TestApplyDefault(t *testing.T) {
	for _, tc := range []struct {
		d    *Answer
		def  Action
		kind string
		want Action
	}{
		{nil, Deny, KindToolCall, Deny},
		{nil, "", KindToolCall, Deny},
		{nil, Allow, KindLLMCall, Allow},
		{nil, Deny, KindLocal, Allow}, // unmatched local steps are always allowed
		{&Answer{Action: Deny}, Allow, KindLocal, Deny},
	} {
		if got := ApplyDefault(tc.d, tc.def, tc.kind); got.Action != tc.want {
			t.Errorf("ApplyDefault(%+v, %s, %s) = %s, want %s", tc.d, tc.def, tc.kind, got.Action, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    *Answer
		ok   bool
	}{
		{"nil", nil, true},
		{"allow", &Answer{Action: Allow}, true},
		{"unknown decision", &Answer{Action: "maybe"}, false},
		{"bad approval timeout", &Answer{Action: RequireApproval, Approval: &Approval{Timeout: "soon"}}, false},
		{"good rate limit", &Answer{Action: Allow, RateLimit: &RateLimit{MaxCalls: 3, Window: "1m", Per: PerAgent, Algorithm: "fixed", OnLimiterError: "fail_open"}}, true},
		{"zero max calls", &Answer{Action: Allow, RateLimit: &RateLimit{MaxCalls: 0, Window: "1m"}}, false},
		{"negative window", &Answer{Action: Allow, RateLimit: &RateLimit{MaxCalls: 1, Window: "-1m"}}, false},
		{"bad scope", &Answer{Action: Allow, RateLimit: &RateLimit{MaxCalls: 1, Window: "1m", Per: "planet"}}, false},
		{"bad algorithm", &Answer{Action: Allow, RateLimit: &RateLimit{MaxCalls: 1, Window: "1m", Algorithm: "leaky"}}, false},
		{"bad limiter error mode", &Answer{Action: Allow, RateLimit: &RateLimit{MaxCalls: 1, Window: "1m", OnLimiterError: "shrug"}}, false},
		{"reason at the ceiling", &Answer{Action: Deny, Reason: strings.Repeat("r", MaxReasonBytes)}, true},
		{"reason too long", &Answer{Action: Deny, Reason: strings.Repeat("r", MaxReasonBytes+1)}, false},
		{"rule id too long", &Answer{Action: Deny, RuleID: strings.Repeat("r", MaxRuleIDBytes+1)}, false},
		{"approval message too long", &Answer{Action: RequireApproval, Approval: &Approval{Message: strings.Repeat("m", MaxReasonBytes+1)}}, false},
		{"too many approvers", &Answer{Action: RequireApproval, Approval: &Approval{Approvers: make([]string, MaxApprovers+1)}}, false},
		{"an approver too long", &Answer{Action: RequireApproval, Approval: &Approval{Approvers: []string{strings.Repeat("a", MaxRuleIDBytes+1)}}}, false},
	} {
		if err := tc.d.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestStrictest(t *testing.T) {
	a := &Answer{Action: Allow}
	d := &Answer{Action: Deny}
	for _, tc := range []struct {
		in   []*Answer
		want int
	}{
		{nil, -1},
		{[]*Answer{nil}, -1},
		{[]*Answer{nil, a}, 1},
		{[]*Answer{a, nil, d, d}, 2}, // the first of the most restrictive
	} {
		if got := Strictest(tc.in); got != tc.want {
			t.Errorf("Strictest(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
}
