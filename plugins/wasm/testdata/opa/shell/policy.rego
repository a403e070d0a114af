# Shell commands: a regex deny-list from data, approvals for writes, an
# allow-list of read-only commands, reasons built with sprintf.
package wicket

import rego.v1

is_shell if input.step.target in {"shell", "shell.exec"}

command := input.step.args.command if is_string(input.step.args.command)

denied contains p if {
	is_shell
	some p in data.shell.denied_patterns
	regex.match(p, command)
}

decision := {"decision": "deny", "reason": sprintf("command %q matches %s", [command, concat(", ", sort(denied))]), "rule_id": "shell-deny"} if {
	count(denied) > 0
} else := {"decision": "allow", "rule_id": "shell-read-only", "reason": sprintf("%s is read-only", [split(command, " ")[0]])} if {
	is_shell
	regex.match(data.shell.safe, command)
} else := {
	"decision": "require_approval", "rule_id": "shell-approval",
	"approval": {"approvers": data.approvers.ops, "timeout": "30m", "message": sprintf("%s wants to run %q", [input.agent_id, command])},
} if {
	is_shell
	command
} else := {"decision": "deny", "rule_id": "shell-no-command", "reason": "no command string"} if {
	is_shell
}
