// Package manifest reads the provisioning manifest of `wicket serve
// --config FILE` and applies it to a kernel as an upsert: tenants with
// their keys first, then bundles, then agents with their policies, and last
// the tenants' guards. Everything the manifest stores is the admin's: its
// bundles (and agents' inline policies) are admin-owned, which is what a
// guard must be, so a guard names a bundle listed under bundles with the
// guarded tenant's id as its tenant.
//
// # Format
//
//	bundles:
//	  - name: research
//	    path: bundles/research     # directory or .tar.gz, relative to the manifest
//	  - name: no-destructive
//	    path: bundles/no-destructive
//	    tenant: acme               # default: default
//	  - name: authz                # or pulled from a bundle server (OPA's protocol)
//	    source: {url: "https://bundles.example/authz.tar.gz", min_delay: 60s, max_delay: 120s}
//	tenants:
//	  - id: acme
//	    keys: [{principal: ci, role: client, key: "${ACME_CI_KEY}"}]
//	    guards: [no-destructive]
//	    allow_bundle_sources: true  # its tenant-admins may set bundle server URLs
//	    bundle_keys:                # verify the tenant's bundle signatures
//	      - {id: acme-ci, algorithm: ES256, key_file: keys/acme.pub}   # or key: "-----BEGIN ..."
//	agents:
//	  - id: researcher
//	    tenant: acme                # default: default
//	    webhook_url: http://127.0.0.1:5001/webhook
//	    secret: ${RESEARCHER_SECRET}
//	    signing: v1                 # or body; omitted: the stored agent's, v1 if new
//	    policy: |                   # native rules inline, or policy_file, or bundle
//	      default_action: deny
//	llm_providers:                  # the LLM gateway's upstreams, per tenant
//	  - name: openai
//	    tenant: acme                # default: default
//	    dialect: openai             # or anthropic
//	    base_url: https://api.openai.com/v1
//	    api_key_env: OPENAI_API_KEY # or api_key_file: secrets/openai.key (0600)
//	    models: [{name: gpt-4o-mini, input_usd_per_mtok: 0.15, output_usd_per_mtok: 0.6}]
//
// ${NAME} in secret, key and webhook_url is replaced by the environment
// variable NAME; an unset variable is an error. Unknown fields are errors,
// and so is any malformed entry: the boot fails rather than running with
// something more permissive than the operator wrote.
package manifest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/pull"
)

// Manifest is the parsed file.
type Manifest struct {
	Bundles []Bundle `yaml:"bundles"`
	Tenants []Tenant `yaml:"tenants"`
	Agents  []Agent  `yaml:"agents"`
	// LLMProviders are the upstreams of the LLM gateway, per tenant.
	LLMProviders []LLMProvider `yaml:"llm_providers"`
	// Dir is the manifest's directory; relative paths resolve against it.
	Dir string `yaml:"-"`
}

// Bundle names a bundle directory or archive to load, or a bundle server
// to keep it in sync with.
type Bundle struct {
	Name   string `yaml:"name"`
	Path   string `yaml:"path"`
	Tenant string `yaml:"tenant"`
	// Source, instead of Path, pulls the bundle from a bundle server.
	Source *Source `yaml:"source"`
}

// Source is a bundle server URL and OPA's polling delays.
type Source struct {
	URL      string        `yaml:"url"`
	MinDelay time.Duration `yaml:"min_delay"`
	MaxDelay time.Duration `yaml:"max_delay"`
}

// Tenant provisions a tenant, its keys and guard bundles.
type Tenant struct {
	ID     string   `yaml:"id"`
	Keys   []Key    `yaml:"keys"`
	Guards []string `yaml:"guards"`
	// Retention overrides serve --retention for the tenant ("720h"; "0s"
	// keeps its executions forever).
	Retention string `yaml:"retention"`
	// BundleKeys verify the signatures of the tenant's bundles.
	BundleKeys []BundleKey `yaml:"bundle_keys"`
	// AllowBundleSources lets the tenant's tenant-admins point bundles at
	// bundle servers (PUT /v0/bundles/{name}/source).
	AllowBundleSources bool `yaml:"allow_bundle_sources"`
}

// BundleKey is a bundle verification key: key is the PEM public key (or
// HMAC secret) itself, or key_file names a file holding it (relative to the
// manifest).
type BundleKey struct {
	ID        string `yaml:"id"`
	Algorithm string `yaml:"algorithm"`
	Key       string `yaml:"key"`
	KeyFile   string `yaml:"key_file"`
	Scope     string `yaml:"scope"`
}

// Key is an API key given in the manifest.
type Key struct {
	Principal string `yaml:"principal"`
	Role      string `yaml:"role"`
	Key       string `yaml:"key"`
}

// Agent provisions an agent and its policy binding.
type Agent struct {
	ID         string `yaml:"id"`
	Tenant     string `yaml:"tenant"`
	WebhookURL string `yaml:"webhook_url"`
	Secret     string `yaml:"secret"`
	Policy     string `yaml:"policy"`
	PolicyFile string `yaml:"policy_file"`
	Bundle     string `yaml:"bundle"`
	// Signing is "v1" or "body"; empty keeps the scheme of an agent
	// already stored and gives a new agent "v1".
	Signing string `yaml:"signing"`
	// OnInterrupted is "indeterminate" (the default) or "approval": what an
	// at_most_once step of the agent found in flight becomes.
	OnInterrupted string `yaml:"on_interrupted"`
}

// LLMProvider is an upstream of the LLM gateway for one tenant. Its key
// comes from the environment (api_key_env) or a file (api_key_file,
// relative to the manifest), never from the manifest itself.
type LLMProvider struct {
	Name              string     `yaml:"name"`
	Tenant            string     `yaml:"tenant"`
	Dialect           string     `yaml:"dialect"`
	BaseURL           string     `yaml:"base_url"`
	APIKeyEnv         string     `yaml:"api_key_env"`
	APIKeyFile        string     `yaml:"api_key_file"`
	IdempotencyHeader string     `yaml:"idempotency_header"`
	Models            []LLMModel `yaml:"models"`
	// apiKey is api_key_env's value, read at Parse.
	apiKey string
}

// LLMModel is a model a provider offers and its price in USD per million
// input and output tokens.
type LLMModel struct {
	Name   string  `yaml:"name"`
	Input  float64 `yaml:"input_usd_per_mtok"`
	Output float64 `yaml:"output_usd_per_mtok"`
}

// LLMKey returns a provider's API key: api_key_env's value, or the
// trimmed content of api_key_file ("" with neither: a provider that takes
// no key). A key file others may read is refused.
func (m *Manifest) LLMKey(p LLMProvider) (string, error) {
	if p.APIKeyFile == "" {
		return p.apiKey, nil
	}
	path := m.resolve(p.APIKeyFile)
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("llm provider %s: api_key_file: %w", p.Name, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("llm provider %s: api_key_file %s is readable by group or others (%s): chmod 600 it", p.Name, path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("llm provider %s: api_key_file: %w", p.Name, err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" || strings.ContainsAny(key, "\r\n") {
		return "", fmt.Errorf("llm provider %s: api_key_file %s must hold one non-empty line", p.Name, path)
	}
	return key, nil
}

// Load reads and validates a manifest file, expanding ${ENV} references
// with lookup (os.LookupEnv when nil).
func Load(path string, lookup func(string) (string, bool)) (*Manifest, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	m, err := Parse(src, lookup)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", path, err)
	}
	m.Dir = filepath.Dir(path)
	return m, nil
}

// Parse decodes and validates manifest YAML.
func Parse(src []byte, lookup func(string) (string, bool)) (*Manifest, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	var m Manifest
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse: %w", err)
	}
	expand := func(where, s string) (string, error) {
		var missing []string
		out := os.Expand(s, func(name string) string {
			v, ok := lookup(name)
			if !ok {
				missing = append(missing, name)
			}
			return v
		})
		if len(missing) > 0 {
			return "", fmt.Errorf("%s: environment variable %s is not set", where, strings.Join(missing, ", "))
		}
		return out, nil
	}
	seen := map[string]bool{}
	for i := range m.Bundles {
		b := &m.Bundles[i]
		where := fmt.Sprintf("bundles[%d]", i)
		switch {
		case b.Path == "" && b.Source == nil:
			return nil, fmt.Errorf("%s: path or source is required", where)
		case b.Path != "" && b.Source != nil:
			return nil, fmt.Errorf("%s: give path or source, not both", where)
		case b.Source != nil:
			if b.Name == "" {
				return nil, fmt.Errorf("%s: a bundle with a source needs a name", where)
			}
			u, err := expand(where+".source.url", b.Source.URL)
			if err != nil {
				return nil, err
			}
			b.Source.URL = u
			if err := b.PullSource().Validate(); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
		}
		if b.Tenant == "" {
			b.Tenant = kernel.DefaultTenant
		}
	}
	for i := range m.Tenants {
		t := &m.Tenants[i]
		where := fmt.Sprintf("tenants[%d]", i)
		if !kernel.ValidID(t.ID) {
			return nil, fmt.Errorf("%s: id %q is invalid", where, t.ID)
		}
		if err := kernel.ValidRetention(t.Retention); err != nil {
			return nil, fmt.Errorf("%s (%s).retention: %w", where, t.ID, err)
		}
		for j := range t.Keys {
			k := &t.Keys[j]
			kw := fmt.Sprintf("%s (%s).keys[%d]", where, t.ID, j)
			v, err := expand(kw+".key", k.Key)
			if err != nil {
				return nil, err
			}
			k.Key = v
			if len(k.Key) < 16 {
				return nil, fmt.Errorf("%s.key: must be at least 16 bytes", kw)
			}
			switch k.Role {
			case kernel.RoleClient, kernel.RoleTenantAdmin, kernel.RoleApprover:
			case kernel.RoleAdmin:
				if t.ID != kernel.DefaultTenant {
					return nil, fmt.Errorf("%s.role: admin keys belong to the default tenant", kw)
				}
			default:
				return nil, fmt.Errorf("%s.role: %q is invalid (want client, approver, tenant-admin, or admin in the default tenant)", kw, k.Role)
			}
			if k.Principal == "" {
				return nil, fmt.Errorf("%s.principal is required", kw)
			}
		}
	}
	for i := range m.Agents {
		a := &m.Agents[i]
		where := fmt.Sprintf("agents[%d]", i)
		if a.Tenant == "" {
			a.Tenant = kernel.DefaultTenant
		}
		if !kernel.ValidID(a.ID) {
			return nil, fmt.Errorf("%s: id %q is invalid", where, a.ID)
		}
		where += " (" + a.ID + ")"
		if seen[a.Tenant+"/"+a.ID] {
			return nil, fmt.Errorf("%s: duplicate agent", where)
		}
		seen[a.Tenant+"/"+a.ID] = true
		var err error
		if a.Secret, err = expand(where+".secret", a.Secret); err != nil {
			return nil, err
		}
		if a.WebhookURL, err = expand(where+".webhook_url", a.WebhookURL); err != nil {
			return nil, err
		}
		n := 0
		for _, s := range []string{a.Policy, a.PolicyFile, a.Bundle} {
			if s != "" {
				n++
			}
		}
		if n > 1 {
			return nil, fmt.Errorf("%s: give at most one of policy, policy_file and bundle", where)
		}
		switch a.Signing {
		case "", kernel.SigningV1, kernel.SigningBody:
		default:
			return nil, fmt.Errorf("%s: signing %q is invalid (want %s or %s)", where, a.Signing, kernel.SigningV1, kernel.SigningBody)
		}
		switch a.OnInterrupted {
		case "", kernel.OnInterruptedIndeterminate, kernel.OnInterruptedApproval:
		default:
			return nil, fmt.Errorf("%s: on_interrupted %q is invalid (want %s or %s)", where, a.OnInterrupted, kernel.OnInterruptedIndeterminate, kernel.OnInterruptedApproval)
		}
	}
	for i := range m.LLMProviders {
		p := &m.LLMProviders[i]
		where := fmt.Sprintf("llm_providers[%d]", i)
		if p.Tenant == "" {
			p.Tenant = kernel.DefaultTenant
		}
		if !kernel.ValidID(p.Name) {
			return nil, fmt.Errorf("%s: name %q is invalid", where, p.Name)
		}
		where += " (" + p.Name + ")"
		var err error
		if p.BaseURL, err = expand(where+".base_url", p.BaseURL); err != nil {
			return nil, err
		}
		switch {
		case p.APIKeyEnv != "" && p.APIKeyFile != "":
			return nil, fmt.Errorf("%s: give api_key_env or api_key_file, not both", where)
		case p.APIKeyEnv != "":
			v, ok := lookup(p.APIKeyEnv)
			if !ok || strings.TrimSpace(v) == "" {
				return nil, fmt.Errorf("%s.api_key_env: environment variable %s is not set", where, p.APIKeyEnv)
			}
			p.apiKey = strings.TrimSpace(v)
		}
	}
	return &m, nil
}

// Apply provisions everything in the manifest. It stops at the first error.
func (m *Manifest) Apply(ctx context.Context, k *kernel.Kernel) error {
	for _, t := range m.Tenants {
		if err := k.EnsureTenant(ctx, t.ID); err != nil {
			return fmt.Errorf("tenant %s: %w", t.ID, err)
		}
		if t.ID != kernel.DefaultTenant || t.Retention != "" {
			if _, err := k.SetTenantRetention(ctx, t.ID, t.Retention); err != nil {
				return fmt.Errorf("tenant %s: %w", t.ID, err)
			}
		}
		keys, err := m.bundleKeys(t)
		if err != nil {
			return err
		}
		if t.ID != kernel.DefaultTenant || len(keys) > 0 || t.AllowBundleSources {
			if err := k.SetTenantBundleTrust(ctx, t.ID, keys, t.AllowBundleSources); err != nil {
				return fmt.Errorf("tenant %s: %w", t.ID, err)
			}
		}
		for _, key := range t.Keys {
			if _, _, err := k.CreateKey(ctx, t.ID, key.Role, key.Principal, key.Key); err != nil {
				return fmt.Errorf("tenant %s key %s: %w", t.ID, key.Principal, err)
			}
		}
	}
	for i, b := range m.Bundles {
		if b.Source != nil {
			continue // pulled: see Sources
		}
		name := b.Name
		if name == "" {
			name = bundleName(b.Path)
		}
		src, err := m.readBundle(b.Path, name)
		if err != nil {
			return fmt.Errorf("bundles[%d]: %w", i, err)
		}
		src.Name = name
		if _, err := k.PutBundle(ctx, b.Tenant, b.Name, src, kernel.BundleOwnerAdmin); err != nil {
			return fmt.Errorf("bundles[%d] (%s): %w", i, b.Path, err)
		}
	}
	for i, a := range m.Agents {
		where := fmt.Sprintf("agents[%d] (%s)", i, a.ID)
		ag := kernel.Agent{ID: a.ID, Tenant: a.Tenant, WebhookURL: a.WebhookURL, Secret: a.Secret, Bundle: a.Bundle, Signing: a.Signing,
			OnInterrupted: a.OnInterrupted}
		rules := []byte(a.Policy)
		if a.PolicyFile != "" {
			var err error
			if rules, err = os.ReadFile(m.resolve(a.PolicyFile)); err != nil {
				return fmt.Errorf("%s: policy_file: %w", where, err)
			}
		}
		if a.Policy != "" || a.PolicyFile != "" {
			// SetAgentPolicy stores the rules bundle and binds the agent to
			// it; until then a new agent is bound to nothing and an existing
			// one keeps its binding (nothing is served during provisioning).
			ag.Bundle = ""
			if old, err := k.Agent(ctx, a.Tenant, a.ID); err == nil {
				ag.Bundle = old.Bundle
			}
		}
		if _, err := k.PutAgent(ctx, ag); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if len(rules) > 0 {
			if _, err := k.SetAgentPolicy(ctx, a.Tenant, a.ID, rules, kernel.BundleOwnerAdmin); err != nil {
				return fmt.Errorf("%s: policy: %w", where, err)
			}
		}
	}
	// Guards last: they must name bundles stored above. The manifest is
	// authoritative for the tenants it lists (no guards: none), except the
	// default tenant, whose guards it sets only when it lists some.
	for _, t := range m.Tenants {
		if t.ID == kernel.DefaultTenant && len(t.Guards) == 0 {
			continue
		}
		if _, err := k.SetTenantGuards(ctx, t.ID, t.Guards); err != nil {
			return fmt.Errorf("tenant %s guards: %w", t.ID, err)
		}
	}
	return nil
}

// PullSource is the bundle's source as the puller takes it.
func (b Bundle) PullSource() pull.Source {
	s := pull.Source{Tenant: b.Tenant, Name: b.Name, Owner: kernel.BundleOwnerAdmin}
	if b.Source != nil {
		s.URL, s.MinDelay, s.MaxDelay = b.Source.URL, b.Source.MinDelay, b.Source.MaxDelay
	}
	return s
}

// Sources lists the bundles to pull from bundle servers.
func (m *Manifest) Sources() []pull.Source {
	var out []pull.Source
	for _, b := range m.Bundles {
		if b.Source != nil {
			out = append(out, b.PullSource())
		}
	}
	return out
}

// bundleKeys reads a tenant's bundle verification keys and checks them.
func (m *Manifest) bundleKeys(t Tenant) ([]kernel.BundleKey, error) {
	var out []kernel.BundleKey
	var check []bundle.Key
	for i, bk := range t.BundleKeys {
		where := fmt.Sprintf("tenant %s: bundle_keys[%d]", t.ID, i)
		key := bk.Key
		switch {
		case key != "" && bk.KeyFile != "":
			return nil, fmt.Errorf("%s: give key or key_file, not both", where)
		case bk.KeyFile != "":
			b, err := os.ReadFile(m.resolve(bk.KeyFile))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			key = string(b)
		}
		id := bk.ID
		if id == "" {
			id = bundle.DefaultKeyID
		}
		out = append(out, kernel.BundleKey{ID: id, Algorithm: bk.Algorithm, Key: key, Scope: bk.Scope})
		check = append(check, bundle.Key{ID: id, Algorithm: bk.Algorithm, Key: key, Scope: bk.Scope})
	}
	if err := bundle.ValidateKeys(check); err != nil {
		return nil, fmt.Errorf("tenant %s: bundle_keys: %w", t.ID, err)
	}
	return out, nil
}

func (m *Manifest) resolve(p string) string {
	if filepath.IsAbs(p) || m.Dir == "" {
		return p
	}
	return filepath.Join(m.Dir, p)
}

func (m *Manifest) readBundle(p, name string) (kernel.BundleSource, error) {
	p = m.resolve(p)
	st, err := os.Stat(p)
	if err != nil {
		return kernel.BundleSource{}, err
	}
	if st.IsDir() {
		b, err := bundle.Options{Name: name}.LoadDir(p)
		if err != nil {
			return kernel.BundleSource{}, err
		}
		ar, err := b.TarGz()
		if err != nil {
			return kernel.BundleSource{}, err
		}
		return kernel.BundleSource{Archive: ar}, nil
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return kernel.BundleSource{}, err
	}
	return kernel.BundleSource{Archive: data}, nil
}

// bundleName names a bundle without bundle.yaml after its directory or
// archive ("authz/", "authz.tar.gz" → "authz").
func bundleName(p string) string {
	base := strings.ToLower(filepath.Base(filepath.Clean(p)))
	for _, ext := range []string{".tar.gz", ".tgz"} {
		base = strings.TrimSuffix(base, ext)
	}
	return base
}
