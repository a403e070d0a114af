package kernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"

	"github.com/wicket-run/wicket/kernel/policy"
)

// BundleSource is a bundle as uploaded: a .tar.gz archive, or a map of
// files (path → content) from the JSON form.
type BundleSource struct {
	Archive []byte
	Files   map[string][]byte
}

// CompiledBundle is a validated, compiled bundle that is not live yet.
type CompiledBundle struct {
	Ref policy.BundleRef
	// Archive is the reproducible .tar.gz the store keeps.
	Archive []byte
	// Handle is the loader's compiled form, passed back to Activate.
	Handle any
}

// BundleLoader validates, compiles and activates bundles (plugins.Host
// implements it). Compile must refuse a bad bundle whole, with an error
// naming the file and field, and must not change what is live; Activate
// swaps a compiled bundle in atomically (the previous revision is released);
// Remove unloads one.
type BundleLoader interface {
	Compile(ctx context.Context, tenant string, src BundleSource) (*CompiledBundle, error)
	Activate(tenant string, cb *CompiledBundle)
	Remove(tenant, name string)
	// RulesBundle wraps native YAML rules (the body of POST /v0/policies/{agent})
	// as a rules bundle named name.
	RulesBundle(name string, rulesYAML []byte) (BundleSource, error)
}

// SetBundleLoader installs the loader (call before serving).
func (k *Kernel) SetBundleLoader(l BundleLoader) { k.bundles = l }

func (k *Kernel) loader() (BundleLoader, error) {
	if k.bundles == nil {
		return nil, Errorf(CodeUnavailable, "no policy engines are configured")
	}
	return k.bundles, nil
}

// PutBundle validates and compiles a bundle, stores it, and makes it live.
// If name is set it must match the manifest's name. A bundle that fails to
// load is refused whole; the running revision stays.
func (k *Kernel) PutBundle(ctx context.Context, tenant, name string, src BundleSource) (*BundleRecord, error) {
	l, err := k.loader()
	if err != nil {
		return nil, err
	}
	cb, err := l.Compile(ctx, tenant, src)
	if err != nil {
		var ke *Error
		if errors.As(err, &ke) {
			return nil, err
		}
		return nil, &Error{Code: CodeValidation, Message: "bundle refused: " + err.Error()}
	}
	if name != "" && cb.Ref.Name != name {
		return nil, Errorf(CodeValidation, "bundle manifest names %q but the request names %q", cb.Ref.Name, name)
	}
	br := &BundleRecord{Tenant: tenant, Name: cb.Ref.Name, Revision: cb.Ref.Revision, Digest: cb.Ref.Digest, Engine: cb.Ref.Engine, Archive: cb.Archive}
	// Stored and activated under bundleMu: a replica reloading the bundle
	// meanwhile cannot activate an older revision after this one.
	k.sh.bundleMu.Lock()
	defer k.sh.bundleMu.Unlock()
	_, err = k.update(ctx, func(r *rec) error {
		if err := k.requireTenant(r.tx, tenant); err != nil {
			return err
		}
		br.UpdatedAt = r.now
		return r.tx.PutBundle(br)
	})
	if err != nil {
		return nil, err
	}
	l.Activate(tenant, cb)
	k.markActive(Ref{Tenant: tenant, Name: br.Name}, br.Digest)
	return br, nil
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

// DeleteBundle removes a bundle. Agents still bound to it are then denied
// (fail closed) until rebound.
func (k *Kernel) DeleteBundle(ctx context.Context, tenant, name string) error {
	k.sh.bundleMu.Lock()
	defer k.sh.bundleMu.Unlock()
	_, err := k.update(ctx, func(r *rec) error {
		if _, err := r.tx.Bundle(tenant, name); err != nil {
			if errors.Is(err, ErrNotFound) {
				return Errorf(CodeNotFound, "bundle %s not found", name)
			}
			return err
		}
		return r.tx.DeleteBundle(tenant, name)
	})
	if err == nil && k.bundles != nil {
		k.bundles.Remove(tenant, name)
		delete(k.sh.active, Ref{Tenant: tenant, Name: name})
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

// SetAgentPolicy stores native YAML rules as the agent's own bundle and binds
// the agent to it.
func (k *Kernel) SetAgentPolicy(ctx context.Context, tenant, agentID string, rulesYAML []byte) (*BundleRecord, error) {
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
	rec, err := k.PutBundle(ctx, tenant, AgentPolicyBundle(agentID), src)
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

// LoadBundles compiles and activates every stored bundle (at boot). A stored
// bundle that no longer compiles is logged and skipped: agents bound to it
// are denied until it is replaced.
func (k *Kernel) LoadBundles(ctx context.Context) error {
	return k.syncBundles(ctx)
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
	Idempotency string
	Labels      map[string]string
}

// EvalResult is what a dry run answers: the decision and what produced it.
type EvalResult struct {
	Decision   policy.Action    `json:"decision"`
	Reason     string           `json:"reason,omitempty"`
	RuleID     string           `json:"rule_id,omitempty"`
	Bundle     policy.BundleRef `json:"bundle"`
	EvalTimeNS int64            `json:"eval_ns"`
	Approval   *policy.Approval `json:"approval,omitempty"`
	RateLimits []RateLimitRule  `json:"rate_limits,omitempty"`
}

// EvalPolicy runs the agent's policy on a step without recording anything.
func (k *Kernel) EvalPolicy(ctx context.Context, req EvalRequest) (*EvalResult, error) {
	sr := StepRequest{Kind: req.Kind, Target: req.Target, Args: req.Args, Effect: req.Effect, Idempotency: req.Idempotency}
	if err := validateStep(&sr); err != nil {
		return nil, err
	}
	if len(sr.Args) == 0 {
		sr.Args = json.RawMessage("null")
	}
	agent, err := k.Agent(ctx, req.Tenant, req.AgentID)
	if err != nil {
		return nil, err
	}
	args, h, err := canonArgs(sr.Args)
	if err != nil {
		return nil, Errorf(CodeValidation, "args: %v", err)
	}
	in := &policy.Input{Tenant: req.Tenant, AgentID: req.AgentID, ExecutionID: "dry-run",
		Step:      policy.Step{Kind: sr.Kind, Target: sr.Target, Args: args, ArgsHash: h, Idempotency: sr.Idempotency, Effect: sr.Effect},
		Execution: policy.Execution{Status: string(ExecRunning), Labels: req.Labels, CreatedAt: k.now()}}
	res, err := k.policy.Decide(ctx, agent, in)
	if err != nil {
		return nil, err
	}
	return &EvalResult{Decision: res.Decision.Decision, Reason: res.Decision.Reason, RuleID: res.Decision.RuleID,
		Bundle: res.Bundle, EvalTimeNS: res.EvalTime.Nanoseconds(), Approval: res.Decision.Approval, RateLimits: res.RateLimits}, nil
}
