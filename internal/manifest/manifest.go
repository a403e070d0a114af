// Package manifest reads the provisioning manifest of `wicket serve
// --config FILE` and applies it to a kernel as an upsert: bundles first,
// then tenants with their keys, then agents with their policies.
//
// # Format
//
//	bundles:
//	  - name: research
//	    path: bundles/research     # directory or .tar.gz, relative to the manifest
//	tenants:
//	  - id: acme
//	    keys: [{principal: ci, role: client, key: "${ACME_CI_KEY}"}]
//	    guards: [no-destructive]
//	agents:
//	  - id: researcher
//	    tenant: acme                # default: default
//	    webhook_url: http://127.0.0.1:5001/webhook
//	    secret: ${RESEARCHER_SECRET}
//	    signing: v1                 # or body; omitted: the stored agent's, v1 if new
//	    policy: |                   # native rules inline, or policy_file, or bundle
//	      default_action: deny
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

	"go.yaml.in/yaml/v3"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// Manifest is the parsed file.
type Manifest struct {
	Bundles []Bundle `yaml:"bundles"`
	Tenants []Tenant `yaml:"tenants"`
	Agents  []Agent  `yaml:"agents"`
	// Dir is the manifest's directory; relative paths resolve against it.
	Dir string `yaml:"-"`
}

// Bundle names a bundle directory or archive to load.
type Bundle struct {
	Name   string `yaml:"name"`
	Path   string `yaml:"path"`
	Tenant string `yaml:"tenant"`
}

// Tenant provisions a tenant, its keys and guard bundles.
type Tenant struct {
	ID     string   `yaml:"id"`
	Keys   []Key    `yaml:"keys"`
	Guards []string `yaml:"guards"`
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
		if b.Path == "" {
			return nil, fmt.Errorf("%s: path is required", where)
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
			case kernel.RoleClient, kernel.RoleTenantAdmin:
			case kernel.RoleAdmin:
				if t.ID != kernel.DefaultTenant {
					return nil, fmt.Errorf("%s.role: admin keys belong to the default tenant", kw)
				}
			default:
				return nil, fmt.Errorf("%s.role: %q is invalid (want client or tenant-admin)", kw, k.Role)
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
	}
	return &m, nil
}

// Apply provisions everything in the manifest. It stops at the first error.
func (m *Manifest) Apply(ctx context.Context, k *kernel.Kernel) error {
	for _, t := range m.Tenants {
		if t.ID != kernel.DefaultTenant {
			if err := k.UpsertTenant(ctx, kernel.Tenant{ID: t.ID, Guards: t.Guards}); err != nil {
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
		src, err := m.readBundle(b.Path)
		if err != nil {
			return fmt.Errorf("bundles[%d]: %w", i, err)
		}
		if _, err := k.PutBundle(ctx, b.Tenant, b.Name, src); err != nil {
			return fmt.Errorf("bundles[%d] (%s): %w", i, b.Path, err)
		}
	}
	for _, a := range m.Agents {
		ag := kernel.Agent{ID: a.ID, Tenant: a.Tenant, WebhookURL: a.WebhookURL, Secret: a.Secret, Bundle: a.Bundle, Signing: a.Signing}
		if a.Policy != "" || a.PolicyFile != "" {
			ag.Bundle = kernel.AgentPolicyBundle(a.ID)
		}
		if _, err := k.PutAgent(ctx, ag); err != nil {
			return fmt.Errorf("agent %s: %w", a.ID, err)
		}
		rules := []byte(a.Policy)
		if a.PolicyFile != "" {
			p := m.resolve(a.PolicyFile)
			var err error
			if rules, err = os.ReadFile(p); err != nil {
				return fmt.Errorf("agent %s: policy_file: %w", a.ID, err)
			}
		}
		if len(rules) > 0 {
			if _, err := k.SetAgentPolicy(ctx, a.Tenant, a.ID, rules); err != nil {
				return fmt.Errorf("agent %s: policy: %w", a.ID, err)
			}
		}
	}
	return nil
}

func (m *Manifest) resolve(p string) string {
	if filepath.IsAbs(p) || m.Dir == "" {
		return p
	}
	return filepath.Join(m.Dir, p)
}

func (m *Manifest) readBundle(p string) (kernel.BundleSource, error) {
	p = m.resolve(p)
	st, err := os.Stat(p)
	if err != nil {
		return kernel.BundleSource{}, err
	}
	if st.IsDir() {
		b, err := bundle.LoadDir(p)
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
