# effect-classes: decisions by the side-effect class the agent declared for
# the step (any step kind): read_only and local_mutation are allowed,
# remote_mutation waits for a human, destructive is denied. A step with no
# declared effect (or an unknown one) is not matched (undefined), so
# default_action deny (bundle.yaml) applies; the kernel still allows an
# unmatched local step.
package wicket

# The classes are disjoint (one effect per step), so at most one of these
# rules is defined for a given input.
decision := {
	"decision": "deny",
	"reason": "destructive steps are not allowed",
	"rule_id": "effect-destructive",
} if input.step.effect == "destructive"

decision := {
	"decision": "require_approval",
	"reason": "a remote side effect needs a human",
	"rule_id": "effect-remote-mutation",
	"approval": {
		"timeout": "1h",
		"message": "The agent declared a remote side effect (remote_mutation). Check the target and arguments before approving.",
	},
} if input.step.effect == "remote_mutation"

decision := {
	"decision": "allow",
	"reason": "local side effects are allowed",
	"rule_id": "effect-local-mutation",
} if input.step.effect == "local_mutation"

decision := {
	"decision": "allow",
	"reason": "reads are allowed",
	"rule_id": "effect-read-only",
} if input.step.effect == "read_only"
