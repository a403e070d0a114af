package kernel

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
)

var (
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)
	bundlePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)
)

// ValidBundleName reports whether s is a valid bundle name (the rule of
// plugins/bundle, repeated here because the kernel imports no engine).
func ValidBundleName(s string) bool { return bundlePattern.MatchString(s) }

// ValidID reports whether s is a valid agent, tenant or bundle id.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// IDRule says what ValidID accepts, for the errors that refuse an id.
const IDRule = "want 1-128 of [A-Za-z0-9_.:-], starting with a letter or digit"

// Ceilings on what a tenant-admin configures, so that each record stays
// small: agents are cached in memory with their secret and webhook URL,
// and the server keeps a verifier per secret.
const (
	// MaxSecretBytes bounds an agent's secret (an HMAC key: 32 bytes are
	// plenty; keys past 64 bytes are hashed first anyway).
	MaxSecretBytes = 1024
	// MaxWebhookURLBytes bounds an agent's webhook URL.
	MaxWebhookURLBytes = 4096
	// MaxPrincipalBytes bounds the principal an API key names.
	MaxPrincipalBytes = 256
)

// PutAgent registers or updates an agent (upsert). The secret must be at
// least 16 bytes, and a bundle it is bound to must be stored in its tenant.
// An empty Signing keeps an existing agent's scheme and gives a new agent
// SigningV1.
func (k *Kernel) PutAgent(ctx context.Context, a Agent) (*Agent, error) {
	if a.Tenant == "" {
		a.Tenant = DefaultTenant
	}
	if !ValidID(a.ID) {
		return nil, Errorf(CodeValidation, "agent id %q is invalid: "+IDRule, a.ID)
	}
	if len(a.WebhookURL) > MaxWebhookURLBytes {
		return nil, Errorf(CodeValidation, "agent %s: webhook_url is %d bytes; at most %d", a.ID, len(a.WebhookURL), MaxWebhookURLBytes)
	}
	if a.WebhookURL != "" { // none: a gate-only agent, driven by sessions
		u, err := url.Parse(a.WebhookURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, Errorf(CodeValidation, "agent %s: webhook_url %q must be an absolute http(s) URL", a.ID, a.WebhookURL)
		}
	}
	switch a.OnInterrupted {
	case "", OnInterruptedIndeterminate, OnInterruptedApproval:
	default:
		return nil, Errorf(CodeValidation, "agent %s: on_interrupted %q is invalid (want %s or %s)", a.ID, a.OnInterrupted, OnInterruptedIndeterminate, OnInterruptedApproval)
	}
	if v, ok := k.deliv.(WebhookValidator); ok && a.WebhookURL != "" {
		if err := v.ValidateWebhookURL(ctx, a.WebhookURL); err != nil {
			return nil, Errorf(CodeValidation, "agent %s: webhook_url %q is refused: %v", a.ID, a.WebhookURL, err)
		}
	}
	if len(a.Secret) < 16 {
		return nil, Errorf(CodeValidation, "agent %s: secret must be at least 16 bytes", a.ID)
	}
	if len(a.Secret) > MaxSecretBytes {
		return nil, Errorf(CodeValidation, "agent %s: secret is %d bytes; at most %d", a.ID, len(a.Secret), MaxSecretBytes)
	}
	switch a.Signing {
	case "", SigningV1, SigningBody:
	default:
		return nil, Errorf(CodeValidation, "agent %s: signing %q is invalid (want %s or %s)", a.ID, a.Signing, SigningV1, SigningBody)
	}
	if a.Bundle != "" && !ValidBundleName(a.Bundle) {
		return nil, Errorf(CodeValidation, "agent %s: bundle name %q is invalid (want [a-z0-9][a-z0-9_.-]{0,62})", a.ID, a.Bundle)
	}
	k.agentsMu.RLock()
	gen := k.agentsGen
	k.agentsMu.RUnlock()
	var out *Agent
	_, err := k.update(ctx, func(r *rec) error {
		if _, err := r.tx.Tenant(a.Tenant); err != nil && a.Tenant != DefaultTenant {
			if errors.Is(err, ErrNotFound) {
				return Errorf(CodeNotFound, "tenant %s not found", a.Tenant)
			}
			return err
		}
		if a.Bundle != "" {
			// The binding is checked when it is made: a name that resolves to
			// nothing would otherwise fail closed on every step, silently.
			if _, err := r.tx.Bundle(a.Tenant, a.Bundle); err != nil {
				if errors.Is(err, ErrNotFound) {
					return Errorf(CodeValidation, "agent %s: bundle %q does not exist in tenant %s: upload it first (wicket bundle put)", a.ID, a.Bundle, a.Tenant)
				}
				return fmt.Errorf("read bundle %s: %w", a.Bundle, err)
			}
		}
		n := a
		n.CreatedAt, n.UpdatedAt = r.now, r.now
		if old, err := r.tx.Agent(a.Tenant, a.ID); err == nil {
			n.CreatedAt = old.CreatedAt
			if n.Signing == "" {
				n.Signing = old.SigningScheme()
			}
		} else if !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("read agent %s: %w", a.ID, err)
		} else if max := k.cfg.MaxTenantAgents; max > 0 {
			n, err := r.tx.CountAgents(a.Tenant)
			if err != nil {
				return err
			}
			if n >= max {
				return Errorf(CodeValidation, "tenant %s holds %d agents, the kernel's ceiling (serve --max-tenant-agents): delete one before registering %s", a.Tenant, n, a.ID)
			}
		}
		if n.Signing == "" {
			n.Signing = SigningV1
		}
		if err := r.tx.PutAgent(&n); err != nil {
			return fmt.Errorf("put agent %s: %w", a.ID, err)
		}
		out = &n
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Cached unless another change to agents was learned of meanwhile (two
	// puts racing may end here in either order): then the next read caches
	// what the store kept.
	k.agentsMu.Lock()
	if k.agentsGen == gen {
		k.agents[agentKey{a.Tenant, a.ID}] = out
	} else {
		delete(k.agents, agentKey{a.Tenant, a.ID})
	}
	k.agentsGen++
	k.agentsMu.Unlock()
	return out, nil
}

// Agent returns an agent, secret included (callers must not expose it).
func (k *Kernel) Agent(ctx context.Context, tenant, id string) (*Agent, error) {
	k.agentsMu.RLock()
	a, ok := k.agents[agentKey{tenant, id}]
	k.agentsMu.RUnlock()
	if ok {
		return a, nil
	}
	return k.loadAgent(ctx, tenant, id)
}

// loadAgent reads an agent into the cache (Agent's slow path, apart so
// that the fast path allocates nothing).
func (k *Kernel) loadAgent(ctx context.Context, tenant, id string) (*Agent, error) {
	k.agentsMu.RLock()
	gen := k.agentsGen
	k.agentsMu.RUnlock()
	var a *Agent
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		a, err = tx.Agent(tenant, id)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, Errorf(CodeNotFound, "agent %s not found", id)
		}
		return nil, fmt.Errorf("read agent %s: %w", id, err)
	}
	k.agentsMu.Lock()
	if k.agentsGen == gen {
		// Otherwise an agent changed since the read began: this copy may
		// predate the change, and the next read caches the current one.
		k.agents[agentKey{tenant, id}] = a
	}
	k.agentsMu.Unlock()
	return a, nil
}

// ListAgents lists a tenant's agents.
func (k *Kernel) ListAgents(ctx context.Context, tenant string) ([]*Agent, error) {
	var out []*Agent
	err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		out, err = tx.ListAgents(tenant)
		return err
	})
	return out, err
}

// DeleteAgent removes an agent. Its executions stay readable; they can no
// longer be dispatched.
func (k *Kernel) DeleteAgent(ctx context.Context, tenant, id string) error {
	_, err := k.update(ctx, func(r *rec) error {
		if _, err := r.tx.Agent(tenant, id); err != nil {
			if errors.Is(err, ErrNotFound) {
				return Errorf(CodeNotFound, "agent %s not found", id)
			}
			return err
		}
		return r.tx.DeleteAgent(tenant, id)
	})
	k.agentsMu.Lock()
	k.agentsGen++
	delete(k.agents, agentKey{tenant, id})
	k.agentsMu.Unlock()
	return err
}

// ExecutionOwner returns the tenant and agent of an execution; agent routes
// use it to find whose signature to check.
func (k *Kernel) ExecutionOwner(ctx context.Context, id string) (tenant, agentID string, err error) {
	k.ownersMu.RLock()
	o, ok := k.owners[id]
	k.ownersMu.RUnlock()
	if ok {
		return o.tenant, o.agentID, nil
	}
	return k.loadOwner(ctx, id)
}

// loadOwner reads an execution's owner into the cache (ExecutionOwner's
// slow path, apart so that the fast path allocates nothing).
func (k *Kernel) loadOwner(ctx context.Context, id string) (tenant, agentID string, err error) {
	var o owner
	err = k.store.View(ctx, func(tx ReadTx) error {
		t, err := tx.ExecutionTenant(id)
		if err != nil {
			return err
		}
		e, err := tx.Execution(t, id)
		if err != nil {
			return err
		}
		o = owner{tenant: t, agentID: e.AgentID}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return "", "", Errorf(CodeNotFound, "execution %s not found", id)
		}
		return "", "", fmt.Errorf("read execution %s: %w", id, err)
	}
	k.ownersMu.Lock()
	if len(k.owners) > 1<<16 {
		clear(k.owners)
	}
	k.owners[id] = o
	k.ownersMu.Unlock()
	return o.tenant, o.agentID, nil
}
