# OPA's usual boolean shape: default deny, allow rules.
package authz

import rego.v1

default allow := false

allow if {
	input.step.kind == "llm_call"
	input.execution.totals.tokens < 100000
}

allow if {
	input.step.effect == "read_only"
	not regex.match(`(?i)secret|passw`, json.marshal(input.step.args))
}

allow if {
	input.step.target in data.always
	input.execution.status == "running"
}
