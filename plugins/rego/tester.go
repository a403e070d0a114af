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
	// Deselected: a test the caller's selection left out, not run.
	Passed     bool `json:"passed"`
	Skipped    bool `json:"skipped,omitempty"`
	Deselected bool `json:"deselected,omitempty"`
	// Error is why the test could not be evaluated (empty when it ran).
	Error string `json:"error,omitempty"`
	// Output is what the test printed (print statements).
	Output string `json:"output,omitempty"`
	// FailedCases, for a failing table of cases (test_x[name] if ...), are
	// the keys of the cases that failed ("k1/k2" for nested keys), sorted,
	// as opa test lists them (b: FAIL).
	FailedCases []string `json:"failed_cases,omitempty"`
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
// files, tests/ included) on OPA's evaluator, with the rules of `opa test`
// (see unittest.go), on b's data and under the same capabilities as the
// engine, so a test cannot pass on a builtin a policy may not use. Each
// .rego file is parsed with its Rego version. Results are sorted by file
// and line.
//
// The error is for a bundle whose modules do not compile (each problem as
// file:line: code: message), or for ctx ending before every test ran; a
// failing test is a result, not an error.
func (e *Engine) RunTests(ctx context.Context, b *bundle.Bundle, timeout time.Duration) ([]TestResult, error) {
	return e.RunSelectedTests(ctx, b, timeout, nil)
}

// RunSelectedTests is [Engine.RunTests] for the tests whose full name
// (data.pkg.test_x) keep accepts (every test when keep is nil), as opa
// test --run selects them: the others are not evaluated, so they take no
// time and reach no line of coverage, and are listed with Deselected set.
func (e *Engine) RunSelectedTests(ctx context.Context, b *bundle.Bundle, timeout time.Duration, keep func(name string) bool) ([]TestResult, error) {
	modules, store, err := e.testInputs(b)
	if err != nil {
		return nil, err
	}
	u := unitTests{
		compiler:      e.testCompiler(),
		modules:       modules,
		store:         store,
		timeout:       timeout,
		builtinErrors: strictBuiltinErrors,
		keep:          keep,
	}
	if e.cov != nil {
		u.tracer = e.cov.c
	}
	return u.run(ctx, e.astErrors)
}

// testCompiler is the compiler the unit tests of a bundle compile with: the
// engine's capabilities, Rego v1 by default, print statements kept.
func (e *Engine) testCompiler() *ast.Compiler {
	return ast.NewCompiler().
		WithCapabilities(e.caps).
		WithDefaultRegoVersion(ast.RegoV1).
		WithEnablePrintStatements(true)
}

// testInputs parses every .rego file of b (each with its Rego version) and
// makes a store holding b's data.
func (e *Engine) testInputs(b *bundle.Bundle) (map[string]*ast.Module, storage.Store, error) {
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
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
		modules[name] = m
	}
	if len(errs) > 0 {
		return nil, nil, e.astErrors(errs)
	}
	data, err := loadData(b)
	if err != nil {
		return nil, nil, err
	}
	if data != nil {
		return modules, inmem.NewFromASTObject(data), nil
	}
	return modules, inmem.New(), nil
}

// sortResults orders results by file, then line.
func sortResults(out []TestResult) {
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].File != out[j].File {
			return out[i].File < out[j].File
		}
		return out[i].Line < out[j].Line
	})
}
