package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	opabundle "github.com/open-policy-agent/opa/v1/bundle"
	opacompile "github.com/open-policy-agent/opa/v1/compile"
	opa "github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/wasm"
)

// opaAuthzDir is an OPA bundle as policy authors keep it: several
// packages, data at nested paths (agents/data.json, tools/data.yaml), a
// .manifest with revision, roots and metadata, and no bundle.yaml.
const opaAuthzDir = "../plugins/bundle/testdata/opa-authz"

// opaWriterArchive packs dir the way `opa build` does: OPA's own reader
// and bundle writer (data merged into /data.json, entries named "/...").
func opaWriterArchive(t testing.TB, dir string) ([]byte, opabundle.Bundle) {
	t.Helper()
	b, err := opabundle.NewCustomReader(opabundle.NewDirectoryLoader(dir)).Read()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := opabundle.NewWriter(&buf).UseModulePath(true).Write(b); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), b
}

// opaBuild is `cd parent && opa build -b base`: OPA's compiler with its
// default target (entries are named "/base/...", data merged into
// /data.json).
func opaBuild(t *testing.T, dir string) []byte {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Dir(abs))
	var buf bytes.Buffer
	if err := opacompile.New().WithPaths(filepath.Base(abs)).WithAsBundle(true).WithOutput(&buf).Build(context.Background()); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// opaDirArchive packs dir file by file with OPA's leading-slash entry
// names, so the nested data files stay nested in the archive.
func opaDirArchive(t testing.TB, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		c, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if err := tw.WriteHeader(&tar.Header{Name: "/" + filepath.ToSlash(rel), Mode: 0o644, Size: int64(len(c)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err = tw.Write(c)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// topdown evaluates data.wicket.decision with OPA itself.
type topdown struct{ pq opa.PreparedEvalQuery }

func newTopdown(t testing.TB, b opabundle.Bundle) *topdown {
	t.Helper()
	opts := []func(*opa.Rego){opa.Query("data.wicket.decision"), opa.Store(inmem.NewFromObject(b.Data)), opa.SetRegoVersion(ast.RegoV1)}
	for _, m := range b.Modules {
		opts = append(opts, opa.ParsedModule(m.Parsed))
	}
	pq, err := opa.New(opts...).PrepareForEval(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &topdown{pq: pq}
}

func (td *topdown) decide(t testing.TB, input any) (decision, ruleID string) {
	t.Helper()
	raw, _ := json.Marshal(input)
	var in any
	_ = json.Unmarshal(raw, &in)
	rs, err := td.pq.Eval(context.Background(), opa.EvalInput(in))
	if err != nil || len(rs) != 1 {
		t.Fatalf("topdown: %v, %d results", err, len(rs))
	}
	m := rs[0].Expressions[0].Value.(map[string]any)
	rid, _ := m["rule_id"].(string)
	return m["decision"].(string), rid
}

type opaStep struct {
	target string
	args   map[string]any
}

// TestOPABundleDecidesAsOPA puts an OPA bundle, unmodified, through PUT
// /v0/bundles (as OPA's writer packs it and as a file-by-file tarball with
// nested data files), drives real agents through it, and checks every
// decision against OPA's topdown on the same modules and data.
func TestOPABundleDecidesAsOPA(t *testing.T) {
	written, ob := opaWriterArchive(t, opaAuthzDir)
	td := newTopdown(t, ob)
	archives := map[string][]byte{"opa writer": written, "nested data files": opaDirArchive(t, opaAuthzDir)}
	archives["opa build"] = opaBuild(t, opaAuthzDir) // last: it changes directory
	steps := []opaStep{
		{"fs.read", map[string]any{"path": "/tmp/x"}},
		{"shell.exec", map[string]any{"command": "ls -l"}},
		{"shell.exec", map[string]any{"command": "rm -rf /"}},
		{"shell.exec", map[string]any{"command": "mkfs /dev/sda"}},
		{"fs.write", map[string]any{"path": "/etc/passwd"}},
		{"http.get", map[string]any{"url": "http://127.0.0.1/"}},
	}
	agents := []string{"researcher", "writer", "stranger"}
	for name, archive := range archives {
		t.Run(name, func(t *testing.T) {
			got := decideThroughKernel(t, rego.New(), archive, td, "2026-12-01.1", agents, steps)
			// The nested data decided something: an allow and both denies occur.
			if d := got["researcher"][0]; d.RuleID != "listed" {
				t.Errorf("researcher fs.read: %+v, want listed (data from agents/data.json)", d)
			}
			if d := got["researcher"][2]; d.RuleID != "dangerous" {
				t.Errorf("researcher rm -rf: %+v, want dangerous (data from tools/data.yaml)", d)
			}
		})
	}
}

// decideThroughKernel puts archive as bundle authz into a kernel running
// engine, drives one agent per id through steps, and checks every decision
// (proceed/denied and rule_id) against OPA's topdown.
func decideThroughKernel(t *testing.T, eng plugins.Engine, archive []byte, td *topdown, wantRev string, agents []string, steps []opaStep) map[string][]kernel.StepDecision {
	t.Helper()
	env := testkit.Start(t, testkit.Options{Config: fast(), Engines: []plugins.Engine{eng}})
	var rec kernel.BundleRecord
	if _, err := testkit.BearerWithHeaders(env.URL, testkit.AdminKey, "PUT", "/v0/bundles/authz", map[string]string{"Content-Type": "application/gzip"}, archive, &rec); err != nil {
		t.Fatalf("PUT the OPA bundle: %v", err)
	}
	if rec.Name != "authz" || rec.Revision != wantRev || rec.Engine != eng.Name() {
		t.Fatalf("bundle record %+v", rec)
	}
	var mu sync.Mutex
	got := map[string][]kernel.StepDecision{}
	for _, id := range agents {
		a := testkit.NewAgent(id, secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
			for _, s := range steps {
				_, err := r.Step(ctx, "tool_call", s.target, s.args, testkit.StepOpts{}, func() (any, error) { return "ok", nil })
				var de *testkit.DecisionError
				if err != nil && !errors.As(err, &de) {
					return nil, err
				}
			}
			mu.Lock()
			got[id] = append([]kernel.StepDecision(nil), r.Decisions...)
			mu.Unlock()
			return "done", nil
		})
		env.RegisterAgent(a, "authz")
		t.Cleanup(a.Close)
		exec := env.CreateExecution(id, map[string]any{})
		if e := env.WaitTerminal(exec, 20*time.Second); e.Status != kernel.ExecCompleted {
			t.Fatalf("%s: execution %s", id, e.Status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range agents {
		if len(got[id]) != len(steps) {
			t.Fatalf("%s: %d decisions, want %d", id, len(got[id]), len(steps))
		}
		for i, s := range steps {
			wantDec, wantRule := td.decide(t, map[string]any{"agent_id": id, "step": map[string]any{"kind": "tool_call", "target": s.target, "args": s.args}})
			want := map[string]kernel.Decision{"allow": kernel.DecisionProceed, "deny": kernel.DecisionDenied}[wantDec]
			if d := got[id][i]; d.Decision != want || d.RuleID != wantRule {
				t.Errorf("%s %s %v: wicket %s/%s, OPA %s/%s", id, s.target, s.args, d.Decision, d.RuleID, wantDec, wantRule)
			}
		}
	}
	return got
}

// TestOPAWasmBundleDecidesAsOPA: a bundle built by OPA's compiler with
// `-t wasm -e wicket/decision` (policy.wasm, /data.json, .manifest with the
// wasm entrypoint and roots; no bundle.yaml) runs on the wasm engine with
// the OPA ABI, unmodified, and decides as topdown does.
func TestOPAWasmBundleDecidesAsOPA(t *testing.T) {
	steps := []opaStep{
		{"fs.read", map[string]any{}},
		{"fs.write", map[string]any{}},
		{"shell.exec", map[string]any{"command": "rm -rf /"}},
		{"shell.exec", map[string]any{"command": "ls"}},
	}
	for _, tc := range []struct{ dir, rev string }{
		{"../plugins/bundle/testdata/opa-wasm-authz", "w1"},
		{opaAuthzDir, "2026-12-01.1"}, // sprintf and regex.match: host builtins
	} {
		t.Run(filepath.Base(tc.dir), func(t *testing.T) {
			_, ob := opaWriterArchive(t, tc.dir)
			td := newTopdown(t, ob)
			abs, err := filepath.Abs(tc.dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Chdir(filepath.Dir(abs))
			var buf bytes.Buffer
			c := opacompile.New().WithTarget(opacompile.TargetWasm).WithEntrypoints("wicket/decision").WithPaths(filepath.Base(abs)).WithAsBundle(true).WithOutput(&buf)
			if err := c.Build(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := decideThroughKernel(t, wasm.New(wasm.Config{CacheDir: wasmCache, Builtins: rego.NewHostBuiltins()}), buf.Bytes(), td, tc.rev, []string{"researcher", "writer", "stranger"}, steps)
			if d := got["researcher"][0]; d.RuleID != "listed" {
				t.Errorf("researcher fs.read: %+v, want listed (data from agents/data.json)", d)
			}
		})
	}
}

// TestOPABundleSurvivesRestart: a stored bundle without bundle.yaml is
// named by its record at boot and loads again.
func TestOPABundleSurvivesRestart(t *testing.T) {
	opts := testkit.Options{Dir: t.TempDir(), Config: fast(), Engines: []plugins.Engine{rego.New()}}
	env := testkit.Start(t, opts)
	if _, err := testkit.BearerWithHeaders(env.URL, testkit.AdminKey, "PUT", "/v0/bundles/authz", map[string]string{"Content-Type": "application/gzip"}, opaDirArchive(t, opaAuthzDir), nil); err != nil {
		t.Fatal(err)
	}
	env.Close()
	env2 := testkit.Start(t, opts)
	if ref, ok := env2.Host.Live("default", "authz"); !ok || ref.Revision != "2026-12-01.1" {
		t.Fatalf("after restart: %+v %v", ref, ok)
	}
}
