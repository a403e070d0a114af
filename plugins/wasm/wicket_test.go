package wasm

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// sdkCases are decisions both SDK examples (and the Go test policy) agree on.
var sdkCases = []struct {
	name   string
	in     *policy.Input
	action policy.Action
	rule   string
}{
	{"destructive", input("tool_call", "fs.delete", "destructive", nil), policy.Deny, "no-destructive"},
	{"shell rm", input("tool_call", "shell.exec", "", map[string]any{"cmd": "rm -rf /tmp/x"}), policy.RequireApproval, "shell-rm"},
	{"shell ls", input("tool_call", "shell.exec", "", map[string]any{"cmd": "ls"}), policy.Allow, "shell"},
	{"read only", input("tool_call", "fs.read", "read_only", nil), policy.Allow, "read-only"},
	{"no match", input("tool_call", "http.get", "remote_mutation", nil), "", ""},
}

func TestWicketABIGo(t *testing.T) {
	e := newEngine(t, Config{})
	ev := compile(t, e, newBundle("go", goPolicy(t), relaxed))
	for _, c := range sdkCases {
		t.Run(c.name, func(t *testing.T) { wantDecision(t, ev, c.in, c.action, c.rule) })
	}
	d := wantDecision(t, ev, sdkCases[1].in, policy.RequireApproval, "shell-rm")
	if d.Approval == nil || d.Approval.Timeout != "15m" || len(d.Approval.Approvers) != 1 {
		t.Fatalf("approval = %+v", d.Approval)
	}
	d = wantDecision(t, ev, input("llm_call", "gpt", "", nil), policy.Allow, "llm")
	if d.RateLimit == nil || d.RateLimit.MaxCalls != 100 || d.RateLimit.Per != policy.PerAgent {
		t.Fatalf("rate limit = %+v", d.RateLimit)
	}
}

func TestWicketABIC(t *testing.T) {
	e := newEngine(t, Config{})
	ev := compile(t, e, newBundle("c", cPolicy(t), bundle.Sandbox{}))
	for _, c := range sdkCases {
		t.Run(c.name, func(t *testing.T) { wantDecision(t, ev, c.in, c.action, c.rule) })
	}
	in := input("tool_call", "x", "", nil)
	in.AgentID = "root-bot"
	wantDecision(t, ev, in, policy.Abort, "no-root-bot")
	// Escaped strings in the input are decoded before comparison.
	wantDecision(t, ev, input("tool_call", "shell.exec", "", map[string]any{"cmd": "rm\u00a0-x \"q\" rm y"}), policy.RequireApproval, "shell-rm")
}

// TestCExampleReproducible rebuilds the checked-in C example with
// policy-sdk/c/build.sh and requires identical bytes.
func TestCExampleReproducible(t *testing.T) {
	if !haveClang() {
		t.Skip("clang and wasm-ld not installed (apt-get install -y clang lld)")
	}
	out := filepath.Join(t.TempDir(), "policy.wasm")
	cmd := exec.Command("bash", "../../policy-sdk/c/build.sh", cExampleSrc, out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, cPolicy(t)) {
		t.Fatalf("%s differs from a fresh build (%d vs %d bytes); rebuild it with policy-sdk/c/build.sh %s %s",
			cExampleWasm, len(got), len(cPolicy(t)), cExampleSrc, cExampleWasm)
	}
}

// TestGoSDKExample builds policy-sdk/go/examples/basic and runs it.
func TestGoSDKExample(t *testing.T) {
	if raceEnabled {
		t.Skip("compiling a second 3 MB Go module takes ~20 s under -race; covered by the non-race run")
	}
	out := filepath.Join(t.TempDir(), "basic.wasm")
	if err := buildGo("../../policy-sdk/go/examples/basic", out); err != nil {
		t.Fatal(err)
	}
	wasm, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	ev := compile(t, newEngine(t, Config{}), newBundle("basic", wasm, relaxed))
	for _, c := range sdkCases {
		t.Run(c.name, func(t *testing.T) { wantDecision(t, ev, c.in, c.action, c.rule) })
	}
}

func TestGoPanicIsPolicyError(t *testing.T) {
	ev := compile(t, newEngine(t, Config{}), newBundle("go", goPolicy(t), relaxed))
	wantError(t, ev, input("tool_call", "test.panic", "", nil), "wasm: policy error: panic: asked to panic")
	wantDecision(t, ev, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule)
}

func TestGoExitCode(t *testing.T) {
	ev := compile(t, newEngine(t, Config{}), newBundle("go", goPolicy(t), relaxed))
	wantError(t, ev, input("tool_call", "test.exit", "", nil), "wasm: module exited with code 3")
	wantDecision(t, ev, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule)
}

// TestSandboxDefaults checks that nothing of the host leaks in by default:
// the clock is fake, random bytes repeat, no environment, no files.
func TestSandboxDefaults(t *testing.T) {
	t.Setenv("WICKET_TEST", "host-value")
	e := newEngine(t, Config{Limits: bundle.Limits{PoolSize: 1}})
	ev := compile(t, e, newBundle("go", goPolicy(t), relaxed))

	d := wantDecision(t, ev, input("tool_call", "test.clock", "", nil), policy.Allow, "clock")
	if !strings.HasPrefix(d.Reason, "2022-01-01T00:00:") {
		t.Errorf("clock without grant = %s, want wazero's fake clock (2022-01-01)", d.Reason)
	}
	d = wantDecision(t, ev, input("tool_call", "test.env", "", nil), policy.Allow, "env")
	if d.Reason != "env=" {
		t.Errorf("env without grant = %q", d.Reason)
	}
	d = wantDecision(t, ev, input("tool_call", "test.file", "", nil), policy.Deny, "file")
	if !strings.Contains(d.Reason, "/etc/passwd") {
		t.Errorf("reading /etc/passwd: %q, want an error", d.Reason)
	}
	// Random bytes come from a fixed seed: two fresh instances agree.
	r1 := wantDecision(t, ev, input("tool_call", "test.random", "", nil), policy.Allow, "random").Reason
	ev2 := compile(t, e, newBundle("go2", goPolicy(t), relaxed))
	r2 := wantDecision(t, ev2, input("tool_call", "test.random", "", nil), policy.Allow, "random").Reason
	if r1 != r2 {
		t.Errorf("random without grant differs across instances: %s vs %s", r1, r2)
	}
}

func TestSandboxGrants(t *testing.T) {
	var logs bytes.Buffer
	e := newEngine(t, Config{
		Limits: bundle.Limits{PoolSize: 1},
		Env:    map[string]string{"WICKET_TEST": "configured"},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	sb := relaxed
	sb.Grants = []string{GrantClock, GrantRandom, GrantEnv, GrantStdout}
	ev := compile(t, e, newBundle("granted", goPolicy(t), sb))

	d := wantDecision(t, ev, input("tool_call", "test.clock", "", nil), policy.Allow, "clock")
	if strings.HasPrefix(d.Reason, "2022-") {
		t.Errorf("clock with grant = %s, want the real time", d.Reason)
	}
	d = wantDecision(t, ev, input("tool_call", "test.env", "", nil), policy.Allow, "env")
	if d.Reason != "env=configured" {
		t.Errorf("env with grant = %q, want env=configured", d.Reason)
	}
	wantDecision(t, ev, input("tool_call", "test.print", "", nil), policy.Allow, "print")
	if !strings.Contains(logs.String(), "hello from the policy") || !strings.Contains(logs.String(), "bundle=granted") {
		t.Errorf("stdout grant: log is %q", logs.String())
	}
	r1 := wantDecision(t, ev, input("tool_call", "test.random", "", nil), policy.Allow, "random").Reason
	r2 := wantDecision(t, ev, input("tool_call", "test.random", "", nil), policy.Allow, "random").Reason
	if r1 == r2 {
		t.Errorf("random with grant repeated %s", r1)
	}
}

func TestStdoutNotLoggedWithoutGrant(t *testing.T) {
	var logs bytes.Buffer
	e := newEngine(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ev := compile(t, e, newBundle("quiet", goPolicy(t), relaxed))
	wantDecision(t, ev, input("tool_call", "test.print", "", nil), policy.Allow, "print")
	if logs.Len() != 0 {
		t.Errorf("log without stdout grant: %q", logs.String())
	}
}

func TestCompileRefuses(t *testing.T) {
	good := answer(`null`)
	cases := []struct {
		name string
		b    *bundle.Bundle
		want string
	}{
		{"not wasm engine", func() *bundle.Bundle {
			b := newBundle("x", good, bundle.Sandbox{})
			b.Manifest.Engine = "rego"
			return b
		}(),
			`wasm: bundle engine is "rego", not "wasm"`},
		{"no policy.wasm", &bundle.Bundle{Manifest: bundle.Manifest{Name: "x", Engine: "wasm"}}, "wasm: bundle has no policy.wasm"},
		{"unknown abi", func() *bundle.Bundle { b := newBundle("x", good, bundle.Sandbox{}); b.Manifest.ABI = "wasi"; return b }(),
			`wasm: unknown abi "wasi"`},
		{"unknown grant", newBundle("x", good, bundle.Sandbox{Grants: []string{"network"}}), `wasm: unknown sandbox grant "network"`},
		{"bad timeout", newBundle("x", good, bundle.Sandbox{Timeout: "soon"}), `wasm: bundle.yaml: sandbox.timeout: must be a positive Go duration (e.g. 50ms), got "soon"`},
		{"negative timeout", newBundle("x", good, bundle.Sandbox{Timeout: "-1s"}), "wasm: bundle.yaml: sandbox.timeout: must be a positive"},
		{"huge memory", newBundle("x", good, bundle.Sandbox{MemoryPages: 70000}), "wasm: bundle.yaml: sandbox.memory_pages: 70000 exceeds the kernel's ceiling of 1024 pages (64 MiB) (serve --wasm-max-memory)"},
		{"not wasm", newBundle("x", []byte("hello"), bundle.Sandbox{}), "wasm: compile policy.wasm:"},
		{"forbidden import", newBundle("x", rawModule(rawSpec{
			evaluate: outputAt(0, 0),
			imports:  []wasmImport{{module: "env", name: "http_get", kind: externFunc, typeIndex: typeI32I32}},
		}), bundle.Sandbox{}), "wasm: module imports env.http_get, which is not granted"},
		{"imported memory", newBundle("x", rawModule(rawSpec{
			evaluate: outputAt(0, 0),
			imports:  []wasmImport{{module: "env", name: "memory", kind: externMemory, memory: memLimits{min: 1}}},
			extra:    func(m *wasmModule) { m.memory = nil },
		}), bundle.Sandbox{}), "wasm: module imports memory env.memory, which is not granted"},
		{"missing evaluate", newBundle("x", rawModule(rawSpec{
			evaluate: outputAt(0, 0),
			extra:    func(m *wasmModule) { m.exports = m.exports[:2] },
		}), bundle.Sandbox{}), "wasm: module does not export wicket_evaluate"},
		{"wrong signature", newBundle("x", rawModule(rawSpec{
			evaluate: outputAt(0, 0),
			extra:    func(m *wasmModule) { m.exports[2].index = 0 }, // alloc's type
		}), bundle.Sandbox{}), "wasm: export wicket_evaluate has type (i32) -> (i32), want (i32, i32) -> (i64)"},
		{"command module", newBundle("x", rawModule(rawSpec{
			evaluate: outputAt(0, 0),
			extra: func(m *wasmModule) {
				m.funcs = append(m.funcs, wasmFunc{typeIndex: typeVoid})
				m.exports = append(m.exports, wasmExport{name: "_start", kind: externFunc, index: 2})
			},
		}), bundle.Sandbox{}), "wasm: module is a WASI command (exports _start)"},
		{"abi version", newBundle("x", rawModule(rawSpec{
			evaluate: outputAt(0, 0),
			extra: func(m *wasmModule) {
				m.types = append(m.types, funcType{results: []byte{valI32}})
				m.funcs = append(m.funcs, wasmFunc{typeIndex: 4, code: i32Const(2)})
				m.exports = append(m.exports, wasmExport{name: "wicket_abi_version", kind: externFunc, index: 2})
			},
		}), bundle.Sandbox{}), "wasm: instantiate: module implements Wicket ABI version 2, this host implements 1"},
		{"initialize traps", newBundle("x", rawModule(rawSpec{
			evaluate: outputAt(0, 0),
			extra: func(m *wasmModule) {
				m.funcs = append(m.funcs, wasmFunc{typeIndex: typeVoid, code: []byte{opUnreachable}})
				m.exports = append(m.exports, wasmExport{name: "_initialize", kind: externFunc, index: 2})
			},
		}), bundle.Sandbox{}), "wasm: instantiate: "},
		{"min memory over cap", newBundle("x", rawModule(rawSpec{
			evaluate: outputAt(0, 0),
			memory:   memLimits{min: 20},
		}), bundle.Sandbox{MemoryPages: 16}), "over limit of 16 pages"},
	}
	e := newEngine(t, Config{})
	for _, c := range cases {
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
	// The engine still works after all that.
	ev := compile(t, e, newBundle("good", cPolicy(t), bundle.Sandbox{}))
	wantDecision(t, ev, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule)
}

func TestEvaluatorClosed(t *testing.T) {
	e := newEngine(t, Config{})
	ev, err := e.Compile(context.Background(), newBundle("c", cPolicy(t), bundle.Sandbox{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ev.Evaluate(context.Background(), sdkCases[0].in); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("evaluate after close: %v", err)
	}
	if err := ev.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Compile(context.Background(), newBundle("c", cPolicy(t), bundle.Sandbox{})); err == nil || !strings.Contains(err.Error(), "engine closed") {
		t.Fatalf("compile after close: %v", err)
	}
}

func TestCancelledContext(t *testing.T) {
	ev := compile(t, newEngine(t, Config{}), newBundle("c", cPolicy(t), bundle.Sandbox{}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := ev.Evaluate(ctx, sdkCases[0].in)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled evaluation: %v", err)
	}
	wantDecision(t, ev, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule)
}

func TestEngineName(t *testing.T) {
	if got := New(Config{}).Name(); got != "wasm" {
		t.Fatalf("Name() = %q", got)
	}
}
