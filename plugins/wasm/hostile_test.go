package wasm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

const goodAnswer = `{"decision":"allow","rule_id":"ok"}`

// conditional is a module that misbehaves (runs bad as wicket_evaluate's
// body) only when the input is longer than 1000 bytes, and otherwise answers
// goodAnswer. A good evaluation after a bad one on the same evaluator shows
// that the failed instance was replaced.
func conditional(bad []byte) []byte {
	const (
		opIf   = 0x04
		opEnd  = 0x0b
		opI32G = 0x4b // i32.gt_u
	)
	body := cat(
		[]byte{opLocalGet, 1}, i32Const(1000), []byte{opI32G, opIf, blockEmpty},
		bad,
		[]byte{opEnd},
		outputAt(2048, uint32(len(goodAnswer))),
	)
	return rawModule(rawSpec{evaluate: body, data: []wasmData{{offset: 2048, bytes: []byte(goodAnswer)}}})
}

// bigInput is longer than conditional's threshold.
func bigInput() *policy.Input {
	return input("tool_call", "bad", "", map[string]any{"pad": strings.Repeat("x", 2000)})
}

func smallInput() *policy.Input { return input("tool_call", "good", "", nil) }

// Bodies of misbehaving evaluations. Each leaves a value-polymorphic stack
// (ends in unreachable or an unconditional branch) so it type-checks inside
// the if.
var (
	infiniteLoop = []byte{opLoop, blockEmpty, opBr, 0, 0x0b, opUnreachable}
	// memoryBomb grows memory to the cap, then traps.
	memoryBomb = cat(growToCap, []byte{opUnreachable})
	trap       = []byte{opUnreachable}
	// recurse calls wicket_evaluate (function 1) forever.
	recurse = []byte{opLocalGet, 0, opLocalGet, 1, opCall, 1, 0x0f /* return */}
	// answerAt returns output at ptr/len.
	answerAt = func(ptr, n uint32) []byte { return cat(outputAt(ptr, n), []byte{0x0f}) }
)

func TestHostileModules(t *testing.T) {
	garbage := func(s string) ([]byte, []wasmData) {
		return answerAt(4096, uint32(len(s))), []wasmData{{offset: 4096, bytes: []byte(s)}}
	}
	type hostile struct {
		name string
		bad  []byte
		data []wasmData
		sb   bundle.Sandbox
		want string
	}
	cases := []hostile{
		{name: "infinite loop", bad: infiniteLoop, sb: bundle.Sandbox{Timeout: "100ms"}, want: "wasm: evaluation timed out after 100ms"},
		{name: "memory bomb", bad: memoryBomb, sb: bundle.Sandbox{MemoryPages: 32},
			want: "wasm: memory limit of 32 pages (2 MiB) exhausted: trap: unreachable"},
		{name: "trap", bad: trap, want: "wasm: trap: unreachable"},
		{name: "stack overflow", bad: recurse, want: "wasm: trap: stack overflow"},
		{name: "output out of bounds", bad: answerAt(0xffff0000, 100), want: "wasm: output out of bounds: ptr=4294901760 len=100 memory=65536 bytes"},
		{name: "output too large", bad: answerAt(0, 2<<20), want: "wasm: output too large: 2097152 bytes"},
	}
	for _, g := range []struct{ name, out, want string }{
		{"not json", "not json", `wasm: output is not valid JSON: "not json"`},
		{"truncated json", `{"decision":"allow"`, `wasm: output is not valid JSON`},
		{"unknown decision", `{"decision":"maybe"}`, `wasm: invalid decision: unknown decision "maybe"`},
		{"array", `[1,2]`, `wasm: output is not a decision: want a JSON object or null, got "[1,2]"`},
		{"no decision", `{"reason":"x"}`, `wasm: output is not a decision: no decision field`},
		{"misspelt field", `{"decision":"allow","reson":"x"}`, `wasm: output is not a decision: json: unknown field "reson"`},
		{"wrong type", `{"decision":7}`, `wasm: output is not a decision: json: cannot unmarshal number`},
		{"bad rate limit", `{"decision":"allow","rate_limit":{"max_calls":0,"window":"1m"}}`, `wasm: invalid decision: rate_limit.max_calls must be > 0`},
		{"policy error", `{"error":"cannot read\nconfig"}`, `wasm: policy error: cannot read config`},
	} {
		bad, data := garbage(g.out)
		cases = append(cases, hostile{name: g.name, bad: bad, data: data, want: g.want})
	}

	e := newEngine(t, Config{Limits: bundle.Limits{PoolSize: 2}})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mod := conditional(c.bad)
			if c.data != nil {
				mod = rawModule(rawSpec{
					evaluate: cat([]byte{opLocalGet, 1}, i32Const(1000), []byte{0x4b, 0x04, blockEmpty}, c.bad, []byte{0x0b},
						outputAt(2048, uint32(len(goodAnswer)))),
					data: append([]wasmData{{offset: 2048, bytes: []byte(goodAnswer)}}, c.data...),
				})
			}
			ev := compile(t, e, newBundle("hostile", mod, c.sb))
			wantDecision(t, ev, smallInput(), policy.Allow, "ok")
			before := ev.instances.Load()
			wantError(t, ev, bigInput(), c.want)
			// The failed instance is gone: the next evaluation works, on a new instance.
			wantDecision(t, ev, smallInput(), policy.Allow, "ok")
			if got := ev.instances.Load(); got != before+1 {
				t.Errorf("instances after failure = %d, want %d (a fresh one)", got, before+1)
			}
			// And the engine serves other bundles.
			other := compile(t, e, newBundle("c", cPolicy(t), bundle.Sandbox{}))
			wantDecision(t, other, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule)
		})
	}
}

func TestTimeoutIsDeadlineExceeded(t *testing.T) {
	ev := compile(t, newEngine(t, Config{Limits: bundle.Limits{Timeout: 50 * time.Millisecond}}), newBundle("loop", conditional(infiniteLoop), bundle.Sandbox{}))
	err := wantError(t, ev, bigInput(), "wasm: evaluation timed out after 50ms")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(%v, context.DeadlineExceeded) = false", err)
	}
	// A caller's own deadline is reported as cancellation, not as the module's timeout.
	ev2 := compile(t, newEngine(t, Config{Limits: bundle.Limits{Timeout: 10 * time.Second}}), newBundle("loop", conditional(infiniteLoop), bundle.Sandbox{}))
	// The deadline is long enough for the evaluation to start on a loaded
	// machine (a deadline that passes while it waits for an instance is
	// another error), and far shorter than the module's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := ev2.Evaluate(ctx, bigInput()); err == nil || !strings.Contains(err.Error(), "wasm: evaluation cancelled: context deadline exceeded") {
		t.Fatalf("caller deadline: %v", err)
	}
}

func TestAllocFailures(t *testing.T) {
	e := newEngine(t, Config{})
	for _, c := range []struct {
		name  string
		alloc []byte
		want  string
	}{
		{"alloc returns 0", i32Const(0), "wasm: wicket_alloc("},
		{"alloc out of bounds", i32Const(0x7fffff00), "returned out-of-bounds pointer 2147483392 (memory is 65536 bytes)"},
		{"alloc traps", []byte{opUnreachable}, "wasm: trap: unreachable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev := compile(t, e, newBundle("alloc", rawModule(rawSpec{alloc: c.alloc, evaluate: outputAt(0, 0)}), bundle.Sandbox{}))
			wantError(t, ev, smallInput(), c.want)
		})
	}
}

// TestMemoryCapPerBundle runs the same module under two caps in one engine:
// each bundle gets its own limit. The bomb reaches its cap in a few dozen
// memory.grow calls whatever the cap, so the deadline is never the answer.
func TestMemoryCapPerBundle(t *testing.T) {
	e := newEngine(t, Config{})
	mod := conditional(memoryBomb)
	small := compile(t, e, newBundle("small", mod, bundle.Sandbox{MemoryPages: 8, Timeout: "20s"}))
	large := compile(t, e, newBundle("large", mod, bundle.Sandbox{MemoryPages: 64, Timeout: "20s"}))
	def := compile(t, e, newBundle("default", mod, bundle.Sandbox{Timeout: "20s"}))
	wantError(t, small, bigInput(), "memory limit of 8 pages (512 KiB) exhausted")
	wantError(t, large, bigInput(), "memory limit of 64 pages (4 MiB) exhausted")
	wantError(t, def, bigInput(), "memory limit of 256 pages (16 MiB) exhausted")
	wantError(t, small, bigInput(), "memory limit of 8 pages (512 KiB) exhausted")
}

func TestGoHostile(t *testing.T) {
	e := newEngine(t, Config{})
	good := func(ev *evaluator) { wantDecision(t, ev, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule) }

	loop := compile(t, e, newBundle("go", goPolicy(t), bundle.Sandbox{Timeout: "300ms"}))
	wantError(t, loop, input("tool_call", "test.loop", "", nil), "wasm: evaluation timed out after 300ms")
	loop.sb.timeout = 5 * time.Second // the good evaluation must not flake on a loaded machine
	good(loop)

	bomb := compile(t, e, newBundle("go", goPolicy(t), bundle.Sandbox{Timeout: "10s", MemoryPages: 128}))
	err := wantError(t, bomb, input("tool_call", "test.bomb", "", nil), "wasm: memory limit of 128 pages (8 MiB) exhausted: ")
	if !strings.Contains(err.Error(), "fatal error: out of memory") {
		t.Errorf("Go memory bomb: %q does not quote Go's fatal error", err)
	}
	t.Logf("Go memory bomb: %v", err)
	good(bomb)
}

// TestTablesBounded: a module's tables are outside its capped linear
// memory, and wazero keeps 8 bytes per element in the kernel's memory. A
// 160-byte module declaring a table of 134,217,728 elements (wazero's own
// limit) and filling it, or growing a small one that far, took 1 GiB of the
// kernel per instance, past every ceiling. Tables now hold at most
// MaxTableElements together: larger tables are refused at load, and
// table.grow fails past the bound as memory.grow fails past the cap.
func TestTablesBounded(t *testing.T) {
	e := newEngine(t, Config{})
	withTables := func(evaluate []byte, tables ...memLimits) []byte {
		return rawModule(rawSpec{
			evaluate: cat(evaluate, outputAt(2048, uint32(len(goodAnswer)))),
			data:     []wasmData{{offset: 2048, bytes: []byte(goodAnswer)}},
			extra:    func(m *wasmModule) { m.tables = tables },
		})
	}
	for _, c := range []struct {
		name   string
		tables []memLimits
	}{
		{"one huge table", []memLimits{{min: 134217728}}},
		{"two tables over the bound together", []memLimits{{min: MaxTableElements / 2}, {min: MaxTableElements/2 + 1, max: MaxTableElements, hasMax: true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.Compile(context.Background(), newBundle("tables", withTables(nil, c.tables...), bundle.Sandbox{}))
			if err == nil || !strings.Contains(err.Error(), "over the limit of 1048576") {
				t.Fatalf("compile: %v, want a refusal naming the limit", err)
			}
		})
	}
	// grow (i32 n) → table.grow 0 (ref.null func) n, then trap unless the
	// result is (want == -1) or is not (want != -1) -1.
	grow := func(n int32, failed bool) []byte {
		cmp := byte(0x46) // i32.eq: trap when the grow failed
		if failed {
			cmp = 0x47 // i32.ne: trap when it did not
		}
		return cat([]byte{0xd0, 0x70}, i32Const(n), []byte{0xfc, 15, 0}, i32Const(-1), []byte{cmp, 0x04, blockEmpty, opUnreachable, 0x0b})
	}
	t.Run("grow", func(t *testing.T) {
		// A table without a maximum grows within the bound, not past it.
		ev := compile(t, e, newBundle("grow", withTables(cat(grow(1000, false), grow(134217000, true)), memLimits{min: 1}), bundle.Sandbox{}))
		wantDecision(t, ev, smallInput(), policy.Allow, "ok")
		// Up to the bound exactly, and a module's own smaller maximum holds.
		ev = compile(t, e, newBundle("grow", withTables(cat(grow(MaxTableElements-11, false), grow(1, true)), memLimits{min: 10}, memLimits{min: 1, max: 5, hasMax: true}), bundle.Sandbox{}))
		wantDecision(t, ev, smallInput(), policy.Allow, "ok")
		ev = compile(t, e, newBundle("grow", withTables(grow(5, true), memLimits{min: 1, max: 5, hasMax: true}), bundle.Sandbox{}))
		wantDecision(t, ev, smallInput(), policy.Allow, "ok")
	})
}
