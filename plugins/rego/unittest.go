package rego

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	opa "github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// The Rego unit-test runner. OPA's own runner (package tester) imports
// testing for its benchmark helpers, which would put the testing package in
// the wicket binary; this one runs the same tests on the same evaluator
// (OPA's rego/topdown, OPA's builtins) with the rules `opa test` applies,
// and tester_diff_test.go checks it against OPA's runner on a corpus:
//
//   - A test is a rule whose head reference names, before its first
//     variable, a term starting with test_ (data.pkg.test_x, or
//     data.pkg.a.b.test_x); todo_test_ marks a test that is reported as
//     skipped and not run. Any .rego file may hold tests.
//   - Each definition is its own test: a second test_x in the same package
//     is renamed test_x#01, a third test_x#02, and so on (in the order of
//     the files' names, then of the rules), so a failing definition is not
//     hidden by a passing one.
//   - A test passes when its value is true. Undefined, false or any other
//     value (a number, a set, a string) fails it. A test whose value is an
//     object built case by case (test_x[name] if ...) is a table of cases:
//     it passes when every case's value is true, null or an object of such
//     cases, and every case the body started on (its key bound) made it
//     into the object, so a case that fails after its key is known counts.
//   - An evaluation error (a conflict, a timeout, a failing builtin when
//     builtin errors are raised) makes the test an error, not a failure:
//     Passed is false and Error says why. A function named test_f(x) is an
//     error too: it cannot be evaluated without arguments.
//   - Each test has its own deadline; print output is captured per test.

// Test rule name prefixes, OPA's.
const (
	testPrefix = "test_"
	todoPrefix = "todo_test_"
)

// unitTests is one run of the unit tests of a set of modules.
type unitTests struct {
	// compiler compiles modules; run adds its two stages to it.
	compiler *ast.Compiler
	modules  map[string]*ast.Module
	store    storage.Store
	// timeout bounds each test (default DefaultTestTimeout).
	timeout time.Duration
	// builtinErrors makes a failing builtin a test error rather than an
	// undefined value (the engine's strictBuiltinErrors).
	builtinErrors bool
	// tracer, when set, sees every test's evaluation (coverage).
	tracer topdown.QueryTracer
	// parallel is how many tests run at once (default GOMAXPROCS).
	parallel int
	// keep, when set, selects the tests to run by full name; the others
	// are reported as deselected without being evaluated.
	keep func(name string) bool
}

// unitTest is one test rule of the compiled modules.
type unitTest struct {
	rule *ast.Rule
	// name is the rule's head reference up to the test_ term.
	name ast.Ref
	skip bool
}

// run compiles the modules and runs every test. Compile errors are returned
// through compileErr.
func (u unitTests) run(ctx context.Context, compileErr func(ast.Errors) error) ([]TestResult, error) {
	if u.timeout <= 0 {
		u.timeout = DefaultTestTimeout
	}
	if u.parallel <= 0 {
		u.parallel = runtime.GOMAXPROCS(0)
	}
	c := u.compiler.
		WithStageAfterID(ast.StageRewriteRuleHeadRefs, ast.CompilerStageDefinition{
			Name: "NumberDuplicateTests", MetricName: "number_duplicate_tests", Stage: numberDuplicateTests,
		}).
		WithStageAfterID(ast.StageRewriteLocalVars, ast.CompilerStageDefinition{
			Name: "MarkTestCases", MetricName: "mark_test_cases", Stage: markTestCases,
		})
	if len(u.modules) > 0 {
		if c.Compile(u.modules); c.Failed() {
			return nil, compileErr(c.Errors)
		}
	}
	tests := findTests(c)
	out := make([]TestResult, len(tests))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(u.parallel, len(tests)) {
		wg.Go(func() {
			for i := range next {
				out[i] = u.runOne(ctx, c, tests[i])
			}
		})
	}
feed:
	for i := range tests {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sortResults(out)
	return out, nil
}

// testName returns the index, in the ground part of a rule head's reference,
// of the term naming a test (test_ or todo_test_), and that name; -1 when
// the rule is not a test.
func testName(h *ast.Head) (int, string) {
	for i, t := range h.Ref().GroundPrefix() {
		var s string
		switch v := t.Value.(type) {
		case ast.Var:
			s = string(v)
		case ast.String:
			s = string(v)
		}
		if strings.HasPrefix(s, testPrefix) || strings.HasPrefix(s, todoPrefix) {
			return i, s
		}
	}
	return -1, ""
}

// sortedModules returns the names of c's modules in order.
func sortedModules(c *ast.Compiler) []string {
	names := make([]string, 0, len(c.Modules))
	for n := range c.Modules {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// findTests lists the test rules of c's compiled modules.
func findTests(c *ast.Compiler) []unitTest {
	var tests []unitTest
	for _, n := range sortedModules(c) {
		for _, r := range c.Modules[n].Rules {
			i, name := testName(r.Head)
			if i < 0 {
				continue
			}
			tests = append(tests, unitTest{
				rule: r,
				name: r.Head.Ref()[:i+1].Copy(),
				skip: strings.HasPrefix(name, todoPrefix),
			})
		}
	}
	return tests
}

// numberDuplicateTests is a compiler stage (after head references are
// rewritten): the second and later definitions of a test in a package get
// a #NN suffix, so that each is a rule of its own and runs alone.
func numberDuplicateTests(c *ast.Compiler) *ast.Error {
	seen := map[string]int{}
	for _, n := range sortedModules(c) {
		m := c.Modules[n]
		for _, r := range m.Rules {
			i, name := testName(r.Head)
			if i < 0 || !strings.HasPrefix(name, testPrefix) {
				continue
			}
			ref := r.Head.Ref()
			key := m.Package.Path.Extend(ref[:i+1]).String()
			k := seen[key]
			seen[key] = k + 1
			if k == 0 {
				continue
			}
			renamed := fmt.Sprintf("%s#%02d", name, k)
			nr := ref.Copy()
			if i == 0 {
				nr[0] = ast.VarTerm(renamed)
			} else {
				nr[i] = ast.StringTerm(renamed)
			}
			r.Head.SetRef(nr)
		}
	}
	return nil
}

// markTestCases is a compiler stage (after local variables are rewritten):
// in a test rule whose reference goes on past the test's name (a table of
// cases, test_x[name] if ...), it calls OPA's internal.test_case builtin
// with the case's key as soon as the body has bound it. The builtin emits
// a trace event, so a case whose body fails later is still seen. Rules
// that call internal.test_case themselves are left as they are.
//
// The compiler puts the assignment of a computed key (tc.note in
// test_x[tc.note]) at the end of the body; it is moved up to just after the
// expressions that first bind the variables it reads, so that the key is
// known before the checks that may fail.
func markTestCases(c *ast.Compiler) *ast.Error {
	for _, m := range c.Modules {
		for _, r := range m.Rules {
			i, name := testName(r.Head)
			if i < 0 || !strings.HasPrefix(name, testPrefix) || callsTestCase(r.Body) {
				continue
			}
			keys := r.Head.Ref()[i+1:]
			if len(keys) == 0 {
				continue
			}
			for _, k := range keys {
				hoistKeyAssignment(r, k)
			}
			at := 0 // after the first binding of every key variable
			for _, k := range keys {
				if j := firstUse(r.Body, len(r.Body), k.Value); j >= 0 && j+1 > at {
					at = j + 1
				}
			}
			call := ast.NewExpr([]*ast.Term{
				ast.NewTerm(ast.InternalTestCase.Ref()),
				ast.NewTerm(ast.NewArray(keys...)),
			})
			body := make(ast.Body, 0, len(r.Body)+1)
			body = append(body, r.Body[:at]...)
			body = append(body, call)
			r.Body = append(body, r.Body[at:]...)
		}
	}
	return nil
}

// callsTestCase reports whether body calls internal.test_case.
func callsTestCase(body ast.Body) bool {
	found := false
	ast.WalkExprs(body, func(x *ast.Expr) bool {
		if x.IsCall() && x.Operator().Equal(ast.InternalTestCase.Ref()) {
			found = true
		}
		return found
	})
	return found
}

// hoistKeyAssignment moves the compiler-generated assignment of the key
// term k (k = expr, the last one in the body) up to just after the first
// use of the last of the local variables expr reads (to the top when it
// reads none); it never moves it down.
func hoistKeyAssignment(r *ast.Rule, k *ast.Term) {
	from := -1
	for j := len(r.Body) - 1; j >= 0; j-- {
		x := r.Body[j]
		if x.Generated && (x.IsEquality() || x.IsAssignment()) && x.Operand(0).Equal(k) {
			from = j
			break
		}
	}
	if from < 0 {
		return
	}
	x := r.Body[from]
	var locals []ast.Var
	ast.WalkVars(x.Operand(1), func(v ast.Var) bool {
		if strings.HasPrefix(string(v), ast.LocalVarPrefix) {
			locals = append(locals, v)
		}
		return false
	})
	to := 0
	if len(locals) > 0 {
		last := 0
		for _, v := range locals {
			if j := firstUse(r.Body, from, v); j > last {
				last = j
			}
		}
		to = last + 1
	}
	if to >= from {
		return
	}
	body := make(ast.Body, 0, len(r.Body))
	body = append(body, r.Body[:to]...)
	body = append(body, x)
	body = append(body, r.Body[to:from]...)
	r.Body = append(body, r.Body[from+1:]...)
}

// firstUse returns the index of the first of body[:end] that mentions the
// variable v, or -1 (also when v is not a variable).
func firstUse(body ast.Body, end int, v ast.Value) int {
	for j := range end {
		found := false
		ast.WalkVars(body[j], func(w ast.Var) bool {
			if w.Equal(v) {
				found = true
			}
			return found
		})
		if found {
			return j
		}
	}
	return -1
}

// caseTracer records the case keys internal.test_case reports.
type caseTracer struct {
	cases [][]string
}

func (*caseTracer) Enabled() bool               { return true }
func (*caseTracer) Config() topdown.TraceConfig { return topdown.TraceConfig{} }
func (t *caseTracer) TraceEvent(ev topdown.Event) {
	if ev.Op != topdown.TestCaseOp {
		return
	}
	x, ok := ev.Node.(*ast.Expr)
	if !ok {
		return
	}
	arr, ok := x.Operand(0).Value.(*ast.Array)
	if !ok {
		return
	}
	key := make([]string, arr.Len())
	for i := range arr.Len() {
		key[i] = keyString(arr.Elem(i).Value)
	}
	t.cases = append(t.cases, key)
}

// keyString is a case key as it appears in the test's value once turned
// into JSON: a string as is, anything else as its JSON text.
func keyString(v ast.Value) string {
	x, err := ast.JSON(v)
	if err != nil {
		return "INVALID"
	}
	if s, ok := x.(string); ok {
		return s
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(x); err != nil {
		return "INVALID"
	}
	return strings.TrimSpace(buf.String())
}

// runOne evaluates one test under its own deadline.
func (u *unitTests) runOne(ctx context.Context, c *ast.Compiler, t unitTest) TestResult {
	name := t.rule.Module.Package.Path.Extend(t.name)
	res := TestResult{Name: t.rule.Module.Package.Path.String() + "." + t.name.String()}
	if loc := t.rule.Loc(); loc != nil {
		res.File, res.Line = loc.File, loc.Row
	}
	if t.skip {
		res.Skipped = true
		return res
	}
	if u.keep != nil && !u.keep(res.Name) {
		res.Deselected = true
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()

	var printed bytes.Buffer
	var builtinErrs []topdown.Error
	opts := []func(*opa.Rego){
		opa.Compiler(c),
		opa.Store(u.store),
		opa.ParsedQuery(ast.NewBody(ast.NewExpr(ast.NewTerm(name)))),
		opa.PrintHook(topdown.NewPrintHook(&printed)),
	}
	if u.builtinErrors {
		opts = append(opts, opa.BuiltinErrorList(&builtinErrs))
	}
	var evalOpts []opa.EvalOption
	if u.tracer != nil {
		evalOpts = append(evalOpts, opa.EvalQueryTracer(u.tracer))
	}
	table := t.rule.Head.DocKind() == ast.PartialObjectDoc
	cases := &caseTracer{}
	if table {
		evalOpts = append(evalOpts, opa.EvalQueryTracer(cases))
	}

	start := time.Now()
	var rs opa.ResultSet
	pq, err := opa.New(opts...).PrepareForEval(ctx)
	if err == nil {
		rs, err = pq.Eval(ctx, evalOpts...)
	}
	res.Duration = time.Since(start)
	res.Output = printed.String()

	switch {
	case err != nil:
		res.Error = err.Error()
		if topdown.IsCancel(err) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			res.Error = fmt.Sprintf("%s (the test ran over its %s timeout)", res.Error, u.timeout)
		}
	case len(builtinErrs) == 1:
		res.Error = builtinErrs[0].Error()
	case len(builtinErrs) > 1:
		msgs := make([]string, len(builtinErrs))
		for i := range builtinErrs {
			msgs[i] = builtinErrs[i].Error()
		}
		res.Error = strings.Join(msgs, "; ")
	case len(rs) == 0 || len(rs[0].Expressions) == 0:
		// undefined: fails
	case table:
		res.FailedCases = failedCases(rs[0].Expressions[0].Value, cases.cases)
		res.Passed = len(res.FailedCases) == 0 && casesPass(rs[0].Expressions[0].Value, cases.cases)
	default:
		b, ok := rs[0].Expressions[0].Value.(bool)
		res.Passed = ok && b
	}
	if table && !res.Passed && res.Error == "" && len(res.FailedCases) == 0 {
		// Undefined: every case the body started failed.
		res.FailedCases = failedCases(nil, cases.cases)
	}
	return res
}

// casesPass reports whether a table test passed: its value (an object of
// cases) holds only passing cases, and every case the body started on is
// in it.
func casesPass(v any, started [][]string) bool {
	if v == nil {
		return false
	}
	obj, _ := v.(map[string]any)
	for _, x := range obj {
		if !casePasses(x) {
			return false
		}
	}
	for _, key := range started {
		if !startedCasePassed(obj, key) {
			return false
		}
	}
	return true
}

// failedCases lists the keys of the cases of a table test that failed: a
// case in v whose value does not pass, and a case the body started on that
// is not in v (or does not pass), each once, sorted; nested keys are
// joined with "/".
func failedCases(v any, started [][]string) []string {
	failed := map[string]bool{}
	var walk func(prefix string, x any)
	walk = func(prefix string, x any) {
		if sub, ok := x.(map[string]any); ok && prefix != "" {
			for k, y := range sub {
				walk(prefix+"/"+k, y)
			}
			return
		}
		if !casePasses(x) {
			failed[prefix] = true
		}
	}
	obj, _ := v.(map[string]any)
	for k, x := range obj {
		walk(k, x)
	}
	for _, key := range started {
		if len(key) > 0 && !startedCasePassed(obj, key) {
			failed[strings.Join(key, "/")] = true
		}
	}
	out := make([]string, 0, len(failed))
	for k := range failed {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// casePasses: a case's value is true, null, or an object of passing cases.
func casePasses(x any) bool {
	switch x := x.(type) {
	case nil:
		return true
	case bool:
		return x
	case map[string]any:
		for _, y := range x {
			if !casePasses(y) {
				return false
			}
		}
		return true
	}
	return false
}

// startedCasePassed follows key into obj: the case must be there, and pass.
func startedCasePassed(obj map[string]any, key []string) bool {
	if len(key) == 0 {
		return false
	}
	x, ok := obj[key[0]]
	if !ok {
		return false
	}
	if len(key) == 1 {
		return casePasses(x)
	}
	sub, ok := x.(map[string]any)
	if !ok {
		return false
	}
	return startedCasePassed(sub, key[1:])
}
