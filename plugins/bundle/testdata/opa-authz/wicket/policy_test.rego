package wicket.tests

import data.wicket

test_listed_tool_allowed if {
	d := wicket.decision with input as {"agent_id": "researcher", "step": {"target": "fs.read", "args": {}}}
	d.decision == "allow"
}

test_rm_rf_denied if {
	d := wicket.decision with input as {"agent_id": "researcher", "step": {"target": "shell.exec", "args": {"command": "rm -rf /"}}}
	d.rule_id == "dangerous"
}
