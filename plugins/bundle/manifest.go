package bundle

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
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

// MaxRateLimits caps the rate limits a manifest declares: each one that
// matches a step is a counter written in the step's transaction.
const MaxRateLimits = 100

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
// wrong type or a second YAML document is an error. Every problem of the
// file is reported, each with its line and field ([Join]); the Manifest
// returned with an error holds what could be read.
func ParseManifest(src []byte) (Manifest, error) {
	var errs []error
	mf := func(field string, err error) {
		errs = append(errs, &Error{File: ManifestFile, Field: field, Err: err})
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	var f manifestFile
	if err := dec.Decode(&f); err != nil {
		var te *yaml.TypeError
		switch {
		case errors.Is(err, io.EOF):
			return Manifest{}, &Error{File: ManifestFile, Err: errors.New("empty manifest")}
		case errors.As(err, &te):
			// Type errors and unknown fields: yaml.v3 decoded the rest, so
			// go on and report the other problems too.
			for _, msg := range te.Errors {
				line, reason := SplitYAMLLine(stripGoType(msg))
				errs = append(errs, &Error{File: ManifestFile, Line: line, Err: errors.New(reason)})
			}
		default:
			line, msg := SplitYAMLLine(yamlReason(err))
			return Manifest{}, &Error{File: ManifestFile, Line: line, Err: errors.New(msg)}
		}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		mf("", errors.New("more than one YAML document"))
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
		mf("name", fmt.Errorf("%q does not match ^[a-z0-9][a-z0-9_.-]{0,62}$", m.Name))
	}
	if err := checkText(m.Revision, 128); err != nil {
		mf("revision", err)
	}
	switch m.Engine {
	case EngineRules, EngineRego, EngineWasm, "":
	default:
		mf("engine", fmt.Errorf("unknown engine %q (want rules, rego or wasm)", m.Engine))
	}
	if m.Entrypoint != "" {
		if m.Engine == EngineRules {
			mf("entrypoint", errors.New("not used by the rules engine; remove it"))
		} else if err := checkText(m.Entrypoint, 256); err != nil {
			mf("entrypoint", err)
		}
	}
	switch {
	case m.ABI == "":
	case m.Engine != EngineWasm && m.Engine != "":
		mf("abi", fmt.Errorf("only wasm bundles have an ABI (engine is %s)", m.Engine))
	case m.ABI != ABIWicket && m.ABI != ABIOPA:
		mf("abi", fmt.Errorf("unknown ABI %q (want wicket or opa)", m.ABI))
	}
	switch m.DefaultAction {
	case "", policy.Allow, policy.Deny:
	default:
		mf("default_action", fmt.Errorf("must be allow or deny, got %q", m.DefaultAction))
	}
	switch m.OnInterrupted {
	case "", OnInterruptedIndeterminate, OnInterruptedApproval:
	default:
		mf("on_interrupted", fmt.Errorf("must be %s or %s, got %q", OnInterruptedIndeterminate, OnInterruptedApproval, m.OnInterrupted))
	}

	if len(f.RateLimits) > MaxRateLimits {
		mf("rate_limits", fmt.Errorf("%d rate limits; at most %d (each one a step matches is a counter written with the step)", len(f.RateLimits), MaxRateLimits))
		f.RateLimits = nil
	}
	ids := make(map[string]int, len(f.RateLimits))
rateLimits:
	for i, r := range f.RateLimits {
		field := fmt.Sprintf("rate_limits[%d]", i)
		switch {
		case r.ID == "":
			mf(field+".id", errors.New("required"))
			continue
		case !ValidID(r.ID):
			mf(field+".id", fmt.Errorf("%q does not match ^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$", r.ID))
			continue
		}
		if j, dup := ids[r.ID]; dup {
			mf(field+".id", fmt.Errorf("duplicate id %q (also rate_limits[%d])", r.ID, j))
			continue
		}
		ids[r.ID] = i
		ok := true
		for j, t := range r.Targets {
			if _, err := CompileGlob(t); err != nil {
				mf(fmt.Sprintf("%s.targets[%d]", field, j), fmt.Errorf("%q: %w", t, err))
				ok = false
			}
		}
		if r.StepKind != "" && !validKind(r.StepKind) {
			mf(field+".step_kind", fmt.Errorf("unknown step kind %q (want tool_call, llm_call or local)", r.StepKind))
			ok = false
		}
		rl := policy.RateLimit{MaxCalls: r.MaxCalls, Window: r.Window, Per: r.Per, Algorithm: r.Algorithm, OnLimiterError: r.OnLimiterError}
		if sub, err := checkRateLimit(rl); err != nil {
			mf(field+"."+sub, err)
			ok = false
		}
		if !ok {
			continue rateLimits
		}
		m.RateLimits = append(m.RateLimits, ManifestRateLimit{ID: r.ID, Targets: r.Targets, StepKind: r.StepKind, RateLimit: rl})
	}

	sb := m.Sandbox
	if sb.MemoryPages != 0 {
		if m.Engine != EngineWasm && m.Engine != "" {
			mf("sandbox.memory_pages", fmt.Errorf("only wasm bundles have a memory cap (engine is %s)", m.Engine))
		} else if sb.MemoryPages > MaxMemoryPages {
			mf("sandbox.memory_pages", fmt.Errorf("%d exceeds %d", sb.MemoryPages, MaxMemoryPages))
		}
	}
	if sb.PoolSize != 0 {
		if m.Engine != EngineWasm {
			mf("sandbox.pool_size", fmt.Errorf("only wasm bundles have an instance pool (engine is %s)", m.Engine))
		} else if sb.PoolSize < 0 {
			mf("sandbox.pool_size", fmt.Errorf("must be positive, got %d", sb.PoolSize))
		}
	}
	if sb.Timeout != "" {
		if d, err := time.ParseDuration(sb.Timeout); err != nil || d <= 0 {
			mf("sandbox.timeout", fmt.Errorf("must be a positive Go duration (e.g. 50ms), got %q", sb.Timeout))
		}
	}
	seen := make(map[string]bool, len(sb.Grants))
	for i, g := range sb.Grants {
		field := fmt.Sprintf("sandbox.grants[%d]", i)
		if m.Engine != EngineWasm && m.Engine != "" {
			mf(field, fmt.Errorf("only wasm bundles take grants (engine is %s)", m.Engine))
			continue
		}
		switch g {
		case GrantClock, GrantRandom, GrantEnv, GrantStdout:
		default:
			mf(field, fmt.Errorf("unknown grant %q (want clock, random, env or stdout)", g))
			continue
		}
		if seen[g] {
			mf(field, fmt.Errorf("duplicate grant %q", g))
		}
		seen[g] = true
	}
	if len(errs) == 0 {
		return m, nil
	}
	// Give each problem the line of its field.
	var root yaml.Node
	if yaml.Unmarshal(src, &root) == nil {
		for _, err := range errs {
			if e := err.(*Error); e.Line == 0 && e.Field != "" {
				e.Line = FieldLine(&root, e.Field)
			}
		}
	}
	return m, Join(errs...)
}

// FieldLine returns the line of the value at the dotted field path
// ("rate_limits[1].window", "sandbox.grants[0]") within the YAML document
// or mapping n, or of its deepest part that exists; 0 when none does.
func FieldLine(n *yaml.Node, field string) int {
	if n == nil {
		return 0
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return 0
		}
		n = n.Content[0]
	}
	line := 0
	for _, part := range strings.Split(field, ".") {
		key, rest, _ := strings.Cut(part, "[")
		if key != "" {
			v := mappingValue(n, key)
			if v == nil {
				return line
			}
			n, line = v, v.Line
		}
		for rest != "" {
			num, after, ok := strings.Cut(rest, "]")
			i, err := strconv.Atoi(num)
			if !ok || err != nil || n.Kind != yaml.SequenceNode || i < 0 || i >= len(n.Content) {
				return line
			}
			n = n.Content[i]
			line = n.Line
			rest = strings.TrimPrefix(after, "[")
		}
	}
	return line
}

// mappingValue returns the value of key in mapping n, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
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
