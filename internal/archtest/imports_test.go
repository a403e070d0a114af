// Package archtest enforces the import rules of docs/RATIONALE.md: the
// domain core imports only the standard library, and each heavy dependency
// lives in exactly one package.
package archtest

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/wicket-run/wicket"

// owners maps a dependency prefix to the only package allowed to import it
// directly (test files excepted).
var owners = map[string][]string{
	"go.etcd.io/bbolt":                 {module + "/store/bbolt"},
	"github.com/open-policy-agent/opa": {module + "/plugins/rego", module + "/plugins/bundle"},
	"github.com/tetratelabs/wazero":    {module + "/plugins/wasm"},
	"github.com/gorilla/mux":           {module + "/server"},
	"github.com/jackc/pgx":             {module + "/store/postgres"},
	// The MCP Go SDK: wicket mcp-proxy (its tests build MCP clients and
	// servers with it too; test files are not checked).
	"github.com/modelcontextprotocol/go-sdk": {module + "/internal/mcpproxy"},
}

func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		for _, imp := range imports {
			// The domain core: stdlib and kernel/... only.
			if strings.HasPrefix(pkg, module+"/kernel") && !strings.HasPrefix(pkg, module+"/kernel/storetest") {
				if strings.Contains(strings.Split(imp, "/")[0], ".") && !strings.HasPrefix(imp, module+"/kernel") {
					t.Errorf("%s imports %s: kernel/ may import only the standard library and kernel/...", pkg, imp)
				}
			}
			for dep, allowed := range owners {
				if !strings.HasPrefix(imp, dep) {
					continue
				}
				ok := false
				for _, a := range allowed {
					ok = ok || pkg == a
				}
				if !ok {
					t.Errorf("%s imports %s: only %v may", pkg, imp, allowed)
				}
			}
		}
	}
}
