// Package kernel is Wicket's domain core: executions, steps, dispatches,
// leases, events, approvals and the decision path of a submitted step
// (replay → limits → policy → rate limit → approval). The contract it
// implements is in docs/ (protocol.md, identity.md, durability.md,
// policy.md).
//
// # Basics
//
// The kernel owns the interfaces it needs and receives their implementations
// from its caller, all at once, in [New]: a [Store] (store/bbolt), a
// [Deliverer] (internal/webhook), a [Policy] and a [BundleLoader] (both
// plugins.Host). It imports neither HTTP, nor bbolt, nor a policy engine.
//
//	k, err := kernel.New(store, deliverer, host, host, kernel.Config{})
//	if err != nil {
//		return err
//	}
//	if err := k.Start(ctx); err != nil { // the dispatcher and the reapers
//		return err
//	}
//	defer k.Close(ctx)
//
// # Deciding a step
//
// [Kernel.SubmitStep] reads what the decision depends on in one read
// transaction (the execution, the occurrence counter, the step, the agent's
// bundle and the tenant's guards), applies the execution's limits, asks the
// [Policy] for a [Verdict] outside any transaction, then writes the
// decision and its events in one transaction that re-checks what was read;
// if something changed in between, it starts over.
//
// # Time
//
// Every time the kernel records or compares (events, leases, approval
// expiry, deadlines) comes from [Config.Clock], so tests can move it.
package kernel
