# safe-shell: shell steps (data.safe_shell.targets, any step kind) run without
# a human only when input.step.args.command is a string matching
# data.safe_shell.command_regex: one safe read-only command (ls, cat, echo,
# pwd, grep, head, tail or wc) whose arguments are free of ; & | ` $ < > \
# and control characters. Every other shell step, including a missing, empty
# or non-string command, requires approval. Other steps are not matched
# (undefined), so default_action allow (bundle.yaml) applies.
#
# regex.match is Go's RE2, as in the rules engine; the regex is anchored.
package wicket

decision := {
	"decision": "allow",
	"reason": "safe read-only shell command",
	"rule_id": "shell-safe",
} if {
	shell_step
	safe_command
} else := {
	"decision": "require_approval",
	"reason": "shell command is not on the safe list",
	"rule_id": "shell-needs-approval",
	"approval": data.safe_shell.approval,
} if {
	shell_step
}

shell_step if input.step.target in data.safe_shell.targets

safe_command if {
	command := input.step.args.command
	is_string(command) # regex.match on a non-string is an error, not a mismatch
	regex.match(data.safe_shell.command_regex, command)
}
