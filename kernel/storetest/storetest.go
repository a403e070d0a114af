// Package storetest is the conformance suite every kernel.Store
// implementation must pass, and the shared store benchmarks.
//
// # Basics
//
// An implementation's tests call [Run] with a function that opens a new,
// empty store for one subtest:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) kernel.Store { return openTest(t) })
//	}
//
// The suite writes only data that satisfies the kernel's own invariants (an
// execution's events start with execution.created at seq 1 and run
// contiguously to its LastSeq), so an implementation may run its
// consistency checker when a subtest ends.
//
// # Semantics the suite fixes
//
// Beyond the doc comments of kernel.Store, the suite requires:
//   - a limit <= 0 (Events, StepsPage, DueDispatches, ExpiredLeases,
//     ExpiredApprovals, ExecutionFilter.Limit) means "no limit";
//   - DeleteAgent, DeleteBundle and DeleteAPIKey of a missing record are
//     ErrNotFound;
//   - PutExecution of an id owned by another tenant, PutExecution with an
//     idempotency key that names another execution of the tenant, and
//     PutAPIKey with a hash used by another key are ErrConflict;
//   - records read back marshal to the same JSON as the records written
//     (times in the fixtures are UTC with microsecond precision);
//   - a cancelled context fails Update and View without writing anything;
//   - DeleteExecution of a missing execution (or one of another tenant) is
//     ErrNotFound.
package storetest

import (
	"testing"

	"github.com/wicket-run/wicket/kernel"
)

// Run runs the conformance suite against the stores open returns. open is
// called once per subtest; it must return a new, empty store and arrange
// (with t.Cleanup) for it to be closed.
func Run(t *testing.T, open func(t *testing.T) kernel.Store) {
	for _, tc := range suite {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t)) })
	}
}

// suite lists the conformance tests in the order Run runs them.
var suite = []struct {
	name string
	fn   func(t *testing.T, s kernel.Store)
}{
	{"NotFound", testNotFound},
	{"ExecutionRoundTrip", testExecutionRoundTrip},
	{"ExecutionOwnership", testExecutionOwnership},
	{"IdempotencyKey", testIdempotencyKey},
	{"ListExecutions", testListExecutions},
	{"Steps", testSteps},
	{"StepsPage", testStepsPage},
	{"Occurrence", testOccurrence},
	{"StepsBesideEvents", testStepsBesideEvents},
	{"Events", testEvents},
	{"EventConflict", testEventConflict},
	{"Agents", testAgents},
	{"Approvals", testApprovals},
	{"ApprovalExpiry", testApprovalExpiry},
	{"Bundles", testBundles},
	{"Counters", testCounters},
	{"TenantsAndKeys", testTenantsAndKeys},
	{"TenantIsolation", testTenantIsolation},
	{"DispatchIndexes", testDispatchIndexes},
	{"ReadYourWrites", testReadYourWrites},
	{"RollbackOnError", testRollbackOnError},
	{"RollbackOnPanic", testRollbackOnPanic},
	{"CancelledContext", testCancelledContext},
	{"Hammer", testHammer},
	{"BatchWithFailures", testBatchWithFailures},
	{"SnapshotReads", testSnapshotReads},
	{"DeleteExecution", testDeleteExecution},
	{"DeleteExecutionInChunks", testDeleteExecutionInChunks},
	{"DeleteExecutionApprovalsOverLimit", testDeleteExecutionApprovalsOverLimit},
}
