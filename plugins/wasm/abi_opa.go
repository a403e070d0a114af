package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// OPA's wasm ABI (https://www.openpolicyagent.org/docs/wasm): the module
// imports its memory and a few functions from "env"; the host resolves "env"
// to a small generated module per instance that defines the memory (capped
// like any other) and re-exports the host functions below.

// opaHostModule is the host module holding the functions OPA modules import.
// Only the generated env modules import from it: a Wicket-ABI module that
// tried would be refused at Compile.
const opaHostModule = "wicket_opa_host"

// opaEnvImports lists the env functions an OPA module may import, in the
// order the generated env module declares them.
var opaEnvImports = []string{"opa_abort", "opa_println", "opa_builtin0", "opa_builtin1", "opa_builtin2", "opa_builtin3", "opa_builtin4"}

// opaAbortError is a call to opa_abort (or to a host builtin this sandbox
// does not provide).
type opaAbortError struct{ msg string }

func (e *opaAbortError) Error() string { return "opa abort: " + e.msg }

// outputsKey carries the calling instance's outputs to the host functions.
type outputsKey struct{}

// instantiateOPAHost instantiates the OPA host functions into r.
func instantiateOPAHost(ctx context.Context, r wazero.Runtime) error {
	b := r.NewHostModuleBuilder(opaHostModule)
	b.NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, addr uint32) {
		panic(&opaAbortError{msg: readCString(m.Memory(), addr, 1024)})
	}).Export("opa_abort")
	b.NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, addr uint32) {
		if out, ok := ctx.Value(outputsKey{}).(*outputs); ok {
			_, _ = out.stdout.Write([]byte(readCString(m.Memory(), addr, maxLogLine) + "\n"))
		}
	}).Export("opa_println")
	for n := 0; n <= 4; n++ {
		params := make([]api.ValueType, n+2) // builtin id, opa ctx, args
		for i := range params {
			params[i] = api.ValueTypeI32
		}
		name := fmt.Sprintf("opa_builtin%d", n)
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, stack []uint64) {
			panic(&opaAbortError{msg: fmt.Sprintf("host builtin %d is not available in the sandbox", uint32(stack[0]))})
		}), params, []api.ValueType{api.ValueTypeI32}).Export(name)
	}
	if _, err := b.Instantiate(ctx); err != nil {
		return fmt.Errorf("wasm: instantiate OPA host functions: %w", err)
	}
	return nil
}

// readCString reads a NUL-terminated string of at most limit bytes at addr.
func readCString(mem api.Memory, addr uint32, limit uint32) string {
	if mem == nil || addr >= mem.Size() {
		return fmt.Sprintf("<invalid string address %d>", addr)
	}
	n := min(mem.Size()-addr, limit)
	b, _ := mem.Read(addr, n)
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

type opaDriver struct {
	cm         wazero.CompiledModule
	envCM      wazero.CompiledModule
	data       []byte
	entrypoint string // normalised: "wicket/decision"; empty means the only one
	legacy     bool   // force the pre-1.2 eval sequence (tests)
}

// newOPADriver checks an OPA module's imports and exports and compiles its
// env module.
func newOPADriver(ctx context.Context, rt *sandboxRuntime, cm wazero.CompiledModule, b *bundle.Bundle) (*opaDriver, error) {
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod != "env" || !slices.Contains(opaEnvImports, name) {
			return nil, fmt.Errorf("wasm: module imports %s.%s, which is not granted", mod, name)
		}
	}
	mems := cm.ImportedMemories()
	if len(mems) != 1 {
		return nil, fmt.Errorf("wasm: OPA module must import one memory (env.memory), imports %d", len(mems))
	}
	if mod, name, _ := mems[0].Import(); mod != "env" || name != "memory" {
		return nil, fmt.Errorf("wasm: module imports memory %s.%s, which is not granted", mod, name)
	}
	exports := cm.ExportedFunctions()
	for _, name := range []string{"opa_malloc", "opa_json_parse", "opa_json_dump", "opa_heap_ptr_get", "opa_heap_ptr_set", "entrypoints", "builtins"} {
		if _, ok := exports[name]; !ok {
			return nil, fmt.Errorf("wasm: OPA module does not export %s", name)
		}
	}
	_, hasEval := exports["opa_eval"]
	if !hasEval {
		for _, name := range []string{"opa_eval_ctx_new", "opa_eval_ctx_set_input", "opa_eval_ctx_set_data", "opa_eval_ctx_set_entrypoint", "opa_eval_ctx_get_result", "eval"} {
			if _, ok := exports[name]; !ok {
				return nil, fmt.Errorf("wasm: OPA module exports neither opa_eval nor %s", name)
			}
		}
	}

	limits := memLimits{min: mems[0].Min(), max: rt.pages, hasMax: true}
	if max, ok := mems[0].Max(); ok && max < limits.max {
		limits.max = max
	}
	if limits.min > limits.max {
		return nil, fmt.Errorf("wasm: module needs %d pages of memory, over the limit of %s", limits.min, pagesString(rt.pages))
	}
	envCM, err := rt.r.CompileModule(ctx, opaEnvModule(limits))
	if err != nil {
		return nil, fmt.Errorf("wasm: compile OPA env module: %w", err)
	}
	data := []byte(b.Data)
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	return &opaDriver{cm: cm, envCM: envCM, data: data, entrypoint: normaliseEntrypoint(b.Manifest.Entrypoint), legacy: !hasEval}, nil
}

// normaliseEntrypoint maps data.wicket.decision and wicket.decision to
// OPA's entrypoint name wicket/decision.
func normaliseEntrypoint(s string) string {
	s = strings.TrimPrefix(strings.TrimSpace(s), "data.")
	return strings.ReplaceAll(s, ".", "/")
}

// opaEnvModule encodes the module that stands in for OPA's "env": one
// memory with the given limits and the OPA host functions, re-exported.
func opaEnvModule(l memLimits) []byte {
	m := &wasmModule{memory: &l}
	m.types = append(m.types, funcType{params: []byte{valI32}}) // opa_abort, opa_println
	for n := 0; n <= 4; n++ {
		m.types = append(m.types, funcType{params: bytes.Repeat([]byte{valI32}, n+2), results: []byte{valI32}})
	}
	for i, name := range opaEnvImports {
		typ := uint32(0)
		if i >= 2 {
			typ = uint32(i - 1)
		}
		m.imports = append(m.imports, wasmImport{module: opaHostModule, name: name, kind: externFunc, typeIndex: typ})
		m.exports = append(m.exports, wasmExport{name: name, kind: externFunc, index: uint32(i)})
	}
	m.exports = append(m.exports, wasmExport{name: "memory", kind: externMemory, index: 0})
	return m.encode()
}

func (d *opaDriver) close(ctx context.Context) error { return d.envCM.Close(ctx) }

func (d *opaDriver) instantiate(ctx context.Context, ev *evaluator, out *outputs) (instance, error) {
	env, err := ev.rt.r.InstantiateModule(ctx, d.envCM, wazero.NewModuleConfig().WithName("").WithStartFunctions())
	if err != nil {
		return nil, fmt.Errorf("env module: %w", err)
	}
	rctx := experimental.WithImportResolver(ctx, func(name string) api.Module {
		if name == "env" {
			return env
		}
		return nil
	})
	mod, err := ev.rt.r.InstantiateModule(rctx, d.cm, ev.engine.moduleConfig(ev.sb, out.stdout, out.stderr))
	if err != nil {
		_ = env.Close(ctx)
		return nil, err
	}
	inst := &opaInstance{mod: mod, env: env, out: out, legacy: d.legacy}
	if err := inst.init(context.WithValue(ctx, outputsKey{}, out), d); err != nil {
		_ = inst.close(ctx)
		return nil, err
	}
	return inst, nil
}

type opaInstance struct {
	mod, env api.Module
	out      *outputs
	legacy   bool

	entrypoint int32
	dataAddr   uint32
	baseHeap   uint32
}

func (o *opaInstance) module() api.Module { return o.mod }
func (o *opaInstance) outputs() *outputs  { return o.out }

func (o *opaInstance) close(ctx context.Context) error {
	return errors.Join(o.mod.Close(ctx), o.env.Close(ctx))
}

// call calls an export and returns its first result (0 if none).
func (o *opaInstance) call(ctx context.Context, name string, args ...uint64) (uint32, error) {
	f := o.mod.ExportedFunction(name)
	if f == nil {
		return 0, fmt.Errorf("OPA module does not export %s", name)
	}
	res, err := f.Call(ctx, args...)
	if err != nil {
		return 0, &callError{fn: name, err: err}
	}
	if len(res) == 0 {
		return 0, nil
	}
	return uint32(res[0]), nil
}

// dump serialises an OPA value to JSON with opa_json_dump.
func (o *opaInstance) dump(ctx context.Context, value uint32) ([]byte, error) {
	addr, err := o.call(ctx, "opa_json_dump", uint64(value))
	if err != nil {
		return nil, err
	}
	return o.cString(addr)
}

// cString reads a NUL-terminated string the module produced.
func (o *opaInstance) cString(addr uint32) ([]byte, error) {
	mem := o.mod.Memory()
	if addr == 0 || addr >= mem.Size() {
		return nil, fmt.Errorf("wasm: OPA result address %d out of bounds (memory is %d bytes)", addr, mem.Size())
	}
	b, _ := mem.Read(addr, min(mem.Size()-addr, maxOutputBytes+1))
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return nil, fmt.Errorf("wasm: OPA result at %d is not NUL-terminated within %d bytes", addr, len(b))
	}
	return append([]byte(nil), b[:i]...), nil
}

// parse copies JSON into the module's heap and parses it into an OPA value.
func (o *opaInstance) parse(ctx context.Context, doc []byte, what string) (uint32, error) {
	addr, err := o.call(ctx, "opa_malloc", uint64(len(doc)))
	if err != nil {
		return 0, err
	}
	if !o.mod.Memory().Write(addr, doc) {
		return 0, fmt.Errorf("opa_malloc(%d) returned out-of-bounds address %d", len(doc), addr)
	}
	v, err := o.call(ctx, "opa_json_parse", uint64(addr), uint64(len(doc)))
	if err != nil {
		return 0, err
	}
	if v == 0 {
		return 0, fmt.Errorf("OPA could not parse %s", what)
	}
	return v, nil
}

// init checks the ABI version, refuses host builtins, resolves the
// entrypoint, loads data.json and records where the heap starts.
func (o *opaInstance) init(ctx context.Context, d *opaDriver) error {
	if g := o.mod.ExportedGlobal("opa_wasm_abi_version"); g != nil {
		if v := int32(g.Get()); v != 1 {
			return fmt.Errorf("OPA wasm ABI version %d is not supported (want 1)", v)
		}
	}
	v, err := o.call(ctx, "builtins")
	if err != nil {
		return err
	}
	raw, err := o.dump(ctx, v)
	if err != nil {
		return err
	}
	var builtins map[string]int32
	if err := json.Unmarshal(raw, &builtins); err != nil {
		return fmt.Errorf("OPA builtins list: %w", err)
	}
	if len(builtins) > 0 {
		names := make([]string, 0, len(builtins))
		for n := range builtins {
			names = append(names, n)
		}
		slices.Sort(names)
		return fmt.Errorf("policy needs host builtins %s, which the sandbox does not provide", strings.Join(names, ", "))
	}

	if v, err = o.call(ctx, "entrypoints"); err != nil {
		return err
	}
	if raw, err = o.dump(ctx, v); err != nil {
		return err
	}
	var eps map[string]int32
	if err := json.Unmarshal(raw, &eps); err != nil {
		return fmt.Errorf("OPA entrypoints list: %w", err)
	}
	names := make([]string, 0, len(eps))
	for n := range eps {
		names = append(names, n)
	}
	slices.Sort(names)
	switch id, ok := eps[d.entrypoint]; {
	case ok:
		o.entrypoint = id
	case d.entrypoint == "" && len(eps) == 1:
		o.entrypoint = eps[names[0]]
	case d.entrypoint == "":
		return fmt.Errorf("manifest names no entrypoint and the module has %d: %s", len(eps), strings.Join(names, ", "))
	default:
		return fmt.Errorf("entrypoint %q not in module (has %s)", d.entrypoint, strings.Join(names, ", "))
	}

	if o.dataAddr, err = o.parse(ctx, d.data, "data.json"); err != nil {
		return err
	}
	if o.baseHeap, err = o.call(ctx, "opa_heap_ptr_get"); err != nil {
		return err
	}
	return nil
}

func (o *opaInstance) evaluate(ctx context.Context, input []byte) ([]byte, error) {
	ctx = context.WithValue(ctx, outputsKey{}, o.out)
	var (
		raw []byte
		err error
	)
	if o.legacy {
		raw, err = o.evalLegacy(ctx, input)
	} else {
		raw, err = o.evalFast(ctx, input)
	}
	if err != nil {
		return nil, err
	}
	var results []struct {
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(raw, &results); err != nil {
		return nil, fmt.Errorf("wasm: OPA result set is not valid: %w", err)
	}
	switch len(results) {
	case 0:
		return nil, nil // undefined
	case 1:
		return results[0].Result, nil
	default:
		return nil, fmt.Errorf("wasm: OPA entrypoint produced %d results, want at most 1", len(results))
	}
}

// evalFast uses opa_eval (ABI 1.2+): input is written at the heap base and
// the evaluation's heap starts right after it, so each call starts afresh.
func (o *opaInstance) evalFast(ctx context.Context, input []byte) ([]byte, error) {
	mem := o.mod.Memory()
	end := uint64(o.baseHeap) + uint64(len(input))
	if end > uint64(mem.Size()) {
		pages := uint32((end - uint64(mem.Size()) + 65535) / 65536)
		if _, ok := mem.Grow(pages); !ok {
			return nil, fmt.Errorf("wasm: memory limit exhausted: cannot grow memory by %d pages for a %d-byte input", pages, len(input))
		}
	}
	if !mem.Write(o.baseHeap, input) {
		return nil, fmt.Errorf("wasm: cannot write input at %d", o.baseHeap)
	}
	addr, err := o.call(ctx, "opa_eval", 0, uint64(o.entrypoint), uint64(o.dataAddr),
		uint64(o.baseHeap), uint64(len(input)), end, 0)
	if err != nil {
		return nil, err
	}
	return o.cString(addr)
}

// evalLegacy uses the opa_eval_ctx_* sequence of ABI 1.0 and 1.1.
func (o *opaInstance) evalLegacy(ctx context.Context, input []byte) ([]byte, error) {
	if _, err := o.call(ctx, "opa_heap_ptr_set", uint64(o.baseHeap)); err != nil {
		return nil, err
	}
	in, err := o.parse(ctx, input, "the input")
	if err != nil {
		return nil, err
	}
	ectx, err := o.call(ctx, "opa_eval_ctx_new")
	if err != nil {
		return nil, err
	}
	for _, c := range []struct {
		fn  string
		arg uint32
	}{{"opa_eval_ctx_set_input", in}, {"opa_eval_ctx_set_data", o.dataAddr}, {"opa_eval_ctx_set_entrypoint", uint32(o.entrypoint)}} {
		if _, err := o.call(ctx, c.fn, uint64(ectx), uint64(c.arg)); err != nil {
			return nil, err
		}
	}
	errno, err := o.call(ctx, "eval", uint64(ectx))
	if err != nil {
		return nil, err
	}
	if errno != 0 {
		return nil, fmt.Errorf("wasm: OPA eval failed with error code %d", errno)
	}
	res, err := o.call(ctx, "opa_eval_ctx_get_result", uint64(ectx))
	if err != nil {
		return nil, err
	}
	return o.dump(ctx, res)
}
