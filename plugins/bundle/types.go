// Package bundle is the policy bundle format (SPEC §5): a manifest
// (bundle.yaml), one engine's policy files, optional data.json and test cases
// under tests/. A bundle is read from a directory or a .tar.gz of one and is
// identified by name, revision and the sha256 digest of its content.
package bundle

import (
	"encoding/json"

	"github.com/wicket-run/wicket/kernel/policy"
)

// Engine names.
const (
	EngineRules = "rules"
	EngineRego  = "rego"
	EngineWasm  = "wasm"
)

// WASM ABIs a wasm bundle may declare.
const (
	ABIWicket = "wicket" // JSON in, JSON out (policy-sdk/ABI.md)
	ABIOPA    = "opa"    // OPA's wasm ABI (opa build -t wasm)
)

// Manifest is bundle.yaml.
type Manifest struct {
	// Name identifies the bundle within a tenant ([a-z0-9][a-z0-9_.-]*).
	Name string `yaml:"name" json:"name"`
	// Revision is free text chosen by the author ("3", "2026-11-29").
	Revision string `yaml:"revision" json:"revision"`
	// Engine is rules, rego or wasm.
	Engine string `yaml:"engine" json:"engine"`
	// Entrypoint is the Rego query (e.g. data.wicket.decision) or, for OPA-ABI
	// wasm, the entrypoint name. Unused by the rules engine.
	Entrypoint string `yaml:"entrypoint,omitempty" json:"entrypoint,omitempty"`
	// ABI is the wasm ABI: wicket (default) or opa.
	ABI string `yaml:"abi,omitempty" json:"abi,omitempty"`
	// DefaultAction applies when no rule matched: allow or deny (default deny).
	// For the rules engine, rules.yaml's own default_action is used when this is empty.
	DefaultAction policy.Action `yaml:"default_action,omitempty" json:"default_action,omitempty"`
	// RateLimits declared by the manifest apply to matching steps whatever the engine answered.
	RateLimits []ManifestRateLimit `yaml:"rate_limits,omitempty" json:"rate_limits,omitempty"`
	// Sandbox limits for wasm bundles.
	Sandbox Sandbox `yaml:"sandbox,omitempty" json:"sandbox,omitempty"`
}

// ManifestRateLimit is a rate limit declared in bundle.yaml.
type ManifestRateLimit struct {
	// ID names the limit (its counter key).
	ID string `yaml:"id" json:"id"`
	// Targets are globs of step targets the limit applies to (empty: all).
	Targets []string `yaml:"targets,omitempty" json:"targets,omitempty"`
	// StepKind restricts the limit to one kind (empty: all).
	StepKind         string `yaml:"step_kind,omitempty" json:"step_kind,omitempty"`
	policy.RateLimit `yaml:",inline" json:",inline"`
}

// Sandbox holds the wasm sandbox limits and grants.
type Sandbox struct {
	// MemoryPages caps linear memory in 64 KiB pages (default 256 = 16 MiB... see plugins/wasm).
	MemoryPages uint32 `yaml:"memory_pages,omitempty" json:"memory_pages,omitempty"`
	// Timeout is the per-evaluation deadline as a Go duration (default set by plugins/wasm).
	Timeout string `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	// Grants lists host capabilities the module may use: "clock", "random",
	// "env", "stdout". Nothing is granted by default.
	Grants []string `yaml:"grants,omitempty" json:"grants,omitempty"`
}

// Bundle is a loaded, validated bundle.
type Bundle struct {
	Manifest Manifest
	// Files maps slash-separated relative paths to content (manifest, policy
	// files, data.json and tests included).
	Files map[string][]byte
	// Data is data.json, or nil.
	Data json.RawMessage
	// Digest is the lowercase hex sha256 over the bundle content (see Digest).
	Digest string
}

// Ref returns the bundle's identity for decision events.
func (b *Bundle) Ref() policy.BundleRef {
	return policy.BundleRef{Name: b.Manifest.Name, Revision: b.Manifest.Revision, Digest: b.Digest, Engine: b.Manifest.Engine}
}

// TestCase is one entry of a tests/*.yaml file: an input step (plus optional
// execution context) and the decision the bundle must give.
type TestCase struct {
	Name       string            `yaml:"name" json:"name"`
	AgentID    string            `yaml:"agent_id,omitempty" json:"agent_id,omitempty"`
	Tenant     string            `yaml:"tenant,omitempty" json:"tenant,omitempty"`
	Step       TestStep          `yaml:"step" json:"step"`
	Execution  *policy.Execution `yaml:"execution,omitempty" json:"execution,omitempty"`
	Expect     TestExpect        `yaml:"expect" json:"expect"`
	SourceFile string            `yaml:"-" json:"-"`
}

// TestStep is the step of a test case; Args is any YAML value, converted to JSON.
type TestStep struct {
	Kind        string `yaml:"kind" json:"kind"`
	Target      string `yaml:"target" json:"target"`
	Args        any    `yaml:"args,omitempty" json:"args,omitempty"`
	Idempotency string `yaml:"idempotency,omitempty" json:"idempotency,omitempty"`
	Effect      string `yaml:"effect,omitempty" json:"effect,omitempty"`
}

// TestExpect is what a test case expects after default_action is applied.
type TestExpect struct {
	Decision policy.Action `yaml:"decision" json:"decision"`
	// RuleID, when set, must equal the answer's rule_id.
	RuleID string `yaml:"rule_id,omitempty" json:"rule_id,omitempty"`
}
