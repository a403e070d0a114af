package wicket

import data.lib

known if data.agents[input.agent_id]

default decision := {"decision": "deny", "rule_id": "unknown-agent", "reason": "the agent is not listed in agents/data.json"}

decision := {"decision": "deny", "rule_id": "dangerous", "reason": sprintf("%s: %s is dangerous", [input.step.target, input.step.args.command])} if {
	known
	input.step.target in data.tools.guarded
	lib.dangerous(input.step.args.command)
} else := {"decision": "allow", "rule_id": "listed", "reason": sprintf("%s may use %s", [input.agent_id, input.step.target])} if {
	known
	input.step.target in data.agents[input.agent_id].tools
} else := {"decision": "deny", "rule_id": "not-listed", "reason": sprintf("%s may not use %s", [input.agent_id, input.step.target])} if {
	known
}
