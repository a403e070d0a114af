package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/wicket-run/wicket/kernel/policy"
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

// instanceKey carries the evaluating instance to the host functions.
type instanceKey struct{}

// callingInstance returns the instance whose call reached a host function.
func callingInstance(ctx context.Context) *opaInstance {
	inst, _ := ctx.Value(instanceKey{}).(*opaInstance)
	return inst
}

// instantiateOPAHost instantiates the OPA host functions into r.
func instantiateOPAHost(ctx context.Context, r wazero.Runtime) error {
	b := r.NewHostModuleBuilder(opaHostModule)
	b.NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, addr uint32) {
		panic(&opaAbortError{msg: readCString(m.Memory(), addr, 1024)})
	}).Export("opa_abort")
	b.NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, addr uint32) {
		if inst := callingInstance(ctx); inst != nil {
			_, _ = inst.out.stdout.Write([]byte(readCString(m.Memory(), addr, maxLogLine) + "\n"))
		}
	}).Export("opa_println")
	for n := 0; n <= 4; n++ {
		params := make([]api.ValueType, n+2) // builtin id, opa ctx, args
		for i := range params {
			params[i] = api.ValueTypeI32
		}
		name := fmt.Sprintf("opa_builtin%d", n)
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, stack []uint64) {
			if n == 0 && uint32(stack[0]) == fuelCheckID {
				checkDeadline(ctx)
				stack[0] = 0
				return
			}
			inst := callingInstance(ctx)
			if inst == nil {
				panic(&opaAbortError{msg: fmt.Sprintf("host builtin %d called outside an evaluation", uint32(stack[0]))})
			}
			stack[0] = uint64(inst.callBuiltin(ctx, uint32(stack[0]), stack[2:2+n]))
		}), params, []api.ValueType{api.ValueTypeI32}).Export(name)
	}
	if _, err := b.Instantiate(ctx); err != nil {
		return fmt.Errorf("wasm: instantiate OPA host functions: %w", err)
	}
	return nil
}

// checkDeadline stops the module (a panic wazero returns as the call's
// error) when ctx has passed its deadline or is cancelled. Fuel-instrumented
// modules call it every fuelPerCheck loop iterations and calls. It reads
// the clock rather than waiting for ctx's timer, which needs a free
// processor to fire.
func checkDeadline(ctx context.Context) {
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		panic(sys.NewExitError(sys.ExitCodeDeadlineExceeded))
	}
	if err := ctx.Err(); err != nil {
		code := sys.ExitCodeContextCanceled
		if errors.Is(err, context.DeadlineExceeded) {
			code = sys.ExitCodeDeadlineExceeded
		}
		panic(sys.NewExitError(code))
	}
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
	pages      uint32 // the memory cap
	builtins   HostBuiltins
	grants     []string
}

// newOPADriver checks an OPA module's imports and exports and compiles its
// env module.
func newOPADriver(ctx context.Context, rt *sandboxRuntime, cm wazero.CompiledModule, b *bundle.Bundle, hb HostBuiltins, sb *sandbox) (*opaDriver, error) {
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
	for _, name := range []string{"opa_eval_ctx_new", "opa_eval_ctx_set_input", "opa_eval_ctx_set_data", "opa_eval_ctx_set_entrypoint", "opa_eval_ctx_get_result", "eval"} {
		if _, ok := exports[name]; !ok {
			return nil, fmt.Errorf("wasm: OPA module does not export %s", name)
		}
	}

	limits := memLimits{min: mems[0].Min(), max: rt.pages, hasMax: true}
	if max, ok := mems[0].Max(); ok && max < limits.max {
		limits.max = max
	}
	// OPA's compiler computes the minimum before it adds the policy's
	// strings to the data section: make room for all of it.
	if end, err := dataEnd(b.Files[PolicyFile]); err == nil {
		limits.min = max(limits.min, uint32((end+65535)/65536))
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
	grants := make([]string, 0, len(sb.grants))
	for g := range sb.grants {
		grants = append(grants, g)
	}
	slices.Sort(grants)
	return &opaDriver{
		cm: cm, envCM: envCM, data: data,
		entrypoint: normaliseEntrypoint(b.Manifest.Entrypoint),
		pages:      limits.max,
		builtins:   hb,
		grants:     grants,
	}, nil
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
	inst := &opaInstance{mod: mod, env: env, mem: mod.Memory(), out: out, hb: d.builtins}
	if err := inst.init(context.WithValue(ctx, instanceKey{}, inst), d); err != nil {
		_ = inst.close(ctx)
		return nil, err
	}
	return inst, nil
}

// opaFuncs are the exports an instance calls, looked up once: wazero
// builds a new call engine for every ExportedFunction call.
type opaFuncs struct {
	malloc, jsonParse, jsonDump, valueDump, valueParse, heapPtrGet, heapPtrSet api.Function
	eval                                                                       api.Function // opa_eval (ABI 1.2+)
	ctxNew, ctxSetInput, ctxSetData, ctxSetEntrypoint, ctxGetResult, evalCtx   api.Function // ABI 1.0, 1.1
}

type opaInstance struct {
	mod, env api.Module
	mem      api.Memory
	out      *outputs
	fn       opaFuncs

	// hb resolves host builtins; builtins holds them by the module's ids.
	hb       HostBuiltins
	builtins []opaBuiltin

	entrypoint int32
	entry      string // the entrypoint as a reference: data.wicket.decision
	dataAddr   uint32
	// evalCtx is the evaluation context, made once at init with the data
	// and the entrypoint set; each evaluation sets its input.
	evalCtx uint32
	// baseHeap is where the heap starts once data.json is loaded. Every
	// evaluation allocates above it; the heap is set back to it only when it
	// has grown resetBytes past it, so that OPA's builtin cache (compiled
	// regular expressions and globs) outlives an evaluation.
	baseHeap   uint32
	resetBytes uint32
	// dirty is set when the last evaluation started above baseHeap.
	dirty bool
}

// opaBuiltin is one host builtin the module imports.
type opaBuiltin struct {
	name string
	call func(ctx context.Context, args [][]byte) ([]byte, error)
}

func (o *opaInstance) module() api.Module { return o.mod }
func (o *opaInstance) outputs() *outputs  { return o.out }

func (o *opaInstance) close(ctx context.Context) error {
	return errors.Join(o.mod.Close(ctx), o.env.Close(ctx))
}

// call calls an export and returns its first result (0 if none).
func (o *opaInstance) call(ctx context.Context, name string, f api.Function, args ...uint64) (uint32, error) {
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
	addr, err := o.call(ctx, "opa_json_dump", o.fn.jsonDump, uint64(value))
	if err != nil {
		return nil, err
	}
	b, err := o.cString(addr)
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), b...), nil
}

// cString returns the NUL-terminated string the module produced at addr,
// as a view of the module's memory (valid until the module runs again).
func (o *opaInstance) cString(addr uint32) ([]byte, error) {
	mem := o.mem
	if addr == 0 || addr >= mem.Size() {
		return nil, fmt.Errorf("wasm: OPA result address %d out of bounds (memory is %d bytes)", addr, mem.Size())
	}
	b, _ := mem.Read(addr, min(mem.Size()-addr, maxOutputBytes+1))
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return nil, fmt.Errorf("wasm: OPA result at %d is not NUL-terminated within %d bytes", addr, len(b))
	}
	return b[:i:i], nil
}

// write copies b into the module's heap (opa_malloc) and returns its address.
func (o *opaInstance) write(ctx context.Context, b []byte) (uint32, error) {
	addr, err := o.call(ctx, "opa_malloc", o.fn.malloc, uint64(len(b)))
	if err != nil {
		return 0, err
	}
	if !o.mem.Write(addr, b) {
		return 0, fmt.Errorf("opa_malloc(%d) returned out-of-bounds address %d", len(b), addr)
	}
	return addr, nil
}

// parse copies JSON into the module's heap and parses it into an OPA value.
func (o *opaInstance) parse(ctx context.Context, doc []byte, what string) (uint32, error) {
	addr, err := o.write(ctx, doc)
	if err != nil {
		return 0, err
	}
	v, err := o.call(ctx, "opa_json_parse", o.fn.jsonParse, uint64(addr), uint64(len(doc)))
	if err != nil {
		return 0, err
	}
	if v == 0 {
		return 0, fmt.Errorf("OPA could not parse %s", what)
	}
	return v, nil
}

// lookupFuncs finds the exports the instance calls.
func (o *opaInstance) lookupFuncs() {
	f := o.mod.ExportedFunction
	o.fn = opaFuncs{
		malloc: f("opa_malloc"), jsonParse: f("opa_json_parse"), jsonDump: f("opa_json_dump"),
		valueDump: f("opa_value_dump"), valueParse: f("opa_value_parse"),
		heapPtrGet: f("opa_heap_ptr_get"), heapPtrSet: f("opa_heap_ptr_set"),
		eval:   f("opa_eval"),
		ctxNew: f("opa_eval_ctx_new"), ctxSetInput: f("opa_eval_ctx_set_input"), ctxSetData: f("opa_eval_ctx_set_data"),
		ctxSetEntrypoint: f("opa_eval_ctx_set_entrypoint"), ctxGetResult: f("opa_eval_ctx_get_result"), evalCtx: f("eval"),
	}
}

// init checks the ABI version, resolves the host builtins the module
// imports (refusing those the sandbox forbids, by name), resolves the
// entrypoint, loads data.json and records where the heap starts.
func (o *opaInstance) init(ctx context.Context, d *opaDriver) error {
	if g := o.mod.ExportedGlobal("opa_wasm_abi_version"); g != nil {
		if v := int32(g.Get()); v != 1 {
			return fmt.Errorf("OPA wasm ABI version %d is not supported (want 1)", v)
		}
	}
	o.lookupFuncs()
	v, err := o.call(ctx, "builtins", o.mod.ExportedFunction("builtins"))
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
	if err := o.resolveBuiltins(builtins, d); err != nil {
		return err
	}

	if v, err = o.call(ctx, "entrypoints", o.mod.ExportedFunction("entrypoints")); err != nil {
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
		o.entrypoint, o.entry = id, entryRef(d.entrypoint)
	case d.entrypoint == "" && len(eps) == 1:
		o.entrypoint, o.entry = eps[names[0]], entryRef(names[0])
	case d.entrypoint == "":
		return fmt.Errorf("manifest names no entrypoint and the module has %d: %s", len(eps), strings.Join(names, ", "))
	default:
		return fmt.Errorf("entrypoint %q not in module (has %s)", d.entrypoint, strings.Join(names, ", "))
	}

	if o.dataAddr, err = o.parse(ctx, d.data, "data.json"); err != nil {
		return err
	}
	if o.evalCtx, err = o.call(ctx, "opa_eval_ctx_new", o.fn.ctxNew); err != nil {
		return err
	}
	if _, err = o.call(ctx, "opa_eval_ctx_set_data", o.fn.ctxSetData, uint64(o.evalCtx), uint64(o.dataAddr)); err != nil {
		return err
	}
	if _, err = o.call(ctx, "opa_eval_ctx_set_entrypoint", o.fn.ctxSetEntrypoint, uint64(o.evalCtx), uint64(o.entrypoint)); err != nil {
		return err
	}
	if o.baseHeap, err = o.call(ctx, "opa_heap_ptr_get", o.fn.heapPtrGet); err != nil {
		return err
	}
	// Start every evaluation from a clean heap, and keep what the module
	// allocates for its caches, until memory grows by a quarter of what the
	// cap leaves above the base (at least 1 MiB).
	if _, err = o.call(ctx, "opa_heap_ptr_set", o.fn.heapPtrSet, uint64(o.baseHeap)); err != nil {
		return err
	}
	free := uint64(d.pages)*65536 - uint64(o.baseHeap)
	o.resetBytes = uint32(min(free, max(free/4, 1<<20)))
	return nil
}

// resolveBuiltins finds an implementation for every host builtin the
// module imports. All refusals are reported at once, sorted by name.
func (o *opaInstance) resolveBuiltins(ids map[string]int32, d *opaDriver) error {
	if len(ids) == 0 {
		return nil
	}
	names := make([]string, 0, len(ids))
	for n := range ids {
		names = append(names, n)
	}
	slices.Sort(names)
	if d.builtins == nil {
		return fmt.Errorf("policy needs host builtins %s, which this kernel does not provide (wasm.Config.Builtins is not set)", strings.Join(names, ", "))
	}
	if o.fn.valueDump == nil || o.fn.valueParse == nil {
		return fmt.Errorf("policy needs host builtins %s but does not export opa_value_dump and opa_value_parse (OPA wasm ABI 1.1 or later)", strings.Join(names, ", "))
	}
	var refused []string
	for _, n := range names {
		id := ids[n]
		if id < 0 || id > 1<<16 {
			return fmt.Errorf("OPA builtins list: id %d of %s out of range", id, n)
		}
		call, err := d.builtins.Lookup(n, d.grants)
		if err != nil {
			refused = append(refused, err.Error())
			continue
		}
		if int(id) >= len(o.builtins) {
			o.builtins = append(o.builtins, make([]opaBuiltin, int(id)+1-len(o.builtins))...)
		}
		o.builtins[id] = opaBuiltin{name: n, call: call}
	}
	if len(refused) > 0 {
		return errors.New(strings.Join(refused, "; "))
	}
	return nil
}

// callBuiltin runs host builtin id on the OPA values at args and returns
// the address of its result, 0 for undefined. It panics with an
// *opaAbortError to stop the evaluation.
func (o *opaInstance) callBuiltin(ctx context.Context, id uint32, args []uint64) uint32 {
	if int(id) >= len(o.builtins) || o.builtins[id].call == nil {
		panic(&opaAbortError{msg: fmt.Sprintf("host builtin %d is not one the module declared", id)})
	}
	b := o.builtins[id]
	vals := make([][]byte, len(args))
	for i, a := range args {
		addr, err := o.call(ctx, "opa_value_dump", o.fn.valueDump, a)
		if err != nil {
			panic(err)
		}
		s, err := o.cString(addr)
		if err != nil {
			panic(&opaAbortError{msg: fmt.Sprintf("%s: argument %d: %v", b.name, i+1, err)})
		}
		vals[i] = s
	}
	res, err := b.call(ctx, vals)
	if err != nil {
		panic(&opaAbortError{msg: err.Error()})
	}
	if res == nil {
		return 0
	}
	addr, err := o.write(ctx, res)
	if err != nil {
		panic(err)
	}
	v, err := o.call(ctx, "opa_value_parse", o.fn.valueParse, uint64(addr), uint64(len(res)))
	if err != nil {
		panic(err)
	}
	if v == 0 {
		panic(&opaAbortError{msg: fmt.Sprintf("%s: OPA could not parse the result %s", b.name, snippet(string(res)))})
	}
	return v
}

func (o *opaInstance) dirtyHeap() bool { return o.dirty }

func (o *opaInstance) decode(out []byte) (*policy.Answer, error) { return decodeOPA(o.entry, out) }

func (o *opaInstance) evaluate(ctx context.Context, input []byte) ([]byte, error) {
	ctx = context.WithValue(ctx, instanceKey{}, o)
	if len(o.builtins) > 0 {
		ctx = o.hb.Evaluation(ctx, o.out.stdout)
	}
	raw, err := o.eval(ctx, input)
	if err != nil {
		return nil, err
	}
	return resultOf(raw)
}

// resultOf returns the value of a result set as opa_json_dump writes it:
// nil for [] (undefined), X for [{"result":X}], without a JSON decode in
// the common case. X is copied out of the module's memory.
func resultOf(raw []byte) ([]byte, error) {
	const prefix, suffix = `[{"result":`, `}]`
	if string(raw) == "[]" {
		return nil, nil
	}
	if len(raw) > len(prefix)+len(suffix) && string(raw[:len(prefix)]) == prefix && string(raw[len(raw)-len(suffix):]) == suffix {
		x := raw[len(prefix) : len(raw)-len(suffix)]
		// The shortcut holds only if X is one value: [{"result":1},{"result":2}]
		// also starts and ends so.
		if json.Valid(x) {
			return append([]byte(nil), x...), nil
		}
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

// eval evaluates the entrypoint on input and returns the result set as
// JSON (a view of the module's memory). The heap is set back to its base
// only when memory has grown past resetSize.
func (o *opaInstance) eval(ctx context.Context, input []byte) ([]byte, error) {
	heap, err := o.call(ctx, "opa_heap_ptr_get", o.fn.heapPtrGet)
	if err != nil {
		return nil, err
	}
	if heap-o.baseHeap > o.resetBytes {
		if _, err := o.call(ctx, "opa_heap_ptr_set", o.fn.heapPtrSet, uint64(o.baseHeap)); err != nil {
			return nil, err
		}
		heap = o.baseHeap
	}
	o.dirty = heap != o.baseHeap
	in, err := o.parse(ctx, input, "the input")
	if err != nil {
		return nil, err
	}
	if _, err := o.call(ctx, "opa_eval_ctx_set_input", o.fn.ctxSetInput, uint64(o.evalCtx), uint64(in)); err != nil {
		return nil, err
	}
	errno, err := o.call(ctx, "eval", o.fn.evalCtx, uint64(o.evalCtx))
	if err != nil {
		return nil, err
	}
	if errno != 0 {
		return nil, fmt.Errorf("wasm: OPA eval failed with error code %d", errno)
	}
	res, err := o.call(ctx, "opa_eval_ctx_get_result", o.fn.ctxGetResult, uint64(o.evalCtx))
	if err != nil {
		return nil, err
	}
	addr, err := o.call(ctx, "opa_json_dump", o.fn.jsonDump, uint64(res))
	if err != nil {
		return nil, err
	}
	return o.cString(addr)
}
