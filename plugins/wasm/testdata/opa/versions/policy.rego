# Model and size checks: semantic versions, units, numbers parsed from
# strings, durations.
package wicket

import rego.v1

model := input.step.args.model if is_string(input.step.args.model)

version := trim_prefix(regex.find_n(`v[0-9]+\.[0-9]+\.[0-9]+`, model, 1)[0], "v")

decision := {"decision": "deny", "rule_id": "old-model", "reason": sprintf("%s is older than %s", [version, data.min_version])} if {
	semver.is_valid(version)
	semver.compare(version, data.min_version) < 0
} else := {"decision": "deny", "rule_id": "too-big", "reason": sprintf("upload of %s over %s", [input.step.args.size, data.max_upload])} if {
	units.parse_bytes(input.step.args.size) > units.parse_bytes(data.max_upload)
} else := {"decision": "require_approval", "rule_id": "long-job", "approval": {"timeout": "2h", "message": sprintf("%.1f hours", [time.parse_duration_ns(input.step.args.timeout) / 3600000000000])}} if {
	time.parse_duration_ns(input.step.args.timeout) > time.parse_duration_ns(data.max_timeout)
} else := {"decision": "allow", "rule_id": "sized", "reason": format_int(to_number(input.step.args.count) * 2, 16)} if {
	to_number(input.step.args.count) < 1000
}
