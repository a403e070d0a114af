// Command src is the effect-classes bundle's wasm policy (Wicket ABI, Go
// SDK): decisions by the side-effect class the agent declared for the step
// (any step kind). read_only and local_mutation are allowed, remote_mutation
// requires approval, destructive is denied; no (or an unknown) effect is not
// matched, so default_action deny applies (the kernel still allows an
// unmatched local step).
//
// It gives the same decisions as ../../rules and ../../rego. Build it with
// bundles/build.sh (the exact command is in bundles/README.md); the build is
// reproducible and bundles_test.go checks ../policy.wasm against it.
package main

import "github.com/wicket-run/wicket/policy-sdk/go/policy"

func init() {
	policy.Handle(decide)
}

func decide(in *policy.Input) *policy.Decision {
	switch in.Step.Effect {
	case policy.EffectDestructive:
		return policy.Deny("destructive steps are not allowed").WithRule("effect-destructive")
	case policy.EffectRemoteMutation:
		return policy.RequireApproval("a remote side effect needs a human").
			WithRule("effect-remote-mutation").
			WithApproval(policy.Approval{
				Timeout: "1h",
				Message: "The agent declared a remote side effect (remote_mutation). " +
					"Check the target and arguments before approving.",
			})
	case policy.EffectLocalMutation:
		return policy.Allow("local side effects are allowed").WithRule("effect-local-mutation")
	case policy.EffectReadOnly:
		return policy.Allow("reads are allowed").WithRule("effect-read-only")
	}
	return nil // no or unknown effect: default_action (deny) applies
}

// main is never called in a c-shared module; package main must declare it.
func main() {}
