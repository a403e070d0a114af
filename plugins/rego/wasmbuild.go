package rego

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	opabundle "github.com/open-policy-agent/opa/v1/bundle"
	opacompile "github.com/open-policy-agent/opa/v1/compile"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// BuildWasm compiles the Rego of b to an OPA wasm module with OPA's own
// compiler (github.com/open-policy-agent/opa/v1/compile), as
// `opa build -t wasm -e ENTRYPOINT` does, under the engine's capabilities
// (a forbidden builtin is refused here too), and returns b in the wasm
// engine's form: the same files and data plus policy.wasm, engine wasm with
// abi opa, the entrypoint as OPA names it (wicket/decision), and the same
// default action, rate limits and sandbox. Test files (tests/,
// *_test.rego) are left out of the build.
//
// `wicket policy test --target wasm|both` runs a Rego bundle's cases through
// this build to show where the two engines disagree.
func (e *Engine) BuildWasm(ctx context.Context, b *bundle.Bundle) (*bundle.Bundle, error) {
	if b == nil {
		return nil, errors.New("rego: build wasm: nil bundle")
	}
	if eng := b.Manifest.Engine; eng != bundle.EngineRego {
		return nil, fmt.Errorf("rego: build wasm of bundle %q: engine is %q, not %q", b.Manifest.Name, eng, bundle.EngineRego)
	}
	wasm, entry, err := e.buildWasm(ctx, b)
	if err != nil {
		return nil, fmt.Errorf("rego: build wasm of bundle %q rev %s: %w", b.Manifest.Name, b.Manifest.Revision, err)
	}
	out := *b
	out.Files = maps.Clone(b.Files)
	out.Files[bundle.WasmFile] = wasm
	out.Manifest.Engine = bundle.EngineWasm
	out.Manifest.ABI = bundle.ABIOPA
	out.Manifest.Entrypoint = entry
	out.Digest = bundle.Digest(out.Files)
	return &out, nil
}

func (e *Engine) buildWasm(ctx context.Context, b *bundle.Bundle) ([]byte, string, error) {
	_, ref, err := parseEntrypoint(b.Manifest.Entrypoint)
	if err != nil {
		return nil, "", err
	}
	parts := make([]string, 0, len(ref)-1)
	for _, t := range ref[1:] {
		parts = append(parts, string(t.Value.(ast.String)))
	}
	entry := strings.Join(parts, "/")

	var names []string
	for name := range b.Files {
		if path.Ext(name) == ".rego" && !strings.HasPrefix(name, bundle.TestsDir) && !IsRegoTestFile(name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	ob := &opabundle.Bundle{}
	ob.SetRegoVersion(ast.RegoV1)
	ob.Manifest.Init()
	var errs ast.Errors
	for _, name := range names {
		opts := ast.ParserOptions{RegoVersion: b.RegoVersion(name), Capabilities: e.caps, ProcessAnnotation: true}
		m, err := ast.ParseModuleWithOpts(name, string(b.Files[name]), opts)
		if err != nil {
			var ae ast.Errors
			if errors.As(err, &ae) {
				errs = append(errs, ae...)
				continue
			}
			return nil, "", fmt.Errorf("%s: %w", name, err)
		}
		ob.Modules = append(ob.Modules, opabundle.ModuleFile{URL: name, Path: name, Raw: b.Files[name], Parsed: m})
	}
	if len(errs) > 0 {
		return nil, "", e.astErrors(errs)
	}
	c := opacompile.New().
		WithTarget(opacompile.TargetWasm).
		WithEntrypoints(entry).
		WithBundle(ob).
		WithCapabilities(e.caps).
		WithRegoVersion(ast.RegoV1)
	if err := c.Build(ctx); err != nil {
		var ae ast.Errors
		if errors.As(err, &ae) {
			return nil, "", e.astErrors(ae)
		}
		return nil, "", err
	}
	built := c.Bundle()
	if len(built.WasmModules) != 1 {
		return nil, "", fmt.Errorf("OPA's compiler wrote %d wasm modules, want 1", len(built.WasmModules))
	}
	return built.WasmModules[0].Raw, entry, nil
}
