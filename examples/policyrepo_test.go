package examples_test

import (
	"encoding/xml"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The policy-repo example is a repository of bundles with a CI workflow.
// These tests run the workflow's own `wicket` steps, read from the
// workflow file, with a freshly built wicket, against a copy of the
// example and against broken copies of it, as CI would on a pull request.

// workflowSteps returns the run: scripts of the policy workflow that call
// wicket (installing it is replaced by the binary built here).
func workflowSteps(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("policy-repo", ".github", "workflows", "policy.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var wf struct {
		On   map[string]any `yaml:"on"`
		Jobs map[string]struct {
			Steps []struct {
				Name string `yaml:"name"`
				Run  string `yaml:"run"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(raw, &wf); err != nil {
		t.Fatalf("policy.yml: %v", err)
	}
	if _, ok := wf.On["pull_request"]; !ok {
		t.Error("the workflow does not run on pull requests")
	}
	var runs []string
	for _, job := range wf.Jobs {
		for _, s := range job.Steps {
			if strings.Contains(s.Run, "wicket policy") {
				runs = append(runs, s.Run)
			}
		}
	}
	if len(runs) != 2 || !strings.Contains(runs[0], "wicket policy test") || !strings.Contains(runs[0], "--format junit") || !strings.Contains(runs[1], "wicket policy build") {
		t.Fatalf("workflow steps: %q, want the test step (JUnit) then the build step", runs)
	}
	return runs
}

// buildWicket builds cmd/wicket into a temporary directory and returns it.
func buildWicket(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "wicket"), "../cmd/wicket").CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/wicket: %v\n%s", err, out)
	}
	return dir
}

// copyRepo copies examples/policy-repo to a temporary directory.
func copyRepo(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "repo")
	err := filepath.WalkDir("policy-repo", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel("policy-repo", p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// step runs one workflow script in dir as GitHub's runner does (bash -e
// -o pipefail), with bin first on PATH; it returns the output and the exit
// status.
func step(t *testing.T, bin, dir, script string) (string, int) {
	t.Helper()
	shell, args := "sh", []string{"-e", "-c", script}
	if p, err := exec.LookPath("bash"); err == nil {
		shell, args = p, []string{"--noprofile", "--norc", "-eo", "pipefail", "-c", script}
	}
	cmd := exec.Command(shell, args...)
	cmd.Dir = dir
	cache := t.TempDir()
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "XDG_CACHE_HOME="+cache, "HOME="+cache)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("%s: %v", script, err)
	return "", -1
}

// junitReport is what CI reads from policy-tests.xml.
type junitReport struct {
	Tests    int `xml:"tests,attr"`
	Failures int `xml:"failures,attr"`
	Suites   []struct {
		Name  string `xml:"name,attr"`
		Cases []struct {
			Name    string `xml:"name,attr"`
			File    string `xml:"file,attr"`
			Line    int    `xml:"line,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func readJUnit(t *testing.T, path string) junitReport {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r junitReport
	if err := xml.Unmarshal(raw, &r); err != nil {
		t.Fatalf("%s is not XML: %v", path, err)
	}
	return r
}

func TestPolicyRepoWorkflow(t *testing.T) {
	runs := workflowSteps(t)
	bin := buildWicket(t)

	t.Run("passes", func(t *testing.T) {
		repo := copyRepo(t)
		out, code := step(t, bin, repo, runs[0])
		if code != 0 || !strings.Contains(out, "18 passed, 0 failed") {
			t.Fatalf("test step: exit %d\n%s", code, out)
		}
		r := readJUnit(t, filepath.Join(repo, "policy-tests.xml"))
		if r.Tests != 18 || r.Failures != 0 || len(r.Suites) != 2 {
			t.Errorf("JUnit: %d tests, %d failures, %d suites", r.Tests, r.Failures, len(r.Suites))
		}
		if out, code = step(t, bin, repo, runs[1]); code != 0 {
			t.Fatalf("build step: exit %d\n%s", code, out)
		}
		for _, name := range []string{"shell-guard", "team-tools"} {
			archive := filepath.Join(repo, "dist", name+".tar.gz")
			// The archive is the same bundle: it passes the same tests.
			if out, code := step(t, bin, repo, "wicket policy test "+archive); code != 0 || !strings.Contains(out, "ok  \t"+name+"\t") {
				t.Errorf("%s: exit %d\n%s", archive, code, out)
			}
		}
	})

	t.Run("a wrong expectation fails the test step", func(t *testing.T) {
		repo := copyRepo(t)
		cases := filepath.Join(repo, "policies", "shell-guard", "tests", "cases.yaml")
		src, err := os.ReadFile(cases)
		if err != nil {
			t.Fatal(err)
		}
		broken := strings.Replace(string(src), "expect: {decision: deny, rule_id: no-destructive-shell, reason:", "expect: {decision: allow, rule_id: no-destructive-shell, reason:", 1)
		if broken == string(src) {
			t.Fatal("the case to break is gone")
		}
		if err := os.WriteFile(cases, []byte(broken), 0o644); err != nil {
			t.Fatal(err)
		}
		out, code := step(t, bin, repo, runs[0])
		if code != 1 || !strings.Contains(out, "--- FAIL: shell-guard/rm is denied even after a harmless command") ||
			!strings.Contains(out, "policies/shell-guard/tests/cases.yaml:3: unexpected decision") || !strings.Contains(out, "17 passed, 1 failed") {
			t.Fatalf("test step: exit %d\n%s", code, out)
		}
		r := readJUnit(t, filepath.Join(repo, "policy-tests.xml"))
		var failed []string
		for _, s := range r.Suites {
			for _, c := range s.Cases {
				if c.Failure != nil {
					failed = append(failed, c.Name+"@"+filepath.Base(c.File)+":"+strconv.Itoa(c.Line))
					if !strings.Contains(c.Failure.Text, "expected: allow") || !strings.Contains(c.Failure.Text, "got:      deny") {
						t.Errorf("failure text: %q", c.Failure.Text)
					}
				}
			}
		}
		if r.Failures != 1 || len(failed) != 1 || failed[0] != "rm is denied even after a harmless command@cases.yaml:3" {
			t.Errorf("JUnit failures %d: %v", r.Failures, failed)
		}
		// The bundle itself is valid: it still builds.
		if out, code := step(t, bin, repo, runs[1]); code != 0 {
			t.Errorf("build step: exit %d\n%s", code, out)
		}
	})

	t.Run("a bundle the kernel would refuse fails both steps", func(t *testing.T) {
		repo := copyRepo(t)
		rules := filepath.Join(repo, "policies", "shell-guard", "rules.yaml")
		src, err := os.ReadFile(rules)
		if err != nil {
			t.Fatal(err)
		}
		// A duplicate rule id: upload refuses it, and so must CI.
		broken := strings.Replace(string(src), "id: reads-run-alone", "id: remote-changes-need-ops", 1)
		if err := os.WriteFile(rules, []byte(broken), 0o644); err != nil {
			t.Fatal(err)
		}
		out, code := step(t, bin, repo, runs[0])
		if code != 1 || !strings.Contains(out, "--- FAIL: shell-guard/[load]") || !strings.Contains(out, `rules.yaml:19: rule "remote-changes-need-ops": id: duplicate id (also rules[1])`) {
			t.Fatalf("test step: exit %d\n%s", code, out)
		}
		out, code = step(t, bin, repo, runs[1])
		if code != 1 || !strings.Contains(out, "duplicate id") {
			t.Fatalf("build step: exit %d\n%s", code, out)
		}
	})

	t.Run("exit statuses", func(t *testing.T) {
		repo := copyRepo(t)
		for script, want := range map[string]int{
			"wicket policy test policies/ --format yaml":     2, // a usage mistake
			"wicket policy test policies/ --nope":            2,
			"wicket policy test .github":                     1, // no bundles there
			"wicket policy test policies/shell-guard --help": 0,
			"wicket policy test policies/shell-guard -v":     0,
		} {
			if out, code := step(t, bin, repo, script); code != want {
				t.Errorf("%s: exit %d, want %d\n%s", script, code, want, out)
			}
		}
	})
}
