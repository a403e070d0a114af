/*
 * reader.c: exercises the C SDK's JSON reader for plugins/wasm tests
 * (TestCSDKReader). It answers allow with a reason that reports what it read,
 * selected by step.target.
 */
#include "../../../../policy-sdk/c/wicket_policy.h"

static char buf[512];

/* show copies s into buf as the reason ("<absent>" when missing). */
static const char *show(wk_str s) {
	if (!s.ok) return "<absent>";
	wk_size n = s.len < sizeof buf - 1 ? s.len : sizeof buf - 1;
	for (wk_size i = 0; i < n; i++) buf[i] = s.ptr[i];
	buf[n] = 0;
	return buf;
}

static const char *show_number(double v) {
	long long i = (long long)(v * 100); /* two decimals */
	char tmp[32];
	int n = 0, neg = i < 0;
	if (neg) i = -i;
	do { tmp[n++] = (char)('0' + i % 10); i /= 10; } while (i);
	int o = 0;
	if (neg) buf[o++] = '-';
	while (n--) buf[o++] = tmp[n];
	buf[o] = 0;
	return buf;
}

wk_decision wicket_policy(const wk_input *in) {
	wk_str target = wk_step_target(in);
	if (wk_eq(target, "arg")) return wk_allow(show(wk_arg_string(in, "q")), "arg");
	if (wk_eq(target, "label")) return wk_allow(show(wk_get_string(in, "execution.labels.team")), "label");
	if (wk_eq(target, "tokens")) return wk_allow(show_number(wk_get_number(in, "execution.totals.tokens", -1)), "tokens");
	if (wk_eq(target, "cost")) return wk_allow(show_number(wk_get_number(in, "execution.totals.cost_usd", -1)), "cost");
	if (wk_eq(target, "missing")) return wk_allow(show(wk_get_string(in, "step.args.nope")), "missing");
	if (wk_eq(target, "tenant")) return wk_allow(show(wk_tenant(in)), "tenant");
	if (wk_has_prefix(target, "pre.") && wk_has_suffix(target, ".post")) return wk_deny("prefix and suffix", "affix");
	if (wk_eq(target, "error")) return wk_error("cannot decide \"this\"");
	return wk_no_match();
}
