package wasm

import (
	"context"
	"strings"
	"testing"
	"time"
)

// callbackLoopModule is an OPA-ABI module declaring one host builtin
// (sprintf) that its eval calls; the host then calls back into the module
// (opa_value_dump, to read the argument), which loops for ever. With
// withBuiltin0 the module is fuel-instrumented; without, it runs under
// wazero's check.
func callbackLoopModule(withBuiltin0 bool) []byte {
	const (
		biAddr  = 1024
		epAddr  = 1040
		resAddr = 1100
	)
	m := &wasmModule{
		types: []funcType{
			{results: []byte{valI32}},                                         // 0: () -> i32
			{params: []byte{valI32}, results: []byte{valI32}},                 // 1: (i32) -> i32
			{params: []byte{valI32, valI32}, results: []byte{valI32}},         // 2: (i32, i32) -> i32
			{params: []byte{valI32}},                                          // 3: (i32) -> ()
			{params: []byte{valI32, valI32}},                                  // 4: (i32, i32) -> ()
			{params: []byte{valI32, valI32, valI32}, results: []byte{valI32}}, // 5: opa_builtin1
		},
		data: []wasmData{
			{offset: biAddr, bytes: []byte(`{"sprintf":0}` + "\x00")},
			{offset: epAddr, bytes: []byte(`{"x":0}` + "\x00")},
			{offset: resAddr, bytes: []byte(`[{"result":{"decision":"allow"}}]` + "\x00")},
		},
	}
	first := uint32(1)
	if withBuiltin0 {
		m.imports = append(m.imports, wasmImport{module: "env", name: "opa_builtin0", kind: externFunc, typeIndex: 2})
		first = 2
	}
	builtin1 := first - 1
	m.imports = append(m.imports,
		wasmImport{module: "env", name: "opa_builtin1", kind: externFunc, typeIndex: 5},
		wasmImport{module: "env", name: "memory", kind: externMemory, memory: memLimits{min: 1}})
	loop := []byte{opLoop, blockEmpty, opBr, 0, 0x0b, opUnreachable}
	funcs := []struct {
		name string
		typ  uint32
		code []byte
	}{
		{"opa_malloc", 1, i32Const(8192)},
		{"opa_json_parse", 2, i32Const(1)},
		{"opa_json_dump", 1, []byte{opLocalGet, 0}},
		{"opa_heap_ptr_get", 0, i32Const(16384)},
		{"opa_heap_ptr_set", 3, nil},
		{"entrypoints", 0, i32Const(epAddr)},
		{"builtins", 0, i32Const(biAddr)},
		{"opa_eval_ctx_new", 0, i32Const(64)},
		{"opa_eval_ctx_set_input", 4, nil},
		{"opa_eval_ctx_set_data", 4, nil},
		{"opa_eval_ctx_set_entrypoint", 4, nil},
		{"opa_eval_ctx_get_result", 1, i32Const(resAddr)},
		{"opa_value_dump", 1, loop},
		{"opa_value_parse", 2, i32Const(1)},
		// eval: drop(opa_builtin1(0, 0, 5)); return 0
		{"eval", 1, cat(i32Const(0), i32Const(0), i32Const(5), []byte{opCall, byte(builtin1), 0x1a}, i32Const(0))},
	}
	for i, f := range funcs {
		m.funcs = append(m.funcs, wasmFunc{typeIndex: f.typ, code: f.code})
		m.exports = append(m.exports, wasmExport{name: f.name, kind: externFunc, index: first + uint32(i)})
	}
	return m.encode()
}

// TestHostCallbackDeadline: a module that loops inside a function the host
// calls back while it answers a builtin is stopped at the deadline like
// any other loop, with or without fuel.
func TestHostCallbackDeadline(t *testing.T) {
	e := newEngine(t, Config{})
	for _, withBuiltin0 := range []bool{true, false} {
		b := opaBundle(callbackLoopModule(withBuiltin0), "x", "")
		b.Manifest.Sandbox.Timeout = "100ms"
		ev := compile(t, e, b)
		if ev.rt.fuel != withBuiltin0 {
			t.Fatalf("fuel runtime = %v, want %v", ev.rt.fuel, withBuiltin0)
		}
		done := make(chan error, 1)
		go func() { _, err := ev.Evaluate(context.Background(), smallInput()); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "wasm: evaluation timed out after 100ms") {
				t.Errorf("fuel=%v: %v, want a timeout", withBuiltin0, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("fuel=%v: evaluation still running a minute past its 100ms deadline", withBuiltin0)
		}
	}
}
