// Command basic is an example Wicket wasm policy written with the Go SDK.
//
// Build:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o policy.wasm .
//
// It denies destructive steps, asks for approval before shell commands that
// run "rm", rate-limits LLM calls, allows read-only steps and has no opinion
// on anything else.
package main

import (
	"strings"

	"github.com/wicket-run/wicket/policy-sdk/go/policy"
)

func init() {
	policy.Handle(decide)
}

func decide(in *policy.Input) *policy.Decision {
	s := &in.Step
	switch {
	case s.Effect == policy.EffectDestructive:
		return policy.Deny("destructive steps are not allowed").WithRule("no-destructive")
	case s.Kind == policy.KindToolCall && s.Target == "shell.exec":
		if cmd, _ := s.StringArg("cmd"); strings.Contains(cmd, "rm ") {
			return policy.RequireApproval("shell command removes files").
				WithRule("shell-rm").
				WithApproval(policy.Approval{Approvers: []string{"ops"}, Timeout: "15m"})
		}
		return policy.Allow("shell command").WithRule("shell")
	case s.Kind == policy.KindLLMCall:
		return policy.Allow("llm call").WithRule("llm").
			WithRateLimit(policy.RateLimit{MaxCalls: 100, Window: "1m", Per: policy.PerAgent})
	case s.Effect == policy.EffectReadOnly:
		return policy.Allow("read-only step").WithRule("read-only")
	}
	return nil
}

// main is never called in a c-shared module; it exists because package main
// must declare it.
func main() {}
