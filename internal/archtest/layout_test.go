package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// module is the path of the module whose layout the table describes.
const module = "github.com/wicket-run/wicket"

// Entries of a row's may list besides module packages and other modules.
const (
	std     = "std"     // the standard library, except testing
	testPkg = "testing" // the testing package: test-support packages only
	anyPkg  = "module"  // any package of the module not reserved to tests
)

// row is one line of the layout: a package (or a subtree, "plugins/...")
// of the module and what it may import directly. Rows are matched in order
// and the first match applies; a package no row matches is an error, so a
// new package must find its place here.
type row struct {
	pkg string
	// may lists what the package may import: std, testing, module (any
	// package of the module but the test-support ones), a package of the
	// module ("kernel", "plugins/..."), or a third-party module path
	// ("go.etcd.io/bbolt", covering its packages).
	may []string
	why string
}

// layout is the whole import table. Because every package of the module is
// checked against its row, a rule on direct imports holds transitively: the
// kernel imports only the standard library and kernel/canon and
// kernel/policy, which import only the standard library, so nothing of the
// kernel's dependencies is anything else.
var layout = []row{
	{"kernel", []string{std, "kernel/canon", "kernel/policy"}, "the domain core: standard library only; it declares the interfaces others implement"},
	{"kernel/canon", []string{std}, "step identity, importable by anything"},
	{"kernel/policy", []string{std}, "the engine contract, importable by engines and SDK copies"},
	{"kernel/storetest", []string{std, testPkg, "kernel", "kernel/policy"}, "the store conformance suite (test support)"},

	{"server/wire", []string{std}, "wire types and signing, for agent SDKs: standard library only"},
	{"sdk/client", []string{std, "server/wire"}, "the client SDK stays light"},
	{"sdk/agent", []string{std, "sdk/client", "server/wire", "kernel/canon", "internal/llmrec"}, "the agent SDK stays light; kernel/canon (standard library only) computes the step ids it sends as Rebuno-Step-Id"},
	{"server", []string{std, "kernel", "kernel/policy", "server/wire", "internal/metrics", "github.com/gorilla/mux", "golang.org/x/net/netutil"}, "the HTTP API: the only user of mux (and of x/net's connection limit); never the policy engines (cmd/wicket wires them)"},
	{"server/console", []string{std, "kernel", "server/wire"}, "the web console: pages made from the API's answers to the signed-in key (called in process, through the handler the server hands it); no dependency of its own, no permission model of its own"},
	{"server/llmgw", []string{std, "kernel", "kernel/policy", "server/wire", "internal/llmrec"}, "the LLM gateway: provider wire formats in, steps recorded through the kernel; a handler the server mounts"},
	{"internal/llmrec", []string{std, "server/wire"}, "the llm_call record (format, refusal, usage, stream recorder) shared by the SDK's Transport and the gateway: standard library only"},
	{"internal/metrics", []string{std, "kernel", "kernel/policy", "github.com/prometheus/client_golang"}, "Prometheus metrics: the only user of the Prometheus client"},

	{"store/bbolt", []string{std, "kernel", "kernel/policy", "store/storecopy", "go.etcd.io/bbolt", "golang.org/x/sys/unix"}, "the embedded store: the only user of bbolt (and of x/sys, for sync_file_range)"},
	{"store/postgres", []string{std, "kernel", "kernel/policy", "store/storecopy", "github.com/jackc/pgx/v5"}, "the shared-database store: the only user of pgx"},
	{"store/postgres/pgtest", []string{std, testPkg, "store/postgres"}, "a PostgreSQL schema per test, skipping without WICKET_TEST_POSTGRES (test support)"},
	{"store/storecopy", []string{std, "kernel"}, "wicket store copy: moves every record between two stores, checked and compared by digest"},

	{"plugins", []string{std, "kernel", "kernel/policy", "plugins/bundle"}, "the engine host; engines are passed in"},
	{"plugins/bundle", []string{std, "kernel/canon", "kernel/policy", "go.yaml.in/yaml/v3", "github.com/open-policy-agent/opa"}, "the bundle format, which is OPA's: its bundle reader, roots, signatures"},
	{"plugins/pull", []string{std, "kernel", "plugins/bundle"}, "keeps bundles in sync with bundle servers"},
	{"plugins/rules", []string{std, "kernel/policy", "plugins/bundle", "go.yaml.in/yaml/v3"}, "native rules"},
	{"plugins/rego", []string{std, "kernel/policy", "plugins/bundle", "github.com/open-policy-agent/opa"}, "Rego: the only user of OPA"},
	{"plugins/wasm", []string{std, "kernel/policy", "plugins/bundle", "github.com/tetratelabs/wazero"}, "wasm: the only user of wazero"},
	{"plugins/worker", []string{std, "kernel/policy", "plugins", "plugins/bundle"}, "runs an engine in a child process whose memory the OS caps (the Rego worker)"},
	{"plugins/policytest", []string{std, "kernel/policy", "plugins", "plugins/bundle", "plugins/rules", "plugins/rego", "plugins/wasm"}, "wicket policy test: finds bundles, runs their cases and Rego tests through the host's own preparation, reports (text, JUnit, JSON)"},
	{"plugins/enginetest", []string{std, testPkg, "kernel/policy", "plugins", "plugins/bundle"}, "runs bundle tests through an engine (test support)"},

	{"internal/webhook", []string{std, "kernel", "server/wire", "internal/netguard"}, "outbound webhooks"},
	{"internal/netguard", []string{std}, "the outbound address policy"},
	{"internal/netguard/netguardtest", []string{std, testPkg}, "a fake DNS server for netguard tests (test support)"},
	{"internal/manifest", []string{std, "kernel", "plugins/bundle", "plugins/pull", "go.yaml.in/yaml/v3"}, "the provisioning manifest"},
	{"internal/fakellm", []string{std}, "a fake LLM provider for examples and tests"},
	{"internal/mcpproxy", []string{std, "sdk/agent", "sdk/client", "server/wire", "github.com/modelcontextprotocol/go-sdk"}, "wicket mcp-proxy: the only user of the MCP Go SDK; a client of the kernel like any agent"},
	{"internal/testkit", []string{std, testPkg, anyPkg, "store/postgres/pgtest"}, "the end-to-end harness (test support)"},
	{"internal/cpubench", []string{std, testPkg}, "a CPU-time metric for benchmarks (test support)"},
	{"internal/wasmwarm", []string{std}, "fills a wazero disk cache for tests from a non-race build (test support)"},

	{"cmd/wicket", []string{std, anyPkg}, "the binary: the one place concrete parts are wired; no test support, so it never links testing"},
	{"examples/...", []string{std, "sdk/agent", "sdk/client", "server/wire", "internal/fakellm"}, "runnable agents use only what a user has"},

	// Packages with only test files import nothing outside their tests.
	{"e2e", nil, "end-to-end tests"},
	{"bundles", nil, "the stock bundles' cross-engine tests"},
	{"internal/archtest", nil, "this table"},
}

// testSupport are the packages that import testing; no other package may
// import them outside its tests.
var testSupport = []string{"kernel/storetest", "plugins/enginetest", "internal/testkit", "internal/netguard/netguardtest",
	"internal/cpubench", "internal/wasmwarm", "store/postgres/pgtest"}

// heavy are the large dependencies that each belong to one package; a
// second row naming one must be justified here.
var heavy = map[string]string{
	"go.etcd.io/bbolt": "",
	"github.com/open-policy-agent/opa": "plugins/rego evaluates Rego; plugins/bundle reads, verifies and signs bundles, whose format is OPA's " +
		"(neither kernel/ nor server/ sees OPA)",
	"github.com/tetratelabs/wazero":          "",
	"github.com/gorilla/mux":                 "",
	"github.com/jackc/pgx/v5":                "",
	"github.com/prometheus/client_golang":    "",
	"github.com/modelcontextprotocol/go-sdk": "",
}

// pkg is what go list says of one package.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// graph is every package go list -deps listed, by import path.
type graph map[string]pkg

// reaches reports whether from reaches to through imports.
func (g graph) reaches(from, to string) bool {
	seen := map[string]bool{from: true}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range g[p].Imports {
			if imp == to {
				return true
			}
			if !seen[imp] {
				seen[imp] = true
				queue = append(queue, imp)
			}
		}
	}
	return false
}

// list runs go list -deps on every package of the module in dir and
// returns the module's own packages and the whole graph.
func list(t *testing.T, dir string) ([]pkg, graph) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports,Deps,Module,Standard", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", dir, err, stderr.String())
	}
	var pkgs []pkg
	g := graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			pkg
			Standard bool
			Module   *struct{ Path string }
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		g[p.ImportPath] = p.pkg
		if !p.Standard && p.Module != nil && p.Module.Path == module {
			pkgs = append(pkgs, p.pkg)
		}
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list in %s found no package of %s", dir, module)
	}
	return pkgs, g
}

// rel is a module package's path relative to the module ("kernel").
func rel(path string) (string, bool) {
	if path == module {
		return ".", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

// matches reports whether the module-relative package p is covered by a
// row pattern ("plugins" or "plugins/...").
func matches(pattern, p string) bool {
	if sub, ok := strings.CutSuffix(pattern, "/..."); ok {
		return p == sub || strings.HasPrefix(p, sub+"/")
	}
	return p == pattern
}

// isStd reports whether an import path is of the standard library.
func isStd(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// allowed reports whether a package of row r may import imp.
func (r row) allowed(imp string) bool {
	if p, ok := rel(imp); ok {
		for _, m := range r.may {
			switch {
			case m == anyPkg:
				if !slices.Contains(testSupport, p) {
					return true
				}
			case m == std || m == testPkg || !isStd(m): // not a module package
			case matches(m, p):
				return true
			}
		}
		return false
	}
	if imp == "testing" || strings.HasPrefix(imp, "testing/") {
		return slices.Contains(r.may, testPkg)
	}
	if isStd(imp) {
		return slices.Contains(r.may, std)
	}
	for _, m := range r.may {
		if imp == m || strings.HasPrefix(imp, m+"/") {
			return true
		}
	}
	return false
}

// check returns every way pkgs break the layout.
func check(pkgs []pkg, g graph, layout []row) []string {
	var bad []string
	for _, p := range pkgs {
		name, _ := rel(p.ImportPath)
		i := slices.IndexFunc(layout, func(r row) bool { return matches(r.pkg, name) })
		if i < 0 {
			bad = append(bad, fmt.Sprintf("%s: no row of the layout table covers this package; add one", name))
			continue
		}
		r := layout[i]
		for _, imp := range p.Imports {
			if !r.allowed(imp) {
				short := imp
				if s, ok := rel(imp); ok {
					short = s
				}
				bad = append(bad, fmt.Sprintf("%s imports %s; its row (%s) allows only %v", name, short, r.why, r.may))
			}
		}
		// The transitive view: what links testing, whatever path it came
		// by, a dependency's included.
		if !slices.Contains(r.may, testPkg) && g.reaches(p.ImportPath, "testing") {
			bad = append(bad, fmt.Sprintf("%s links testing (go list -deps): only test-support packages may", name))
		}
	}
	return bad
}

// TestLayout checks every package of the module against the table.
func TestLayout(t *testing.T) {
	pkgs, g := list(t, root)
	for _, v := range check(pkgs, g, layout) {
		t.Error(v)
	}
}

// TestLayoutTable keeps the table honest: each heavy dependency belongs to
// exactly one row unless a second one is justified in heavy.
func TestLayoutTable(t *testing.T) {
	for dep, why := range heavy {
		var rows []string
		for _, r := range layout {
			if slices.Contains(r.may, dep) {
				rows = append(rows, r.pkg)
			}
		}
		switch {
		case len(rows) == 0:
			t.Errorf("heavy dependency %s has no package", dep)
		case len(rows) > 1 && why == "":
			t.Errorf("heavy dependency %s is allowed in %v; one package owns it, or justify the second in heavy", dep, rows)
		}
	}
}

// binaryLinks returns what the wicket binary (cmd/wicket, with everything
// go list -deps lists for it) links that it may not: our test support, and
// the testing package by whatever path.
func binaryLinks(g graph) []string {
	bin := module + "/cmd/wicket"
	var bad []string
	for _, d := range g[bin].Deps {
		if p, ok := rel(d); ok && slices.Contains(testSupport, p) {
			bad = append(bad, "the wicket binary links "+p)
		}
	}
	if slices.Contains(g[bin].Deps, "testing") || g.reaches(bin, "testing") {
		bad = append(bad, "the wicket binary links testing")
	}
	return bad
}

// TestBinaryLinksNoTestSupport: the wicket binary links none of our test
// support and not the testing package at all (go list -deps ./cmd/wicket),
// whatever dependency might bring it (OPA's test runner would: wicket
// policy test runs Rego unit tests with plugins/rego's own runner instead).
func TestBinaryLinksNoTestSupport(t *testing.T) {
	_, g := list(t, root)
	if deps := g[module+"/cmd/wicket"].Deps; len(deps) < 50 {
		t.Fatalf("go list -deps ./cmd/wicket listed only %d packages", len(deps))
	}
	for _, v := range binaryLinks(g) {
		t.Error(v)
	}
}

// TestLayoutCatchesForbiddenImports runs the same check on a fixture module
// (testdata/forbidden, same module path) whose packages break the rules,
// and requires each break to be reported.
func TestLayoutCatchesForbiddenImports(t *testing.T) {
	pkgs, g := list(t, filepath.Join("testdata", "forbidden"))
	got := check(pkgs, g, layout)
	for _, want := range []string{
		"kernel imports server/wire",                // the kernel reaches outside the standard library
		"server imports plugins",                    // the server reaches the engines
		"sdk/agent imports kernel",                  // the SDK pulls in the kernel
		"cmd/wicket imports internal/testkit",       // the binary imports test support
		"cmd/wicket links testing",                  // ... and so links testing
		"plugins/rego links testing",                // an allowed dependency (OPA's test runner) brings testing
		"newpkg: no row of the layout table covers", // a package without a row
	} {
		if !slices.ContainsFunc(got, func(v string) bool { return strings.HasPrefix(v, want) }) {
			t.Errorf("the check did not report %q; it reported:\n%s", want, strings.Join(got, "\n"))
		}
	}
	// The binary's own check sees the same.
	bin := binaryLinks(g)
	for _, want := range []string{"the wicket binary links internal/testkit", "the wicket binary links testing"} {
		if !slices.Contains(bin, want) {
			t.Errorf("the binary check did not report %q; it reported %q", want, bin)
		}
	}
	// With test support gone, the binary check still sees testing brought
	// by a dependency alone: a cmd/wicket linking only plugins/rego (and
	// through it OPA's test runner).
	rg := g[module+"/plugins/rego"]
	only := graph{}
	for k, v := range g {
		only[k] = v
	}
	only[module+"/cmd/wicket"] = pkg{
		ImportPath: module + "/cmd/wicket",
		Imports:    []string{rg.ImportPath},
		Deps:       append([]string{rg.ImportPath}, rg.Deps...),
	}
	if bin := binaryLinks(only); !slices.Equal(bin, []string{"the wicket binary links testing"}) {
		t.Errorf("the binary check on a binary linking OPA's test runner reported %q, want only that it links testing", bin)
	}
	// The fixture's well-behaved packages pass, and plugins/rego's direct
	// import of OPA is allowed (only what it links is not).
	for _, v := range got {
		if strings.HasPrefix(v, "plugins/rego imports") {
			t.Errorf("reported an allowed import: %s", v)
		}
		for _, ok := range []string{"server/wire ", "plugins ", "internal/testkit "} {
			if strings.HasPrefix(v, ok) {
				t.Errorf("reported a package that keeps the rules: %s", v)
			}
		}
	}
}
