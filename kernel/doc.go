// Package kernel is Wicket's domain core: executions, steps, dispatches,
// leases, events, approvals and the decision path of a submitted step
// (replay → limits → policy → rate limit → approval).
//
// # Basics
//
// The kernel owns the interfaces it needs and receives their implementations
// from its caller: a [Store] (store/bbolt), a [Deliverer] (internal/webhook)
// and a [Policy] (plugins). It imports neither HTTP, nor bbolt, nor a policy
// engine.
package kernel
