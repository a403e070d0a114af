package wasm

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// fakeOPAModule encodes a minimal module with OPA's ABI whose eval runs
// evalBody (which must leave nothing on the stack) and then answers
// {"decision": "allow"}. withBuiltin0 imports env.opa_builtin0, which
// fuel instrumentation needs.
func fakeOPAModule(evalBody []byte, withBuiltin0 bool) []byte {
	const (
		biAddr  = 1024
		epAddr  = 1040
		resAddr = 1100
	)
	m := &wasmModule{
		types: []funcType{
			{results: []byte{valI32}},                                 // 0: () -> i32
			{params: []byte{valI32}, results: []byte{valI32}},         // 1: (i32) -> i32
			{params: []byte{valI32, valI32}, results: []byte{valI32}}, // 2: (i32, i32) -> i32
			{params: []byte{valI32}},                                  // 3: (i32) -> ()
			{params: []byte{valI32, valI32}},                          // 4: (i32, i32) -> ()
		},
		data: []wasmData{
			{offset: biAddr, bytes: []byte("{}\x00")},
			{offset: epAddr, bytes: []byte(`{"x":0}` + "\x00")},
			{offset: resAddr, bytes: []byte(`[{"result":{"decision":"allow"}}]` + "\x00")},
		},
	}
	if withBuiltin0 {
		m.imports = append(m.imports, wasmImport{module: "env", name: "opa_builtin0", kind: externFunc, typeIndex: 2})
	}
	m.imports = append(m.imports, wasmImport{module: "env", name: "memory", kind: externMemory, memory: memLimits{min: 1}})
	first := uint32(0)
	if withBuiltin0 {
		first = 1
	}
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
		{"eval", 1, cat(evalBody, i32Const(0))},
	}
	for i, f := range funcs {
		m.funcs = append(m.funcs, wasmFunc{typeIndex: f.typ, code: f.code})
		m.exports = append(m.exports, wasmExport{name: f.name, kind: externFunc, index: first + uint32(i)})
	}
	return m.encode()
}

// evalIndex is the function index of eval in fakeOPAModule.
func evalIndex(withBuiltin0 bool) byte {
	if withBuiltin0 {
		return 13
	}
	return 12
}

// TestOPADeadline stops OPA-ABI modules that run past their deadline,
// whether they check it themselves (fuel instrumentation: the module
// imports env.opa_builtin0) or rely on wazero's check (it does not), and
// stops an OPA-compiled policy whose evaluation is merely long.
func TestOPADeadline(t *testing.T) {
	e := newEngine(t, Config{})
	for _, withBuiltin0 := range []bool{true, false} {
		// A loop that never ends; a call that recurses forever.
		loop := []byte{opLoop, blockEmpty, opBr, 0, 0x0b}
		recurse := []byte{opLocalGet, 0, opCall, evalIndex(withBuiltin0), 0x1a /* drop */}
		for _, c := range []struct {
			name, want string
			body       []byte
		}{
			{"infinite loop", "wasm: evaluation timed out after 100ms", loop},
			// Stopped by the stack's limit or the deadline, whichever
			// comes first.
			{"infinite recursion", "wasm: ", recurse},
		} {
			t.Run(c.name+map[bool]string{true: " (fuel)", false: " (wazero)"}[withBuiltin0], func(t *testing.T) {
				b := opaBundle(fakeOPAModule(c.body, withBuiltin0), "x", "")
				b.Manifest.Sandbox.Timeout = "100ms"
				ev := compile(t, e, b)
				if ev.rt.fuel != withBuiltin0 {
					t.Fatalf("fuel runtime = %v, want %v", ev.rt.fuel, withBuiltin0)
				}
				start := time.Now()
				err := wantError(t, ev, smallInput(), c.want)
				if msg := err.Error(); c.want == "wasm: " && !strings.Contains(msg, "stack overflow") && !strings.Contains(msg, "timed out") {
					t.Errorf("error %q: want a stack overflow or a timeout", msg)
				}
				if c.want == "wasm: evaluation timed out after 100ms" && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("error %v is not context.DeadlineExceeded", err)
				}
				// That it stops at all, not how fast: a recursion under
				// -race on a loaded machine took 18.6 s to reach its
				// deadline or wazero's stack limit (against 100 ms asked).
				if d := time.Since(start); d > time.Minute {
					t.Errorf("stopped after %s", d)
				}
			})
		}
	}
	t.Run("an answering module", func(t *testing.T) {
		for _, withBuiltin0 := range []bool{true, false} {
			ev := compile(t, e, opaBundle(fakeOPAModule(nil, withBuiltin0), "x", ""))
			for range 3 {
				wantDecision(t, ev, smallInput(), policy.Allow, "")
			}
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		b := opaBundle(fakeOPAModule([]byte{opLoop, blockEmpty, opBr, 0, 0x0b}, true), "x", "")
		b.Manifest.Sandbox.Timeout = "30s" // the ceiling newEngine allows: cancellation answers first
		ev := compile(t, e, b)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		_, err := ev.Evaluate(ctx, smallInput())
		if err == nil || !strings.Contains(err.Error(), "wasm: evaluation cancelled") {
			t.Fatalf("err = %v, want cancelled", err)
		}
	})
	t.Run("long Rego", func(t *testing.T) {
		mod, err := buildRego(`package p

decision := {"decision": "deny", "reason": sprintf("%d pairs", [n])} if {
	n := count([1 | some x in numbers.range(1, input.step.args.n); some y in numbers.range(1, input.step.args.n); x != y])
}
`, "p/decision")
		if err != nil {
			t.Fatal(err)
		}
		b := opaBundle(mod, "p/decision", "")
		b.Manifest.Sandbox.Timeout = "100ms"
		ev := compile(t, e, b)
		wantError(t, ev, input("tool_call", "t", "", map[string]any{"n": 100000}), "wasm: evaluation timed out after 100ms")
		d := wantDecision(t, ev, input("tool_call", "t", "", map[string]any{"n": 3}), policy.Deny, "")
		if d.Reason != "6 pairs" {
			t.Fatalf("reason %q", d.Reason)
		}
	})
}

// TestInstrumentFuel checks the rewriting itself: every corpus module (and
// the fake) is instrumented, validates, gains one function and one global,
// and keeps its data.
func TestInstrumentFuel(t *testing.T) {
	mods := [][]byte{fakeOPAModule(nil, true)}
	for _, p := range loadCorpus(t) {
		mods = append(mods, p.wasm)
	}
	r := wazero.NewRuntime(context.Background())
	defer r.Close(context.Background())
	for i, bin := range mods {
		out, err := instrumentFuel(bin)
		if err != nil {
			t.Fatalf("module %d: %v", i, err)
		}
		before, err := r.CompileModule(context.Background(), bin)
		if err != nil {
			t.Fatal(err)
		}
		after, err := r.CompileModule(context.Background(), out)
		if err != nil {
			t.Fatalf("module %d: instrumented module does not validate: %v", i, err)
		}
		if got, want := len(after.ExportedFunctions()), len(before.ExportedFunctions()); got != want {
			t.Errorf("module %d: %d exports, want %d", i, got, want)
		}
		de, _ := dataEnd(bin)
		if de2, _ := dataEnd(out); de2 != de {
			t.Errorf("module %d: data ends at %d, was %d", i, de2, de)
		}
		if !bytes.Contains(out, checkCode(0, 0)[:1]) {
			t.Errorf("module %d: no check", i)
		}
	}
	if _, err := instrumentFuel(fakeOPAModule(nil, false)); !errors.Is(err, errNoFuelImport) {
		t.Fatalf("without opa_builtin0: %v", err)
	}
	if _, err := instrumentFuel([]byte("not wasm")); err == nil {
		t.Fatal("garbage instrumented")
	}
}

// FuzzInstrumentFuel feeds mangled modules to the rewriter: it must return
// an error or a module, never panic, and an OPA module it accepts must still
// validate.
func FuzzInstrumentFuel(f *testing.F) {
	f.Add(fakeOPAModule([]byte{opLoop, blockEmpty, opBr, 0, 0x0b}, true))
	f.Fuzz(func(t *testing.T, bin []byte) {
		_, _ = instrumentFuel(bin)
	})
}

// TestOPAHeapKeptBetweenEvaluations checks what keeping an OPA instance's
// heap between evaluations must not change: every evaluation answers as on
// a fresh instance, the heap is set back once it has grown enough, and an
// evaluation that runs out of memory above the garbage of earlier ones is
// run again on a fresh instance instead of failing.
func TestOPAHeapKeptBetweenEvaluations(t *testing.T) {
	mod, err := buildRego(`package p

decision := {"decision": "allow", "reason": sprintf("%d", [count(numbers.range(1, input.step.args.n))])} if {
	regex.match("^[a-z]+$", input.step.target)
}
`, "p/decision")
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, Config{})
	newEv := func() *evaluator {
		b := opaBundle(mod, "p/decision", "")
		b.Manifest.Sandbox = bundle.Sandbox{MemoryPages: 64, Timeout: "5s"}
		return compile(t, e, b)
	}
	with := func(n int) *policy.Input { return input("tool_call", "abc", "", map[string]any{"n": n}) }

	ev := newEv()
	inst, err := ev.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	o := inst.(*opaInstance)
	o.resetBytes = ^uint32(0) // never reset: keep every evaluation's garbage
	ev.release(inst)
	// Each evaluation leaves its garbage until one runs out of memory: it
	// is run again on a fresh instance and answers all the same.
	for i := 0; ev.instances.Load() == 1; i++ {
		d := wantDecision(t, ev, with(5000), policy.Allow, "")
		if d.Reason != "5000" {
			t.Fatalf("evaluation %d: reason %q", i, d.Reason)
		}
		if i > 2000 {
			t.Fatal("memory never filled up")
		}
	}
	if !memoryFull(o.mod, 64) {
		t.Fatal("the first instance was replaced before its memory was full")
	}
	if ev.instances.Load() != 2 {
		t.Fatalf("%d instances, want 2", ev.instances.Load())
	}

	// The default reset keeps the heap bounded.
	ev = newEv()
	for range 300 {
		wantDecision(t, ev, with(500), policy.Allow, "")
	}
	inst, err = ev.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	o = inst.(*opaInstance)
	heap, err := o.call(context.Background(), "opa_heap_ptr_get", o.fn.heapPtrGet)
	ev.release(inst)
	if err != nil || heap-o.baseHeap > o.resetBytes+1<<20 {
		t.Fatalf("heap %d above base after 300 evaluations (reset at %d): %v", heap-o.baseHeap, o.resetBytes, err)
	}
	if ev.instances.Load() != 1 {
		t.Fatalf("%d instances: evaluations failed", ev.instances.Load())
	}
}

// TestFuelNotTheModules: a module cannot set the fuel counter the engine
// adds to it. The uploaded module is not validated before it is
// instrumented, so code naming global 0 of a module that has none was
// valid once the fuel global took that index: an eval loop refilling it
// never reached a check, and ran past its deadline forever, holding a CPU
// and its instance. It is refused like any module naming a global (or a
// function) it does not define.
func TestFuelNotTheModules(t *testing.T) {
	e := newEngine(t, Config{})
	for _, c := range []struct {
		name, want string
		body       []byte
	}{
		// loop { global.set 0 (i32.const 1000); br 0 }
		{"sets the fuel", "invalid global index", []byte{opLoop, blockEmpty, 0x41, 0xe8, 0x07, 0x24, 0x00, opBr, 0, 0x0b}},
		// call 14, the refuel function once appended
		{"calls the refuel function", "invalid function index", []byte{opCall, 14}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := opaBundle(fakeOPAModule(c.body, true), "x", "")
			b.Manifest.Sandbox.Timeout = "100ms"
			ev, err := e.Compile(context.Background(), b)
			if err == nil {
				defer ev.Close()
				done := make(chan error, 1)
				go func() { _, err := ev.Evaluate(context.Background(), smallInput()); done <- err }()
				select {
				case err := <-done:
					t.Fatalf("compiled, and evaluated to %v", err)
				case <-time.After(10 * time.Second):
					t.Fatal("compiled, and evaluation still runs 10s past its 100ms deadline")
				}
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("compile: %v, want %q", err, c.want)
			}
			if _, ierr := instrumentFuel(fakeOPAModule(c.body, true)); ierr == nil {
				t.Error("instrumentFuel accepted the module")
			}
		})
	}
}
