/*
 * deny_destructive: an example Wicket policy in C.
 *
 *   - destructive steps are denied;
 *   - shell.exec commands containing "rm " need approval;
 *   - anything from agent "root-bot" is aborted;
 *   - read-only steps are allowed;
 *   - everything else: no match (the bundle's default_action applies).
 *
 * Build: policy-sdk/c/build.sh policy-sdk/c/examples/deny_destructive.c policy-sdk/c/examples/deny_destructive.wasm
 */
#include "../wicket_policy.h"

wk_decision wicket_policy(const wk_input *in) {
	if (wk_eq(wk_agent_id(in), "root-bot"))
		return wk_abort("agent root-bot may not run", "no-root-bot");
	if (wk_eq(wk_step_effect(in), "destructive"))
		return wk_deny("destructive steps are not allowed", "no-destructive");
	if (wk_eq(wk_step_kind(in), "tool_call") && wk_eq(wk_step_target(in), "shell.exec")) {
		if (wk_contains(wk_arg_string(in, "cmd"), "rm "))
			return wk_require_approval("shell command removes files", "shell-rm");
		return wk_allow("shell command", "shell");
	}
	if (wk_eq(wk_step_effect(in), "read_only"))
		return wk_allow("read-only step", "read-only");
	return wk_no_match();
}
