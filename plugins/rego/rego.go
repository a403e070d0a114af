package rego

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	opa "github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/util"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// strictBuiltinErrors is the engine's rule for a failing builtin: false,
// OPA's rule, which OPA-compiled wasm follows too, so a failing builtin is
// undefined in both engines (docs/policy.md). Rego unit tests run under the
// same rule as the policy.
const strictBuiltinErrors = false

// DefaultEntrypoint is the query evaluated when the manifest names none.
const DefaultEntrypoint = "data.wicket.decision"

// Engine compiles Rego bundles. Its zero value is not usable; call [New].
// An Engine is safe for concurrent use.
type Engine struct {
	caps *ast.Capabilities
	// removed maps each builtin taken out of caps to the reason, for errors.
	removed map[string]string
	limits  bundle.Limits
	// cov, when set, records what evaluations and unit tests reach
	// ([Engine.WithCoverage]).
	cov *Coverage
}

// Option configures an [Engine].
type Option func(*Engine)

// WithLimits sets the kernel's limits: a bundle's sandbox.timeout (default
// Limits.Timeout) is its per-evaluation deadline, and one over
// Limits.MaxTimeout is refused at Compile. Without it the defaults of
// [bundle.Limits] apply.
func WithLimits(l bundle.Limits) Option { return func(e *Engine) { e.limits = l.WithDefaults() } }

// New returns the Rego engine.
func New(opts ...Option) *Engine {
	caps, removed := capabilities()
	e := &Engine{caps: caps, removed: removed, limits: bundle.Limits{}.WithDefaults()}
	for _, o := range opts {
		o(e)
	}
	return e
}

// Name returns "rego", the manifest engine name this engine serves.
func (*Engine) Name() string { return bundle.EngineRego }

// Compile parses, compiles and prepares b's policy for evaluation.
//
// Every *.rego file of b.Files outside tests/ is parsed as Rego v1; b.Data
// (data.json), when present, is loaded as data; the manifest's entrypoint
// (default [DefaultEntrypoint]) is prepared once and reused by every
// Evaluate.
//
// # Errors
//
// A bundle is refused whole, with an error wrapped as
// `rego: compile bundle "name" rev X: ...`, when: its engine is not rego; the
// entrypoint is not a data reference of the form data.pkg.rule or no rule
// defines it; it has no .rego file; a file fails to parse or compile (each
// problem is reported as file:line: code: message); it calls a forbidden
// builtin (see the package documentation); data.json is not a JSON object or
// collides with a rule; its sandbox.timeout is over the engine's limits
// (matching [bundle.ErrCeiling]); or ctx is done.
func (e *Engine) Compile(ctx context.Context, b *bundle.Bundle) (policy.Evaluator, error) {
	if b == nil {
		return nil, errors.New("rego: compile: nil bundle")
	}
	ev, err := e.compile(ctx, b)
	if err != nil {
		return nil, fmt.Errorf("rego: compile bundle %q rev %s: %w", b.Manifest.Name, b.Manifest.Revision, err)
	}
	return ev, nil
}

func (e *Engine) compile(ctx context.Context, b *bundle.Bundle) (*evaluator, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if eng := b.Manifest.Engine; eng != "" && eng != bundle.EngineRego {
		return nil, fmt.Errorf("bundle engine is %q, not %q", eng, bundle.EngineRego)
	}
	entry, ref, err := parseEntrypoint(b.Manifest.Entrypoint)
	if err != nil {
		return nil, err
	}
	sb, err := e.limits.Apply(&b.Manifest)
	if err != nil {
		return nil, err
	}

	modules, err := e.parse(b)
	if err != nil {
		return nil, err
	}

	c := ast.NewCompiler().
		WithCapabilities(e.caps).
		WithDefaultRegoVersion(ast.RegoV1).
		WithEnablePrintStatements(false)
	c.Compile(modules)
	if c.Failed() {
		return nil, e.astErrors(c.Errors)
	}
	if len(c.GetRules(ref)) == 0 {
		if entry == DefaultEntrypoint {
			// Likely an OPA bundle, which names its query nowhere (opa
			// build -e is not recorded in a Rego bundle, and --optimize
			// drops annotations).
			return nil, fmt.Errorf("entrypoint %s is not defined by any rule (packages: %s; rules: %s): name the one to evaluate with entrypoint: in bundle.yaml or a # METADATA entrypoint: true annotation",
				entry, packages(modules), ruleNames(modules))
		}
		return nil, fmt.Errorf("entrypoint %s is not defined by any rule (packages: %s)", entry, packages(modules))
	}
	for _, r := range c.GetRulesExact(ref) {
		if len(r.Head.Args) > 0 {
			return nil, fmt.Errorf("%s: entrypoint %s is a function, want a rule that takes no arguments", where(r), entry)
		}
	}

	data, err := loadData(b)
	if err != nil {
		return nil, err
	}
	if err := checkDataConflicts(data, c.Modules); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	var store storage.Store
	if data != nil {
		store = inmem.NewFromASTObject(data)
	} else {
		store = inmem.NewWithOpts(inmem.OptReturnASTValuesOnRead(true))
	}

	r := opa.New(
		opa.Compiler(c),
		opa.Store(store),
		opa.ParsedQuery(ast.NewBody(ast.NewExpr(ast.NewTerm(ref)))),
		opa.Capabilities(e.caps),
		opa.SetRegoVersion(ast.RegoV1),
		opa.StrictBuiltinErrors(strictBuiltinErrors),
		opa.GenerateJSON(decisionGenerator(entry)),
	)
	pq, err := r.PrepareForEval(ctx)
	if err != nil {
		var ae ast.Errors
		if errors.As(err, &ae) {
			return nil, fmt.Errorf("prepare %s: %w", entry, e.astErrors(ae))
		}
		return nil, fmt.Errorf("prepare %s: %w", entry, err)
	}
	ev := newEvaluator(entry, pq, sb.Timeout)
	if e.cov != nil {
		ev.tracer = e.cov.c
	}
	return ev, nil
}

// opaEntrypointRE matches a path of names (x/y or x.y); group 1 is the first.
var opaEntrypointRE = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)([./][A-Za-z_][A-Za-z0-9_]*)+$`)

// parseEntrypoint validates the manifest entrypoint: a ground reference into
// data with at least a package and a rule (data.x.y). OPA's entrypoint
// names (x/y, as opa build -e takes them) and references without data.
// (x.y) are read as data.x.y, as the wasm engine reads them.
func parseEntrypoint(s string) (string, ast.Ref, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		s = DefaultEntrypoint
	}
	if m := opaEntrypointRE.FindStringSubmatch(s); m != nil && m[1] != "data" && m[1] != "input" {
		s = "data." + strings.ReplaceAll(s, "/", ".")
	}
	ref, err := ast.ParseRef(s)
	if err != nil {
		return "", nil, fmt.Errorf("entrypoint %q is not a reference like %s: %w", s, DefaultEntrypoint, err)
	}
	if !ref.HasPrefix(ast.DefaultRootRef) || len(ref) < 3 {
		return "", nil, fmt.Errorf("entrypoint %q must be a reference into data like %s", s, DefaultEntrypoint)
	}
	for _, t := range ref[1:] {
		if _, ok := t.Value.(ast.String); !ok {
			return "", nil, fmt.Errorf("entrypoint %q must be a constant path like %s (found %s)", s, DefaultEntrypoint, t)
		}
	}
	return ref.String(), ref, nil
}

// parse parses every .rego file outside tests/, in path order, and reports
// all parse errors at once.
func (e *Engine) parse(b *bundle.Bundle) (map[string]*ast.Module, error) {
	files := b.Files
	names := make([]string, 0, len(files))
	for name := range files {
		if path.Ext(name) != ".rego" || strings.HasPrefix(name, "tests/") {
			continue
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil, errors.New("no .rego files outside tests/")
	}
	sort.Strings(names)

	modules := make(map[string]*ast.Module, len(names))
	var errs ast.Errors
	for _, name := range names {
		// .manifest's rego_version (or file_rego_versions) decides, as in OPA.
		opts := ast.ParserOptions{RegoVersion: b.RegoVersion(name), Capabilities: e.caps, ProcessAnnotation: true}
		m, err := ast.ParseModuleWithOpts(name, string(files[name]), opts)
		if err != nil {
			var ae ast.Errors
			var one *ast.Error
			switch {
			case errors.As(err, &ae):
				errs = append(errs, ae...)
			case errors.As(err, &one):
				errs = append(errs, one)
			default:
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			continue
		}
		if m == nil { // defensive: OPA reports an empty module as an error
			return nil, fmt.Errorf("%s: empty module", name)
		}
		modules[name] = m
	}
	if len(errs) > 0 {
		return nil, e.astErrors(errs)
	}
	return modules, nil
}

// astErrors turns OPA's errors into a bundle error listing every problem
// as file:line: code: message ([bundle.Join]: one *bundle.Error per
// problem), and explains forbidden builtins.
func (e *Engine) astErrors(errs ast.Errors) error {
	errs.Sort()
	out := make([]error, 0, len(errs))
	for _, ae := range errs {
		be := &bundle.Error{}
		msg := e.formatASTError(ae)
		if loc := ae.Location; loc != nil && loc.File != "" {
			be.File, be.Line = loc.File, loc.Row
			// formatASTError led with the location: keep the rest.
			msg = strings.TrimPrefix(msg, fmt.Sprintf("%s:%d: ", loc.File, loc.Row))
			msg = strings.TrimPrefix(msg, loc.File+": ")
		}
		be.Err = errors.New(msg)
		out = append(out, be)
	}
	return bundle.Join(out...)
}

func (e *Engine) formatASTError(ae *ast.Error) string {
	var sb strings.Builder
	if loc := ae.Location; loc != nil {
		switch {
		case loc.File != "" && loc.Row > 0:
			fmt.Fprintf(&sb, "%s:%d: ", loc.File, loc.Row)
		case loc.File != "":
			fmt.Fprintf(&sb, "%s: ", loc.File)
		default:
			fmt.Fprintf(&sb, "%d:%d: ", loc.Row, loc.Col)
		}
	}
	msg := ae.Message
	if name, ok := strings.CutPrefix(msg, "undefined function "); ok && ae.Code == ast.TypeErr {
		if why, ok := e.removed[name]; ok {
			msg = fmt.Sprintf("builtin %s is not allowed in wicket policies: %s", name, why)
		}
	}
	// A test mocking a forbidden builtin (with time.now_ns as 5): OPA
	// says only that the target does not exist.
	if ae.Code == ast.TypeErr && strings.HasPrefix(msg, "with keyword target must reference existing") && ae.Location != nil {
		if name := withTarget(ae.Location.Text); name != "" {
			if why, ok := e.removed[name]; ok {
				msg = fmt.Sprintf("with %s: builtin %s is not allowed in wicket policies, so there is nothing to mock: %s", name, name, why)
			}
		}
	}
	sb.WriteString(ae.Code)
	sb.WriteString(": ")
	sb.WriteString(msg)
	// Parse error details repeat the source line with a caret: skip them.
	// Other details (type errors: have/want) say what was wrong.
	if ae.Details != nil && ae.Code != ast.ParseErr {
		var ds []string
		for _, l := range ae.Details.Lines() {
			if l = strings.TrimSpace(l); l != "" {
				ds = append(ds, l)
			}
		}
		if len(ds) > 0 {
			sb.WriteString(" (")
			sb.WriteString(strings.Join(ds, ", "))
			sb.WriteString(")")
		}
	}
	return sb.String()
}

// withTarget returns the target of a with modifier from its source text
// ("with time.now_ns as 5" or the target alone), or "".
func withTarget(text []byte) string {
	f := strings.Fields(string(text))
	if len(f) > 1 && f[0] == "with" {
		return f[1]
	}
	if len(f) > 0 {
		return f[0]
	}
	return ""
}

// packages lists the package paths of modules, for error messages.
func packages(modules map[string]*ast.Module) string {
	seen := make(map[string]bool)
	var ps []string
	for _, m := range modules {
		p := m.Package.Path.String()
		if !seen[p] {
			seen[p] = true
			ps = append(ps, p)
		}
	}
	sort.Strings(ps)
	return strings.Join(ps, ", ")
}

// ruleNames lists the rules a query could name (not functions, not
// tests), at most ten.
func ruleNames(modules map[string]*ast.Module) string {
	seen := make(map[string]bool)
	var names []string
	for _, m := range modules {
		for _, r := range m.Rules {
			name := r.Head.Ref().String()
			if len(r.Head.Args) > 0 || strings.HasPrefix(name, "test_") || strings.HasPrefix(name, "todo_test_") {
				continue
			}
			p := m.Package.Path.String() + "." + name
			if !seen[p] {
				seen[p] = true
				names = append(names, p)
			}
		}
	}
	if len(names) == 0 {
		return "none"
	}
	sort.Strings(names)
	if len(names) > 10 {
		names = append(names[:10], "…")
	}
	return strings.Join(names, ", ")
}

// loadData returns the bundle's data document (every data file merged by
// the loader) as an OPA object, or nil when the bundle has none.
func loadData(b *bundle.Bundle) (ast.Object, error) {
	raw := []byte(b.Data)
	if len(strings.TrimSpace(string(raw))) == 0 {
		return nil, nil
	}
	var x any
	if err := util.UnmarshalJSON(raw, &x); err != nil {
		return nil, fmt.Errorf("data.json: %w", err)
	}
	v, err := ast.InterfaceToValue(x)
	if err != nil {
		return nil, fmt.Errorf("data.json: %w", err)
	}
	obj, ok := v.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("data.json: want a JSON object, got %s", ast.ValueName(v))
	}
	return obj, nil
}

// checkDataConflicts refuses data.json values that sit where a rule is
// defined: OPA would otherwise have to pick one of the two at evaluation.
func checkDataConflicts(data ast.Object, modules map[string]*ast.Module) error {
	if data == nil {
		return nil
	}
	var errs []string
	for _, m := range modules {
		for _, r := range m.Rules {
			p := r.Ref().GroundPrefix()
			if len(p) == 0 || !p[0].Equal(ast.DefaultRootDocument) {
				continue
			}
			if _, err := data.Find(p[1:]); err == nil {
				errs = append(errs, fmt.Sprintf("%s: data.json also defines %s", where(r), p))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	sort.Strings(errs)
	return errors.New(strings.Join(errs, "; "))
}

// where returns a rule's file:line.
func where(r *ast.Rule) string {
	if r.Location == nil {
		return "?"
	}
	return fmt.Sprintf("%s:%d", r.Location.File, r.Location.Row)
}
