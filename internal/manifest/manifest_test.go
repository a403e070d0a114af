package manifest_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/manifest"
	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rules"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"unknown field", "agents:\n  - id: a\n    webhok_url: x\n", "webhok_url"},
		{"unset env", "agents:\n  - id: a\n    webhook_url: http://127.0.0.1:1/\n    secret: ${NOPE}\n", "NOPE is not set"},
		{"duplicate agent", "agents:\n  - {id: a, webhook_url: 'http://h/', secret: s}\n  - {id: a, webhook_url: 'http://h/', secret: s}\n", "duplicate agent"},
		{"two policies", "agents:\n  - {id: a, webhook_url: 'http://h/', secret: s, policy: 'x', bundle: b}\n", "at most one"},
		{"bad agent id", "agents:\n  - {id: 'a b', webhook_url: 'http://h/', secret: s}\n", "invalid"},
		{"bad role", "tenants:\n  - id: acme\n    keys: [{principal: ci, role: root, key: 0123456789abcdef0}]\n", "role"},
		{"short key", "tenants:\n  - id: acme\n    keys: [{principal: ci, role: client, key: short}]\n", "16 bytes"},
		{"bundle without path", "bundles:\n  - name: x\n", "path or source is required"},
		{"source and path", "bundles:\n  - {name: a, path: x, source: {url: \"https://example.com/a\"}}\n", "not both"},
		{"source without a name", "bundles:\n  - {source: {url: \"https://example.com/a\"}}\n", "needs a name"},
		{"source not http", "bundles:\n  - {name: a, source: {url: \"file:///etc/passwd\"}}\n", "http or https"},
		{"not yaml", "agents: [\n", "parse"},
		{"bad signing", "agents:\n  - {id: a, webhook_url: 'http://h/', secret: s, signing: hmac}\n", "signing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := manifest.Parse([]byte(tc.src), env(nil))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestApply(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "strict.yaml"), []byte("default_action: deny\nrules: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bdir := filepath.Join(dir, "bundles", "ro")
	if err := os.MkdirAll(bdir, 0o700); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(bdir, "bundle.yaml"), []byte("name: ro\nrevision: \"7\"\nengine: rules\n"), 0o600)
	_ = os.WriteFile(filepath.Join(bdir, "rules.yaml"), []byte("default_action: deny\nrules:\n  - id: reads\n    priority: 1\n    when: {effect: read_only}\n    then: {decision: allow}\n"), 0o600)
	gdir := filepath.Join(dir, "bundles", "no-rm")
	if err := os.MkdirAll(gdir, 0o700); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(gdir, "bundle.yaml"), []byte("name: no-rm\nrevision: \"1\"\nengine: rules\n"), 0o600)
	_ = os.WriteFile(filepath.Join(gdir, "rules.yaml"), []byte("rules:\n  - id: no-rm\n    priority: 1\n    when: {target: rm}\n    then: {decision: deny}\n"), 0o600)
	src := `
bundles:
  - name: ro
    path: bundles/ro
  - name: no-rm
    path: bundles/no-rm
    tenant: acme
tenants:
  - id: acme
    keys: [{principal: ci, role: client, key: "${ACME_KEY}"}]
    guards: [no-rm]
agents:
  - id: inline
    webhook_url: http://127.0.0.1:9/hook
    secret: ${SECRET}
    policy: |
      default_action: allow
      rules:
        - id: no-rm
          priority: 1
          when: {target: rm}
          then: {decision: deny}
  - id: fromfile
    webhook_url: http://127.0.0.1:9/hook
    secret: ${SECRET}
    policy_file: strict.yaml
  - id: named
    webhook_url: http://127.0.0.1:9/hook
    secret: ${SECRET}
    bundle: ro
  - id: tenanted
    tenant: acme
    webhook_url: http://127.0.0.1:9/hook
    secret: ${SECRET}
`
	path := filepath.Join(dir, "wicket.yaml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Load(path, env(map[string]string{"SECRET": "s3cret-0123456789", "ACME_KEY": "acme-ci-key-0123456789"}))
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}})
	ctx := context.Background()
	for range 2 { // applying twice is an upsert
		if err := m.Apply(ctx, e.Kernel); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		agent, tenant, target, effect string
		want                          string
	}{
		{"inline", "default", "rm", "", "deny"},
		{"inline", "default", "ls", "", "allow"},
		{"fromfile", "default", "ls", "", "deny"},
		{"named", "default", "ls", "read_only", "allow"},
		{"named", "default", "ls", "destructive", "deny"},
		// No bundle of its own, but acme's guard.
		{"tenanted", "acme", "ls", "", "allow"},
		{"tenanted", "acme", "rm", "", "deny"},
	} {
		res, err := e.Kernel.EvalPolicy(ctx, kernel.EvalRequest{Tenant: tc.tenant, AgentID: tc.agent, Kind: "tool_call", Target: tc.target, Effect: tc.effect})
		if err != nil {
			t.Fatalf("%s: %v", tc.agent, err)
		}
		if string(res.Action) != tc.want {
			t.Errorf("%s %s/%s: %s (%s), want %s", tc.agent, tc.target, tc.effect, res.Action, res.Reason, tc.want)
		}
	}
	key, err := e.Kernel.AuthenticateKey(ctx, "acme-ci-key-0123456789")
	if err != nil || key.Tenant != "acme" || key.Role != "client" {
		t.Errorf("provisioned key: %+v %v", key, err)
	}
	if ref, ok := e.Host.Live("default", "ro"); !ok || ref.Revision != "7" {
		t.Errorf("bundle ro: %+v %v", ref, ok)
	}
	// What the manifest stores is the admin's: the guard is safe from
	// acme's tenant-admins.
	for _, b := range []struct{ tenant, name string }{{"default", "ro"}, {"acme", "no-rm"}, {"default", kernel.AgentPolicyBundle("inline")}} {
		b, err := e.Kernel.GetBundle(ctx, b.tenant, b.name)
		if err != nil || b.Owner != kernel.BundleOwnerAdmin {
			t.Errorf("%+v %v, want admin-owned", b, err)
		}
	}
	if err := e.Kernel.DeleteBundle(ctx, "acme", "no-rm", kernel.BundleOwnerTenant); kernel.CodeOf(err) != kernel.CodeForbidden {
		t.Errorf("acme's tenant deleting its guard: %v, want forbidden", err)
	}
}

// TestApplyGuardOfAnotherTenantFailsBoot: a guard names a bundle of the
// guarded tenant; one stored only in the default tenant fails the boot with
// an error naming the guard (it used to boot and deny every step).
func TestApplyGuardOfAnotherTenantFailsBoot(t *testing.T) {
	dir := t.TempDir()
	bdir := filepath.Join(dir, "safe-shell")
	if err := os.MkdirAll(bdir, 0o700); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(bdir, "bundle.yaml"), []byte("name: safe-shell\nrevision: \"1\"\nengine: rules\n"), 0o600)
	_ = os.WriteFile(filepath.Join(bdir, "rules.yaml"), []byte("default_action: deny\n"), 0o600)
	path := filepath.Join(dir, "wicket.yaml")
	src := "bundles:\n  - {name: safe-shell, path: safe-shell}\ntenants:\n  - {id: acme, guards: [safe-shell]}\n"
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Load(path, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}})
	err = m.Apply(context.Background(), e.Kernel)
	if err == nil || !strings.Contains(err.Error(), `guard "safe-shell"`) || !strings.Contains(err.Error(), "acme") {
		t.Fatalf("a guard stored in another tenant must fail the boot naming it, got %v", err)
	}
}

func TestApplyBadPolicyFailsBoot(t *testing.T) {
	m, err := manifest.Parse([]byte("agents:\n  - id: a\n    webhook_url: http://127.0.0.1:9/\n    secret: s3cret-0123456789\n    policy: |\n      rules:\n        - id: x\n          when: {arguments: {cmd: {}}}\n          then: {decision: allow}\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}})
	if err := m.Apply(context.Background(), e.Kernel); err == nil || !strings.Contains(err.Error(), "agents[0] (a)") {
		t.Fatalf("a malformed policy must fail the boot, got %v", err)
	}
}

// TestApplyMissingBundleFailsBoot: an agent entry bound to a bundle that
// neither the manifest nor the store holds (or that another tenant holds)
// fails the boot, naming the entry.
func TestApplyMissingBundleFailsBoot(t *testing.T) {
	dir := t.TempDir()
	b := filepath.Join(dir, "ro")
	_ = os.MkdirAll(b, 0o700)
	_ = os.WriteFile(filepath.Join(b, "bundle.yaml"), []byte("name: ro\nrevision: \"1\"\nengine: rules\n"), 0o600)
	_ = os.WriteFile(filepath.Join(b, "rules.yaml"), []byte("default_action: deny\n"), 0o600)
	for _, tc := range []struct{ name, src, want string }{
		{"missing", "agents:\n  - id: a\n    webhook_url: http://127.0.0.1:9/\n    secret: s3cret-0123456789\n    bundle: nope\n", `agents[0] (a): validation: agent a: bundle "nope" does not exist in tenant default`},
		{"other tenant", "tenants:\n  - id: acme\nbundles:\n  - path: ro\nagents:\n  - id: ok\n    webhook_url: http://127.0.0.1:9/\n    secret: s3cret-0123456789\n    bundle: ro\n  - id: a\n    tenant: acme\n    webhook_url: http://127.0.0.1:9/\n    secret: s3cret-0123456789\n    bundle: ro\n", `agents[1] (a): validation: agent a: bundle "ro" does not exist in tenant acme`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name+".yaml")
			_ = os.WriteFile(path, []byte(tc.src), 0o600)
			m, err := manifest.Load(path, env(nil))
			if err != nil {
				t.Fatal(err)
			}
			e := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}})
			if err := m.Apply(context.Background(), e.Kernel); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestTenantBundleKeys: a tenant's bundle_keys (from the manifest) make its
// bundles need a signature by one of them; other tenants are unaffected.
func TestTenantBundleKeys(t *testing.T) {
	dir := t.TempDir()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	priv, _ := x509.MarshalPKCS8PrivateKey(k)
	pub, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
	privPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: priv}))
	if err := os.WriteFile(filepath.Join(dir, "acme.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		t.Fatal(err)
	}
	src := "tenants:\n  - id: acme\n    bundle_keys: [{id: acme-ci, algorithm: ES256, key_file: acme.pub}]\n  - id: other\n"
	if err := os.WriteFile(filepath.Join(dir, "wicket.yaml"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Load(filepath.Join(dir, "wicket.yaml"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}})
	ctx := context.Background()
	if err := m.Apply(ctx, e.Kernel); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"bundle.yaml": []byte("name: g\nengine: rules\n"), "rules.yaml": []byte("default_action: allow\n")}
	if _, err := e.Kernel.PutBundle(ctx, "other", "g", kernel.BundleSource{Files: files}, kernel.BundleOwnerAdmin); err != nil {
		t.Fatalf("tenant without keys: %v", err)
	}
	if _, err := e.Kernel.PutBundle(ctx, "acme", "g", kernel.BundleSource{Files: files}, kernel.BundleOwnerAdmin); err == nil || !strings.Contains(err.Error(), ".signatures.json: missing") {
		t.Fatalf("unsigned bundle for acme: %v", err)
	}
	sig, err := bundle.Sign(files, bundle.SigningKey{Key: privPEM, Algorithm: "ES256", KeyID: "acme-ci"})
	if err != nil {
		t.Fatal(err)
	}
	signed := map[string][]byte{bundle.SignaturesFile: sig}
	for p, c := range files {
		signed[p] = c
	}
	if _, err := e.Kernel.PutBundle(ctx, "acme", "g", kernel.BundleSource{Files: signed}, kernel.BundleOwnerAdmin); err != nil {
		t.Fatalf("signed bundle for acme: %v", err)
	}

	bad, err := manifest.Parse([]byte("tenants:\n  - id: acme\n    bundle_keys: [{algorithm: RS256, key: not-a-pem}]\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Apply(ctx, e.Kernel); err == nil || !strings.Contains(err.Error(), "bundle_keys") {
		t.Fatalf("a bad key must fail the boot: %v", err)
	}
}

// TestApplySigning: which signing scheme manifest agents get. An agent
// stored before schemes existed (a record without the field) keeps the body
// scheme when the manifest does not name one; a new agent gets v1; an
// explicit field wins.
func TestApplySigning(t *testing.T) {
	e := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}})
	ctx := context.Background()
	t0 := time.Now().UTC()
	err := e.Store.Update(ctx, func(tx kernel.Tx) error {
		return tx.PutAgent(&kernel.Agent{ID: "legacy", Tenant: "default", WebhookURL: "http://127.0.0.1:9/hook",
			Secret: "s3cret-0123456789", CreatedAt: t0, UpdatedAt: t0})
	})
	if err != nil {
		t.Fatal(err)
	}
	src := `
agents:
  - {id: legacy, webhook_url: "http://127.0.0.1:9/hook", secret: s3cret-0123456789}
  - {id: fresh, webhook_url: "http://127.0.0.1:9/hook", secret: s3cret-0123456789}
  - {id: seeds, webhook_url: "http://127.0.0.1:9/hook", secret: s3cret-0123456789, signing: body}
  - {id: upgraded, webhook_url: "http://127.0.0.1:9/hook", secret: s3cret-0123456789, signing: v1}
  - {id: desk, secret: s3cret-0123456789, on_interrupted: approval}
`
	m, err := manifest.Parse([]byte(src), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := m.Apply(ctx, e.Kernel); err != nil {
			t.Fatal(err)
		}
	}
	if a, err := e.Kernel.Agent(ctx, "default", "desk"); err != nil || !a.GateOnly() || a.OnInterrupted != kernel.OnInterruptedApproval {
		t.Fatalf("gate-only agent with on_interrupted: %+v %v", a, err)
	}
	if _, err := manifest.Parse([]byte("agents:\n  - {id: x, secret: s3cret-0123456789, on_interrupted: sometimes}\n"), env(nil)); err == nil || !strings.Contains(err.Error(), "on_interrupted") {
		t.Fatalf("a bad on_interrupted: %v", err)
	}
	for id, want := range map[string]string{"legacy": "body", "fresh": "v1", "seeds": "body", "upgraded": "v1"} {
		a, err := e.Kernel.Agent(ctx, "default", id)
		if err != nil {
			t.Fatal(err)
		}
		if a.Signing != want {
			t.Errorf("%s: signing %q, want %q", id, a.Signing, want)
		}
	}
}

func TestLLMProviders(t *testing.T) {
	env := map[string]string{"OPENAI_KEY": "sk-from-env", "EMPTY": " "}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	dir := t.TempDir()
	good := filepath.Join(dir, "anthropic.key")
	if err := os.WriteFile(good, []byte("sk-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open.key")
	if err := os.WriteFile(open, []byte("sk-open\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := `llm_providers:
  - {name: openai, dialect: openai, api_key_env: OPENAI_KEY, models: [{name: gpt-x, input_usd_per_mtok: 1.5}]}
  - {name: anthropic, tenant: acme, dialect: anthropic, api_key_file: anthropic.key, models: [{name: claude-x}]}
  - {name: local, dialect: openai, base_url: "http://127.0.0.1:11434/v1", models: [{name: llama}]}
`
	m, err := manifest.Parse([]byte(src), lookup)
	if err != nil {
		t.Fatal(err)
	}
	m.Dir = dir
	want := []string{"sk-from-env", "sk-from-file", ""}
	for i, p := range m.LLMProviders {
		k, err := m.LLMKey(p)
		if err != nil || k != want[i] {
			t.Fatalf("provider %s: key %q (%v), want %q", p.Name, k, err, want[i])
		}
	}
	if m.LLMProviders[0].Tenant != "default" || m.LLMProviders[0].Models[0].Input != 1.5 {
		t.Fatalf("parsed %+v", m.LLMProviders[0])
	}
	m.LLMProviders[1].APIKeyFile = "open.key"
	if _, err := m.LLMKey(m.LLMProviders[1]); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a key file others may read: %v", err)
	}
	for _, tc := range []struct{ src, want string }{
		{`llm_providers: [{name: a, dialect: openai, api_key_env: NOPE, models: [{name: m}]}]`, "NOPE is not set"},
		{`llm_providers: [{name: a, dialect: openai, api_key_env: EMPTY, models: [{name: m}]}]`, "EMPTY is not set"},
		{`llm_providers: [{name: a, dialect: openai, api_key_env: OPENAI_KEY, api_key_file: k, models: [{name: m}]}]`, "not both"},
		{`llm_providers: [{name: "bad name", dialect: openai}]`, "name \"bad name\" is invalid"},
		{`llm_providers: [{name: a, api_key: sk-inline}]`, "field api_key not found"},
	} {
		if _, err := manifest.Parse([]byte(tc.src), lookup); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.src, err, tc.want)
		}
	}
}
