package wicket

import rego.v1

# An agent may call the tools of its execution's team (label "team"), until
# the execution has spent the team's budget.

team := data.teams[input.execution.labels.team]

over_budget if input.execution.totals.cost_usd > team.budget_usd

decision := {
	"decision": "deny",
	"rule_id": "over-budget",
	"reason": sprintf("the execution spent %v USD of the team's %v", [input.execution.totals.cost_usd, team.budget_usd]),
} if over_budget

decision := {
	"decision": "allow",
	"rule_id": "team-tool",
	"reason": "a tool of the team",
} if {
	not over_budget
	input.step.target in team.tools
}
