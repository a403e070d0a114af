package rego

import (
	"context"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// TestRunTestsV0AndNestedData: Rego unit tests of a v0 bundle (.manifest
// rego_version 0) run on the data merged from nested data files.
func TestRunTestsV0AndNestedData(t *testing.T) {
	b, err := bundle.Options{Name: "v0"}.LoadFiles(map[string][]byte{
		".manifest":        []byte(`{"rego_version": 0}`),
		"tools/data.yaml":  []byte("allowed: [fs.read]\n"),
		"policy.rego":      []byte("package wicket\n\nallowed[t] { t := data.tools.allowed[_] }\n"),
		"policy_test.rego": []byte("package wicket\n\ntest_read { allowed[\"fs.read\"] }\n\ntest_write { allowed[\"fs.write\"] }\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := New().RunTests(context.Background(), b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 {
		t.Fatalf("results = %+v", res)
	}
	if r := res[0]; r.Name != "data.wicket.test_read" || !r.Passed || r.File != "policy_test.rego" || r.Line != 3 {
		t.Errorf("first = %+v", r)
	}
	if r := res[1]; r.Name != "data.wicket.test_write" || r.Passed {
		t.Errorf("second = %+v, want a failure", r)
	}
}

// TestRunTestsNamesFailedCases: a failing table of cases names the cases
// that failed, as opa test does ("b: FAIL"), nested keys included (the
// same set opa test v1.22.3 marks FAIL for this file); a
// passing one names none.
func TestRunTestsNamesFailedCases(t *testing.T) {
	b, err := bundle.Options{Name: "table"}.LoadFiles(map[string][]byte{
		"policy.rego": []byte("package wicket\n\nallow if input.x > 1\n"),
		"policy_test.rego": []byte(`package wicket

cases := {"a": 2, "b": 0, "c": 3, "d": -1}

test_flat[name] if {
	some name, x in cases
	allow with input.x as x
}

test_nested[group][name] if {
	some group in ["g1", "g2"]
	some name, x in cases
	x > 0
	allow with input.x as x
}

test_passes[name] if {
	some name, x in {"a": 2, "c": 3}
	allow with input.x as x
}
`),
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := New().RunTests(context.Background(), b, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"data.wicket.test_flat":   "b d",
		"data.wicket.test_nested": "g1/b g1/d g2/b g2/d", // d is started (keys bound), then fails x > 0: opa test says FAIL too
		"data.wicket.test_passes": "",
	}
	if len(res) != len(want) {
		t.Fatalf("results = %+v", res)
	}
	for _, r := range res {
		w, ok := want[r.Name]
		if got := strings.Join(r.FailedCases, " "); !ok || got != w || r.Passed != (w == "") {
			t.Errorf("%s: passed %v, failed cases %q, want %q", r.Name, r.Passed, got, w)
		}
	}
}
