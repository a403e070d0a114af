package kernel

import (
	"context"
	"errors"
	"sync"
)

// Replicas: several kernels may share one store (a database); each is a
// replica. Nothing is owned by a replica but the webhook POSTs it has in
// flight: every dispatch, lease, approval and timer is a row of the store,
// and every replica's dispatcher and reapers work on all of them, the
// store's transactions deciding which one wins. What a replica keeps in
// memory (event-stream watchers, the agent cache, the live bundles) follows
// the writes of the others through the store's Feed.

// sharedState is the part of a Kernel that follows the other replicas.
type sharedState struct {
	// bundleMu orders bundle activations: each activation reads (or
	// writes) the store and activates under it, so the last activation is
	// of the last stored revision, whichever replica stored it.
	bundleMu sync.Mutex
	active   map[Ref]string // live bundles → digest
}

// shared returns the store's Feed when other kernels may share the store.
func (k *Kernel) shared() (Feed, bool) {
	f, ok := k.store.(Feed)
	return f, ok
}

// follow applies what the other replicas commit until ctx ends.
func (k *Kernel) follow(ctx context.Context, f Feed) {
	err := f.Follow(ctx, func(c Change) { k.applyChange(ctx, c) })
	if err != nil && ctx.Err() == nil {
		k.log.Error("following the other replicas stopped", "err", err)
	}
}

// applyChange brings what this kernel holds in memory up to a change
// another replica committed.
func (k *Kernel) applyChange(ctx context.Context, c Change) {
	if c.All {
		k.notifyAll()
		k.agentsMu.Lock()
		clear(k.agents)
		k.agentsMu.Unlock()
		k.poke()
		if err := k.syncBundles(ctx); err != nil && ctx.Err() == nil {
			k.log.Error("sync bundles with the store", "err", err)
		}
		return
	}
	k.notify(c.Executions...)
	if c.Dispatch {
		k.poke()
	}
	if len(c.Agents) > 0 {
		k.agentsMu.Lock()
		for _, a := range c.Agents {
			delete(k.agents, a.Tenant+"\x00"+a.Name)
		}
		k.agentsMu.Unlock()
	}
	for _, b := range c.Bundles {
		if err := k.reloadBundle(ctx, b); err != nil && ctx.Err() == nil {
			k.log.Error("reload bundle another replica changed", "tenant", b.Tenant, "bundle", b.Name, "err", err)
		}
	}
}

// notifyAll wakes every watcher (changes may have been missed).
func (k *Kernel) notifyAll() {
	k.subsMu.Lock()
	ids := make([]string, 0, len(k.subs))
	for id := range k.subs {
		ids = append(ids, id)
	}
	k.subsMu.Unlock()
	k.notify(ids...)
}

// reloadBundle makes the stored revision of a bundle live (or removes it
// when it is no longer stored).
func (k *Kernel) reloadBundle(ctx context.Context, ref Ref) error {
	if k.bundles == nil {
		return nil
	}
	k.sh.bundleMu.Lock()
	defer k.sh.bundleMu.Unlock()
	var rec *BundleRecord
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		rec, err = tx.Bundle(ref.Tenant, ref.Name)
		return err
	})
	switch {
	case errors.Is(err, ErrNotFound):
		if _, live := k.sh.active[ref]; live {
			k.bundles.Remove(ref.Tenant, ref.Name)
			delete(k.sh.active, ref)
			k.log.Info("bundle removed by another replica", "tenant", ref.Tenant, "bundle", ref.Name)
		}
		return nil
	case err != nil:
		return err
	}
	return k.activateStored(ctx, rec)
}

// activateStored compiles and activates a stored bundle unless its digest
// is live already. bundleMu must be held.
func (k *Kernel) activateStored(ctx context.Context, rec *BundleRecord) error {
	ref := Ref{Tenant: rec.Tenant, Name: rec.Name}
	if d, live := k.sh.active[ref]; live && d == rec.Digest {
		return nil
	}
	cb, err := k.bundles.Compile(ctx, rec.Tenant, BundleSource{Archive: rec.Archive, Name: rec.Name})
	if err != nil {
		return err
	}
	k.bundles.Activate(rec.Tenant, cb)
	k.markActive(ref, rec.Digest)
	k.log.Info("bundle activated", "tenant", rec.Tenant, "bundle", rec.Name, "revision", rec.Revision, "sha256", rec.Digest)
	return nil
}

// markActive records the digest of a live bundle. bundleMu must be held.
func (k *Kernel) markActive(ref Ref, digest string) {
	if k.sh.active == nil {
		k.sh.active = map[Ref]string{}
	}
	k.sh.active[ref] = digest
}

// syncBundles makes every stored bundle live at its stored revision and
// removes the live ones no longer stored.
func (k *Kernel) syncBundles(ctx context.Context) error {
	if k.bundles == nil {
		return nil
	}
	k.sh.bundleMu.Lock()
	defer k.sh.bundleMu.Unlock()
	recs, err := k.ListBundles(ctx, "")
	if err != nil {
		return err
	}
	stored := map[Ref]bool{}
	for _, rec := range recs {
		stored[Ref{Tenant: rec.Tenant, Name: rec.Name}] = true
		if err := k.activateStored(ctx, rec); err != nil {
			k.log.Error("stored bundle does not load", "tenant", rec.Tenant, "bundle", rec.Name, "err", err)
		}
	}
	for ref := range k.sh.active {
		if !stored[ref] {
			k.bundles.Remove(ref.Tenant, ref.Name)
			delete(k.sh.active, ref)
		}
	}
	return nil
}
