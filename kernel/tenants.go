package kernel

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// KeyPrefix starts every API key the kernel issues.
const KeyPrefix = "wk_"

// HashKey returns the stored form of an API key secret.
func HashKey(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// CreateTenant creates a tenant; creating an existing one is a conflict.
// Its guards are checked as by SetTenantGuards; a new tenant has no bundles
// yet, so in practice a tenant is created bare and given guards once the
// admin has stored them into it.
func (k *Kernel) CreateTenant(ctx context.Context, t Tenant) (*Tenant, error) {
	if !ValidID(t.ID) {
		return nil, Errorf(CodeValidation, "tenant id %q is invalid: "+IDRule, t.ID)
	}
	if err := ValidRetention(t.Retention); err != nil {
		return nil, err
	}
	_, err := k.update(ctx, func(r *rec) error {
		if _, err := r.tx.Tenant(t.ID); err == nil || t.ID == DefaultTenant {
			return Errorf(CodeConflict, "tenant %s already exists", t.ID)
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
		if err := checkGuards(r.tx, t.ID, t.Guards); err != nil {
			return err
		}
		t.CreatedAt = r.now
		return r.tx.PutTenant(&t)
	})
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// EnsureTenant creates a tenant without guards unless it exists; an
// existing one is left as it is (manifest provisioning).
func (k *Kernel) EnsureTenant(ctx context.Context, id string) error {
	if !ValidID(id) {
		return Errorf(CodeValidation, "tenant id %q is invalid: "+IDRule, id)
	}
	if id == DefaultTenant {
		return nil
	}
	_, err := k.update(ctx, func(r *rec) error {
		if _, err := r.tx.Tenant(id); err == nil {
			return nil
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
		return r.tx.PutTenant(&Tenant{ID: id, CreatedAt: r.now})
	})
	return err
}

// SetTenantGuards replaces a tenant's guard bundles (the default tenant
// included). Every guard must name a bundle of that tenant that the admin
// owns (BundleOwnerAdmin): a guard the tenant could replace or delete would
// guard nothing. Anything else is a validation error naming the guard.
func (k *Kernel) SetTenantGuards(ctx context.Context, tenant string, guards []string) (*Tenant, error) {
	var out *Tenant
	_, err := k.update(ctx, func(r *rec) error {
		t, err := tenantToChange(r, tenant)
		if err != nil {
			return err
		}
		if err := checkGuards(r.tx, tenant, guards); err != nil {
			return err
		}
		t.Guards = slices.Clone(guards)
		if len(t.Guards) == 0 {
			t.Guards = nil
		}
		out = t
		return r.tx.PutTenant(t)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// checkGuards checks the guards of tenant against its stored bundles.
func checkGuards(tx ReadTx, tenant string, guards []string) error {
	if len(guards) > MaxGuards {
		return Errorf(CodeValidation, "a tenant may have at most %d guards, got %d", MaxGuards, len(guards))
	}
	for i, g := range guards {
		if !ValidID(g) {
			return Errorf(CodeValidation, "guard %q is not a valid bundle name", g)
		}
		if slices.Contains(guards[:i], g) {
			return Errorf(CodeValidation, "guard %q is listed twice", g)
		}
		b, err := tx.Bundle(tenant, g)
		if errors.Is(err, ErrNotFound) {
			return (&Error{Code: CodeValidation, Message: fmt.Sprintf("guard %q: tenant %s has no bundle %s (store it with the admin key: PUT /v0/bundles/%s?tenant=%s)", g, tenant, g, g, tenant)}).
				WithDetails(map[string]any{"guard": g})
		}
		if err != nil {
			return err
		}
		if b.OwnedBy() != BundleOwnerAdmin {
			return (&Error{Code: CodeValidation, Message: fmt.Sprintf("guard %q: bundle %s of tenant %s is owned by the tenant, and a guard must be owned by the admin (store it with the admin key: PUT /v0/bundles/%s?tenant=%s)", g, g, tenant, g, tenant)}).
				WithDetails(map[string]any{"guard": g, "owner": string(b.OwnedBy())})
		}
	}
	return nil
}

// MaxGuards bounds the guard bundles of one tenant (each is evaluated on
// every step of the tenant).
const MaxGuards = 16

// RequireTenant returns a not_found error when tenant does not exist (the
// default tenant always does).
func (k *Kernel) RequireTenant(ctx context.Context, tenant string) error {
	return k.store.View(ctx, func(tx ReadTx) error { return k.requireTenant(tx, tenant) })
}

// ListTenants lists tenants; default is always first.
func (k *Kernel) ListTenants(ctx context.Context) ([]*Tenant, error) {
	var out []*Tenant
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		out, err = tx.ListTenants()
		return err
	})
	if err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(out, func(t *Tenant) bool { return t.ID == DefaultTenant }) {
		out = append([]*Tenant{{ID: DefaultTenant}}, out...)
	}
	return out, nil
}

// SetTenantBundleTrust sets the keys that verify a tenant's bundle
// signatures and whether its tenant-admins may set bundle sources (an
// admin's decision: the manifest's bundle_keys and allow_bundle_sources).
func (k *Kernel) SetTenantBundleTrust(ctx context.Context, tenant string, keys []BundleKey, allowSources bool) error {
	_, err := k.update(ctx, func(r *rec) error {
		t, err := tenantToChange(r, tenant)
		if err != nil {
			return err
		}
		t.BundleKeys = slices.Clone(keys)
		t.AllowBundleSources = allowSources
		return r.tx.PutTenant(t)
	})
	return err
}

// TenantBundleKeys returns the keys that verify a tenant's bundles (none
// for an unknown tenant or one without keys).
func (k *Kernel) TenantBundleKeys(ctx context.Context, tenant string) ([]BundleKey, error) {
	var keys []BundleKey
	err := k.store.View(ctx, func(tx ReadTx) error {
		t, err := tx.Tenant(tenant)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		keys = t.BundleKeys
		return nil
	})
	return keys, err
}

// TenantAllowsBundleSources reports whether a tenant's tenant-admins may
// point bundles at bundle servers (set by an admin; default no).
func (k *Kernel) TenantAllowsBundleSources(ctx context.Context, tenant string) (bool, error) {
	allow := false
	err := k.store.View(ctx, func(tx ReadTx) error {
		t, err := tx.Tenant(tenant)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		allow = t.AllowBundleSources
		return nil
	})
	return allow, err
}

// CreateKey issues an API key for a tenant as the admin (IssueKey with
// byAdmin). The secret is returned once; only its hash is stored. A
// non-empty secret (manifest provisioning) is used as given.
func (k *Kernel) CreateKey(ctx context.Context, tenant, role, principal, secret string) (*APIKey, string, error) {
	return k.IssueKey(ctx, tenant, role, principal, secret, true)
}

// IssueKey issues an API key for a tenant, as CreateKey; byAdmin says
// whether the admin issues it (APIKey.IssuedByAdmin) or the tenant's
// tenant-admin does. Re-provisioning a key (the same secret) keeps its
// record, except that the admin re-issuing it marks it the admin's.
func (k *Kernel) IssueKey(ctx context.Context, tenant, role, principal, secret string, byAdmin bool) (*APIKey, string, error) {
	switch role {
	case RoleAdmin:
		if tenant != DefaultTenant {
			// An admin key acts on every tenant; it belongs to none but default.
			return nil, "", Errorf(CodeValidation, "an admin key belongs to the default tenant, not %s (admin keys act on every tenant)", tenant)
		}
	case RoleTenantAdmin, RoleClient, RoleApprover:
	default:
		return nil, "", Errorf(CodeValidation, "role %q is invalid (want admin, tenant-admin, client or approver)", role)
	}
	if principal == "" {
		return nil, "", Errorf(CodeValidation, "principal is required")
	}
	if len(principal) > MaxPrincipalBytes {
		return nil, "", Errorf(CodeValidation, "principal is %d bytes; at most %d", len(principal), MaxPrincipalBytes)
	}
	if secret == "" {
		var b [24]byte
		_, _ = rand.Read(b[:])
		secret = KeyPrefix + hex.EncodeToString(b[:])
	} else if len(secret) < 16 {
		return nil, "", Errorf(CodeValidation, "key for %s must be at least 16 bytes", principal)
	}
	key := &APIKey{ID: "key_" + strings.ReplaceAll(k.ids.next(k.now()), "-", "")[:20], Tenant: tenant, Role: role, Principal: principal, Hash: HashKey(secret),
		IssuedByAdmin: byAdmin}
	_, err := k.update(ctx, func(r *rec) error {
		if err := k.requireTenant(r.tx, tenant); err != nil {
			return err
		}
		if old, err := r.tx.APIKeyByHash(key.Hash); err == nil {
			if old.Tenant != tenant || old.Role != role {
				return Errorf(CodeConflict, "that key is already registered for another tenant or role")
			}
			*key = *old // idempotent provisioning
			if byAdmin && !key.IssuedByAdmin {
				key.IssuedByAdmin = true
				return r.tx.PutAPIKey(key)
			}
			return nil
		}
		if max := k.cfg.MaxTenantKeys; max > 0 {
			n, err := r.tx.CountAPIKeys(tenant)
			if err != nil {
				return err
			}
			if n >= max {
				return Errorf(CodeValidation, "tenant %s holds %d keys, the kernel's ceiling (serve --max-tenant-keys): revoke one first", tenant, n)
			}
		}
		key.CreatedAt = r.now
		return r.tx.PutAPIKey(key)
	})
	if err != nil {
		return nil, "", err
	}
	return key, secret, nil
}

// DeleteKey revokes a key.
func (k *Kernel) DeleteKey(ctx context.Context, tenant, keyID string) error {
	_, err := k.update(ctx, func(r *rec) error {
		keys, err := r.tx.ListAPIKeys(tenant)
		if err != nil {
			return err
		}
		for _, key := range keys {
			if key.ID == keyID {
				return r.tx.DeleteAPIKey(tenant, keyID)
			}
		}
		return Errorf(CodeNotFound, "key %s not found in tenant %s", keyID, tenant)
	})
	return err
}

// ListKeys lists a tenant's keys (hashes only).
func (k *Kernel) ListKeys(ctx context.Context, tenant string) ([]*APIKey, error) {
	var out []*APIKey
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		out, err = tx.ListAPIKeys(tenant)
		return err
	})
	return out, err
}

// AuthenticateKey finds the stored key for a bearer secret.
func (k *Kernel) AuthenticateKey(ctx context.Context, secret string) (*APIKey, error) {
	var key *APIKey
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		key, err = tx.APIKeyByHash(HashKey(secret))
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, Errorf(CodeUnauthenticated, "unknown API key")
		}
		return nil, fmt.Errorf("look up key: %w", err)
	}
	return key, nil
}

// tenantToChange reads a tenant's record to change it in r: the default
// tenant, which has no record until first configured, starts from a new
// one; any other unknown tenant is not found.
func tenantToChange(r *rec, tenant string) (*Tenant, error) {
	t, err := r.tx.Tenant(tenant)
	switch {
	case errors.Is(err, ErrNotFound) && tenant == DefaultTenant:
		return &Tenant{ID: DefaultTenant, CreatedAt: r.now}, nil
	case errors.Is(err, ErrNotFound):
		return nil, Errorf(CodeNotFound, "tenant %s not found", tenant)
	case err != nil:
		return nil, err
	}
	return t, nil
}
