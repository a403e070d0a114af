package client

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps this package light for the programs and agent SDKs
// that import it: the standard library and server/wire only.
func TestDependencies(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case "github.com/wicket-run/wicket/sdk/client", "github.com/wicket-run/wicket/server/wire":
		default:
			t.Errorf("sdk/client imports %s; it may import only the standard library and server/wire", p)
		}
	}
}
