# Approvals and rate limits by effect class, approvers from data.
package wicket

import rego.v1

approvers := {a | some team in data.owners[input.step.target]; some a in data.teams[team]}

decision := {"decision": "abort", "rule_id": "prod-destructive", "reason": "destructive step in production"} if {
	input.step.effect == "destructive"
	input.execution.labels.env == "prod"
} else := {
	"decision": "require_approval", "rule_id": "owners",
	"approval": {"approvers": sort(approvers), "timeout": data.timeouts[input.step.effect], "message": sprintf("%s/%s by %s", [input.tenant, input.step.target, input.agent_id])},
} if {
	input.step.effect in {"remote_mutation", "destructive"}
	count(approvers) > 0
} else := {"decision": "allow", "rule_id": "rate-limited", "rate_limit": {"max_calls": object.get(data.limits, input.step.target, 10), "window": "1m", "per": "execution", "algorithm": "fixed"}} if {
	input.step.kind == "tool_call"
	input.step.effect != "destructive"
}
