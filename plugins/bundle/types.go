package bundle

import (
	"encoding/json"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/wicket-run/wicket/kernel/policy"
)

// Engine names (bundle.yaml's engine).
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
	// OnInterrupted is what an at_most_once step this bundle allowed
	// becomes when it is found in flight by a later attempt:
	// OnInterruptedIndeterminate (empty: the default, the step fails
	// "indeterminate") or OnInterruptedApproval (an
	// interrupted_side_effect approval). The stricter of the agent's and
	// the evaluated bundles' settings applies.
	OnInterrupted string `yaml:"on_interrupted,omitempty" json:"on_interrupted,omitempty"`
	// RateLimits declared by the manifest apply to matching steps whatever the engine answered.
	RateLimits []ManifestRateLimit `yaml:"rate_limits,omitempty" json:"rate_limits,omitempty"`
	// Sandbox limits for wasm bundles.
	Sandbox Sandbox `yaml:"sandbox,omitempty" json:"sandbox,omitempty"`
}

// Values of Manifest.OnInterrupted.
const (
	OnInterruptedIndeterminate = "indeterminate"
	OnInterruptedApproval      = "approval"
)

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

// Sandbox holds the sandbox limits and grants. The kernel's [Limits] give
// the defaults and ceilings of memory_pages, timeout and pool_size.
type Sandbox struct {
	// MemoryPages caps a wasm instance's linear memory in 64 KiB pages
	// (default [Limits].MemoryPages, 256 = 16 MiB).
	MemoryPages uint32 `yaml:"memory_pages,omitempty" json:"memory_pages,omitempty"`
	// Timeout is the per-evaluation deadline as a Go duration, for every
	// engine (default [Limits].Timeout, 1s).
	Timeout string `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	// PoolSize is the most instances of a wasm bundle revision, hence the
	// most evaluations it runs at once (default [Limits].PoolSize).
	PoolSize int `yaml:"pool_size,omitempty" json:"pool_size,omitempty"`
	// Grants lists host capabilities the module may use: "clock", "random",
	// "env", "stdout". Nothing is granted by default.
	Grants []string `yaml:"grants,omitempty" json:"grants,omitempty"`
}

// Bundle is a loaded, validated bundle.
type Bundle struct {
	// Manifest is the validated bundle.yaml, completed with what the loader
	// inferred: the name given to the loader, .manifest's revision, the
	// engine and ABI the files call for, the entrypoint OPA's layout names.
	Manifest Manifest
	// Files maps slash-separated relative paths to content (manifests,
	// policy files, data files, signatures and tests included).
	Files map[string][]byte
	// Data is the data document: every data.json, data.yaml and data.yml of
	// the bundle merged under the path of its directory, as OPA merges
	// them (a JSON object), or nil when the bundle has no data file.
	Data json.RawMessage
	// OPA is what OPA's bundle reader found: .manifest, roots, data files,
	// annotated entrypoints.
	OPA *OPA
	// Signature reports whether .signatures.json was verified.
	Signature Signature
	// Digest is the lowercase hex sha256 over the bundle content (see [Digest]).
	Digest string

	regoVersions map[string]ast.RegoVersion
}

// Ref returns the bundle's identity for decision events.
func (b *Bundle) Ref() policy.BundleRef {
	return policy.BundleRef{Name: b.Manifest.Name, Revision: b.Manifest.Revision, Digest: b.Digest, Engine: b.Manifest.Engine}
}

// TestCase is one entry of a tests/*.yaml file: an input step (plus optional
// execution context) and the decision the bundle must give. A table entry
// of the file (see [ParseTestFile]) gives one TestCase per row.
//
// Test files are read with [ParseTestFile], which decodes each case by its
// JSON field names; build the policy input with [TestCase.Input] and check
// an answer with [TestExpect.Check].
type TestCase struct {
	// Name identifies the case; unique within a bundle.
	Name string `yaml:"name" json:"name"`
	// AgentID is the input's agent_id (empty if not given).
	AgentID string `yaml:"agent_id,omitempty" json:"agent_id,omitempty"`
	// Tenant is the input's tenant (default "default").
	Tenant string `yaml:"tenant,omitempty" json:"tenant,omitempty"`
	// ExecutionID is the input's execution_id (default [DefaultTestExecutionID]).
	ExecutionID string `yaml:"execution_id,omitempty" json:"execution_id,omitempty"`
	// Step is the submitted step.
	Step TestStep `yaml:"step" json:"step"`
	// Execution is the execution context (default: running, no labels, zero totals).
	Execution *policy.Execution `yaml:"execution,omitempty" json:"execution,omitempty"`
	// Expect is the decision the bundle must give.
	Expect TestExpect `yaml:"expect" json:"expect"`
	// SourceFile is the test file the case came from (set by [ParseTestFile]).
	SourceFile string `yaml:"-" json:"-"`
	// SourceLine is the line of the case (of its row, for a table) in
	// SourceFile.
	SourceLine int `yaml:"-" json:"-"`
}

// TestStep is the step of a test case; Args is any YAML value, converted to JSON.
type TestStep struct {
	// Kind is tool_call, llm_call or local.
	Kind string `yaml:"kind" json:"kind"`
	// Target is the tool name, model id or local name.
	Target string `yaml:"target" json:"target"`
	// Args are the step's arguments (absent: null, as the kernel records a
	// step submitted without args).
	Args any `yaml:"args,omitempty" json:"args,omitempty"`
	// Idempotency is safe_to_retry or at_most_once (if not given: the
	// kernel's default for the kind, at_most_once for a tool call).
	Idempotency string `yaml:"idempotency,omitempty" json:"idempotency,omitempty"`
	// Effect is the declared side-effect class (empty if not given).
	Effect string `yaml:"effect,omitempty" json:"effect,omitempty"`
	// Occurrence is the input's step.occurrence (default 0).
	Occurrence int `yaml:"occurrence,omitempty" json:"occurrence,omitempty"`
}

// TestExpect is what a test case expects after default_action is applied.
// Only Decision is required; every other field is checked when it is given.
type TestExpect struct {
	// Decision is the expected action.
	Decision policy.Action `yaml:"decision" json:"decision"`
	// RuleID, when set, must equal the answer's rule_id: a rule's id,
	// "default_action" when no rule matched, or "engine_error" when the
	// policy failed to answer (the kernel then denies the step).
	RuleID string `yaml:"rule_id,omitempty" json:"rule_id,omitempty"`
	// Reason, when set, must equal the answer's reason.
	Reason string `yaml:"reason,omitempty" json:"reason,omitempty"`
	// ReasonMatches, when set, is an RE2 regular expression the reason must
	// match (unanchored: use ^ and $ for the whole reason).
	ReasonMatches string `yaml:"reason_matches,omitempty" json:"reason_matches,omitempty"`
	// Approval, when set, holds the approval settings the answer must
	// carry: each field given must equal the answer's (approvers as a set).
	Approval *policy.Approval `yaml:"approval,omitempty" json:"approval,omitempty"`
	// RateLimit, when set, is the rate limit the answer must carry: each
	// field given must equal the answer's; an empty mapping only requires
	// that there is one.
	RateLimit *policy.RateLimit `yaml:"rate_limit,omitempty" json:"rate_limit,omitempty"`
	// RateLimits, when set, are the ids of every rate limit the kernel
	// would count the step against, as a set: the answer's own (under its
	// rule_id) and each of bundle.yaml's rate_limits that matches the
	// step. An empty list expects none.
	RateLimits *[]string `yaml:"rate_limits,omitempty" json:"rate_limits,omitempty"`
}
