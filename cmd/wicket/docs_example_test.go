package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBundleDocExample keeps docs/bundles.md's complete example true: its
// three files, written out as the page shows them, pass `wicket policy
// test` with every case, and build.
func TestBundleDocExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/bundles.md")
	if err != nil {
		t.Fatal(err)
	}
	// A file is a line "`no-deletes/PATH`..." followed by a fenced yaml block.
	file := regexp.MustCompile("(?m)^`(no-deletes/[^`]+)`[^\\n]*\\n\\n```yaml\\n((?s:.*?))```")
	dir := t.TempDir()
	n := 0
	for _, m := range file.FindAllStringSubmatch(string(doc), -1) {
		p := filepath.Join(dir, filepath.FromSlash(m[1]))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(m[2]), 0o644); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 3 {
		t.Fatalf("found %d of the example's 3 files in docs/bundles.md", n)
	}
	b := filepath.Join(dir, "no-deletes")
	out, errOut, code := runExit(t, "policy", "test", b)
	if code != 0 || !strings.Contains(out, "4 passed, 0 failed") {
		t.Fatalf("policy test of the documented example: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = runExit(t, "policy", "build", b, "-o", filepath.Join(dir, "no-deletes.tar.gz"))
	if code != 0 || !strings.Contains(out, "no-deletes rev 1 sha256:") {
		t.Fatalf("policy build of the documented example: exit %d\n%s%s", code, out, errOut)
	}
}
