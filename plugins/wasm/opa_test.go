package wasm

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	opacompile "github.com/open-policy-agent/opa/v1/compile"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// The OPA library is used here, in test code only, to build policy.wasm
// from Rego the way `opa build -t wasm` does.

const opaPolicy = `package wicket

decision := {"decision": "deny", "reason": "destructive steps are not allowed", "rule_id": "no-destructive"} if {
	input.step.effect == "destructive"
}

decision := {"decision": "allow", "reason": "trusted agent", "rule_id": "trusted"} if {
	input.step.effect != "destructive"
	input.agent_id in data.trusted_agents
}

decision := null if input.step.target == "explicit.null"

bad := {"decision": "maybe"}

conflict = 1 if input.step.target == "conflict"

conflict = 2 if input.step.target == "conflict"
`

const opaBuiltinPolicy = `package wicket

decision := {"decision": "allow", "reason": r.body} if {
	r := http.send({"method": "GET", "url": "http://example.invalid/"})
}
`

var opaBuilt struct {
	once    sync.Once
	policy  []byte
	builtin []byte
	err     error
}

// buildRego compiles Rego source to an OPA wasm module with the given entrypoints.
func buildRego(src string, entrypoints ...string) ([]byte, error) {
	return buildRegoWith(src, false, entrypoints...)
}

// buildRegoWith is buildRego, optionally keeping print statements.
func buildRegoWith(src string, prints bool, entrypoints ...string) ([]byte, error) {
	return buildRegoVersion(src, prints, ast.RegoV1, entrypoints...)
}

// buildRegoVersion is buildRegoWith for Rego of the given version.
func buildRegoVersion(src string, prints bool, version ast.RegoVersion, entrypoints ...string) ([]byte, error) {
	dir, err := os.MkdirTemp(shared.dir, "rego-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.rego"), []byte(src), 0o600); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	c := opacompile.New().WithTarget(opacompile.TargetWasm).WithEntrypoints(entrypoints...).WithPaths(dir).WithOutput(&out).WithEnablePrintStatements(prints).WithRegoVersion(version)
	if err := c.Build(context.Background()); err != nil {
		return nil, err
	}
	gz, err := gzip.NewReader(&out)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, errors.New("no policy.wasm in OPA's bundle")
		}
		if strings.TrimPrefix(h.Name, "/") == "policy.wasm" {
			return io.ReadAll(tr)
		}
	}
}

func opaModules(tb testing.TB) (policyWasm, builtinWasm []byte) {
	tb.Helper()
	opaBuilt.once.Do(func() {
		opaBuilt.policy, opaBuilt.err = buildRego(opaPolicy, "wicket/decision", "wicket/bad", "wicket/conflict")
		if opaBuilt.err == nil {
			opaBuilt.builtin, opaBuilt.err = buildRego(opaBuiltinPolicy, "wicket/decision")
		}
	})
	if opaBuilt.err != nil {
		tb.Fatalf("build Rego to wasm: %v", opaBuilt.err)
	}
	return opaBuilt.policy, opaBuilt.builtin
}

func opaBundle(wasm []byte, entrypoint string, data string) *bundle.Bundle {
	b := newBundle("opa", wasm, relaxed)
	b.Manifest.ABI = bundle.ABIOPA
	b.Manifest.Entrypoint = entrypoint
	if data != "" {
		b.Data = json.RawMessage(data)
		b.Files["data.json"] = []byte(data)
	}
	return b
}

const trusted = `{"trusted_agents": ["support-bot"]}`

func TestOPAABI(t *testing.T) {
	mod, _ := opaModules(t)
	e := newEngine(t, Config{})
	for _, ep := range []string{"data.wicket.decision", "wicket.decision", "wicket/decision"} {
		t.Run(ep, func(t *testing.T) {
			ev := compile(t, e, opaBundle(mod, ep, trusted))
			wantDecision(t, ev, input("tool_call", "fs.delete", "destructive", nil), policy.Deny, "no-destructive")
			wantDecision(t, ev, input("tool_call", "fs.read", "read_only", nil), policy.Allow, "trusted")
			other := input("tool_call", "fs.read", "read_only", nil)
			other.AgentID = "stranger"
			wantDecision(t, ev, other, "", "") // undefined
			null := input("tool_call", "explicit.null", "", nil)
			null.AgentID = "stranger"
			wantDecision(t, ev, null, "", "") // null
		})
	}
	t.Run("no data", func(t *testing.T) {
		ev := compile(t, e, opaBundle(mod, "wicket/decision", ""))
		wantDecision(t, ev, input("tool_call", "fs.read", "read_only", nil), "", "")
	})
	t.Run("invalid decision", func(t *testing.T) {
		ev := compile(t, e, opaBundle(mod, "wicket/bad", ""))
		wantError(t, ev, smallInput(), `wasm: invalid decision: unknown decision "maybe"`)
	})
	t.Run("not a decision", func(t *testing.T) {
		ev := compile(t, e, opaBundle(mod, "wicket/conflict", ""))
		wantDecision(t, ev, smallInput(), "", "")
		err := wantError(t, ev, input("tool_call", "conflict", "", nil), "wasm: ")
		t.Logf("conflicting rule values: %v", err)
		wantDecision(t, ev, smallInput(), "", "")
	})
	t.Run("many evaluations reuse the heap", func(t *testing.T) {
		ev := compile(t, e, opaBundle(mod, "wicket/decision", trusted))
		big := input("tool_call", "fs.read", "read_only", map[string]any{"pad": strings.Repeat("y", 100_000)})
		for range 50 {
			wantDecision(t, ev, big, policy.Allow, "trusted")
		}
		if n := ev.instances.Load(); n != 1 {
			t.Errorf("instances = %d, want 1", n)
		}
	})
}

func TestOPAABIRefuses(t *testing.T) {
	mod, builtin := opaModules(t)
	e := newEngine(t, Config{})
	for _, c := range []struct {
		name string
		b    *bundle.Bundle
		want string
	}{
		{"host builtins", opaBundle(builtin, "wicket/decision", ""), "wasm: instantiate: builtin http.send is not allowed in wicket policies: it reaches the network"},
		{"unknown entrypoint", opaBundle(mod, "wicket/nope", ""), `wasm: instantiate: entrypoint "wicket/nope" not in module (has wicket/bad, wicket/conflict, wicket/decision)`},
		{"ambiguous entrypoint", opaBundle(mod, "", ""), "wasm: instantiate: manifest names no entrypoint and the module has 3"},
		{"bad data", opaBundle(mod, "wicket/decision", `{"trusted_agents": [`), "wasm: instantiate: OPA could not parse data.json"},
		{"wicket module as opa", opaBundle(cPolicy(t), "x", ""), "wasm: OPA module must import one memory (env.memory), imports 0"},
		{"memory cap below module minimum", func() *bundle.Bundle {
			b := opaBundle(mod, "wicket/decision", "")
			b.Manifest.Sandbox.MemoryPages = 1
			return b
		}(), "min 2 pages (128 Ki) over limit of 1 pages"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev, err := e.Compile(context.Background(), c.b)
			if err == nil {
				_ = ev.Close()
				t.Fatalf("compiled, want error containing %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
		})
	}
	// An OPA-ABI module given to the Wicket ABI is refused on its imports.
	b := newBundle("opa-as-wicket", mod, bundle.Sandbox{})
	if _, err := e.Compile(context.Background(), b); err == nil || !strings.Contains(err.Error(), "wasm: module imports env.opa_") {
		t.Fatalf("OPA module under the Wicket ABI: %v", err)
	}
}
