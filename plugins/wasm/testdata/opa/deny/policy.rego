# OPA's usual deny-set shape: each rule adds a message.
package authz

import rego.v1

deny contains sprintf("%s is destructive", [input.step.target]) if input.step.effect == "destructive"

deny contains sprintf("agent %s is not registered", [input.agent_id]) if not input.agent_id in data.agents

deny contains msg if {
	some k, v in input.step.args
	is_string(v)
	count(v) > data.max_arg_len
	msg := sprintf("argument %s is %d bytes long", [k, count(v)])
}

deny contains {"msg": sprintf("%s needs the %s label", [input.step.target, l])} if {
	some l in data.labels_for[input.step.target]
	not input.execution.labels[l]
}
