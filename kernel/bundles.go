package kernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
)

// BundleSource is a bundle as uploaded: a .tar.gz archive, or a map of
// files (path → content) from the JSON form.
type BundleSource struct {
	Archive []byte
	Files   map[string][]byte
	// Name is the name the bundle is put under; it names a bundle whose own
	// manifest gives none (an OPA bundle as `opa build` writes it).
	Name string
	// TenantKeys are the tenant's own bundle verification keys. The kernel
	// fills them in (from the tenant record) before it asks the loader to
	// compile, so the loader needs no read of its own.
	TenantKeys []BundleKey
}

// CompiledBundle is a validated, compiled bundle that is not live yet.
type CompiledBundle struct {
	Ref policy.BundleRef
	// Archive is the reproducible .tar.gz the store keeps.
	Archive []byte
	// Size is the summed size of the bundle's files unpacked, which the
	// loader keeps in memory while the bundle is live; it counts against
	// Config.MaxTenantBundleBytes (an archive of a few KiB may unpack to
	// 32 MiB). Zero counts the archive only.
	Size int64
	// Handle is the loader's compiled form, passed back to Activate.
	Handle any
}

// BundleLoader validates, compiles and activates bundles (plugins.Host
// implements it). Compile must refuse a bad bundle whole, with an error
// naming the file and field, and must not change what is live; Activate
// swaps a compiled bundle in atomically (the previous revision is released);
// Discard releases a compiled bundle that will not be activated; Remove
// unloads one. Failed records that a stored bundle did not load at boot
// (agents bound to it are denied with that reason until it is replaced).
type BundleLoader interface {
	Compile(ctx context.Context, tenant string, src BundleSource) (*CompiledBundle, error)
	Activate(tenant string, cb *CompiledBundle)
	Discard(cb *CompiledBundle)
	Remove(tenant, name string)
	Failed(tenant, name string, err error)
	// RulesBundle wraps native YAML rules (the body of POST /v0/policies/{agent})
	// as a rules bundle named name.
	RulesBundle(name string, rulesYAML []byte) (BundleSource, error)
}

func (k *Kernel) loader() (BundleLoader, error) {
	if k.bundles == nil {
		return nil, Errorf(CodeUnavailable, "no policy engines are configured")
	}
	return k.bundles, nil
}

// PutBundle validates and compiles a bundle, stores it as owner's, and
// makes it live. If name is set it must match the manifest's name. A bundle
// that fails to load is refused whole; the running revision stays. The
// tenant (BundleOwnerTenant) may not replace a bundle the admin owns
// (forbidden); a bundle the admin stores becomes the admin's.
func (k *Kernel) PutBundle(ctx context.Context, tenant, name string, src BundleSource, owner BundleOwner) (*BundleRecord, error) {
	if err := validOwner(owner); err != nil {
		return nil, err
	}
	l, err := k.loader()
	if err != nil {
		return nil, err
	}
	if src.Name == "" {
		src.Name = name
	}
	// Refuse before compiling what would be refused after.
	if name != "" {
		if err := k.store.View(ctx, func(tx ReadTx) error { return mayWriteBundle(tx, tenant, name, owner) }); err != nil {
			return nil, err
		}
	}
	if src.TenantKeys, err = k.TenantBundleKeys(ctx, tenant); err != nil {
		return nil, fmt.Errorf("read the bundle keys of tenant %s: %w", tenant, err)
	}
	t0 := time.Now()
	cb, err := l.Compile(ctx, tenant, src)
	compiled := time.Since(t0)
	if err != nil {
		var ke *Error
		if errors.As(err, &ke) {
			return nil, err
		}
		return nil, &Error{Code: CodeValidation, Message: "bundle refused: " + err.Error(), Details: problemDetails(err)}
	}
	if name != "" && cb.Ref.Name != name {
		l.Discard(cb)
		return nil, Errorf(CodeValidation, "bundle manifest names %q but the request names %q", cb.Ref.Name, name)
	}
	br := &BundleRecord{Tenant: tenant, Name: cb.Ref.Name, Revision: cb.Ref.Revision, Digest: cb.Ref.Digest, Engine: cb.Ref.Engine,
		Owner: owner, Archive: cb.Archive}
	// Stored and activated under bundleMu: a replica reloading the bundle
	// meanwhile cannot activate an older revision after this one.
	k.sh.bundleMu.Lock()
	defer k.sh.bundleMu.Unlock()
	if owner == BundleOwnerTenant {
		if err := k.checkBundleCeilings(tenant, br.Name, len(br.Archive), cb.Size); err != nil {
			l.Discard(cb)
			return nil, err
		}
	}
	_, err = k.update(ctx, func(r *rec) error {
		if err := k.requireTenant(r.tx, tenant); err != nil {
			return err
		}
		if err := mayWriteBundle(r.tx, tenant, br.Name, owner); err != nil {
			return err
		}
		br.UpdatedAt = r.now
		if old, err := r.tx.Bundle(tenant, br.Name); err == nil {
			br.Source = old.Source // a new revision keeps its bundle server
		}
		return r.tx.PutBundle(br)
	})
	if err != nil {
		l.Discard(cb)
		return nil, err
	}
	l.Activate(tenant, cb)
	k.markActive(Ref{Tenant: tenant, Name: br.Name}, br.Digest, accountedSize(len(br.Archive), cb.Size))
	k.log.Info("bundle activated", "tenant", tenant, "bundle", br.Name, "revision", br.Revision, "engine", br.Engine,
		"sha256", br.Digest, "compile", compiled.Round(time.Microsecond).String())
	return br, nil
}

// checkBundleCeilings refuses a tenant's bundle named name, of archive
// bytes stored and unpacked bytes held in memory, when, with the tenant's
// other live bundles, it would take the tenant past
// Config.MaxTenantBundles bundles or Config.MaxTenantBundleBytes: every
// bundle is kept in the store and its files in memory, so without them one
// tenant's uploads would take the disk and memory every tenant shares.
// Each bundle counts the larger of its archive and its unpacked files (a
// gzip archive of a few KiB may unpack to 32 MiB). A bundle replacing one
// of the same name counts instead of it. The account is this replica's
// live bundles (replicas storing at the same moment may each admit one).
// bundleMu must be held.
func (k *Kernel) checkBundleCeilings(tenant, name string, archive int, unpacked int64) error {
	var n int
	bytes := accountedSize(archive, unpacked)
	for ref, a := range k.sh.active {
		if ref.Tenant == tenant && ref.Name != name {
			n++
			bytes += a.size
		}
	}
	if max := k.cfg.MaxTenantBundles; max > 0 && n+1 > max {
		return Errorf(CodeValidation, "tenant %s holds %d bundles, the kernel's ceiling (serve --max-tenant-bundles): delete one before storing %s", tenant, n, name)
	}
	if max := k.cfg.MaxTenantBundleBytes; max > 0 && bytes > max {
		return Errorf(CodeValidation, "bundle %s (an archive of %d bytes, %d unpacked) would take tenant %s's bundles to %d bytes, over the kernel's ceiling of %d (serve --max-tenant-bundle-bytes; a bundle counts the larger of its archive and its unpacked files)", name, archive, unpacked, tenant, bytes, max)
	}
	return nil
}

// accountedSize is what a bundle counts against
// Config.MaxTenantBundleBytes: the larger of its archive and its unpacked
// files.
func accountedSize(archive int, unpacked int64) int64 {
	return max(int64(archive), unpacked)
}

// BundlePull names the bundle server a bundle is pulled from (OPA's bundle
// service protocol) and the random delay between polls.
type BundlePull struct {
	URL      string `json:"url"`
	MinDelay string `json:"min_delay,omitempty"` // a Go duration; default 60s
	MaxDelay string `json:"max_delay,omitempty"` // default 120s
	// Owner is whose the downloads are (the setter's: admin or tenant);
	// empty reads as the bundle's owner.
	Owner BundleOwner `json:"owner,omitempty"`
}

// BundlePuller keeps bundles in sync with bundle servers (plugins/pull
// implements it). Watch downloads the bundle now, activating it through
// PutBundle, and keeps polling; when the first download fails it registers
// nothing and says why. Unwatch stops polling (the live revision stays).
type BundlePuller interface {
	Watch(ctx context.Context, tenant, name string, src BundlePull) error
	Unwatch(tenant, name string)
}

// SetBundlePuller installs the puller (call before serving).
func (k *Kernel) SetBundlePuller(p BundlePuller) { k.puller = p }

// SetBundleSource makes the bundle tenant/name follow a bundle server: the
// first download must load (it becomes the live revision, owner's), then
// the puller polls. A nil src stops pulling and forgets the source. A
// tenant (BundleOwnerTenant) may not touch a bundle the admin owns. Who
// may call it at all is the caller's to check (admins; tenant-admins whose
// tenant allows bundle sources).
func (k *Kernel) SetBundleSource(ctx context.Context, tenant, name string, src *BundlePull, owner BundleOwner) (*BundleRecord, error) {
	if k.puller == nil {
		return nil, Errorf(CodeUnavailable, "this kernel does not pull bundles")
	}
	if !ValidID(name) {
		return nil, Errorf(CodeValidation, "bundle name %q is invalid: "+IDRule, name)
	}
	if err := validOwner(owner); err != nil {
		return nil, err
	}
	if err := k.store.View(ctx, func(tx ReadTx) error { return mayWriteBundle(tx, tenant, name, owner) }); err != nil {
		return nil, err
	}
	if src != nil {
		c := *src
		c.Owner = owner
		src = &c
	}
	if src == nil {
		k.puller.Unwatch(tenant, name)
	} else if err := k.puller.Watch(ctx, tenant, name, *src); err != nil {
		var ke *Error
		if errors.As(err, &ke) {
			return nil, err
		}
		return nil, Errorf(CodeValidation, "bundle source refused: %v", err)
	}
	var out *BundleRecord
	_, err := k.update(ctx, func(r *rec) error {
		b, err := r.tx.Bundle(tenant, name)
		if errors.Is(err, ErrNotFound) {
			return Errorf(CodeNotFound, "bundle %s not found", name)
		}
		if err != nil {
			return err
		}
		if err := mayWriteBundle(r.tx, tenant, name, owner); err != nil {
			return err
		}
		b.Source = src
		out = b
		return r.tx.PutBundle(b)
	})
	if err != nil && src != nil {
		k.puller.Unwatch(tenant, name)
	}
	return out, err
}

// BundleSources lists every stored bundle that names a bundle server, of
// every tenant (to resume pulling at boot).
func (k *Kernel) BundleSources(ctx context.Context) ([]*BundleRecord, error) {
	tenants, err := k.ListTenants(ctx)
	if err != nil {
		return nil, err
	}
	var out []*BundleRecord
	for _, t := range tenants {
		bs, err := k.ListBundles(ctx, t.ID)
		if err != nil {
			return nil, err
		}
		for _, b := range bs {
			if b.Source != nil {
				out = append(out, b)
			}
		}
	}
	return out, nil
}

func validOwner(o BundleOwner) error {
	if o != BundleOwnerAdmin && o != BundleOwnerTenant {
		return fmt.Errorf("kernel: bundle owner %q is invalid", o)
	}
	return nil
}

// mayWriteBundle refuses the tenant's change of a bundle the admin owns.
func mayWriteBundle(tx ReadTx, tenant, name string, by BundleOwner) error {
	if by == BundleOwnerAdmin {
		return nil
	}
	old, err := tx.Bundle(tenant, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if old.OwnedBy() == BundleOwnerAdmin {
		return (&Error{Code: CodeForbidden, Message: fmt.Sprintf("bundle %s of tenant %s is owned by the admin: a tenant-admin key may not replace or delete it", name, tenant)}).
			WithDetails(map[string]any{"bundle": name, "owner": string(BundleOwnerAdmin)})
	}
	return nil
}

func (k *Kernel) requireTenant(tx ReadTx, tenant string) error {
	if tenant == DefaultTenant {
		return nil
	}
	if _, err := tx.Tenant(tenant); err != nil {
		if errors.Is(err, ErrNotFound) {
			return Errorf(CodeNotFound, "tenant %s not found", tenant)
		}
		return err
	}
	return nil
}

// GetBundle returns a stored bundle (with its archive).
func (k *Kernel) GetBundle(ctx context.Context, tenant, name string) (*BundleRecord, error) {
	var b *BundleRecord
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		b, err = tx.Bundle(tenant, name)
		if errors.Is(err, ErrNotFound) {
			return Errorf(CodeNotFound, "bundle %s not found", name)
		}
		return err
	})
	return b, err
}

// ListBundles lists a tenant's bundles.
func (k *Kernel) ListBundles(ctx context.Context, tenant string) ([]*BundleRecord, error) {
	var out []*BundleRecord
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		out, err = tx.ListBundles(tenant)
		return err
	})
	return out, err
}

// DeleteBundle removes a bundle; by is who asks. Agents still bound to it
// are then denied (fail closed) until rebound. The tenant may not delete a
// bundle the admin owns (forbidden), and nobody may delete one of the
// tenant's guards (conflict: remove it from the guards first).
func (k *Kernel) DeleteBundle(ctx context.Context, tenant, name string, by BundleOwner) error {
	if err := validOwner(by); err != nil {
		return err
	}
	k.sh.bundleMu.Lock()
	defer k.sh.bundleMu.Unlock()
	_, err := k.update(ctx, func(r *rec) error {
		if _, err := r.tx.Bundle(tenant, name); err != nil {
			if errors.Is(err, ErrNotFound) {
				return Errorf(CodeNotFound, "bundle %s not found", name)
			}
			return err
		}
		if err := mayWriteBundle(r.tx, tenant, name, by); err != nil {
			return err
		}
		t, err := r.tx.Tenant(tenant)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		if t != nil && slices.Contains(t.Guards, name) {
			return Errorf(CodeConflict, "bundle %s is a guard of tenant %s: remove it from the tenant's guards first (PUT /v0/tenants/%s)", name, tenant, tenant)
		}
		return r.tx.DeleteBundle(tenant, name)
	})
	if err == nil && k.bundles != nil {
		k.bundles.Remove(tenant, name)
		delete(k.sh.active, Ref{Tenant: tenant, Name: name})
	}
	if err == nil && k.puller != nil {
		k.puller.Unwatch(tenant, name)
	}
	return err
}

// AgentPolicyBundle is the name of the bundle POST /v0/policies/{agent}
// makes: "agent-<id>", lowercased, with characters a bundle name cannot hold
// replaced and a short hash of the id appended when anything was changed.
func AgentPolicyBundle(agentID string) string {
	b := []byte("agent-")
	changed := false
	for _, c := range []byte(agentID) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '.', c == '-':
			b = append(b, c)
		case c >= 'A' && c <= 'Z':
			b = append(b, c+'a'-'A')
			changed = true
		default:
			b = append(b, '-')
			changed = true
		}
	}
	if len(b) > 54 {
		b, changed = b[:54], true
	}
	if changed {
		sum := sha256.Sum256([]byte(agentID))
		b = append(b, '-')
		b = append(b, hex.EncodeToString(sum[:4])...)
	}
	return string(b)
}

// SetAgentPolicy stores native YAML rules as the agent's own bundle, owned
// by owner (see PutBundle), and binds the agent to it.
func (k *Kernel) SetAgentPolicy(ctx context.Context, tenant, agentID string, rulesYAML []byte, owner BundleOwner) (*BundleRecord, error) {
	l, err := k.loader()
	if err != nil {
		return nil, err
	}
	a, err := k.Agent(ctx, tenant, agentID)
	if err != nil {
		return nil, err
	}
	src, err := l.RulesBundle(AgentPolicyBundle(agentID), rulesYAML)
	if err != nil {
		return nil, &Error{Code: CodeValidation, Message: "policy refused: " + err.Error()}
	}
	rec, err := k.PutBundle(ctx, tenant, AgentPolicyBundle(agentID), src, owner)
	if err != nil {
		return nil, err
	}
	if a.Bundle != rec.Name {
		n := *a
		n.Bundle = rec.Name
		if _, err := k.PutAgent(ctx, n); err != nil {
			return nil, err
		}
	}
	return rec, nil
}

// LoadBundles compiles and activates every stored bundle (at boot), a few
// at a time (GOMAXPROCS), each under Config.BundleLoadTimeout, so that no
// bundle can hold the boot up: one that fails or does not load in time is
// skipped with a warning naming it (its late result, if any, is
// discarded), the loader is told (Failed), and agents bound to it are
// denied (engine_error) until it is replaced.
func (k *Kernel) LoadBundles(ctx context.Context) error {
	return k.syncBundles(ctx)
}

// loadStored compiles and activates one stored bundle under the load
// timeout and returns what it counts against the tenant's bytes
// (accountedSize); an error says why it is not live. The loader is not
// trusted to honour ctx: a compile that outlasts it is left to finish in
// the background and discarded.
func (k *Kernel) loadStored(ctx context.Context, rec *BundleRecord) (int64, error) {
	timeout := k.cfg.BundleLoadTimeout
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type result struct {
		cb  *CompiledBundle
		err error
	}
	t0 := time.Now()
	done := make(chan result, 1)
	go func() {
		keys, err := k.TenantBundleKeys(lctx, rec.Tenant)
		if err != nil {
			done <- result{nil, fmt.Errorf("read the bundle keys of tenant %s: %w", rec.Tenant, err)}
			return
		}
		cb, err := k.bundles.Compile(lctx, rec.Tenant, BundleSource{Archive: rec.Archive, Name: rec.Name, TenantKeys: keys})
		done <- result{cb, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return 0, r.err
		}
		k.bundles.Activate(rec.Tenant, r.cb)
		k.log.Info("bundle loaded", "tenant", rec.Tenant, "bundle", rec.Name, "revision", rec.Revision, "engine", rec.Engine,
			"sha256", rec.Digest, "compile", time.Since(t0).Round(time.Microsecond).String())
		return accountedSize(len(rec.Archive), r.cb.Size), nil
	case <-lctx.Done():
		go func() {
			if r := <-done; r.err == nil {
				k.bundles.Discard(r.cb)
			}
		}()
		return 0, fmt.Errorf("did not load within %s", timeout)
	}
}

// EvalRequest is a policy dry run.
type EvalRequest struct {
	Tenant  string
	AgentID string
	Kind    string
	Target  string
	Args    json.RawMessage
	Effect  string
	// Idempotency defaults as for a submission.
	Idempotency Idempotency
	Labels      map[string]string
}

// EvalPolicy runs the agent's policy on a step without recording anything
// and returns the verdict: the action and the bundle and rule behind it.
// Execution limits are not applied (there is no execution).
func (k *Kernel) EvalPolicy(ctx context.Context, req EvalRequest) (*Verdict, error) {
	sub, err := newSubmission(StepRequest{Kind: req.Kind, Target: req.Target, Args: req.Args, Effect: req.Effect, Idempotency: req.Idempotency})
	if err != nil {
		return nil, err
	}
	var preq *PolicyRequest
	err = k.store.View(ctx, func(tx ReadTx) error {
		var err error
		preq, err = policyRequest(tx, req.Tenant, req.AgentID)
		return err
	})
	if err != nil {
		return nil, err
	}
	preq.Input = &policy.Input{Tenant: req.Tenant, AgentID: req.AgentID, ExecutionID: "dry-run",
		Step: policy.Step{Kind: sub.Kind, Target: sub.Target, Args: sub.Args, ArgsHash: sub.argsHash,
			Idempotency: string(sub.Idempotency), Effect: sub.Effect},
		Execution: policy.Execution{Status: string(ExecRunning), Labels: policy.LabelsOrNone(req.Labels), CreatedAt: k.now()}}
	return k.decide(ctx, preq)
}

// problemDetails lists, as details of a refused bundle, each problem err
// holds when it holds several (the loaders report every problem of a bundle
// as an error that unwraps to a list); nil otherwise.
func problemDetails(err error) map[string]any {
	for e := err; e != nil; e = errors.Unwrap(e) {
		multi, ok := e.(interface{ Unwrap() []error })
		if !ok {
			continue
		}
		list := multi.Unwrap()
		if len(list) < 2 {
			return nil
		}
		problems := make([]string, len(list))
		for i, p := range list {
			problems[i] = p.Error()
		}
		return map[string]any{"problems": problems}
	}
	return nil
}
