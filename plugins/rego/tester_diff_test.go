package rego

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// Our unit-test runner (unittest.go) is checked against OPA's own runner
// (package tester, which the binary may not link because it imports
// testing): the same bundles run through both must give every test the
// same outcome, name, location and print output.

// outcome is a test's result in one word.
type outcome string

const (
	oPass  outcome = "pass"
	oFail  outcome = "fail"
	oError outcome = "error"
	oSkip  outcome = "skip"
)

// ranTest is one test's result, from either runner.
type ranTest struct {
	name    string
	outcome outcome
	output  string
	err     string
}

func ourOutcome(r TestResult) outcome {
	switch {
	case r.Skipped:
		return oSkip
	case r.Error != "":
		return oError
	case r.Passed:
		return oPass
	}
	return oFail
}

func opaOutcome(r *tester.Result) outcome {
	switch {
	case r.Skip:
		return oSkip
	case r.Error != nil:
		return oError
	case r.Fail:
		return oFail
	}
	return oPass
}

// runners runs b's unit tests through our runner and OPA's, with the same
// compiler, modules, data, timeout and builtin-error rule, and returns
// each one's results by file:line, or its compile error.
func runners(t testing.TB, b *bundle.Bundle, timeout time.Duration, builtinErrors bool) (ours, theirs map[string]ranTest, oursErr, theirsErr error) {
	t.Helper()
	ctx := context.Background()
	e := New()

	modules, store, err := e.testInputs(b)
	if err != nil {
		t.Fatalf("test inputs: %v", err)
	}
	u := unitTests{compiler: e.testCompiler(), modules: modules, store: store, timeout: timeout, builtinErrors: builtinErrors}
	res, oursErr := u.run(ctx, e.astErrors)
	if oursErr == nil {
		ours = map[string]ranTest{}
		for _, r := range res {
			k := fmt.Sprintf("%s:%d", r.File, r.Line)
			if _, dup := ours[k]; dup {
				t.Fatalf("two of our results at %s", k)
			}
			ours[k] = ranTest{name: r.Name, outcome: ourOutcome(r), output: r.Output, err: r.Error}
		}
	}

	// OPA's runner on a fresh parse: compiling rewrites modules.
	modules, store, err = e.testInputs(b)
	if err != nil {
		t.Fatalf("test inputs: %v", err)
	}
	ch, theirsErr := tester.NewRunner().
		SetCompiler(e.testCompiler()).
		SetStore(store).
		SetModules(modules).
		CapturePrintOutput(true).
		RaiseBuiltinErrors(builtinErrors).
		SetTimeout(timeout).
		RunTests(ctx, nil)
	if theirsErr == nil {
		theirs = map[string]ranTest{}
		for r := range ch {
			k := fmt.Sprintf("%s:%d", r.Location.File, r.Location.Row)
			if _, dup := theirs[k]; dup {
				t.Fatalf("two of OPA's results at %s", k)
			}
			rt := ranTest{name: r.Package + "." + r.Name, outcome: opaOutcome(r), output: string(r.Output)}
			if r.Error != nil {
				rt.err = r.Error.Error()
			}
			theirs[k] = rt
		}
	}
	return ours, theirs, oursErr, theirsErr
}

// compareRunners reports every test the two runners disagree on.
func compareRunners(t testing.TB, ours, theirs map[string]ranTest, compareOutput bool) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(theirs)) {
		o, ok := ours[k]
		th := theirs[k]
		if !ok {
			t.Errorf("%s (%s): OPA ran it (%s), we did not", k, th.name, th.outcome)
			continue
		}
		if o.name != th.name {
			t.Errorf("%s: named %q by us, %q by OPA", k, o.name, th.name)
		}
		if o.outcome != th.outcome {
			t.Errorf("%s (%s): %s by us (%s), %s by OPA (%s)", k, o.name, o.outcome, o.err, th.outcome, th.err)
		}
		if compareOutput && th.outcome != oError && o.output != th.output {
			t.Errorf("%s (%s): printed %q by us, %q by OPA", k, o.name, o.output, th.output)
		}
	}
	for k, o := range ours {
		if _, ok := theirs[k]; !ok {
			t.Errorf("%s (%s): we ran it (%s), OPA did not", k, o.name, o.outcome)
		}
	}
}

// diffCorpus is the differential corpus: bundles whose tests cover what a
// runner decides (what is a test, what passes, what is an error). want is
// each test's expected outcome by name, under OPA's default builtin-error
// rule (undefined); wantStrict overrides it when builtin errors are raised.
var diffCorpus = []struct {
	name       string
	files      map[string]string
	timeout    time.Duration
	want       map[string]outcome
	wantStrict map[string]outcome
}{
	{
		name: "outcomes",
		files: map[string]string{
			"policy.rego": `package wicket

allow if input.tool == "fs.read"

# a rule named like a test in a policy file is a test too
test_in_policy if allow with input as {"tool": "fs.read"}
`,
			"policy_test.rego": `package wicket

test_pass if allow with input as {"tool": "fs.read"}

test_false if allow with input as {"tool": "fs.write"}

test_undefined if input.nothing

test_explicit_false := false

test_number := 100

test_string := "yes"

test_object := {"a": true}

test_set contains 1

test_empty_set contains x if {
	some x in []
}

test_array := [true]

todo_test_later if false

todo_test_later_too := 1

not_a_test := false

test_print_pass if {
	print("hello", input.tool)
	true
}

test_print_fail if {
	print("about to fail")
	false
}

test_else if {
	false
} else := true

test_dup if false

test_dup if true

test_dup := true

default test_default := false

test_default if false

a.b.test_nested if true

a.b.test_nested if false

x.test_deeper.y := true

conflict := 1 if true

conflict := 2 if true

test_conflict if conflict

f(x) := x if x > 0

f(x) := -x if x > 0

test_fn_conflict if f(1)

g(x) := x + 1

test_mock_fn if {
	g(1) == 5 with g as h
}

h(_) := 5

test_with_data if {
	data.tools.allowed[_] == "fs.exec" with data.tools.allowed as ["fs.exec"]
}

test_function(x) if x > 0

test_function_value(x) := x
`,
		},
		want: map[string]outcome{
			"data.wicket.test_in_policy":        oPass,
			"data.wicket.test_pass":             oPass,
			"data.wicket.test_false":            oFail,
			"data.wicket.test_undefined":        oFail,
			"data.wicket.test_explicit_false":   oFail,
			"data.wicket.test_number":           oFail,
			"data.wicket.test_string":           oFail,
			"data.wicket.test_object":           oFail,
			"data.wicket.test_set":              oFail,
			"data.wicket.test_empty_set":        oFail,
			"data.wicket.test_array":            oFail,
			"data.wicket.todo_test_later":       oSkip,
			"data.wicket.todo_test_later_too":   oSkip,
			"data.wicket.test_print_pass":       oPass,
			"data.wicket.test_print_fail":       oFail,
			"data.wicket.test_else":             oPass,
			"data.wicket.test_dup":              oFail,
			"data.wicket.test_dup#01":           oPass,
			"data.wicket.test_dup#02":           oPass,
			"data.wicket.test_default":          oFail,
			"data.wicket.test_default#01":       oFail,
			"data.wicket.a.b.test_nested":       oPass,
			`data.wicket.a.b["test_nested#01"]`: oFail,
			"data.wicket.x.test_deeper":         oFail,
			"data.wicket.test_conflict":         oError,
			"data.wicket.test_fn_conflict":      oError,
			"data.wicket.test_mock_fn":          oPass,
			"data.wicket.test_with_data":        oPass,
			"data.wicket.test_function":         oError,
			"data.wicket.test_function_value":   oError,
		},
	},
	{
		name: "builtin errors",
		files: map[string]string{
			"errors_test.rego": `package errs

test_to_number if to_number("x") == 1

test_regex if regex.match("[", "x")

test_div_zero if 1 / 0 == 1

test_two_errors if {
	to_number("x") == 1
} else if {
	to_number("y") == 1
}

test_negated_error if not to_number("x")

test_fine_after_error if {
	not regex.match("[", "x")
	true
}
`,
		},
		want: map[string]outcome{
			"data.errs.test_to_number":        oFail,
			"data.errs.test_regex":            oFail,
			"data.errs.test_div_zero":         oFail,
			"data.errs.test_two_errors":       oFail,
			"data.errs.test_negated_error":    oPass,
			"data.errs.test_fine_after_error": oPass,
		},
		wantStrict: map[string]outcome{
			"data.errs.test_to_number":        oError,
			"data.errs.test_regex":            oError,
			"data.errs.test_div_zero":         oError,
			"data.errs.test_two_errors":       oError,
			"data.errs.test_negated_error":    oError,
			"data.errs.test_fine_after_error": oError,
		},
	},
	{
		name: "tables of cases",
		files: map[string]string{
			"table_test.rego": `package table

test_all_pass[x] if {
	some x in ["foo", "bar"]
}

test_all_fail[x] if {
	some x in ["foo", "bar"]
	false
}

test_one_fails[x] if {
	some x in ["foo", "bar", "baz"]
	x != "bar"
}

test_nested[x][y] if {
	some x in ["foo", "bar"]
	some y in ["do", "re", "mi"]
	not f(x, y)
}

f(x, y) if {
	x == "foo"
	y == "re"
}

test_computed_key[tc.note] if {
	some tc in [
		{"note": "one", "a": 1, "want": 2},
		{"note": "two", "a": 2, "want": 5},
	]
	tc.a + 1 == tc.want
}

test_computed_key_pass[tc.note] if {
	some tc in [{"note": "one", "a": 1, "want": 2}]
	tc.a + 1 == tc.want
}

test_number_keys[n] if {
	some n in [1, 2, 3]
	n < 3
}

test_false_value[x] := false if {
	some x in ["a"]
}

test_null_value[x] := null if {
	some x in ["a"]
}

test_string_value[x] := "yes" if {
	some x in ["a"]
}

test_object_value[x] := {"deep": true} if {
	some x in ["a"]
}

test_object_value_fail[x] := {"deep": false} if {
	some x in ["a"]
}

test_empty[x] if {
	some x in []
}

test_constant_key["k"] := true

test_array_key[[a, b]] if {
	some a in [1]
	some b in ["z"]
}
`,
		},
		want: map[string]outcome{
			"data.table.test_all_pass":          oPass,
			"data.table.test_all_fail":          oFail,
			"data.table.test_one_fails":         oFail,
			"data.table.test_nested":            oFail,
			"data.table.test_computed_key":      oFail,
			"data.table.test_computed_key_pass": oPass,
			"data.table.test_number_keys":       oFail,
			"data.table.test_false_value":       oFail,
			"data.table.test_null_value":        oPass,
			"data.table.test_string_value":      oFail,
			"data.table.test_object_value":      oPass,
			"data.table.test_object_value_fail": oFail,
			"data.table.test_empty":             oPass,
			"data.table.test_constant_key":      oPass,
			"data.table.test_array_key":         oPass,
		},
	},
	{
		name: "packages and data",
		files: map[string]string{
			"data.json": `{"tools": {"allowed": ["fs.read"]}}`,
			"authz/policy.rego": `package authz

allowed contains t if some t in data.tools.allowed
`,
			"authz/policy_test.rego": `package authz

test_read if "fs.read" in allowed

test_write if "fs.write" in allowed
`,
			"tests/other_test.rego": `package other

import data.authz

test_cross_package if count(authz.allowed) == 1

test_same_name if true
`,
			"more_test.rego": `package more

test_same_name if false

test_data_override if {
	not "fs.read" in data.authz.allowed with data.tools.allowed as []
}
`,
		},
		want: map[string]outcome{
			"data.authz.test_read":          oPass,
			"data.authz.test_write":         oFail,
			"data.other.test_cross_package": oPass,
			"data.other.test_same_name":     oPass,
			"data.more.test_same_name":      oFail,
			"data.more.test_data_override":  oPass,
		},
	},
	{
		name: "rego v0",
		files: map[string]string{
			".manifest": `{"rego_version": 0}`,
			"policy.rego": `package v0

allowed[t] { t := data.tools[_] }
`,
			"data.json": `{"tools": ["fs.read"]}`,
			"policy_test.rego": `package v0

test_read { allowed["fs.read"] }

test_write { allowed["fs.write"] }

test_partial_set[x] { x := 1 }

test_value = 100

test_true = true

test_dup { false }

test_dup { true }

todo_test_v0 { false }

test_print { print("v0") }
`,
		},
		want: map[string]outcome{
			"data.v0.test_read":        oPass,
			"data.v0.test_write":       oFail,
			"data.v0.test_partial_set": oFail,
			"data.v0.test_value":       oFail,
			"data.v0.test_true":        oPass,
			"data.v0.test_dup":         oFail,
			"data.v0.test_dup#01":      oPass,
			"data.v0.todo_test_v0":     oSkip,
			"data.v0.test_print":       oPass,
		},
	},
	{
		name: "timeout",
		files: map[string]string{
			"slow_test.rego": `package slow

test_loops if {
	some i in numbers.range(1, 100000)
	some j in numbers.range(1, 100000)
	i + j < 0
}
`,
		},
		timeout: 300 * time.Millisecond,
		want:    map[string]outcome{"data.slow.test_loops": oError},
	},
}

// TestRunnersAgree runs the corpus through our runner and OPA's, under
// both builtin-error rules, and requires the same outcome (and name and
// print output) for every test, and the outcome the corpus expects.
func TestRunnersAgree(t *testing.T) {
	for _, c := range diffCorpus {
		files := map[string][]byte{}
		for p, s := range c.files {
			files[p] = []byte(s)
		}
		b, err := bundle.Options{Name: "diff"}.LoadFiles(files)
		if err != nil {
			t.Fatalf("%s: load: %v", c.name, err)
		}
		timeout := c.timeout
		if timeout == 0 {
			timeout = time.Minute
		}
		for _, strict := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/builtin_errors=%v", c.name, strict), func(t *testing.T) {
				ours, theirs, oursErr, theirsErr := runners(t, b, timeout, strict)
				if oursErr != nil || theirsErr != nil {
					t.Fatalf("compile: ours %v, OPA's %v", oursErr, theirsErr)
				}
				compareRunners(t, ours, theirs, c.timeout == 0)
				want := maps.Clone(c.want)
				if strict {
					maps.Copy(want, c.wantStrict)
				}
				got := map[string]outcome{}
				for _, r := range ours {
					got[r.name] = r.outcome
				}
				for _, n := range slices.Sorted(maps.Keys(want)) {
					if got[n] != want[n] {
						t.Errorf("%s: %q, want %q", n, got[n], want[n])
					}
				}
				for n := range got {
					if _, ok := want[n]; !ok {
						t.Errorf("unexpected test %s (%s)", n, got[n])
					}
				}
			})
		}
	}
}

// TestRunnersAgreeOnRepositoryBundles: the Rego unit tests the repository
// ships (the policy-repo example, the OPA-layout bundle fixture) get the
// same outcomes from both runners, and pass.
func TestRunnersAgreeOnRepositoryBundles(t *testing.T) {
	for _, dir := range []string{
		"../../examples/policy-repo/policies/team-tools",
		"../bundle/testdata/opa-authz",
	} {
		t.Run(dir, func(t *testing.T) {
			b, err := bundle.Options{Name: "repo"}.LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			ours, theirs, oursErr, theirsErr := runners(t, b, time.Minute, strictBuiltinErrors)
			if oursErr != nil || theirsErr != nil {
				t.Fatalf("compile: ours %v, OPA's %v", oursErr, theirsErr)
			}
			if len(ours) == 0 {
				t.Fatal("no Rego unit test found")
			}
			compareRunners(t, ours, theirs, true)
			for k, r := range ours {
				if r.outcome != oPass {
					t.Errorf("%s (%s): %s %s", k, r.name, r.outcome, r.err)
				}
			}
		})
	}
}

// TestRunTestsEngine: Engine.RunTests (the engine's capabilities and
// builtin-error rule) gives what the corpus expects, sorted by file and
// line, with print output and a timeout error naming the timeout.
func TestRunTestsEngine(t *testing.T) {
	files := map[string][]byte{}
	for _, c := range diffCorpus {
		if c.name != "outcomes" {
			continue
		}
		for p, s := range c.files {
			files[p] = []byte(s)
		}
	}
	b, err := bundle.Options{Name: "eng"}.LoadFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	res, err := New().RunTests(context.Background(), b, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.IsSortedFunc(res, func(a, b TestResult) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		return a.Line - b.Line
	}) {
		t.Errorf("results not sorted by file and line: %+v", res)
	}
	byName := map[string]TestResult{}
	for _, r := range res {
		byName[r.Name] = r
	}
	if r := byName["data.wicket.test_print_fail"]; r.Output != "about to fail\n" || r.Passed || r.File != "policy_test.rego" {
		t.Errorf("test_print_fail = %+v", r)
	}
	if r := byName["data.wicket.test_print_pass"]; r.Output != "hello <undefined>\n" || !r.Passed {
		t.Errorf("test_print_pass = %+v", r)
	}
	if r := byName["data.wicket.todo_test_later"]; !r.Skipped || r.Passed || r.Duration != 0 {
		t.Errorf("todo_test_later = %+v", r)
	}
	if r := byName["data.wicket.test_conflict"]; r.Passed || !strings.Contains(r.Error, "eval_conflict_error") {
		t.Errorf("test_conflict = %+v", r)
	}
}

// TestRunTestsForbiddenBuiltin: a test may not call a builtin the engine
// refuses (the engine's capabilities): it is a compile error naming the
// file and line.
func TestRunTestsForbiddenBuiltin(t *testing.T) {
	b, err := bundle.Options{Name: "caps"}.LoadFiles(map[string][]byte{
		"clock_test.rego": []byte("package caps\n\ntest_clock if time.now_ns() > 0\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New().RunTests(context.Background(), b, 0)
	var be *bundle.Error
	if !errors.As(err, &be) || be.File != "clock_test.rego" || be.Line != 3 || !strings.Contains(err.Error(), "time.now_ns") {
		t.Fatalf("err = %v, want a compile error at clock_test.rego:3", err)
	}
}

// TestRunTestsTimeoutAndCancel: a test that runs over its timeout is an
// error saying so, and the others still run; a caller's context that ends
// stops the run with its error.
func TestRunTestsTimeoutAndCancel(t *testing.T) {
	b, err := bundle.Options{Name: "slow"}.LoadFiles(map[string][]byte{
		"slow_test.rego": []byte(`package slow

test_loops if {
	some i in numbers.range(1, 100000)
	some j in numbers.range(1, 100000)
	i + j < 0
}

test_quick if true
`),
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := New().RunTests(context.Background(), b, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].Passed || !strings.Contains(res[0].Error, "timeout") || !res[1].Passed {
		t.Errorf("results = %+v, want test_loops timed out and test_quick passed", res)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := New().RunTests(ctx, b, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled run: err = %v, want context.Canceled", err)
	}
	// The caller's deadline ends the looping test long before its own.
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := New().RunTests(ctx, b, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("run past the caller's deadline: err = %v, want context.DeadlineExceeded", err)
	}
}

// TestRunTestsCoverage: the unit tests feed the engine's coverage record.
func TestRunTestsCoverage(t *testing.T) {
	b, err := bundle.Options{Name: "cov"}.LoadFiles(map[string][]byte{
		"policy.rego":      []byte("package cov\n\nallow if input.x == 1\n\ndeny if input.x == 2\n"),
		"policy_test.rego": []byte("package cov\n\ntest_allow if allow with input as {\"x\": 1}\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	cov := NewCoverage()
	if _, err := New().WithCoverage(cov).RunTests(context.Background(), b, 0); err != nil {
		t.Fatal(err)
	}
	rep, err := cov.Report(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Files) != 1 || rep.Covered == 0 || rep.NotCovered == 0 {
		t.Fatalf("coverage = %+v, want policy.rego partly covered", rep)
	}
	if u := rep.Files[0].Unreached; len(u) == 0 || slices.ContainsFunc(u, func(r LineRange) bool { return r.Start != 5 }) {
		t.Errorf("unreached = %v, want line 5 (deny)", u)
	}
}

// FuzzRunnersAgree: any single test file (Rego v1, or v0 through the
// manifest) both runners compile gets the same outcome for every test from
// both.
func FuzzRunnersAgree(f *testing.F) {
	for _, c := range diffCorpus {
		if c.timeout != 0 {
			continue
		}
		_, v0 := c.files[".manifest"]
		for p, s := range c.files {
			if strings.HasSuffix(p, ".rego") {
				f.Add(s, v0)
			}
		}
	}
	f.Fuzz(func(t *testing.T, src string, v0 bool) {
		files := map[string][]byte{"fuzz_test.rego": []byte(src)}
		version := ast.RegoV1
		if v0 {
			files[".manifest"] = []byte(`{"rego_version": 0}`)
			version = ast.RegoV0
		}
		if _, err := ast.ParseModuleWithOpts("fuzz_test.rego", src, ast.ParserOptions{RegoVersion: version}); err != nil {
			t.Skip("does not parse")
		}
		b, err := bundle.Options{Name: "fuzz"}.LoadFiles(files)
		if err != nil {
			t.Skip("not a bundle")
		}
		ours, theirs, oursErr, theirsErr := runners(t, b, 2*time.Second, false)
		if (oursErr != nil) != (theirsErr != nil) {
			t.Fatalf("compile: ours %v, OPA's %v", oursErr, theirsErr)
		}
		compareRunners(t, ours, theirs, true)
	})
}

// TestRunTestsDuplicatesAcrossFiles: a test defined in two files of one
// package is numbered in the order of the files' names (OPA's runner
// numbers in map order, so the corpus cannot check this), and the same
// name in another package is a test of its own, not a duplicate.
func TestRunTestsDuplicatesAcrossFiles(t *testing.T) {
	b, err := bundle.Options{Name: "dup"}.LoadFiles(map[string][]byte{
		"b_test.rego":       []byte("package dup\n\ntest_x if true\n"),
		"a_test.rego":       []byte("package dup\n\ntest_x if false\n"),
		"c/other_test.rego": []byte("package other\n\ntest_x if true\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 { // module order must not depend on map iteration
		res, err := New().RunTests(context.Background(), b, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]TestResult{}
		for _, r := range res {
			got[r.Name] = r
		}
		if len(res) != 3 || len(got) != 3 {
			t.Fatalf("results = %+v, want three distinct tests", res)
		}
		if r := got["data.dup.test_x"]; r.File != "a_test.rego" || r.Passed {
			t.Errorf("data.dup.test_x = %+v, want a_test.rego's, failing", r)
		}
		if r := got["data.dup.test_x#01"]; r.File != "b_test.rego" || !r.Passed {
			t.Errorf("data.dup.test_x#01 = %+v, want b_test.rego's, passing", r)
		}
		if r := got["data.other.test_x"]; r.File != "c/other_test.rego" || !r.Passed {
			t.Errorf("data.other.test_x = %+v, want c/other_test.rego's, passing", r)
		}
	}
}
