package kernel

import "context"

// Feed is implemented by a Store that several kernels (replicas) share: it
// tells each kernel what the others committed, so that event streams,
// caches, bundles and the dispatcher follow writes made elsewhere. A kernel
// whose store implements Feed follows it from Start until Close.
type Feed interface {
	// Follow calls fn with the changes other kernels commit, in commit
	// order, until ctx ends; it reconnects by itself, and after a gap in
	// which changes may have been missed it calls fn with Change.All. It
	// returns ctx's error.
	Follow(ctx context.Context, fn func(Change)) error
}

// Change is what another kernel committed.
type Change struct {
	// Executions gained events.
	Executions []string
	// Dispatch: a dispatch was queued.
	Dispatch bool
	// Agents and Bundles were written or deleted.
	Agents  []Ref
	Bundles []Ref
	// Keys are API keys revoked (Ref.Name is the key id): what they opened
	// on this kernel (event streams) must end.
	Keys []Ref
	// All: changes may have been missed (the feed reconnected); everything
	// derived from the store must be refreshed.
	All bool
}

// Ref names a record of a tenant (an agent id, a bundle name).
type Ref struct {
	Tenant string `json:"t"`
	Name   string `json:"n"`
}
