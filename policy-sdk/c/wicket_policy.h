/*
 * wicket_policy.h: C SDK for Wicket wasm policies (policy-sdk/ABI.md).
 *
 * Freestanding: no libc, no WASI. A policy defines one function,
 *
 *     wk_decision wicket_policy(const wk_input *in);
 *
 * and links with wicket_policy.c; build.sh produces policy.wasm. The SDK
 * implements the ABI exports (wicket_alloc, wicket_evaluate,
 * wicket_abi_version), reads fields of the input JSON on demand and writes
 * the decision JSON.
 *
 * Strings (wk_str) point into the input or into the SDK's arena and are valid
 * until wicket_policy returns. The arena is reset at every evaluation.
 */
#ifndef WICKET_POLICY_H
#define WICKET_POLICY_H

#ifdef __cplusplus
extern "C" {
#endif

typedef unsigned long wk_size;

/* A string slice, not NUL-terminated. ok is 0 when the field was absent or
 * not a string. */
typedef struct {
	const char *ptr;
	wk_size len;
	int ok;
} wk_str;

/* The input document of one evaluation (opaque). */
typedef struct wk_input wk_input;

/* How a require_approval answer is approved. Every field is optional. */
typedef struct {
	const char *approvers; /* comma-separated names, e.g. "alice,ops" */
	const char *timeout;   /* Go duration, e.g. "30m" */
	const char *message;   /* shown to the approver */
} wk_approval;

/* A durable rate limit attached to an allow or require_approval answer. */
typedef struct {
	unsigned long max_calls;      /* > 0 */
	const char *window;           /* Go duration, e.g. "1m" */
	const char *per;              /* "execution" (default), "agent" or "tenant" */
	const char *algorithm;        /* "sliding" (default) or "fixed" */
	const char *on_limiter_error; /* "fail_closed" (default) or "fail_open" */
} wk_rate_limit;

/* A policy's answer. decision == 0 means no match (the bundle's
 * default_action applies). Set error instead to report that the policy
 * could not decide (the step is denied with that reason). The approval and
 * rate_limit pointers, when set, must point at storage that outlives the
 * call (a static, typically). */
typedef struct {
	const char *decision; /* "allow", "deny", "require_approval", "abort" or 0 */
	const char *reason;   /* optional */
	const char *rule_id;  /* optional */
	const char *error;    /* optional: {"error": ...} output */
	const wk_approval *approval;     /* optional */
	const wk_rate_limit *rate_limit; /* optional */
} wk_decision;

/* The policy, defined by the policy author. */
wk_decision wicket_policy(const wk_input *in);

/* ---- reading the input ---- */

/* wk_get_string returns the string at a dotted path of object keys, e.g.
 * "step.target", "agent_id", "execution.labels.team", with JSON escapes
 * decoded. */
wk_str wk_get_string(const wk_input *in, const char *path);

/* wk_get_number returns the number at a dotted path, or def when absent or
 * not a number. Integers and plain decimals are supported. */
double wk_get_number(const wk_input *in, const char *path, double def);

/* Shorthands for the common fields. */
wk_str wk_tenant(const wk_input *in);
wk_str wk_agent_id(const wk_input *in);
wk_str wk_step_kind(const wk_input *in);
wk_str wk_step_target(const wk_input *in);
wk_str wk_step_effect(const wk_input *in);
/* wk_arg_string returns step.args.<key> when it is a string. */
wk_str wk_arg_string(const wk_input *in, const char *key);

/* ---- comparing strings ---- */

int wk_eq(wk_str s, const char *lit);          /* s == lit */
int wk_has_prefix(wk_str s, const char *lit);  /* s starts with lit */
int wk_has_suffix(wk_str s, const char *lit);  /* s ends with lit */
int wk_contains(wk_str s, const char *lit);    /* lit occurs in s */

/* ---- answers ---- */

static inline wk_decision wk_no_match(void) { wk_decision d = {0, 0, 0, 0, 0, 0}; return d; }
static inline wk_decision wk_allow(const char *reason, const char *rule) { wk_decision d = {"allow", reason, rule, 0, 0, 0}; return d; }
static inline wk_decision wk_deny(const char *reason, const char *rule) { wk_decision d = {"deny", reason, rule, 0, 0, 0}; return d; }
static inline wk_decision wk_require_approval(const char *reason, const char *rule) { wk_decision d = {"require_approval", reason, rule, 0, 0, 0}; return d; }
static inline wk_decision wk_abort(const char *reason, const char *rule) { wk_decision d = {"abort", reason, rule, 0, 0, 0}; return d; }
static inline wk_decision wk_error(const char *msg) { wk_decision d = {0, 0, 0, msg, 0, 0}; return d; }
/* wk_with_approval and wk_with_rate_limit return d with the option set. */
static inline wk_decision wk_with_approval(wk_decision d, const wk_approval *a) { d.approval = a; return d; }
static inline wk_decision wk_with_rate_limit(wk_decision d, const wk_rate_limit *r) { d.rate_limit = r; return d; }

#ifdef __cplusplus
}
#endif

#endif /* WICKET_POLICY_H */
