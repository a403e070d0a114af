package bundle

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/wicket-run/wicket/kernel/policy"
)

// ManifestFile is the name of the manifest at the root of every bundle.
const ManifestFile = "bundle.yaml"

// Files an engine requires (see [Manifest.Engine]).
const (
	RulesFile = "rules.yaml"  // the rules engine's policy
	WasmFile  = "policy.wasm" // the wasm engine's module
	DataFile  = "data.json"   // optional data, loaded as Rego's data
)

// Grants a wasm bundle may list in sandbox.grants.
const (
	GrantClock  = "clock"
	GrantRandom = "random"
	GrantEnv    = "env"
	GrantStdout = "stdout"
)

// MaxMemoryPages is the largest sandbox.memory_pages a manifest may ask for
// (65536 pages of 64 KiB, the 4 GiB a 32-bit wasm memory can address).
const MaxMemoryPages = 65536

var (
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)
	idRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$`)
)

// ValidName reports whether s is a valid bundle name:
// ^[a-z0-9][a-z0-9_.-]{0,62}$.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// ValidID reports whether s is a valid identifier for a rule or a manifest
// rate limit: ^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$.
func ValidID(s string) bool { return idRE.MatchString(s) }

// manifestFile mirrors bundle.yaml with the YAML field names of the format.
// (policy.RateLimit only carries JSON tags, so Manifest cannot be decoded
// directly with strict field checking.)
type manifestFile struct {
	Name          string          `yaml:"name"`
	Revision      string          `yaml:"revision"`
	Engine        string          `yaml:"engine"`
	Entrypoint    string          `yaml:"entrypoint"`
	ABI           string          `yaml:"abi"`
	DefaultAction string          `yaml:"default_action"`
	OnInterrupted string          `yaml:"on_interrupted"`
	RateLimits    []rateLimitFile `yaml:"rate_limits"`
	Sandbox       Sandbox         `yaml:"sandbox"`
}

type rateLimitFile struct {
	ID             string   `yaml:"id"`
	Targets        []string `yaml:"targets"`
	StepKind       string   `yaml:"step_kind"`
	MaxCalls       int      `yaml:"max_calls"`
	Window         string   `yaml:"window"`
	Per            string   `yaml:"per"`
	Algorithm      string   `yaml:"algorithm"`
	OnLimiterError string   `yaml:"on_limiter_error"`
}

// ParseManifest decodes and validates bundle.yaml on its own. It does not
// check the files the engine requires; [LoadFiles] does. Name and engine
// may be left out: the loaders take the name they are given and infer the
// engine from the files (policy.wasm: wasm with the OPA ABI; a .rego file:
// rego; rules.yaml: rules).
//
// Decoding is strict: an unknown field, a duplicate key, a value of the
// wrong type or a second YAML document is an error.
func ParseManifest(src []byte) (Manifest, error) {
	mf := func(field string, err error) error {
		return &Error{File: ManifestFile, Field: field, Err: err}
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	var f manifestFile
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return Manifest{}, mf("", errors.New("empty manifest"))
		}
		line, msg := SplitYAMLLine(yamlReason(err))
		return Manifest{}, &Error{File: ManifestFile, Line: line, Err: errors.New(msg)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Manifest{}, mf("", errors.New("more than one YAML document"))
	}

	m := Manifest{
		Name:          f.Name,
		Revision:      f.Revision,
		Engine:        f.Engine,
		Entrypoint:    f.Entrypoint,
		ABI:           f.ABI,
		DefaultAction: policy.Action(f.DefaultAction),
		OnInterrupted: f.OnInterrupted,
		Sandbox:       f.Sandbox,
	}
	if m.Name != "" && !ValidName(m.Name) {
		return m, mf("name", fmt.Errorf("%q does not match ^[a-z0-9][a-z0-9_.-]{0,62}$", m.Name))
	}
	if err := checkText(m.Revision, 128); err != nil {
		return m, mf("revision", err)
	}
	switch m.Engine {
	case EngineRules, EngineRego, EngineWasm, "":
	default:
		return m, mf("engine", fmt.Errorf("unknown engine %q (want rules, rego or wasm)", m.Engine))
	}
	if m.Entrypoint != "" {
		if m.Engine == EngineRules {
			return m, mf("entrypoint", errors.New("not used by the rules engine; remove it"))
		}
		if err := checkText(m.Entrypoint, 256); err != nil {
			return m, mf("entrypoint", err)
		}
	}
	switch {
	case m.ABI == "":
	case m.Engine != EngineWasm && m.Engine != "":
		return m, mf("abi", fmt.Errorf("only wasm bundles have an ABI (engine is %s)", m.Engine))
	case m.ABI != ABIWicket && m.ABI != ABIOPA:
		return m, mf("abi", fmt.Errorf("unknown ABI %q (want wicket or opa)", m.ABI))
	}
	switch m.DefaultAction {
	case "", policy.Allow, policy.Deny:
	default:
		return m, mf("default_action", fmt.Errorf("must be allow or deny, got %q", m.DefaultAction))
	}
	switch m.OnInterrupted {
	case "", OnInterruptedIndeterminate, OnInterruptedApproval:
	default:
		return m, mf("on_interrupted", fmt.Errorf("must be %s or %s, got %q", OnInterruptedIndeterminate, OnInterruptedApproval, m.OnInterrupted))
	}

	ids := make(map[string]int, len(f.RateLimits))
	for i, r := range f.RateLimits {
		field := fmt.Sprintf("rate_limits[%d]", i)
		switch {
		case r.ID == "":
			return m, mf(field+".id", errors.New("required"))
		case !ValidID(r.ID):
			return m, mf(field+".id", fmt.Errorf("%q does not match ^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$", r.ID))
		}
		if j, dup := ids[r.ID]; dup {
			return m, mf(field+".id", fmt.Errorf("duplicate id %q (also rate_limits[%d])", r.ID, j))
		}
		ids[r.ID] = i
		for j, t := range r.Targets {
			if _, err := CompileGlob(t); err != nil {
				return m, mf(fmt.Sprintf("%s.targets[%d]", field, j), fmt.Errorf("%q: %w", t, err))
			}
		}
		if r.StepKind != "" && !validKind(r.StepKind) {
			return m, mf(field+".step_kind", fmt.Errorf("unknown step kind %q (want tool_call, llm_call or local)", r.StepKind))
		}
		rl := policy.RateLimit{MaxCalls: r.MaxCalls, Window: r.Window, Per: r.Per, Algorithm: r.Algorithm, OnLimiterError: r.OnLimiterError}
		if sub, err := checkRateLimit(rl); err != nil {
			return m, mf(field+"."+sub, err)
		}
		m.RateLimits = append(m.RateLimits, ManifestRateLimit{ID: r.ID, Targets: r.Targets, StepKind: r.StepKind, RateLimit: rl})
	}

	sb := m.Sandbox
	if sb.MemoryPages != 0 {
		if m.Engine != EngineWasm && m.Engine != "" {
			return m, mf("sandbox.memory_pages", fmt.Errorf("only wasm bundles have a memory cap (engine is %s)", m.Engine))
		}
		if sb.MemoryPages > MaxMemoryPages {
			return m, mf("sandbox.memory_pages", fmt.Errorf("%d exceeds %d", sb.MemoryPages, MaxMemoryPages))
		}
	}
	if sb.PoolSize != 0 {
		if m.Engine != EngineWasm {
			return m, mf("sandbox.pool_size", fmt.Errorf("only wasm bundles have an instance pool (engine is %s)", m.Engine))
		}
		if sb.PoolSize < 0 {
			return m, mf("sandbox.pool_size", fmt.Errorf("must be positive, got %d", sb.PoolSize))
		}
	}
	if sb.Timeout != "" {
		if d, err := time.ParseDuration(sb.Timeout); err != nil || d <= 0 {
			return m, mf("sandbox.timeout", fmt.Errorf("must be a positive Go duration (e.g. 50ms), got %q", sb.Timeout))
		}
	}
	seen := make(map[string]bool, len(sb.Grants))
	for i, g := range sb.Grants {
		field := fmt.Sprintf("sandbox.grants[%d]", i)
		if m.Engine != EngineWasm && m.Engine != "" {
			return m, mf(field, fmt.Errorf("only wasm bundles take grants (engine is %s)", m.Engine))
		}
		switch g {
		case GrantClock, GrantRandom, GrantEnv, GrantStdout:
		default:
			return m, mf(field, fmt.Errorf("unknown grant %q (want clock, random, env or stdout)", g))
		}
		if seen[g] {
			return m, mf(field, fmt.Errorf("duplicate grant %q", g))
		}
		seen[g] = true
	}
	return m, nil
}

// ValidateRateLimit checks a rate limit the way bundle.yaml's rate_limits and
// the rules engine's then.rate_limit are checked: max_calls > 0, window a
// positive Go duration, per execution|agent|tenant (or empty), algorithm
// sliding|fixed (or empty), on_limiter_error fail_open|fail_closed (or
// empty). The error is an *[Error] whose Field names the offending field
// ("window"); File is empty.
func ValidateRateLimit(rl policy.RateLimit) error {
	if field, err := checkRateLimit(rl); err != nil {
		return &Error{Field: field, Err: err}
	}
	return nil
}

func checkRateLimit(rl policy.RateLimit) (field string, err error) {
	if rl.MaxCalls <= 0 {
		return "max_calls", fmt.Errorf("must be > 0, got %d", rl.MaxCalls)
	}
	if d, err := time.ParseDuration(rl.Window); err != nil || d <= 0 {
		return "window", fmt.Errorf("must be a positive Go duration (e.g. 1m), got %q", rl.Window)
	}
	switch rl.Per {
	case "", policy.PerExecution, policy.PerAgent, policy.PerTenant:
	default:
		return "per", fmt.Errorf("must be execution, agent or tenant, got %q", rl.Per)
	}
	switch rl.Algorithm {
	case "", "sliding", "fixed":
	default:
		return "algorithm", fmt.Errorf("must be sliding or fixed, got %q", rl.Algorithm)
	}
	switch rl.OnLimiterError {
	case "", "fail_open", "fail_closed":
	default:
		return "on_limiter_error", fmt.Errorf("must be fail_open or fail_closed, got %q", rl.OnLimiterError)
	}
	return "", nil
}

func validKind(k string) bool {
	switch k {
	case policy.KindToolCall, policy.KindLLMCall, policy.KindLocal:
		return true
	}
	return false
}

// checkText accepts valid UTF-8 of at most max bytes without control
// characters.
func checkText(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("longer than %d bytes", max)
	}
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return fmt.Errorf("control character at byte %d", i)
	}
	return nil
}

// DefaultAction returns the action the host applies (with
// policy.ApplyDefault) when no rule of the bundle matched: the manifest's
// default_action; when that is empty and the engine is rules, rules.yaml's
// default_action; otherwise deny.
//
// [LoadFiles] refuses a rules bundle whose two default_action fields are
// both set and differ, so the order only matters when one is empty.
func (b *Bundle) DefaultAction() policy.Action {
	if b.Manifest.DefaultAction != "" {
		return b.Manifest.DefaultAction
	}
	if b.Manifest.Engine == EngineRules {
		if a, _, err := rulesDefaultAction(b.Files[RulesFile]); err == nil && a != "" {
			return a
		}
	}
	return policy.Deny
}

// rulesDefaultAction reads the top-level default_action of rules.yaml
// without validating the rest, which is the rules engine's job.
func rulesDefaultAction(src []byte) (policy.Action, int, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return "", 0, errors.New(yamlReason(err))
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return "", 0, nil
	}
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value != "default_action" {
			continue
		}
		if v.Kind != yaml.ScalarNode {
			return "", v.Line, errors.New("must be allow or deny")
		}
		if v.ShortTag() == "!!null" {
			return "", v.Line, nil
		}
		switch a := policy.Action(v.Value); a {
		case "", policy.Allow, policy.Deny:
			return a, v.Line, nil
		default:
			return "", v.Line, fmt.Errorf("must be allow or deny, got %q", v.Value)
		}
	}
	return "", 0, nil
}
