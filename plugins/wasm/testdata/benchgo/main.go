// Command benchgo is policy-sdk/c/examples/deny_destructive.c written with
// the Go SDK: the same decisions, for BenchmarkEngines.
package main

import (
	"strings"

	"github.com/wicket-run/wicket/policy-sdk/go/policy"
)

func init() {
	policy.Handle(func(in *policy.Input) *policy.Decision {
		s := &in.Step
		switch {
		case in.AgentID == "root-bot":
			return policy.Abort("agent root-bot may not run").WithRule("no-root-bot")
		case s.Effect == policy.EffectDestructive:
			return policy.Deny("destructive steps are not allowed").WithRule("no-destructive")
		case s.Kind == policy.KindToolCall && s.Target == "shell.exec":
			if cmd, _ := s.StringArg("cmd"); strings.Contains(cmd, "rm ") {
				return policy.RequireApproval("shell command removes files").WithRule("shell-rm")
			}
			return policy.Allow("shell command").WithRule("shell")
		case s.Effect == policy.EffectReadOnly:
			return policy.Allow("read-only step").WithRule("read-only")
		}
		return nil
	})
}

func main() {}
