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
func (k *Kernel) CreateTenant(ctx context.Context, t Tenant) (*Tenant, error) {
	if !ValidID(t.ID) {
		return nil, Errorf(CodeValidation, "tenant id %q is invalid", t.ID)
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
		t.CreatedAt = r.now
		return r.tx.PutTenant(&t)
	})
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// UpsertTenant creates or updates a tenant (manifest provisioning).
func (k *Kernel) UpsertTenant(ctx context.Context, t Tenant) error {
	if !ValidID(t.ID) {
		return Errorf(CodeValidation, "tenant id %q is invalid", t.ID)
	}
	if err := ValidRetention(t.Retention); err != nil {
		return err
	}
	_, err := k.update(ctx, func(r *rec) error {
		if old, err := r.tx.Tenant(t.ID); err == nil {
			t.CreatedAt = old.CreatedAt
		} else {
			t.CreatedAt = r.now
		}
		return r.tx.PutTenant(&t)
	})
	return err
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

// TenantGuards returns the guard bundles of a tenant.
func (k *Kernel) TenantGuards(ctx context.Context, tenant string) ([]string, error) {
	var g []string
	err := k.store.View(ctx, func(tx ReadTx) error {
		t, err := tx.Tenant(tenant)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		g = t.Guards
		return nil
	})
	return g, err
}

// CreateKey issues an API key for a tenant. The secret is returned once;
// only its hash is stored. A non-empty secret (manifest provisioning) is
// used as given.
func (k *Kernel) CreateKey(ctx context.Context, tenant, role, principal, secret string) (*APIKey, string, error) {
	switch role {
	case RoleAdmin, RoleTenantAdmin, RoleClient:
	default:
		return nil, "", Errorf(CodeValidation, "role %q is invalid (want admin, tenant-admin or client)", role)
	}
	if principal == "" {
		return nil, "", Errorf(CodeValidation, "principal is required")
	}
	if secret == "" {
		var b [24]byte
		_, _ = rand.Read(b[:])
		secret = KeyPrefix + hex.EncodeToString(b[:])
	} else if len(secret) < 16 {
		return nil, "", Errorf(CodeValidation, "key for %s must be at least 16 bytes", principal)
	}
	key := &APIKey{ID: "key_" + strings.ReplaceAll(k.ids.next(k.now()), "-", "")[:20], Tenant: tenant, Role: role, Principal: principal, Hash: HashKey(secret)}
	_, err := k.update(ctx, func(r *rec) error {
		if err := k.requireTenant(r.tx, tenant); err != nil {
			return err
		}
		if old, err := r.tx.APIKeyByHash(key.Hash); err == nil {
			if old.Tenant != tenant || old.Role != role {
				return Errorf(CodeConflict, "that key is already registered for another tenant or role")
			}
			*key = *old // idempotent provisioning
			return nil
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
