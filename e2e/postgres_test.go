package e2e

import (
	"testing"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
)

// TestOnPostgres runs the end-to-end suites (protocol, policy with rate
// limits and approvals, tenants) once more with the kernel on PostgreSQL:
// each test below, unchanged, on a schema of its own. It skips without
// WICKET_TEST_POSTGRES (see pgtest).
func TestOnPostgres(t *testing.T) {
	pgtest.BaseDSN(t)
	testkit.UseBackend(t, testkit.Postgres)
	suites := []struct {
		name string
		fn   func(*testing.T)
	}{
		// protocol
		{"EndToEnd", TestEndToEnd},
		{"ReplayAfterRedelivery", TestReplayAfterRedelivery},
		{"LeaseSuperseded", TestLeaseSuperseded},
		{"ManyConcurrentExecutions", TestManyConcurrentExecutions},
		{"Orphans", TestOrphans},
		{"DispatchRetryAndExhaustion", TestDispatchRetryAndExhaustion},
		{"Cancel", TestCancel},
		{"IdempotentCreate", TestIdempotentCreate},
		{"ListPaging", TestListPaging},
		{"LostAcknowledgement", TestLostAcknowledgement},
		{"BadInput", TestBadInput},
		// policy, limits, rate limits, approvals
		{"PolicyDecisionsPerEngine", TestPolicyDecisionsPerEngine},
		{"BadBundleKeepsRunningRevision", TestBadBundleKeepsRunningRevision},
		{"BundlesSurviveRestart", TestBundlesSurviveRestart},
		{"ExecutionLimits", TestExecutionLimits},
		{"RateLimitScopes", TestRateLimitScopes},
		{"SDKApprovalAcrossAgentRestart", TestSDKApprovalAcrossAgentRestart},
		// tenants
		{"TenantIsolation", TestTenantIsolation},
	}
	for _, s := range suites {
		t.Run(s.name, s.fn)
	}
}
