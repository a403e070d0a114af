# Tool allow-list by glob patterns kept in data, per agent, with a
# tenant-wide block list.
package wicket

import rego.v1

target := input.step.target

blocked if {
	some p in data.blocked
	glob.match(p, ["."], target)
}

allowed contains p if {
	some p in object.get(data.agents, input.agent_id, data.agents["*"])
	glob.match(p, ["."], target)
}

decision := {"decision": "deny", "rule_id": "blocked", "reason": sprintf("%s is blocked for every agent", [target])} if {
	blocked
} else := {"decision": "allow", "rule_id": "allow-listed", "reason": sprintf("%s matches %s", [target, concat(", ", sort(allowed))])} if {
	count(allowed) > 0
} else := {"decision": "deny", "rule_id": "not-listed", "reason": sprintf("%s may not call %s", [input.agent_id, target])} if {
	input.step.kind == "tool_call"
}
