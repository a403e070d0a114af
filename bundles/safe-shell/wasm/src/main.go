// Command src is the safe-shell bundle's wasm policy (Wicket ABI, Go SDK).
//
// Shell steps (target shell or shell.exec, any step kind) are allowed when
// args.command is one safe read-only command (ls, cat, echo, pwd, grep, head,
// tail or wc) whose arguments are free of ; & | ` $ < > \ and control
// characters; every other shell step requires an operator's approval. Other
// steps are not matched, so default_action allow applies.
//
// It gives the same decisions as ../../rules and ../../rego. Build it with
// bundles/build.sh (the exact command is in bundles/README.md); the build is
// reproducible and bundles_test.go checks ../policy.wasm against it.
package main

import (
	"regexp"

	"github.com/wicket-run/wicket/policy-sdk/go/policy"
)

// safeCommand is RE2, as in the rules and rego forms. Keep it identical to
// ../../rules/rules.yaml and ../../rego/data.json. (It contains a backtick,
// hence the interpreted string literal.)
var safeCommand = regexp.MustCompile("^(ls|cat|echo|pwd|grep|head|tail|wc)( [^;&|`$<>\\\\[:cntrl:]]*)?$")

var approval = policy.Approval{
	Approvers: []string{"ops"},
	Timeout:   "30m",
	Message: "The agent wants to run a shell command that is not a single safe " +
		"read-only command (ls, cat, echo, pwd, grep, head, tail or wc " +
		"without ; & | ` $ < > \\ or control characters). Check args.command " +
		"before approving.",
}

func init() {
	policy.Handle(decide)
}

func decide(in *policy.Input) *policy.Decision {
	s := &in.Step
	if s.Target != "shell" && s.Target != "shell.exec" {
		return nil // default_action (allow) applies
	}
	// StringArg is false for a missing, non-string or non-object value.
	if cmd, ok := s.StringArg("command"); ok && safeCommand.MatchString(cmd) {
		return policy.Allow("safe read-only shell command").WithRule("shell-safe")
	}
	return policy.RequireApproval("shell command is not on the safe list").
		WithRule("shell-needs-approval").
		WithApproval(approval)
}

// main is never called in a c-shared module; package main must declare it.
func main() {}
