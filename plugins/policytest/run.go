package policytest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/plugins/wasm"
)

// Targets of a Rego bundle's cases (Options.Target).
const (
	TargetRego = "rego" // OPA's evaluator (topdown), the Rego engine
	TargetWasm = "wasm" // the bundle compiled to wasm by OPA's compiler, the wasm engine with abi opa
	TargetBoth = "both" // both, and any disagreement between them fails the case
)

// Options tune a [Runner].
type Options struct {
	// Target is how a Rego bundle's cases run: TargetRego (default),
	// TargetWasm or TargetBoth. Bundles of the other engines run on their
	// engine whatever it says.
	Target string
	// Run, when set, selects the tests whose full name (bundle/case)
	// it matches.
	Run *regexp.Regexp
	// AllowEmpty accepts a bundle with no test at all; by default it fails.
	AllowEmpty bool
	// Coverage measures, per bundle, the rules (rules engine) and Rego lines
	// (OPA's coverage) the tests reach.
	Coverage bool
	// CoverageMin, when positive, fails a bundle whose coverage is below
	// this percentage (it implies Coverage). Wasm bundles are not measured.
	CoverageMin float64
	// Keys verify bundle signatures (see bundle.Options.Keys).
	Keys []bundle.Key
	// RegoTestTimeout bounds one Rego unit test (default
	// rego.DefaultTestTimeout).
	RegoTestTimeout time.Duration
}

// Runner runs the tests of bundles. Its wasm engine (and its on-disk
// cache) is shared by every bundle; the other engines are made per bundle.
type Runner struct {
	opts Options
	wasm *wasm.Engine
}

// NewRunner returns a runner whose wasm bundles run on w (the caller closes
// it).
func NewRunner(w *wasm.Engine, opts Options) (*Runner, error) {
	switch opts.Target {
	case "":
		opts.Target = TargetRego
	case TargetRego, TargetWasm, TargetBoth:
	default:
		return nil, fmt.Errorf("unknown target %q (want rego, wasm or both)", opts.Target)
	}
	if opts.CoverageMin < 0 || opts.CoverageMin > 100 {
		return nil, fmt.Errorf("coverage minimum %v is not a percentage", opts.CoverageMin)
	}
	if opts.CoverageMin > 0 {
		opts.Coverage = true
	}
	return &Runner{opts: opts, wasm: w}, nil
}

// Status of a test.
const (
	Pass = "pass"
	Fail = "fail"
	Skip = "skip"
)

// Kinds of test.
const (
	KindCase   = "case"   // a tests/*.yaml case
	KindRego   = "rego"   // a Rego unit test (a test_ rule), run by rego.Engine.RunTests
	KindBundle = "bundle" // a check of the bundle as a whole: [load], [no tests], [coverage], [wasm build]
)

// Bundle-level checks, named like tests.
const (
	CheckLoad      = "[load]"
	CheckNoTests   = "[no tests]"
	CheckCoverage  = "[coverage]"
	CheckWasmBuild = "[wasm build]"
)

// BundleResult is the outcome of one bundle.
type BundleResult struct {
	// Name is the bundle's name (its manifest's, else its path's).
	Name string `json:"name"`
	// Path is where it was found.
	Path     string `json:"path"`
	Engine   string `json:"engine,omitempty"`
	Revision string `json:"revision,omitempty"`
	Digest   string `json:"sha256,omitempty"`
	// Targets are the engines the cases ran on: the bundle's engine, or
	// rego and/or wasm for a Rego bundle.
	Targets []string `json:"targets,omitempty"`
	// Status is Pass or Fail.
	Status string `json:"status"`
	// Tests are the cases, then the Rego unit tests, then the failing
	// bundle-level checks, in order.
	Tests []TestResult `json:"tests"`
	// Empty reports that the bundle has no test at all.
	Empty bool `json:"empty,omitempty"`
	// Coverage is set when coverage was measured.
	Coverage *Coverage `json:"coverage,omitempty"`
	// Duration is the time spent on the bundle.
	Duration time.Duration `json:"duration_ns"`
}

// TestResult is the outcome of one test.
type TestResult struct {
	// Name is bundle/case (or bundle/data.pkg.test_x, or bundle/[check]).
	Name string `json:"name"`
	// Case is the case's own name.
	Case string `json:"case"`
	// Kind is KindCase, KindRego or KindBundle.
	Kind string `json:"kind"`
	// File and Line locate the case (File as found: joined to the bundle's
	// path); Line is 0 when unknown.
	File   string `json:"file,omitempty"`
	Line   int    `json:"line,omitempty"`
	Status string `json:"status"`
	// Message says why the test failed, in one line.
	Message string `json:"message,omitempty"`
	// Errored reports a failed test that did not evaluate to an answer (a
	// Rego unit test whose evaluation failed: a timeout, a conflict), what
	// OPA reports as ERROR rather than FAIL. It is counted as failed.
	Errored bool `json:"errored,omitempty"`
	// Details are more lines about a failure (expected, got, input,
	// errors), without indentation.
	Details []string `json:"details,omitempty"`
	// Expected is what the case expects; Got what each target answered.
	Expected *bundle.TestExpect `json:"expected,omitempty"`
	Got      map[string]*Got    `json:"got,omitempty"`
	// Mismatches are the expectations an answer missed, by target.
	Mismatches map[string][]bundle.Mismatch `json:"mismatches,omitempty"`
	// Input is the policy input, for a case the engines disagree on.
	Input    json.RawMessage `json:"input,omitempty"`
	Duration time.Duration   `json:"duration_ns"`
}

// Got is what one engine answered for a case.
type Got struct {
	// Answer is after default_action (the fail-closed denial on error).
	Answer policy.Answer `json:"decision"`
	// Matched: a rule answered (false: the default action applied).
	Matched bool `json:"matched"`
	// RateLimits are the ids of the rate limits the step would count
	// against (without the bundle name).
	RateLimits []string `json:"rate_limits,omitempty"`
	// Error is why the engine failed to answer.
	Error string `json:"error,omitempty"`
}

// Coverage is what the tests of a bundle reached.
type Coverage struct {
	// Kind is "rules" (rules reached) or "rego" (lines reached).
	Kind string `json:"kind"`
	// Percent reached; Reached of Total.
	Percent float64 `json:"percent"`
	Reached int     `json:"reached"`
	Total   int     `json:"total"`
	// Unreached are the rules (`DIR/rules.yaml:12: rule "x"`) or line
	// ranges (`DIR/policy.rego:12-14`) no test reached.
	Unreached []string `json:"unreached,omitempty"`
}

// Counts returns the number of tests that passed, failed and were skipped.
func (b *BundleResult) Counts() (passed, failed, skipped int) {
	for _, t := range b.Tests {
		switch t.Status {
		case Pass:
			passed++
		case Fail:
			failed++
		case Skip:
			skipped++
		}
	}
	return
}

// Run runs the tests of the bundle f: it loads and compiles the bundle
// exactly as the kernel does ([plugins.Host.Prepare]), runs every
// tests/*.yaml case (on each target), runs the Rego unit tests
// ([rego.Engine.RunTests]), and measures coverage. Every problem is part of
// the result.
func (r *Runner) Run(ctx context.Context, f Found) *BundleResult {
	start := time.Now()
	res := &BundleResult{Name: nameOf(f.Path), Path: f.Path}
	defer func() {
		res.Duration = time.Since(start)
		res.Status = Pass
		if _, failed, _ := res.Counts(); failed > 0 {
			res.Status = Fail
		}
	}()
	b, err := r.load(f)
	if err != nil {
		res.check(CheckLoad, f, err)
		return res
	}
	res.Name, res.Engine, res.Revision, res.Digest = b.Manifest.Name, b.Manifest.Engine, b.Manifest.Revision, b.Digest

	var cov *rego.Coverage
	re := rego.New()
	if r.opts.Coverage && b.Manifest.Engine == bundle.EngineRego && r.opts.Target != TargetWasm {
		cov = rego.NewCoverage()
		re = re.WithCoverage(cov)
	}
	host := plugins.NewHost(plugins.Options{}, rules.New(), re, r.wasm)
	defer host.Close()

	// The kernel's own check and compile: what it accepts, this accepts.
	p, err := host.Prepare(ctx, b)
	if err != nil {
		res.check(CheckLoad, f, err)
		return res
	}
	defer p.Close()

	targets := map[string]*plugins.Prepared{b.Manifest.Engine: p}
	res.Targets = []string{b.Manifest.Engine}
	if b.Manifest.Engine == bundle.EngineRego && r.opts.Target != TargetRego {
		wb, err := re.BuildWasm(ctx, b)
		var wp *plugins.Prepared
		if err == nil {
			wp, err = host.Prepare(ctx, wb)
		}
		if err != nil {
			res.check(CheckWasmBuild, f, err)
			return res
		}
		defer wp.Close()
		targets[TargetWasm] = wp
		res.Targets = []string{bundle.EngineRego, TargetWasm}
		if r.opts.Target == TargetWasm {
			delete(targets, bundle.EngineRego)
			res.Targets = []string{TargetWasm}
		}
	}

	cases, err := b.TestCases()
	if err != nil { // the loader checked them: cannot happen
		res.check(CheckLoad, f, err)
		return res
	}
	var regoTests []rego.TestResult
	if hasRegoFiles(b) {
		keep := func(test string) bool { return r.selected(res.Name + "/" + test) }
		if regoTests, err = re.RunSelectedTests(ctx, b, r.opts.RegoTestTimeout, keep); err != nil {
			res.check(CheckLoad, f, fmt.Errorf("rego unit tests: %w", err))
			return res
		}
	}
	if len(cases)+len(regoTests) == 0 {
		res.Empty = true
		if !r.opts.AllowEmpty {
			res.check(CheckNoTests, f, fmt.Errorf("no test cases (tests/*.yaml) and no Rego unit tests (test_ rules): a bundle without tests fails unless --allow-empty"))
		}
		return res
	}

	reached := make(map[string]bool) // rule ids that decided a case
	for _, tc := range cases {
		name := res.Name + "/" + tc.Name
		if !r.selected(name) {
			continue
		}
		t := r.runCase(ctx, targets, res.Targets, tc)
		t.Name, t.Case, t.Kind = name, tc.Name, KindCase
		t.File, t.Line = filePath(f, tc.SourceFile), tc.SourceLine
		for _, g := range t.Got {
			if g.Matched {
				reached[g.Answer.RuleID] = true
			}
		}
		res.Tests = append(res.Tests, t)
	}
	for _, rt := range regoTests {
		name := res.Name + "/" + rt.Name
		if !r.selected(name) {
			continue
		}
		t := TestResult{Name: name, Case: rt.Name, Kind: KindRego, File: filePath(f, rt.File), Line: rt.Line, Duration: rt.Duration}
		switch {
		case rt.Skipped:
			t.Status = Skip
		case rt.Passed:
			t.Status = Pass
		default:
			t.Status = Fail
			t.Message = "test rule is false or undefined"
			if rt.Error != "" {
				t.Message, t.Errored = rt.Error, true
			}
			if len(rt.FailedCases) > 0 {
				t.Details = append(t.Details, "failed cases: "+strings.Join(rt.FailedCases, ", "))
			}
			if out := strings.TrimSpace(rt.Output); out != "" {
				t.Details = append(t.Details, "printed:")
				for _, l := range strings.Split(out, "\n") {
					t.Details = append(t.Details, "    "+l)
				}
			}
		}
		res.Tests = append(res.Tests, t)
	}

	if r.opts.Coverage {
		res.Coverage = r.coverage(f, b, cov, reached)
		if c := res.Coverage; c != nil && r.opts.CoverageMin > 0 && c.Percent < r.opts.CoverageMin {
			res.check(CheckCoverage, f, fmt.Errorf("coverage %.1f%% of %s is below --coverage-min %g%%", c.Percent, coverageUnit(c.Kind), r.opts.CoverageMin))
		}
	}
	return res
}

// load reads the bundle with the loader the kernel uses.
func (r *Runner) load(f Found) (*bundle.Bundle, error) {
	opts := bundle.Options{Name: NameFromPath(f.Path), Keys: r.opts.Keys}
	if !f.Archive {
		return opts.LoadDir(f.Path)
	}
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, err
	}
	return opts.LoadTarGz(bytes.NewReader(data))
}

func (r *Runner) selected(name string) bool {
	return r.opts.Run == nil || r.opts.Run.MatchString(name)
}

// check records a failing bundle-level check; every problem err holds
// becomes a line naming its file (joined to the bundle's path) and line.
func (b *BundleResult) check(name string, f Found, err error) {
	t := TestResult{Name: b.Name + "/" + name, Case: name, Kind: KindBundle, Status: Fail}
	context, problems := Problems(err)
	for _, p := range problems {
		if p.File != "" {
			q := *p
			q.File = filePath(f, p.File)
			p = &q
		}
		t.Details = append(t.Details, p.Error())
	}
	switch len(problems) {
	case 0:
		t.Message = context
	case 1:
		t.Message = context + t.Details[0]
		t.Details = nil
	default:
		t.Message = fmt.Sprintf("%s%d problems", context, len(problems))
	}
	switch name {
	case CheckLoad:
		t.Message = "bundle refused: " + t.Message
	case CheckWasmBuild:
		t.Message = "OPA's wasm build failed: " + t.Message
	}
	b.Tests = append(b.Tests, t)
}

// Problems splits a load or compile error into the context wrapped around
// it and the problems it lists, each an *bundle.Error naming its file and
// line when known. When every problem names its file, the context (such as
// `bundle "x" rev 1: rego: compile bundle "x" rev 1: `) says nothing the
// file names do not, and is left out.
func Problems(err error) (context string, list bundle.Errors) {
	if err == nil {
		return "", nil
	}
	var es bundle.Errors
	var e *bundle.Error
	switch {
	case errors.As(err, &es):
		list = es
	case errors.As(err, &e):
		list = bundle.Errors{e}
	default:
		return err.Error(), nil
	}
	located := true
	for _, p := range list {
		located = located && p.File != ""
	}
	if c, ok := strings.CutSuffix(err.Error(), list.Error()); ok && !located {
		context = c
	}
	return context, list
}

// runCase runs one case on every target and compares the answers with the
// expectation and with each other.
func (r *Runner) runCase(ctx context.Context, targets map[string]*plugins.Prepared, order []string, tc bundle.TestCase) TestResult {
	start := time.Now()
	t := TestResult{Expected: &tc.Expect, Got: map[string]*Got{}, Status: Pass}
	in, err := tc.Input()
	if err != nil { // the loader checked the case: cannot happen
		t.Status, t.Message = Fail, err.Error()
		return t
	}
	for _, target := range order {
		a := targets[target].Decide(ctx, in)
		g := &Got{Answer: a.Answer, Matched: a.Matched}
		for _, l := range a.RateLimits {
			g.RateLimits = append(g.RateLimits, l.ID[strings.IndexByte(l.ID, '/')+1:])
		}
		if a.Err != nil {
			g.Error = a.Err.Error()
		}
		t.Got[target] = g
		miss := tc.Expect.Check(&g.Answer, g.RateLimits)
		// An engine error fails a case unless the case expects it.
		if a.Err != nil && tc.Expect.RuleID != "engine_error" {
			miss = append(miss, bundle.Mismatch{Field: "error", Want: "an answer", Got: g.Error})
		}
		if len(miss) > 0 {
			if t.Mismatches == nil {
				t.Mismatches = map[string][]bundle.Mismatch{}
			}
			t.Mismatches[target] = miss
		}
	}
	multi := len(order) > 1
	for _, target := range order {
		miss := t.Mismatches[target]
		if len(miss) == 0 {
			continue
		}
		t.Status = Fail
		fields := make([]string, len(miss))
		for i, m := range miss {
			fields[i] = m.Field
		}
		msg := "unexpected " + strings.Join(fields, ", ")
		if multi {
			msg = target + ": " + msg
		}
		if t.Message == "" {
			t.Message = msg
		} else {
			t.Message += "; " + msg
		}
	}
	t.Details = append(t.Details, "expected: "+describeExpect(tc.Expect))
	for _, target := range order {
		label := "got:      "
		if multi {
			label = fmt.Sprintf("%-10s", target+":")
		}
		t.Details = append(t.Details, label+describeGot(t.Got[target]))
	}
	if multi {
		a, b := t.Got[order[0]], t.Got[order[1]]
		if !sameAnswer(a, b) {
			t.Status = Fail
			msg := fmt.Sprintf("%s and %s disagree", order[0], order[1])
			if t.Message == "" {
				t.Message = msg
			} else {
				t.Message = msg + "; " + t.Message
			}
			raw, _ := json.Marshal(in)
			t.Input = raw
			t.Details = append(t.Details, "input:    "+string(raw))
		}
	}
	if t.Status == Pass {
		t.Details = nil
	}
	t.Duration = time.Since(start)
	return t
}

// sameAnswer reports whether two engines answered alike: the same decision
// (reason, approval and rate limit included) and rate limits, or both
// failed (their error texts differ by engine).
func sameAnswer(a, b *Got) bool {
	if (a.Error != "") != (b.Error != "") {
		return false
	}
	if a.Error != "" {
		return true
	}
	return a.Matched == b.Matched && reflect.DeepEqual(a.Answer, b.Answer) && slices.Equal(a.RateLimits, b.RateLimits)
}

// coverage computes what the tests reached.
func (r *Runner) coverage(f Found, b *bundle.Bundle, cov *rego.Coverage, reached map[string]bool) *Coverage {
	switch b.Manifest.Engine {
	case bundle.EngineRules:
		rs, err := rules.Parse(b.Files[bundle.RulesFile])
		if err != nil {
			return nil
		}
		c := &Coverage{Kind: "rules"}
		for _, id := range rs.RuleIDs() {
			c.Total++
			if reached[id] {
				c.Reached++
				continue
			}
			c.Unreached = append(c.Unreached, fmt.Sprintf("%s:%d: rule %q", filePath(f, bundle.RulesFile), rs.RuleLine(id), id))
		}
		c.Percent = percent(c.Reached, c.Total)
		return c
	case bundle.EngineRego:
		if cov == nil {
			return nil // --target wasm: nothing ran on OPA's evaluator
		}
		rep, err := cov.Report(b)
		if err != nil {
			return nil
		}
		c := &Coverage{Kind: "rego", Percent: rep.Percent, Reached: rep.Covered, Total: rep.Covered + rep.NotCovered}
		for _, fc := range rep.Files {
			for _, lr := range fc.Unreached {
				c.Unreached = append(c.Unreached, fmt.Sprintf("%s:%s", filePath(f, fc.File), lr))
			}
		}
		return c
	}
	return nil
}

func coverageUnit(kind string) string {
	if kind == "rules" {
		return "rules"
	}
	return "lines"
}

func percent(n, total int) float64 {
	if total == 0 {
		return 100
	}
	return 100 * float64(n) / float64(total)
}

func hasRegoFiles(b *bundle.Bundle) bool {
	for p := range b.Files {
		if strings.HasSuffix(p, ".rego") {
			return true
		}
	}
	return false
}

// filePath is a bundle file's path as a user finds it: joined to the
// bundle's directory, or after the archive's name and "#".
func filePath(f Found, file string) string {
	if file == "" {
		return f.Path
	}
	if f.Archive {
		return f.Path + "#" + file
	}
	return filepath.Join(f.Path, filepath.FromSlash(file))
}

// NameFromPath makes a bundle name of a directory or archive name
// ("authz/", "authz.tar.gz" → "authz"), or "" when it cannot be one; the
// loader names a bundle whose manifest gives no name (OPA's layout) with it.
func NameFromPath(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return ""
	}
	base := strings.ToLower(filepath.Base(abs))
	for _, ext := range []string{".tar.gz", ".tgz"} {
		base = strings.TrimSuffix(base, ext)
	}
	if !bundle.ValidName(base) {
		return ""
	}
	return base
}

// nameOf names a bundle that could not be loaded: its path's base name.
func nameOf(path string) string {
	if n := NameFromPath(path); n != "" {
		return n
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	return filepath.Base(abs)
}

// describeExpect writes an expectation in one line.
func describeExpect(x bundle.TestExpect) string {
	parts := []string{string(x.Decision)}
	if x.RuleID != "" {
		parts = append(parts, "rule_id "+x.RuleID)
	}
	if x.Reason != "" {
		parts = append(parts, fmt.Sprintf("reason %q", x.Reason))
	}
	if x.ReasonMatches != "" {
		parts = append(parts, "reason matching /"+x.ReasonMatches+"/")
	}
	if a := x.Approval; a != nil {
		parts = append(parts, "approval "+describeApproval(a))
	}
	if l := x.RateLimit; l != nil {
		parts = append(parts, "rate_limit "+describeLimit(l))
	}
	if x.RateLimits != nil {
		parts = append(parts, "rate_limits ["+strings.Join(*x.RateLimits, ", ")+"]")
	}
	return strings.Join(parts, ", ")
}

// describeGot writes an answer in one line.
func describeGot(g *Got) string {
	d := g.Answer
	parts := []string{string(d.Action)}
	if d.RuleID != "" {
		parts = append(parts, "rule_id "+d.RuleID)
	}
	if d.Reason != "" {
		parts = append(parts, fmt.Sprintf("reason %q", d.Reason))
	}
	if d.Approval != nil {
		parts = append(parts, "approval "+describeApproval(d.Approval))
	}
	if d.RateLimit != nil {
		parts = append(parts, "rate_limit "+describeLimit(d.RateLimit))
	}
	if len(g.RateLimits) > 0 {
		parts = append(parts, "rate_limits ["+strings.Join(g.RateLimits, ", ")+"]")
	}
	return strings.Join(parts, ", ")
}

func describeApproval(a *policy.Approval) string {
	var parts []string
	if a.Approvers != nil {
		parts = append(parts, "approvers ["+strings.Join(a.Approvers, ", ")+"]")
	}
	if a.Timeout != "" {
		parts = append(parts, "timeout "+a.Timeout)
	}
	if a.Message != "" {
		parts = append(parts, fmt.Sprintf("message %q", a.Message))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func describeLimit(l *policy.RateLimit) string {
	var parts []string
	if l.MaxCalls != 0 || l.Window != "" {
		parts = append(parts, fmt.Sprintf("%d per %s", l.MaxCalls, l.Window))
	}
	for _, kv := range [][2]string{{"per", l.Per}, {"algorithm", l.Algorithm}, {"on_limiter_error", l.OnLimiterError}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+" "+kv[1])
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
