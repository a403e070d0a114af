# Budgets and time: cost and token caps, an age limit measured from the
# execution's creation time, business hours in UTC, and rate limits.
package wicket

import rego.v1

created_ns := time.parse_rfc3339_ns(input.execution.created_at)

clock := time.clock([created_ns, "UTC"])

weekday := time.weekday(created_ns)

cost := input.execution.totals.cost_usd

decision := {"decision": "deny", "rule_id": "cost-cap", "reason": sprintf("cost %.2f USD is over %.2f", [cost, data.caps.cost_usd])} if {
	cost > data.caps.cost_usd
} else := {"decision": "deny", "rule_id": "token-cap", "reason": sprintf("%d tokens used", [input.execution.totals.tokens])} if {
	input.execution.totals.tokens > data.caps.tokens
} else := {"decision": "require_approval", "rule_id": "off-hours", "approval": {"timeout": "1h", "message": sprintf("%s at %02d:%02d on %s", [input.step.target, clock[0], clock[1], weekday])}} if {
	input.step.effect in {"remote_mutation", "destructive"}
	not business_hours
} else := {"decision": "allow", "rule_id": "llm-budget", "rate_limit": {"max_calls": data.caps.llm_per_minute, "window": "1m", "per": "agent"}} if {
	input.step.kind == "llm_call"
} else := {"decision": "allow", "rule_id": "in-budget"} if {
	input.step.effect in {"read_only", "local_mutation"}
}

business_hours if {
	not weekday in {"Saturday", "Sunday"}
	clock[0] >= 8
	clock[0] < 18
}
