package policytest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestDiscover(t *testing.T) {
	root := t.TempDir()
	for name, content := range map[string]string{
		"a/bundle.yaml":               "name: a\n",
		"a/nested/bundle.yaml":        "name: inside-a\n", // part of a, not a bundle of its own
		"b/c/d/.manifest":             "{}",
		"b/c/x.tar.gz":                "not read by discovery",
		"b/c/notes.txt":               "",
		".hidden/bundle.yaml":         "",
		"_draft/bundle.yaml":          "",
		"e/testdata/bundle.yaml":      "",
		"e/.manifest.tar.gz":          "",
		"opa-only/policy.rego":        "package x\n",
		"opa-only/tests/cases.yaml":   "cases: []\n",
		"nothing/README.md":           "",
		"nothing/deeper/data.json":    "{}",
		"f/bundle.yaml/not-a-file.md": "", // a directory named bundle.yaml
	} {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	j := func(p string) string { return filepath.Join(root, filepath.FromSlash(p)) }
	found, err := Discover(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []Found{{Path: j("a")}, {Path: j("b/c/d")}, {Path: j("b/c/x.tar.gz"), Archive: true}}
	if len(found) != len(want) {
		t.Fatalf("found %+v, want %+v", found, want)
	}
	for i := range want {
		if found[i] != want[i] {
			t.Errorf("found[%d] = %+v, want %+v", i, found[i], want[i])
		}
	}
	// An OPA directory without .manifest, given as the path itself.
	if found, err := Discover(j("opa-only")); err != nil || len(found) != 1 || found[0].Path != j("opa-only") {
		t.Errorf("opa-only: %+v, %v", found, err)
	}
	// Paths named directly: an archive, a skipped directory, each once.
	if found, err := Discover(j("b/c/x.tar.gz"), j("e/testdata"), j("a"), root); err != nil || len(found) != 4 {
		t.Errorf("direct paths: %+v, %v", found, err)
	}
	if _, err := Discover(j("nothing")); !errors.Is(err, ErrNoBundles) {
		t.Errorf("no bundles: %v", err)
	}
	if _, err := Discover(j("b/c/notes.txt")); err == nil {
		t.Error("a plain file was taken as a bundle")
	}
	if _, err := Discover(j("missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing path: %v", err)
	}
}
