package wicket.policy_test

import rego.v1

import data.wicket

test_team_tool_allowed if {
	d := wicket.decision with input as {"step": {"target": "search"}, "execution": {"labels": {"team": "web"}, "totals": {"cost_usd": 0}}}
	d.decision == "allow"
}

test_unknown_team_has_no_answer if {
	not wicket.decision with input as {"step": {"target": "search"}, "execution": {"labels": {"team": "sales"}, "totals": {"cost_usd": 0}}}
}
