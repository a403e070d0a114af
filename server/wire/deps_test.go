package wire

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStdlibOnly keeps this package importable by agent SDKs: it may import
// nothing outside the standard library (STYLE practice 17).
func TestStdlibOnly(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/wicket-run/wicket/server/wire" {
			t.Errorf("server/wire imports %s; it must import only the standard library", p)
		}
	}
}
