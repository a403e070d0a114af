package wicket

known if data.agents[input.agent_id]

default decision := {"decision": "deny", "rule_id": "unknown-agent"}

decision := {"decision": "allow", "rule_id": "listed"} if {
	known
	input.step.target in data.agents[input.agent_id].tools
} else := {"decision": "deny", "rule_id": "not-listed"} if {
	known
}
