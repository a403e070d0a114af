/* options.c exercises the C SDK's approval and rate-limit options
 * (TestCSDKOptions). */
#include "wicket_policy.h"

static const wk_approval deploy_approval = {"alice, ops,,bob", "30m", "deploy \"prod\"?"};
static const wk_rate_limit search_limit = {25, "1m", "agent", "fixed", "fail_open"};

wk_decision wicket_policy(const wk_input *in) {
	wk_str target = wk_step_target(in);
	if (wk_eq(target, "deploy"))
		return wk_with_approval(wk_require_approval("deploys need a human", "deploy"), &deploy_approval);
	if (wk_eq(target, "search"))
		return wk_with_rate_limit(wk_allow("", "search"), &search_limit);
	return wk_no_match();
}
