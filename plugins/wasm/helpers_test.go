package wasm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/wasmwarm"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
)

// shared holds what is expensive to build once per test binary: the Go test
// policy (go build, then about a second of wazero compilation, 20 s under
// -race) and a compilation cache directory every test engine shares so that
// compilation happens once.
var shared struct {
	dir      string // removed by TestMain
	cacheDir string

	goOnce sync.Once
	goWasm []byte
	goErr  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "wicket-wasm-test-")
	if err != nil {
		panic(err)
	}
	shared.dir = dir
	shared.cacheDir = filepath.Join(dir, "cache")
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildGo builds a Go policy package (a directory with its own go.mod) for
// wasip1 with the local toolchain.
func buildGo(pkgDir, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-buildmode=c-shared", "-o", out, ".")
	cmd.Dir = pkgDir
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOWORK=off", "GOFLAGS=-mod=mod -buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		return &buildError{cmd: strings.Join(cmd.Args, " "), out: string(b), err: err}
	}
	return nil
}

type buildError struct {
	cmd, out string
	err      error
}

func (e *buildError) Error() string { return e.cmd + ": " + e.err.Error() + "\n" + e.out }

// goPolicy returns testdata/gopolicy built for wasip1.
func goPolicy(tb testing.TB) []byte {
	tb.Helper()
	shared.goOnce.Do(func() {
		out := filepath.Join(shared.dir, "gopolicy.wasm")
		if shared.goErr = buildGo("testdata/gopolicy", out); shared.goErr == nil {
			shared.goWasm, shared.goErr = os.ReadFile(out)
		}
		if shared.goErr == nil && raceEnabled {
			warmCache(out)
		}
	})
	if shared.goErr != nil {
		tb.Fatalf("build Go test policy: %v", shared.goErr)
	}
	return shared.goWasm
}

// warmCache compiles a module into the shared disk cache with a normal
// (non-race) build (see wasmwarm.Warm).
func warmCache(wasmPath string) {
	if err := wasmwarm.Warm(shared.cacheDir, wasmPath); err != nil {
		fmt.Fprintf(os.Stderr, "%v (continuing without)\n", err)
	}
}

// cPolicy returns the checked-in C example module.
func cPolicy(tb testing.TB) []byte {
	tb.Helper()
	b, err := os.ReadFile(cExampleWasm)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

const (
	cExampleSrc  = "../../policy-sdk/c/examples/deny_destructive.c"
	cExampleWasm = "../../policy-sdk/c/examples/deny_destructive.wasm"
)

// newBundle makes a wasm bundle around a module.
func newBundle(name string, wasm []byte, sb bundle.Sandbox) *bundle.Bundle {
	sum := sha256.Sum256(wasm)
	return &bundle.Bundle{
		Manifest: bundle.Manifest{Name: name, Revision: "1", Engine: bundle.EngineWasm, Sandbox: sb},
		Files:    map[string][]byte{PolicyFile: wasm},
		Digest:   hex.EncodeToString(sum[:]),
	}
}

// newEngine returns an engine on the shared cache, closed at cleanup. Its
// largest timeout is 30s unless cfg sets one: tests give slow modules time
// on a loaded machine (the ceilings are tested with explicit limits).
func newEngine(tb testing.TB, cfg Config) *Engine {
	tb.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = shared.cacheDir
	}
	if cfg.Limits.MaxTimeout == 0 {
		cfg.Limits.MaxTimeout = 30 * time.Second
	}
	if cfg.Builtins == nil {
		cfg.Builtins = rego.NewHostBuiltins()
	}
	e := New(cfg)
	tb.Cleanup(func() {
		if err := e.Close(); err != nil {
			tb.Errorf("close engine: %v", err)
		}
	})
	return e
}

// compile compiles b and closes the evaluator at cleanup.
func compile(tb testing.TB, e *Engine, b *bundle.Bundle) *evaluator {
	tb.Helper()
	ev, err := e.Compile(context.Background(), b)
	if err != nil {
		tb.Fatalf("compile %s: %v", b.Manifest.Name, err)
	}
	tb.Cleanup(func() {
		if err := ev.Close(); err != nil {
			tb.Errorf("close evaluator: %v", err)
		}
	})
	return ev.(*evaluator)
}

// relaxed is a sandbox whose deadline tolerates a loaded CI machine.
var relaxed = bundle.Sandbox{Timeout: "2s"}

// input builds an input document.
func input(kind, target, effect string, args map[string]any) *policy.Input {
	raw := json.RawMessage("{}")
	if args != nil {
		raw, _ = json.Marshal(args)
	}
	return &policy.Input{
		Tenant:      "default",
		AgentID:     "support-bot",
		ExecutionID: "0191e5a2-0000-7000-8000-000000000001",
		Step: policy.Step{
			Kind: kind, Target: target, Args: raw, ArgsHash: "abc", Effect: effect, Occurrence: 1,
		},
		Execution: policy.Execution{
			Status:    "running",
			Labels:    map[string]string{"team": "a"},
			Totals:    policy.Totals{Steps: 3, LLMCalls: 1, Tokens: 900, CostUSD: 0.01},
			CreatedAt: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
		},
	}
}

// wantDecision evaluates in and checks the answer's action and rule (nil
// want means no match).
func wantDecision(tb testing.TB, ev policy.Evaluator, in *policy.Input, action policy.Action, rule string) *policy.Answer {
	tb.Helper()
	d, err := ev.Evaluate(context.Background(), in)
	if err != nil {
		tb.Fatalf("evaluate %s: %v", in.Step.Target, err)
	}
	if action == "" {
		if d != nil {
			tb.Fatalf("evaluate %s: got %+v, want no match", in.Step.Target, d)
		}
		return nil
	}
	if d == nil || d.Action != action || d.RuleID != rule {
		tb.Fatalf("evaluate %s: got %+v, want %s/%s", in.Step.Target, d, action, rule)
	}
	return d
}

// wantError evaluates in and checks that the error text contains want.
func wantError(tb testing.TB, ev policy.Evaluator, in *policy.Input, want string) error {
	tb.Helper()
	d, err := ev.Evaluate(context.Background(), in)
	if err == nil {
		tb.Fatalf("evaluate %s: got %+v, want error containing %q", in.Step.Target, d, want)
	}
	if !strings.Contains(err.Error(), want) {
		tb.Fatalf("evaluate %s: error %q does not contain %q", in.Step.Target, err, want)
	}
	return err
}

// haveClang reports whether the C toolchain of policy-sdk/c is installed.
func haveClang() bool {
	for _, tool := range []string{"clang", "wasm-ld"} {
		if _, err := exec.LookPath(tool); err != nil {
			return false
		}
	}
	return runtime.GOOS != "windows"
}

// ---- hand-written modules ----

// Instruction bytes used by the hostile modules.
const (
	opUnreachable = 0x00
	opBlock       = 0x02
	opLoop        = 0x03
	opBr          = 0x0c
	opBrIf        = 0x0d
	opDrop        = 0x1a
	opLocalGet    = 0x20
	opLocalSet    = 0x21
	opIf          = 0x04
	opEnd         = 0x0b
	opI32Eqz      = 0x45
	opI32Shl      = 0x74
	opI32ShrU     = 0x76
	opMemorySize  = 0x3f
	opMisc        = 0xfc // prefix of memory.fill (0x0b) and memory.copy (0x0a)
	opI32Const    = 0x41
	opI64Const    = 0x42
	opI32Eq       = 0x46
	opMemoryGrow  = 0x40
	opCall        = 0x10
	blockEmpty    = 0x40
)

// growToCap grows memory to its cap in a few dozen memory.grow calls (it
// halves the request each time one fails), using local 0 as the request.
var growToCap = cat(
	i32Const(65536), []byte{opLocalSet, 0},
	[]byte{opBlock, blockEmpty, opLoop, blockEmpty},
	[]byte{opLocalGet, 0, opI32Eqz, opBrIf, 1}, // request 0: done
	[]byte{opLocalGet, 0, opMemoryGrow, 0}, i32Const(-1), []byte{opI32Eq, opIf, blockEmpty},
	[]byte{opLocalGet, 0}, i32Const(1), []byte{opI32ShrU, opLocalSet, 0, opEnd},
	[]byte{opBr, 0, opEnd, opEnd},
)

// memoryBytes pushes the memory's size in bytes (memory.size << 16).
var memoryBytes = cat([]byte{opMemorySize, 0}, i32Const(16), []byte{opI32Shl})

func i32Const(v int32) []byte { return appendSLEB([]byte{opI32Const}, int64(v)) }
func i64Const(v int64) []byte { return appendSLEB([]byte{opI64Const}, v) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// outputAt returns an evaluate body answering len bytes at ptr.
func outputAt(ptr, n uint32) []byte { return i64Const(int64(uint64(ptr)<<32 | uint64(n))) }

// rawSpec describes a Wicket-ABI module written by hand.
type rawSpec struct {
	alloc    []byte // wicket_alloc body; default returns 1024
	evaluate []byte // wicket_evaluate body
	data     []wasmData
	memory   memLimits // default min 1
	imports  []wasmImport
	extra    func(m *wasmModule)
}

// Types of the hand-written modules.
const (
	typeAlloc    = 0 // (i32) -> i32
	typeEvaluate = 1 // (i32, i32) -> i64
	typeVoid     = 2 // () -> ()
	typeI32I32   = 3 // (i32, i32) -> i32
)

func rawModule(s rawSpec) []byte {
	m := &wasmModule{
		types: []funcType{
			{params: []byte{valI32}, results: []byte{valI32}},
			{params: []byte{valI32, valI32}, results: []byte{valI64}},
			{},
			{params: []byte{valI32, valI32}, results: []byte{valI32}},
		},
		imports: s.imports,
		data:    s.data,
	}
	mem := s.memory
	if mem.min == 0 {
		mem.min = 1
	}
	m.memory = &mem
	if s.alloc == nil {
		s.alloc = i32Const(1024)
	}
	var n uint32 // function imports shift the index of defined functions
	for _, im := range s.imports {
		if im.kind == externFunc {
			n++
		}
	}
	m.funcs = []wasmFunc{{typeIndex: typeAlloc, code: s.alloc}, {typeIndex: typeEvaluate, code: s.evaluate}}
	m.exports = []wasmExport{
		{name: "memory", kind: externMemory, index: 0},
		{name: "wicket_alloc", kind: externFunc, index: n},
		{name: "wicket_evaluate", kind: externFunc, index: n + 1},
	}
	if s.extra != nil {
		s.extra(m)
	}
	return m.encode()
}

// answer is a module that always outputs out.
func answer(out string) []byte {
	return rawModule(rawSpec{
		evaluate: outputAt(2048, uint32(len(out))),
		data:     []wasmData{{offset: 2048, bytes: []byte(out)}},
	})
}
