package main

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// writeTree writes files (slash paths relative to root) below root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// isolateCache keeps the CLI's wasm cache in a temporary directory.
func isolateCache(t *testing.T) {
	t.Helper()
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
}

const (
	authzRules = `default_action: deny
rules:
  - id: allow-reads
    when: {effect: read_only}
    then: {decision: allow}
  - id: deny-rm
    priority: -1
    when: {target: shell, arguments: {command: {regex: "rm "}}}
    then: {decision: deny, reason: no rm}
`
	authzCases = `cases:
  - name: reads are allowed
    step: {kind: tool_call, target: fs.read, effect: read_only}
    expect: {decision: allow, rule_id: allow-reads}
  - name: deny rm
    step: {kind: tool_call, target: shell, args: {command: rm -rf /}, effect: read_only}
    expect: {decision: deny, rule_id: deny-rm, reason: no rm}
  - name: writes fall to the default
    step: {kind: tool_call, target: fs.write}
    expect: {decision: deny, rule_id: default_action}
`
	shellRego = `package shell

import rego.v1

deny contains "no shell" if input.step.target == "shell"
`
	shellCases = `cases:
  - name: shell is denied
    step: {kind: tool_call, target: shell}
    expect: {decision: deny, reason: no shell}
  - name: the rest is no match
    step: {kind: tool_call, target: search}
    expect: {decision: allow, rule_id: default_action}
`
)

// policyRepo writes a tree of bundles: nested directories, an OPA bundle
// with .manifest, an archive, and directories discovery must skip.
func policyRepo(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"teams/a/authz/bundle.yaml":      "name: authz\nengine: rules\n",
		"teams/a/authz/rules.yaml":       authzRules,
		"teams/a/authz/tests/cases.yaml": authzCases,
		// An OPA bundle, deeper: .manifest and no bundle.yaml.
		"teams/b/deep/er/shell/.manifest":         `{"revision": "7", "roots": ["shell"]}`,
		"teams/b/deep/er/shell/shell/policy.rego": shellRego,
		"teams/b/deep/er/shell/bundle.yaml":       "entrypoint: data.shell.deny\ndefault_action: allow\n",
		"teams/b/deep/er/shell/tests/cases.yaml":  shellCases,
		// Skipped: hidden, underscore and testdata directories.
		".git/hooks/bundle.yaml":     "name: hidden\nengine: rules\n",
		"_scratch/x/bundle.yaml":     "engine: nope\n",
		"teams/testdata/bundle.yaml": "engine: nope\n",
		"docs/README.md":             "# not a bundle\n",
	})
	// An archive built from a bundle by the CLI itself.
	src := filepath.Join(t.TempDir(), "allowall")
	writeTree(t, src, map[string]string{
		"bundle.yaml":      "name: allowall\nengine: rules\ndefault_action: allow\n",
		"rules.yaml":       "rules: []\n",
		"tests/cases.yaml": "cases:\n  - {name: anything, step: {kind: tool_call, target: x}, expect: {decision: allow}}\n",
	})
	if err := os.MkdirAll(filepath.Join(root, "dist"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, _, err := runCmd(t, context.Background(), "policy", "build", src, "-o", filepath.Join(root, "dist", "allowall.tar.gz")); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return root
}

// okLines returns the "ok"/"FAIL" lines of a text report.
func okLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "ok  \t") || strings.HasPrefix(l, "FAIL\t") {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestPolicyTestDiscovery: every bundle below the paths, nested, OPA
// layout and archives included, each once, hidden/_/testdata skipped; a
// path without bundles is an error; no path means ".".
func TestPolicyTestDiscovery(t *testing.T) {
	ctx := context.Background()
	root := policyRepo(t)
	out, _, err := runCmd(t, ctx, "policy", "test", root)
	if err != nil {
		t.Fatalf("policy test: %v\n%s", err, out)
	}
	lines := okLines(out)
	want := []string{
		"ok  \tallowall\t" + filepath.Join(root, "dist", "allowall.tar.gz") + "\t",
		"ok  \tauthz\t" + filepath.Join(root, "teams", "a", "authz") + "\t",
		"ok  \tshell\t" + filepath.Join(root, "teams", "b", "deep", "er", "shell") + "\t",
	}
	if len(lines) != len(want) {
		t.Fatalf("bundles found:\n%s\nwant %d", out, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], w)
		}
	}
	if !strings.HasSuffix(out, "6 passed, 0 failed\n") {
		t.Errorf("summary:\n%s", out)
	}

	// Several paths, overlapping: each bundle once.
	out, _, err = runCmd(t, ctx, "policy", "test", filepath.Join(root, "teams"), filepath.Join(root, "teams", "a"))
	if err != nil || len(okLines(out)) != 2 || !strings.HasSuffix(out, "5 passed, 0 failed\n") {
		t.Errorf("overlapping paths: %v\n%s", err, out)
	}

	// A path with no bundle is an error, not a usage mistake.
	_, _, err = runCmd(t, ctx, "policy", "test", filepath.Join(root, "docs"))
	var ue usageError
	if err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "no bundles found") {
		t.Errorf("path without bundles: %v", err)
	}
	if _, _, err = runCmd(t, ctx, "policy", "test", filepath.Join(root, "missing")); err == nil {
		t.Error("a missing path was accepted")
	}

	// The default path is the current directory.
	t.Chdir(filepath.Join(root, "teams", "a"))
	out, _, err = runCmd(t, ctx, "policy", "test")
	if err != nil || len(okLines(out)) != 1 || !strings.Contains(out, "ok  \tauthz\tauthz\t") {
		t.Errorf("no path: %v\n%s", err, out)
	}
}

// TestPolicyTestFailure: a failing case is reported as --- FAIL:
// bundle/case with its file:line and expected vs got, the bundle FAILs and
// the command fails (not as a usage mistake); flags may follow the paths.
func TestPolicyTestFailure(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"authz/bundle.yaml": "name: authz\nengine: rules\n",
		"authz/rules.yaml":  authzRules,
		"authz/tests/cases.yaml": authzCases + `  - name: wrong on purpose
    step: {kind: tool_call, target: fs.write, effect: read_only}
    expect: {decision: deny, rule_id: deny-writes}
`,
	})
	dir := filepath.Join(root, "authz")
	out, _, err := runCmd(t, context.Background(), "policy", "test", dir, "-v")
	var ue usageError
	if err == nil || errors.As(err, &ue) {
		t.Fatalf("a failing case: err %v (want a test failure)\n%s", err, out)
	}
	for _, want := range []string{
		"--- PASS: authz/reads are allowed (",
		"--- FAIL: authz/wrong on purpose (",
		"    " + filepath.Join(dir, "tests", "cases.yaml") + ":11: unexpected decision, rule_id\n",
		"        expected: deny, rule_id deny-writes\n",
		"        got:      allow, rule_id allow-reads\n",
		"FAIL\tauthz\t" + dir + "\t",
		"3 passed, 1 failed\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestPolicyTestEmptyBundle: a bundle with no test fails unless
// --allow-empty.
func TestPolicyTestEmptyBundle(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"empty/bundle.yaml": "name: empty\nengine: rules\n",
		"empty/rules.yaml":  "rules: []\n",
	})
	ctx := context.Background()
	out, _, err := runCmd(t, ctx, "policy", "test", root)
	if err == nil || !strings.Contains(out, "--- FAIL: empty/[no tests]") || !strings.Contains(out, "--allow-empty") || !strings.Contains(out, "0 passed, 1 failed") {
		t.Fatalf("an empty bundle: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, ctx, "policy", "test", "--allow-empty", root)
	if err != nil || !strings.Contains(out, "ok  \tempty\t") || !strings.Contains(out, "[no tests]") || !strings.Contains(out, "0 passed, 0 failed") {
		t.Fatalf("--allow-empty: %v\n%s", err, out)
	}
}

// junitDoc is what a CI system reads from a JUnit report.
type junitDoc struct {
	Tests    int `xml:"tests,attr"`
	Failures int `xml:"failures,attr"`
	Skipped  int `xml:"skipped,attr"`
	Suites   []struct {
		Name     string `xml:"name,attr"`
		Tests    int    `xml:"tests,attr"`
		Failures int    `xml:"failures,attr"`
		Cases    []struct {
			Name      string `xml:"name,attr"`
			Classname string `xml:"classname,attr"`
			File      string `xml:"file,attr"`
			Line      int    `xml:"line,attr"`
			Failure   *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Skipped *struct{} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

var summaryRE = regexp.MustCompile(`(?m)^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$`)

// summaryCounts reads the summary line.
func summaryCounts(t *testing.T, s string) (passed, failed, skipped int) {
	t.Helper()
	m := summaryRE.FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no summary line in %q", s)
	}
	atoi := func(s string) int {
		n := 0
		for _, c := range s {
			n = n*10 + int(c-'0')
		}
		return n
	}
	return atoi(m[1]), atoi(m[2]), atoi(m[3])
}

// failingRepo is a tree with a passing bundle, a failing case, a skipped
// and a failing Rego unit test, and a refused bundle.
func failingRepo(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"authz/bundle.yaml": "name: authz\nengine: rules\n",
		"authz/rules.yaml":  authzRules,
		"authz/tests/cases.yaml": authzCases + `  - name: wrong <on> "purpose" & more
    step: {kind: tool_call, target: fs.write, effect: read_only}
    expect: {decision: deny}
`,
		"shell/bundle.yaml":      "name: shell\nentrypoint: data.shell.deny\ndefault_action: allow\n",
		"shell/policy.rego":      shellRego,
		"shell/tests/cases.yaml": shellCases,
		"shell/policy_test.rego": "package shell_test\n\nimport data.shell\n\ntest_denied if \"no shell\" in shell.deny with input as {\"step\": {\"target\": \"shell\"}}\n\ntest_wrong if count(shell.deny) == 1 with input as {\"step\": {\"target\": \"x\"}}\n\ntodo_test_later if false\n",
		"broken/bundle.yaml":     "name: broken\nengine: rules\n",
		"broken/rules.yaml":      "rules:\n  - {id: a, then: {decision: maybe}}\n",
	})
	return root
}

// TestPolicyTestJUnit: the JUnit report parses as XML, has a testsuite per
// bundle and a testcase per test, and the same counts as the summary line.
func TestPolicyTestJUnit(t *testing.T) {
	root := failingRepo(t)
	ctx := context.Background()
	stdout, stderr, err := runCmd(t, ctx, "policy", "test", root, "--format", "junit")
	if err == nil {
		t.Fatal("failures were not reported")
	}
	var doc junitDoc
	if err := xml.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("not XML: %v\n%s", err, stdout)
	}
	passed, failed, skipped := summaryCounts(t, stderr)
	if passed != 6 || failed != 3 || skipped != 1 {
		t.Errorf("summary %q, want 6 passed, 3 failed, 1 skipped", stderr)
	}
	if doc.Tests != passed+failed+skipped || doc.Failures != failed || doc.Skipped != skipped {
		t.Errorf("testsuites tests=%d failures=%d skipped=%d; summary %q", doc.Tests, doc.Failures, doc.Skipped, stderr)
	}
	if len(doc.Suites) != 3 {
		t.Fatalf("%d testsuites, want 3 (one per bundle)", len(doc.Suites))
	}
	cases, failures := 0, 0
	for _, s := range doc.Suites {
		cases += len(s.Cases)
		for _, c := range s.Cases {
			if c.Failure != nil {
				failures++
			}
		}
	}
	if cases != doc.Tests || failures != doc.Failures {
		t.Errorf("testcases %d (failures %d), want %d (%d)", cases, failures, doc.Tests, doc.Failures)
	}
	authz := doc.Suites[0]
	if authz.Name != filepath.Join(root, "authz") || authz.Tests != 4 || authz.Failures != 1 {
		t.Errorf("authz suite: %+v", authz)
	}
	wrong := authz.Cases[3]
	if wrong.Name != `wrong <on> "purpose" & more` || wrong.Classname != "authz" || wrong.Line != 11 || wrong.File != filepath.Join(root, "authz", "tests", "cases.yaml") ||
		wrong.Failure == nil || !strings.Contains(wrong.Failure.Text, "expected: deny") || !strings.Contains(wrong.Failure.Text, "got:      allow, rule_id allow-reads") {
		t.Errorf("failing testcase: %+v %+v", wrong, wrong.Failure)
	}
	broken := doc.Suites[0]
	for _, s := range doc.Suites {
		if strings.HasSuffix(s.Name, "broken") {
			broken = s
		}
	}
	if len(broken.Cases) != 1 || broken.Cases[0].Name != "[load]" || broken.Cases[0].Failure == nil || !strings.Contains(broken.Cases[0].Failure.Message, `unknown decision "maybe"`) {
		t.Errorf("refused bundle: %+v", broken)
	}

	// --output: the report goes to the file and the text report to stdout.
	file := filepath.Join(t.TempDir(), "report.xml")
	stdout, _, err = runCmd(t, ctx, "policy", "test", "--format", "junit", "--output", file, root)
	if err == nil || !strings.Contains(stdout, "--- FAIL: authz/wrong") || !strings.HasSuffix(stdout, "6 passed, 3 failed, 1 skipped\n") {
		t.Fatalf("--output: %v\n%s", err, stdout)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var again junitDoc
	if err := xml.Unmarshal(raw, &again); err != nil || again.Tests != doc.Tests || again.Failures != doc.Failures {
		t.Errorf("--output file: %v %+v", err, again)
	}
}

// TestPolicyTestJUnitError: a Rego unit test whose evaluation fails (here
// a function with two outputs for one input) is a JUnit <error>, as OPA
// reports it ERROR, and a test that is merely false a <failure>; both
// count as failed in the summary.
func TestPolicyTestJUnitError(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"conflict/bundle.yaml":      "name: conflict\nentrypoint: data.shell.deny\ndefault_action: allow\n",
		"conflict/policy.rego":      shellRego,
		"conflict/policy_test.rego": "package shell_test\n\nf(_) := 1\n\nf(_) := 2\n\ntest_conflict if f(1) == 1\n\ntest_false if false\n\ntest_true if true\n",
	})
	stdout, stderr, err := runCmd(t, context.Background(), "policy", "test", root, "--format", "junit")
	if err == nil {
		t.Fatal("failures were not reported")
	}
	if p, f, _ := summaryCounts(t, stderr); p != 1 || f != 2 {
		t.Errorf("summary %q, want 1 passed, 2 failed", stderr)
	}
	var doc struct {
		Failures int `xml:"failures,attr"`
		Errors   int `xml:"errors,attr"`
		Suites   []struct {
			Failures int `xml:"failures,attr"`
			Errors   int `xml:"errors,attr"`
			Cases    []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
				Error   *struct {
					Message string `xml:"message,attr"`
				} `xml:"error"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal([]byte(stdout), &doc); err != nil || len(doc.Suites) != 1 {
		t.Fatalf("not one testsuite: %v\n%s", err, stdout)
	}
	s := doc.Suites[0]
	if doc.Failures != 1 || doc.Errors != 1 || s.Failures != 1 || s.Errors != 1 {
		t.Errorf("failures %d errors %d (suite %d, %d), want 1 and 1\n%s", doc.Failures, doc.Errors, s.Failures, s.Errors, stdout)
	}
	for _, c := range s.Cases {
		switch c.Name {
		case "data.shell_test.test_conflict":
			if c.Error == nil || c.Failure != nil || !strings.Contains(c.Error.Message, "eval_conflict_error") {
				t.Errorf("%s: %+v", c.Name, c)
			}
		case "data.shell_test.test_false":
			if c.Failure == nil || c.Error != nil {
				t.Errorf("%s: %+v", c.Name, c)
			}
		}
	}
}

// TestPolicyTestJSON: the JSON report has the summary's counts and, per
// test, the expectation and the answer.
func TestPolicyTestJSON(t *testing.T) {
	root := failingRepo(t)
	stdout, stderr, err := runCmd(t, context.Background(), "policy", "test", "--format=json", root)
	if err == nil {
		t.Fatal("failures were not reported")
	}
	var rep struct {
		Bundles []struct {
			Name   string
			Status string
			Tests  []struct {
				Name     string
				Status   string
				File     string
				Line     int
				Expected map[string]any
				Got      map[string]struct{ Decision map[string]any }
			}
		}
		Passed, Failed, Skipped int
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout)
	}
	passed, failed, skipped := summaryCounts(t, stderr)
	if rep.Passed != passed || rep.Failed != failed || rep.Skipped != skipped || len(rep.Bundles) != 3 {
		t.Fatalf("report %+v, summary %q", rep, stderr)
	}
	w := rep.Bundles[0].Tests[3]
	if rep.Bundles[0].Status != "fail" || w.Status != "fail" || w.Line != 11 || w.Expected["decision"] != "deny" || w.Got["rules"].Decision["decision"] != "allow" {
		t.Errorf("failing case: %+v", w)
	}
}

// TestPolicyTestRun: --run selects tests by bundle/case name.
func TestPolicyTestRun(t *testing.T) {
	root := failingRepo(t)
	ctx := context.Background()
	out, _, err := runCmd(t, ctx, "policy", "test", filepath.Join(root, "authz"), filepath.Join(root, "shell"), "--run", "^authz/(deny|reads)", "-v")
	if err != nil {
		t.Fatalf("--run: %v\n%s", err, out)
	}
	if !strings.Contains(out, "--- PASS: authz/deny rm") || !strings.Contains(out, "--- PASS: authz/reads are allowed") ||
		strings.Contains(out, "writes fall") || strings.Contains(out, "shell/") || !strings.Contains(out, "[no tests to run]") || !strings.HasSuffix(out, "2 passed, 0 failed\n") {
		t.Errorf("--run selected:\n%s", out)
	}
	// A refused bundle is reported whatever --run says (as go test reports
	// a package that does not build).
	out, _, err = runCmd(t, ctx, "policy", "test", root, "--run", "test_denied$")
	if err == nil || !strings.Contains(out, "--- FAIL: broken/[load]") || !strings.HasSuffix(out, "1 passed, 1 failed\n") {
		t.Errorf("--run with a refused bundle: %v\n%s", err, out)
	}
	if _, _, err := runCmd(t, ctx, "policy", "test", root, "--run", "("); !errors.As(err, new(usageError)) {
		t.Errorf("a bad --run regex: %v, want a usage error", err)
	}
	for _, args := range [][]string{{"--format", "xml"}, {"--target", "js"}, {"--coverage-min", "101"}, {"--output", "x.xml"}, {"--nope"}} {
		if _, _, err := runCmd(t, ctx, append([]string{"policy", "test", root}, args...)...); !errors.As(err, new(usageError)) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	if out, _, err := runCmd(t, ctx, "policy", "test", "--help"); err != nil || !strings.Contains(out, "coverage-min") || !strings.Contains(out, "usage: wicket policy test [PATH...]") {
		t.Errorf("--help: %v\n%s", err, out)
	}
}

// tagsPolicy decides with concat over a set: OPA's evaluator joins the set
// sorted, OPA's wasm in the module's set order (insertion), so the two
// disagree on the reason whenever the tags come unsorted. It is a real
// difference between OPA's two engines (docs/policy.md, "Differences from
// OPA"), not one of Wicket's making.
const tagsPolicy = `package wicket

decision := {"decision": "deny", "rule_id": "tags", "reason": concat(",", {t | some t in input.step.args.tags})} if count(input.step.args.tags) > 0
`

// TestPolicyTestTargetBoth: --target both runs a Rego bundle through OPA's
// evaluator and through its OPA-compiled wasm, and fails on a disagreement,
// showing the input.
func TestPolicyTestTargetBoth(t *testing.T) {
	isolateCache(t)
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"tags/bundle.yaml": "name: tags\ndefault_action: allow\n",
		"tags/policy.rego": tagsPolicy,
		"tags/tests/cases.yaml": `cases:
  - name: sorted tags
    step: {kind: tool_call, target: label, args: {tags: [a, b]}}
    expect: {decision: deny, rule_id: tags}
  - name: unsorted tags
    step: {kind: tool_call, target: label, args: {tags: [b, a]}}
    expect: {decision: deny, rule_id: tags}
  - name: no tags
    step: {kind: tool_call, target: label}
    expect: {decision: allow}
`,
	})
	// The cases the engines once disagreed on, a failing builtin and an
	// empty answer, now agree (one semantics, docs/policy.md).
	writeTree(t, root, map[string]string{
		"agree/bundle.yaml": "name: agree\ndefault_action: allow\n",
		"agree/policy.rego": `package wicket

decision := {"decision": "deny", "rule_id": "bad-regex"} if regex.match("[", input.step.target)

decision := {"decision": "deny", "rule_id": "not-a-number"} if to_number(input.step.target) > 3

decision := {} if input.step.target == "empty"
`,
		"agree/tests/cases.yaml": `cases:
  - {name: failing builtins are undefined, step: {kind: tool_call, target: seven}, expect: {decision: allow, rule_id: default_action}}
  - {name: "{} is no match", step: {kind: tool_call, target: empty}, expect: {decision: allow, rule_id: default_action}}
  - {name: a number, step: {kind: tool_call, target: "7"}, expect: {decision: deny, rule_id: not-a-number}}
`,
	})
	ctx := context.Background()
	if out, _, err := runCmd(t, ctx, "policy", "test", filepath.Join(root, "agree"), "--target", "both"); err != nil || !strings.HasSuffix(out, "3 passed, 0 failed\n") {
		t.Fatalf("builtin errors and empty answers: %v\n%s", err, out)
	}
	dir := filepath.Join(root, "tags")
	for _, target := range []string{"rego", "wasm"} {
		out, _, err := runCmd(t, ctx, "policy", "test", dir, "--target", target)
		if err != nil || !strings.HasSuffix(out, "3 passed, 0 failed\n") {
			t.Fatalf("--target %s: %v\n%s", target, err, out)
		}
	}
	out, _, err := runCmd(t, ctx, "policy", "test", dir, "--target", "both")
	if err == nil {
		t.Fatalf("--target both passed a disagreement:\n%s", out)
	}
	for _, want := range []string{
		"--- FAIL: tags/unsorted tags",
		filepath.Join(dir, "tests", "cases.yaml") + ":5: rego and wasm disagree\n",
		`        rego:     deny, rule_id tags, reason "a,b"`,
		`        wasm:     deny, rule_id tags, reason "b,a"`,
		`        input:    {"tenant":"default",`,
		`"args":{"tags":["b","a"]}`,
		"FAIL\ttags\t" + dir + "\t",
		"[rego+wasm]",
		"1 passed, 2 failed\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestPolicyTestCoverage: --coverage names the rule (rules engine) and the
// Rego lines no case reached; --coverage-min fails below the threshold.
func TestPolicyTestCoverage(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"authz/bundle.yaml": "name: authz\nengine: rules\n",
		"authz/rules.yaml": authzRules + `  - id: never-reached
    when: {target: nothing.calls.this}
    then: {decision: abort}
`,
		"authz/tests/cases.yaml": authzCases,
		"shell/bundle.yaml":      "name: shell\nentrypoint: data.shell.deny\ndefault_action: allow\n",
		"shell/policy.rego":      shellRego + "\ndeny contains \"no curl\" if {\n\tinput.step.target == \"curl\"\n}\n",
		"shell/tests/cases.yaml": shellCases,
	})
	ctx := context.Background()
	out, _, err := runCmd(t, ctx, "policy", "test", root, "--coverage")
	if err != nil {
		t.Fatalf("--coverage: %v\n%s", err, out)
	}
	for _, want := range []string{
		"    coverage: 66.7% of rules (2 of 3)\n",
		"        not reached: " + filepath.Join(root, "authz", "rules.yaml") + `:10: rule "never-reached"` + "\n",
		"coverage: 66.7% of rules\n",
		"    coverage: 33.3% of lines (1 of 3)\n",
		"        not reached: " + filepath.Join(root, "shell", "policy.rego") + ":7\n",
		"        not reached: " + filepath.Join(root, "shell", "policy.rego") + ":8\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runCmd(t, ctx, "policy", "test", root, "--coverage-min", "50")
	if err == nil || !strings.Contains(out, "--- FAIL: shell/[coverage]") || !strings.Contains(out, "coverage 33.3% of lines is below --coverage-min 50%") ||
		strings.Contains(out, "authz/[coverage]") || !strings.HasSuffix(out, "5 passed, 1 failed\n") {
		t.Errorf("--coverage-min 50: %v\n%s", err, out)
	}
}

// threeErrors is a rules bundle with three problems in rules.yaml: a
// duplicate rule id (which `policy build` used to accept and upload
// refused), an unknown decision and a regex that does not compile.
var threeErrors = map[string]string{
	"bundle.yaml": "name: three\nengine: rules\n",
	"rules.yaml": `default_action: deny
rules:
  - id: a
    when: {target: x}
    then: {decision: allow}
  - id: a
    then: {decision: allow}
  - id: b
    then: {decision: maybe}
  - id: c
    when: {arguments: {cmd: {regex: "("}}}
    then: {decision: deny}
`,
	"tests/cases.yaml": "cases:\n  - {name: x, step: {kind: tool_call, target: x}, expect: {decision: allow}}\n",
}

// TestPolicyValidationReportsEveryError: build, inspect, eval and test
// refuse a bundle the kernel refuses, with every problem of the file, each
// with file:line, rule and field.
func TestPolicyValidationReportsEveryError(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "three")
	writeTree(t, dir, threeErrors)
	rules := filepath.Join(dir, "rules.yaml")
	want := []string{
		rules + `:6: rule "a": id: duplicate id (also rules[0])`,
		rules + `:9: rule "b": then.decision: unknown decision "maybe"`,
		rules + `:11: rule "c": when.arguments.cmd: regex: error parsing regexp: missing closing )`,
	}
	in := filepath.Join(t.TempDir(), "in.json")
	writeTree(t, filepath.Dir(in), map[string]string{"in.json": `{"tenant":"default","execution_id":"e","step":{"kind":"tool_call","target":"x","args":{}}}`})
	for _, args := range [][]string{
		{"policy", "build", dir, "-o", filepath.Join(t.TempDir(), "x.tar.gz")},
		{"policy", "inspect", dir},
		{"policy", "eval", "--bundle", dir, "--input", in},
	} {
		_, _, err := runCmd(t, ctx, args...)
		if err == nil {
			t.Errorf("%v accepted a bundle the kernel refuses", args[:2])
			continue
		}
		if !strings.Contains(err.Error(), "3 problem(s)") {
			t.Errorf("%v: %v", args[:2], err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), "\n  "+w) {
				t.Errorf("%v: error lacks %q:\n%v", args[:2], w, err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(t.TempDir(), "x.tar.gz")); err == nil {
		t.Error("build wrote an archive of a refused bundle")
	}
	out, _, err := runCmd(t, ctx, "policy", "test", dir)
	if err == nil || !strings.Contains(out, "--- FAIL: three/[load]") || !strings.Contains(out, "bundle refused: 3 problems") {
		t.Fatalf("policy test: %v\n%s", err, out)
	}
	for _, w := range want {
		if !strings.Contains(out, "\n        "+w) {
			t.Errorf("policy test lacks %q:\n%s", w, out)
		}
	}

	// Problems in several files: bundle.yaml's and every test file's.
	dir = filepath.Join(t.TempDir(), "five")
	writeTree(t, dir, map[string]string{
		"bundle.yaml": "name: five\nengine: nope\ndefault_action: maybe\nrate_limits:\n  - {id: x, max_calls: 3, window: 0s}\n",
		"rules.yaml":  "rules: []\n",
		"tests/a.yaml": `cases:
  - name: a
    step: {kind: tool_call}
    expect: {decision: allow}
  - name: b
    step: {kind: teleport, target: x}
    expect: {decision: allow}
`,
		"tests/b.yaml": "cases:\n  - {name: c, step: {kind: local, target: x}, expect: {decision: perhaps}}\n",
	})
	_, _, err = runCmd(t, ctx, "policy", "inspect", dir)
	for _, w := range []string{
		"6 problem(s)",
		filepath.Join(dir, "bundle.yaml") + `:2: engine: unknown engine "nope"`,
		filepath.Join(dir, "bundle.yaml") + `:3: default_action: must be allow or deny, got "maybe"`,
		filepath.Join(dir, "bundle.yaml") + `:5: rate_limits[0].window: must be a positive Go duration`,
		filepath.Join(dir, "tests", "a.yaml") + `:3: case "a": step.target: required`,
		filepath.Join(dir, "tests", "a.yaml") + `:6: case "b": step.kind: unknown step kind "teleport"`,
		filepath.Join(dir, "tests", "b.yaml") + `:2: case "c": expect.decision: unknown decision "perhaps"`,
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("inspect: error lacks %q:\n%v", w, err)
		}
	}
}

// TestPolicyCommandsCheckCeilings: a manifest over the kernel's default
// ceilings (here a 1h sandbox.timeout) is refused by build and test as an
// upload to a kernel with default ceilings refuses it, naming the file, the
// field and the serve flag that raises the ceiling.
func TestPolicyCommandsCheckCeilings(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "slow")
	writeTree(t, dir, map[string]string{
		"bundle.yaml":      "name: slow\nengine: rules\nsandbox:\n  timeout: 1h\n",
		"rules.yaml":       "rules: []\n",
		"tests/cases.yaml": "cases:\n  - {name: x, step: {kind: tool_call, target: x}, expect: {decision: allow}}\n",
	})
	want := filepath.Join(dir, "bundle.yaml") + ": sandbox.timeout: 1h0m0s exceeds the kernel's ceiling of 2s (serve --sandbox-max-timeout)"
	out := filepath.Join(t.TempDir(), "slow.tar.gz")
	if _, _, err := runCmd(t, ctx, "policy", "build", dir, "-o", out); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("build: %v\nwant %s", err, want)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("build wrote an archive of a bundle over a ceiling")
	}
	text, _, err := runCmd(t, ctx, "policy", "test", dir)
	if err == nil || !strings.Contains(text, "--- FAIL: slow/[load]") || !strings.Contains(text, want) {
		t.Errorf("test: %v\n%s", err, text)
	}
}

// TestPolicyTestCaseFormat: cases set the execution context and expect
// reason, rule_id, approval settings and rate limits, and tables expand
// one template over many rows.
func TestPolicyTestCaseFormat(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ops")
	writeTree(t, dir, map[string]string{
		"bundle.yaml": `name: ops
engine: rules
rate_limits:
  - {id: github-writes, targets: ["github.*"], max_calls: 10, window: 1m}
`,
		"rules.yaml": `default_action: deny
rules:
  - id: oncall-deploys
    when: {target: deploy, agent_id: oncall}
    then:
      decision: require_approval
      reason: deploys need a human
      approval_config: {approvers: [ops, sre], timeout: 30m, message: check the diff}
  - id: github
    when: {target: "github.*"}
    then:
      decision: allow
      rate_limit: {max_calls: 5, window: 1h, per: agent}
  - id: reads
    when: {effect: read_only}
    then: {decision: allow, reason: reads are safe}
`,
		"tests/cases.yaml": `cases:
  - name: oncall deploys wait for ops
    agent_id: oncall
    execution: {labels: {team: web}, totals: {steps: 40, cost_usd: 1.5}}
    step: {kind: tool_call, target: deploy, args: {service: api}}
    expect:
      decision: require_approval
      rule_id: oncall-deploys
      reason: deploys need a human
      approval: {approvers: [sre, ops], timeout: 0.5h, message: check the diff}
  - name: github writes are counted twice
    step: {kind: tool_call, target: github.create_issue}
    expect:
      decision: allow
      rate_limit: {max_calls: 5, window: 60m, per: agent}
      rate_limits: [github, github-writes]
  - name: reads are not counted
    step: {kind: tool_call, target: fs.read, effect: read_only}
    expect: {decision: allow, reason_matches: "^reads", rate_limits: []}
  - table: targets
    template:
      agent_id: intern
      step: {kind: tool_call}
    columns: [name, step.target, step.effect, expect.decision, expect.rule_id]
    rows:
      - [deploy by an intern, deploy, "", deny, default_action]
      - [reading, notes, read_only, allow, reads]
      - [github, github.merge, "", allow, github]
  - table: unnamed rows
    template: {step: {kind: local, target: x}, expect: {decision: allow}}
    rows:
      - {}
      - {step: {kind: tool_call}, expect: {decision: deny}}
`,
	})
	ctx := context.Background()
	out, _, err := runCmd(t, ctx, "policy", "test", dir, "-v")
	if err != nil {
		t.Fatalf("policy test: %v\n%s", err, out)
	}
	for _, want := range []string{
		"--- PASS: ops/targets/deploy by an intern",
		"--- PASS: ops/targets/github",
		"--- PASS: ops/unnamed rows[0]",
		"--- PASS: ops/unnamed rows[1]",
		"8 passed, 0 failed\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// Each expectation can fail, and says what it wanted and got.
	writeTree(t, dir, map[string]string{"tests/cases.yaml": `cases:
  - name: wrong approval
    agent_id: oncall
    step: {kind: tool_call, target: deploy}
    expect: {decision: require_approval, approval: {approvers: [ops], timeout: 1h}}
  - name: wrong limits
    step: {kind: tool_call, target: github.x}
    expect: {decision: allow, rate_limit: {window: 1m}, rate_limits: [github]}
  - name: wrong reason
    step: {kind: tool_call, target: x, effect: read_only}
    expect: {decision: allow, reason: reads are fine, reason_matches: "^writes"}
  - table: rows
    template: {step: {kind: tool_call}}
    columns: [step.target, expect.decision]
    rows:
      - [deploy, allow]
`})
	out, _, err = runCmd(t, ctx, "policy", "test", dir)
	if err == nil {
		t.Fatalf("wrong expectations passed:\n%s", out)
	}
	cases := filepath.Join(dir, "tests", "cases.yaml")
	for _, want := range []string{
		cases + ":2: unexpected approval.approvers, approval.timeout\n",
		"        expected: require_approval, approval {approvers [ops], timeout 1h}\n",
		`        got:      require_approval, rule_id oncall-deploys, reason "deploys need a human", approval {approvers [ops, sre], timeout 30m, message "check the diff"}` + "\n",
		cases + ":6: unexpected rate_limit.window, rate_limits\n",
		"        got:      allow, rule_id github, rate_limit {5 per 1h, per agent}, rate_limits [github, github-writes]\n",
		cases + ":9: unexpected reason, reason_matches\n",
		"--- FAIL: ops/rows[0]",
		cases + ":16: unexpected decision\n",
		"0 passed, 4 failed\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestPolicyTestRunSkipsRegoTests: --run selects Rego unit tests before
// they run, as opa test --run does: a deselected test is not evaluated, so
// the lines only it reaches are not covered (and a deselected test that
// would run into its timeout costs nothing).
func TestPolicyTestRunSkipsRegoTests(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"authz/bundle.yaml": "name: authz\nengine: rego\n",
		"authz/policy.rego": `package wicket

decision := {"decision": "allow", "rule_id": "reads"} if input.step.effect == "read_only"

decision := {"decision": "deny", "rule_id": "writes"} if {
	input.step.effect == "remote_mutation"
}
`,
		"authz/policy_test.rego": `package wicket

test_reads if decision.rule_id == "reads" with input as {"step": {"effect": "read_only"}}

test_writes if decision.rule_id == "writes" with input as {"step": {"effect": "remote_mutation"}}

test_forever if count([x | some x in numbers.range(1, 1000000000)]) > 0
`,
	})
	ctx := context.Background()
	out, _, err := runCmd(t, ctx, "policy", "test", filepath.Join(root, "authz"), "--run", "test_reads$", "--coverage", "--timeout", "20s", "-v")
	if err != nil {
		t.Fatalf("--run test_reads$: %v\n%s", err, out)
	}
	if !strings.Contains(out, "--- PASS: authz/data.wicket.test_reads") || strings.Contains(out, "test_writes") || strings.Contains(out, "test_forever") ||
		!strings.HasSuffix(out, "1 passed, 0 failed\n") {
		t.Errorf("--run test_reads$:\n%s", out)
	}
	// Line 6 is reached only by test_writes, which did not run.
	if want := "        not reached: " + filepath.Join(root, "authz", "policy.rego") + ":6\n"; !strings.Contains(out, want) {
		t.Errorf("coverage counts a deselected test: output lacks %q:\n%s", want, out)
	}
}

// TestPolicyTestUnusableCache: a CI runner whose cache dir cannot be made
// (a read-only or missing home) still runs --target both, compiling the
// wasm in memory, instead of failing the bundle over the cache.
func TestPolicyTestUnusableCache(t *testing.T) {
	notADir := filepath.Join(t.TempDir(), "cache")
	if err := os.WriteFile(notADir, []byte("a file where the cache dir would be\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CACHE_HOME", notADir)
	t.Setenv("HOME", notADir)
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"authz/bundle.yaml": "name: authz\ndefault_action: deny\n",
		"authz/policy.rego": "package wicket\n\ndecision := {\"decision\": \"allow\", \"rule_id\": \"reads\"} if input.step.effect == \"read_only\"\n",
		"authz/tests/cases.yaml": `cases:
  - {name: reads, step: {kind: tool_call, target: fs.read, effect: read_only}, expect: {decision: allow, rule_id: reads}}
  - {name: writes, step: {kind: tool_call, target: fs.write}, expect: {decision: deny}}
`,
	})
	out, _, err := runCmd(t, context.Background(), "policy", "test", filepath.Join(root, "authz"), "--target", "both")
	if err != nil || !strings.Contains(out, "[rego+wasm]") || !strings.HasSuffix(out, "2 passed, 0 failed\n") {
		t.Errorf("--target both without a usable cache dir: %v\n%s", err, out)
	}
}
