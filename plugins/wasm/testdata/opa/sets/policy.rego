# Sets and comprehensions: required labels, team membership, every, object
# and set comprehensions over the arguments.
package wicket

import rego.v1

labels := {k | some k, _ in object.get(input.execution, "labels", {})}

missing := data.required_labels - labels

team_tools := {t | some team in data.teams; input.agent_id in team.members; some t in team.tools}

arg_keys := {k | some k, _ in input.step.args}

secret_keys := {k | some k in arg_keys; some s in data.secret_words; contains(lower(k), s)}

numbers := [x | some x in input.step.args.values; is_number(x)]

in_range if every x in numbers {
	x >= 0
	x <= 100
}

decision := {"decision": "deny", "rule_id": "labels", "reason": sprintf("missing labels: %v", [sort(missing)])} if {
	input.step.kind == "tool_call"
	count(missing) > 0
} else := {"decision": "deny", "rule_id": "secrets", "reason": sprintf("arguments name secrets: %s", [concat(",", sort(secret_keys))])} if {
	count(secret_keys) > 0
} else := {"decision": "deny", "rule_id": "values", "reason": "values out of range"} if {
	count(numbers) > 0
	not in_range
} else := {"decision": "allow", "rule_id": "team", "reason": sprintf("team tool (%d keys)", [count(arg_keys)])} if {
	input.step.target in team_tools
}
