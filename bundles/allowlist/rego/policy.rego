# allowlist: deny by default; tool calls to the tools listed in
# data.allowlist.tools (data.json) are allowed.
#
# default_action (deny) lives in bundle.yaml; undefined here means no match.
# Unmatched local steps are allowed by the kernel whatever default_action
# says.
#
# List entries are globs matched with glob.match and no delimiters, so '*'
# matches any run of characters, dots included, as the rules engine's globs
# do. Use only '*' and '?' in entries: '[', '{' and '**' mean more to OPA's
# glob.match than to the rules engine.
package wicket

decision := {
	"decision": "allow",
	"reason": "tool is on the allow-list",
	"rule_id": "allow-listed-tools",
} if {
	input.step.kind == "tool_call"
	some pattern in data.allowlist.tools
	glob.match(pattern, null, input.step.target)
}
