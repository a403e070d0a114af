package rego

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// DefaultTestTimeout bounds one Rego unit test (OPA's default for opa test).
const DefaultTestTimeout = 5 * time.Second

// TestResult is the outcome of one Rego unit test (a test_ rule).
type TestResult struct {
	// Name is the test's full name: data.pkg.test_name.
	Name string `json:"name"`
	// File and Line locate the test rule.
	File string `json:"file"`
	Line int    `json:"line"`
	// Passed: the rule was true. Skipped: a todo_ rule, not run.
	Passed  bool `json:"passed"`
	Skipped bool `json:"skipped,omitempty"`
	// Error is why the test could not be evaluated (empty when it ran).
	Error string `json:"error,omitempty"`
	// Output is what the test printed (print statements).
	Output string `json:"output,omitempty"`
	// Duration is how long it ran.
	Duration time.Duration `json:"duration_ns"`
}

// IsRegoTestFile reports whether the bundle path p holds Rego unit tests:
// a *_test.rego file, anywhere in the bundle.
func IsRegoTestFile(p string) bool { return strings.HasSuffix(p, "_test.rego") }

// HasRegoTests reports whether b has a *_test.rego file.
func HasRegoTests(b *bundle.Bundle) bool {
	for p := range b.Files {
		if IsRegoTestFile(p) {
			return true
		}
	}
	return false
}

// RunTests runs the Rego unit tests of b (every test_ rule of its .rego
// files, tests/ included) with OPA's own test runner, on b's data and
// under the same capabilities as the engine, so a test cannot pass on a
// builtin a policy may not use. Each .rego file is parsed with its Rego
// version. Results are sorted by file and line.
//
// The error is for a bundle whose modules do not compile (each problem as
// file:line: code: message); a failing test is a result, not an error.
func (e *Engine) RunTests(ctx context.Context, b *bundle.Bundle, timeout time.Duration) ([]TestResult, error) {
	if timeout <= 0 {
		timeout = DefaultTestTimeout
	}
	modules := make(map[string]*ast.Module)
	var errs ast.Errors
	for name, src := range b.Files {
		if path.Ext(name) != ".rego" {
			continue
		}
		opts := ast.ParserOptions{RegoVersion: b.RegoVersion(name), Capabilities: e.caps, ProcessAnnotation: true}
		m, err := ast.ParseModuleWithOpts(name, string(src), opts)
		if err != nil {
			var ae ast.Errors
			if errors.As(err, &ae) {
				errs = append(errs, ae...)
				continue
			}
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		modules[name] = m
	}
	if len(errs) > 0 {
		return nil, e.astErrors(errs)
	}
	data, err := loadData(b)
	if err != nil {
		return nil, err
	}
	var store storage.Store
	if data != nil {
		store = inmem.NewFromASTObject(data)
	} else {
		store = inmem.New()
	}
	c := ast.NewCompiler().
		WithCapabilities(e.caps).
		WithDefaultRegoVersion(ast.RegoV1).
		WithEnablePrintStatements(true)
	r := tester.NewRunner().
		SetCompiler(c).
		SetStore(store).
		SetModules(modules).
		CapturePrintOutput(true).
		RaiseBuiltinErrors(strictBuiltinErrors).
		SetTimeout(timeout)
	ch, err := r.RunTests(ctx, nil)
	if err != nil {
		var ae ast.Errors
		if errors.As(err, &ae) {
			return nil, e.astErrors(ae)
		}
		return nil, err
	}
	var out []TestResult
	for res := range ch {
		tr := TestResult{
			Name:     res.Package + "." + res.Name,
			Passed:   res.Pass(),
			Skipped:  res.Skip,
			Output:   string(res.Output),
			Duration: res.Duration,
		}
		if loc := res.Location; loc != nil {
			tr.File, tr.Line = loc.File, loc.Row
		}
		if res.Error != nil {
			tr.Error = res.Error.Error()
			tr.Passed = false
		}
		out = append(out, tr)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].File != out[j].File {
			return out[i].File < out[j].File
		}
		return out[i].Line < out[j].Line
	})
	return out, nil
}
