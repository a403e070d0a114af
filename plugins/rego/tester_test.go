package rego

import (
	"context"
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
