# String handling: paths, prefixes, replacements, splits and a scan of every
# string in the arguments.
package wicket

import rego.v1

path := trim_space(input.step.args.path) if is_string(input.step.args.path)

clean := replace(path, "//", "/")

parts := [p | some p in split(clean, "/"); p != ""]

all_strings := [s | walk(input.step.args, [_, s]); is_string(s)]

decision := {"decision": "deny", "rule_id": "traversal", "reason": sprintf("path %s climbs out (%d parts)", [clean, count(parts)])} if {
	".." in parts
} else := {"decision": "deny", "rule_id": "system-path", "reason": sprintf("%s is under %s", [clean, concat("|", data.system)])} if {
	strings.any_prefix_match(clean, data.system)
} else := {"decision": "deny", "rule_id": "injection", "reason": sprintf("argument %q looks like an injection", [s])} if {
	some s in all_strings
	contains(lower(s), "ignore previous instructions")
} else := {"decision": "allow", "rule_id": "workspace", "reason": sprintf("%s in the workspace (%s)", [upper(trim_prefix(clean, "/workspace/")), strings.reverse(input.agent_id)])} if {
	startswith(clean, "/workspace/")
	endswith(clean, data.extensions[_])
}
