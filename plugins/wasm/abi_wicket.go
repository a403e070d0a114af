package wasm

import (
	"context"
	"fmt"
	"slices"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/wicket-run/wicket/kernel/policy"
)

// Wicket ABI export names (policy-sdk/ABI.md §1).
const (
	exportMemory     = "memory"
	exportAlloc      = "wicket_alloc"
	exportEvaluate   = "wicket_evaluate"
	exportABIVersion = "wicket_abi_version"
	exportStart      = "_start"
	exportInitialize = "_initialize"
)

// wicketABIVersion is the ABI version this host implements.
const wicketABIVersion = 1

type wicketDriver struct {
	cm wazero.CompiledModule
}

// newWicketDriver checks a module against the Wicket ABI: imports only from
// WASI, the required exports with the right signatures, and no _start.
func newWicketDriver(cm wazero.CompiledModule) (*wicketDriver, error) {
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod != wasiModule {
			return nil, fmt.Errorf("wasm: module imports %s.%s, which is not granted", mod, name)
		}
	}
	for _, m := range cm.ImportedMemories() {
		mod, name, _ := m.Import()
		return nil, fmt.Errorf("wasm: module imports memory %s.%s, which is not granted (the module must define and export its memory)", mod, name)
	}
	if len(cm.ExportedMemories()) == 0 || cm.ExportedMemories()[exportMemory] == nil {
		return nil, fmt.Errorf("wasm: module does not export its memory as %q", exportMemory)
	}
	exports := cm.ExportedFunctions()
	if _, ok := exports[exportStart]; ok {
		if _, ok := exports[exportInitialize]; !ok {
			return nil, fmt.Errorf("wasm: module is a WASI command (exports _start): build it as a reactor (Go: go build -buildmode=c-shared)")
		}
	}
	if err := checkSignature(exports, exportAlloc, []api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}); err != nil {
		return nil, err
	}
	if err := checkSignature(exports, exportEvaluate, []api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}); err != nil {
		return nil, err
	}
	if _, ok := exports[exportABIVersion]; ok {
		if err := checkSignature(exports, exportABIVersion, nil, []api.ValueType{api.ValueTypeI32}); err != nil {
			return nil, err
		}
	}
	return &wicketDriver{cm: cm}, nil
}

func checkSignature(exports map[string]api.FunctionDefinition, name string, params, results []api.ValueType) error {
	f, ok := exports[name]
	if !ok {
		return fmt.Errorf("wasm: module does not export %s (see policy-sdk/ABI.md)", name)
	}
	if !slices.Equal(f.ParamTypes(), params) || !slices.Equal(f.ResultTypes(), results) {
		return fmt.Errorf("wasm: export %s has type %s, want %s", name,
			signature(f.ParamTypes(), f.ResultTypes()), signature(params, results))
	}
	return nil
}

func signature(params, results []api.ValueType) string {
	s := "("
	for i, p := range params {
		if i > 0 {
			s += ", "
		}
		s += api.ValueTypeName(p)
	}
	s += ") -> ("
	for i, r := range results {
		if i > 0 {
			s += ", "
		}
		s += api.ValueTypeName(r)
	}
	return s + ")"
}

func (d *wicketDriver) instantiate(ctx context.Context, ev *evaluator, out *outputs) (instance, error) {
	mc := ev.engine.moduleConfig(ev.sb, out.stdout, out.stderr)
	mod, err := ev.rt.r.InstantiateModule(ctx, d.cm, mc)
	if err != nil {
		return nil, err
	}
	inst := &wicketInstance{
		mod:   mod,
		out:   out,
		alloc: mod.ExportedFunction(exportAlloc),
		eval:  mod.ExportedFunction(exportEvaluate),
	}
	if f := mod.ExportedFunction(exportABIVersion); f != nil {
		res, err := f.Call(ctx)
		if err != nil {
			_ = mod.Close(ctx)
			return nil, &callError{fn: exportABIVersion, err: err}
		}
		if v := int32(res[0]); v != wicketABIVersion {
			_ = mod.Close(ctx)
			return nil, fmt.Errorf("module implements Wicket ABI version %d, this host implements %d", v, wicketABIVersion)
		}
	}
	return inst, nil
}

func (d *wicketDriver) close(context.Context) error { return nil }

type wicketInstance struct {
	mod         api.Module
	out         *outputs
	alloc, eval api.Function
}

func (w *wicketInstance) module() api.Module { return w.mod }
func (w *wicketInstance) outputs() *outputs  { return w.out }

func (w *wicketInstance) close(ctx context.Context) error { return w.mod.Close(ctx) }

func (w *wicketInstance) decode(out []byte) (*policy.Answer, error) { return decodeOutput(out) }

func (w *wicketInstance) evaluate(ctx context.Context, input []byte) ([]byte, error) {
	res, err := w.alloc.Call(ctx, uint64(len(input)))
	if err != nil {
		return nil, &callError{fn: exportAlloc, err: err}
	}
	ptr := uint32(res[0])
	if ptr == 0 {
		return nil, fmt.Errorf("wasm: %s(%d) returned 0", exportAlloc, len(input))
	}
	mem := w.mod.Memory()
	if !mem.Write(ptr, input) {
		return nil, fmt.Errorf("wasm: %s(%d) returned out-of-bounds pointer %d (memory is %d bytes)", exportAlloc, len(input), ptr, mem.Size())
	}
	res, err = w.eval.Call(ctx, uint64(ptr), uint64(len(input)))
	if err != nil {
		return nil, &callError{fn: exportEvaluate, err: err}
	}
	outPtr, outLen := uint32(res[0]>>32), uint32(res[0])
	if outLen == 0 {
		return nil, nil
	}
	if outLen > maxOutputBytes {
		return nil, fmt.Errorf("wasm: output too large: %d bytes (limit %d)", outLen, maxOutputBytes)
	}
	b, ok := mem.Read(outPtr, outLen)
	if !ok {
		return nil, fmt.Errorf("wasm: output out of bounds: ptr=%d len=%d memory=%d bytes", outPtr, outLen, mem.Size())
	}
	return append([]byte(nil), b...), nil
}
