package kernel

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
	active   map[Ref]activeBundle // live bundles

	// keysRevoked is told of the API keys other replicas revoked (see
	// OnKeysRevoked).
	keysRevoked atomic.Pointer[func(tenant, keyID string)]
}

// OnKeysRevoked sets fn to be called with every API key another replica
// revokes, as soon as this kernel hears of it, so that what the key opened
// here ends too (the server's event streams). After a gap in the feed
// (Change.All) the revocations missed are not told: the server finds them
// when it next checks the key.
func (k *Kernel) OnKeysRevoked(fn func(tenant, keyID string)) {
	k.sh.keysRevoked.Store(&fn)
}

// activeBundle is what a replica knows of a live bundle: its digest, and
// the size of its stored archive (for the tenant's ceilings, see
// Kernel.checkBundleCeilings).
type activeBundle struct {
	digest string
	size   int64
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
		k.agentsGen++
		clear(k.agents)
		k.agentsMu.Unlock()
		k.poke()
		if err := k.syncBundles(ctx); err != nil && ctx.Err() == nil {
			k.log.Error("sync bundles with the store", "err", err)
		}
		return
	}
	if fn := k.sh.keysRevoked.Load(); fn != nil {
		for _, key := range c.Keys {
			(*fn)(key.Tenant, key.Name)
		}
	}
	k.notify(c.Executions...)
	if c.Dispatch {
		k.poke()
	}
	if len(c.Agents) > 0 {
		k.agentsMu.Lock()
		k.agentsGen++
		for _, a := range c.Agents {
			delete(k.agents, agentKey{a.Tenant, a.Name})
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

// activateStored makes a stored bundle live unless its digest is live
// already. A revision that does not load here leaves the running one live
// (the decision events' digests say which) and is tried again at the next
// sync. bundleMu must be held.
func (k *Kernel) activateStored(ctx context.Context, rec *BundleRecord) error {
	ref := Ref{Tenant: rec.Tenant, Name: rec.Name}
	if a, live := k.sh.active[ref]; live && a.digest == rec.Digest {
		return nil
	}
	size, err := k.loadStored(ctx, rec)
	if err != nil {
		return err
	}
	k.markActive(ref, rec.Digest, size)
	return nil
}

// markActive records the digest and accounted size (accountedSize) of a
// live bundle. bundleMu must be held.
func (k *Kernel) markActive(ref Ref, digest string, size int64) {
	if k.sh.active == nil {
		k.sh.active = map[Ref]activeBundle{}
	}
	k.sh.active[ref] = activeBundle{digest: digest, size: size}
}

// syncBundles makes every stored bundle live at its stored revision and
// removes the live ones no longer stored: at boot (LoadBundles), and when
// the feed from the other replicas had a gap. The bundles to load compile
// a few at a time (GOMAXPROCS), each under Config.BundleLoadTimeout, so
// that no bundle can hold the boot up: one that fails or does not load in
// time is skipped with a warning naming it (its late result, if any, is
// discarded), the loader is told (Failed), and agents bound to it are
// denied (engine_error) until it is replaced; a replica that had an older
// revision live keeps it until the new one loads. Nor can one tenant's
// bundles together: once they have spent Config.BundleLoadTenantBudget
// compiling, the tenant's others are skipped the same way. A tenant's
// admin-owned bundles (its guards) compile before its own.
func (k *Kernel) syncBundles(ctx context.Context) error {
	if k.bundles == nil {
		return nil
	}
	k.sh.bundleMu.Lock()
	defer k.sh.bundleMu.Unlock()
	recs, err := k.ListBundles(ctx, "")
	if err != nil {
		return fmt.Errorf("list bundles: %w", err)
	}
	start := time.Now()
	stored := map[Ref]bool{}
	var todo []*BundleRecord
	for _, rec := range recs {
		ref := Ref{Tenant: rec.Tenant, Name: rec.Name}
		stored[ref] = true
		if a, live := k.sh.active[ref]; !live || a.digest != rec.Digest {
			todo = append(todo, rec)
		}
	}
	// By tenant, the admin's bundles first: a tenant's guards are not the
	// ones its own bundles' budget leaves out.
	slices.SortStableFunc(todo, func(a, b *BundleRecord) int {
		if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
			return c
		}
		aa, ba := a.OwnedBy() == BundleOwnerAdmin, b.OwnedBy() == BundleOwnerAdmin
		switch {
		case aa && !ba:
			return -1
		case ba && !aa:
			return 1
		}
		return 0
	})
	errs := make([]error, len(todo))
	sizes := make([]int64, len(todo))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	var spentMu sync.Mutex
	spent := map[string]time.Duration{} // compile time per tenant
	budget := k.cfg.BundleLoadTenantBudget
	for i, rec := range todo {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		spentMu.Lock()
		over := budget > 0 && spent[rec.Tenant] >= budget
		spentMu.Unlock()
		if over {
			<-sem
			errs[i] = fmt.Errorf("not compiled: tenant %s's bundles spent the boot budget of %s (serve --bundle-load-tenant-budget) compiling its others", rec.Tenant, budget)
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			t0 := time.Now()
			sizes[i], errs[i] = k.loadStored(ctx, rec)
			spentMu.Lock()
			spent[rec.Tenant] += time.Since(t0)
			spentMu.Unlock()
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	failed := 0
	for i, rec := range todo {
		if errs[i] == nil {
			k.markActive(Ref{Tenant: rec.Tenant, Name: rec.Name}, rec.Digest, sizes[i])
			continue
		}
		failed++
		k.log.Warn("stored bundle skipped: it does not load; agents bound to it are denied (engine_error) until it is replaced",
			"tenant", rec.Tenant, "bundle", rec.Name, "revision", rec.Revision, "err", errs[i])
		k.bundles.Failed(rec.Tenant, rec.Name, errs[i])
	}
	for ref := range k.sh.active {
		if !stored[ref] {
			k.bundles.Remove(ref.Tenant, ref.Name)
			delete(k.sh.active, ref)
		}
	}
	if len(todo) > 0 {
		k.log.Info("bundles loaded", "bundles", len(todo)-failed, "failed", failed, "took", time.Since(start).Round(time.Millisecond).String())
	}
	return nil
}
