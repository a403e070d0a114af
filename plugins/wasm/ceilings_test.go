package wasm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// ceilingLimits are small ceilings for the tests below.
var ceilingLimits = bundle.Limits{
	Timeout: 100 * time.Millisecond, MaxTimeout: 2 * time.Second,
	MemoryPages: 16, MaxMemoryPages: 64,
	PoolSize: 1, MaxPoolSize: 3,
	TenantMemory: 8 << 20,
}

// TestCeilings: a manifest asking for more than the engine's limits is
// refused, naming the field, what it asked and the ceiling; at the ceiling
// it compiles and gets exactly what it asked.
func TestCeilings(t *testing.T) {
	e := newEngine(t, Config{Limits: ceilingLimits})
	mod := conditional(memoryBomb)
	for _, c := range []struct {
		name string
		sb   bundle.Sandbox
		want string
	}{
		{"timeout", bundle.Sandbox{Timeout: "87600h"}, "wasm: bundle.yaml: sandbox.timeout: 87600h0m0s exceeds the kernel's ceiling of 2s (serve --sandbox-max-timeout)"},
		{"memory", bundle.Sandbox{MemoryPages: 65536}, "wasm: bundle.yaml: sandbox.memory_pages: 65536 exceeds the kernel's ceiling of 64 pages (4 MiB) (serve --wasm-max-memory)"},
		{"pool", bundle.Sandbox{PoolSize: 4}, "wasm: bundle.yaml: sandbox.pool_size: 4 exceeds the kernel's ceiling of 3 (serve --wasm-max-pool-size)"},
		{"tenant memory", bundle.Sandbox{MemoryPages: 64, PoolSize: 3}, "wasm: bundle.yaml: sandbox: 64 pages (4 MiB) × 3 instances = 12 MiB exceeds the kernel's ceiling of 8 MiB of wasm memory per tenant (serve --wasm-tenant-memory)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.Compile(context.Background(), newBundle("greedy", mod, c.sb))
			if err == nil || err.Error() != c.want {
				t.Fatalf("got %v\nwant %s", err, c.want)
			}
			if !errors.Is(err, bundle.ErrCeiling) {
				t.Errorf("%v does not match bundle.ErrCeiling", err)
			}
		})
	}

	// At the ceilings: what was asked, no more.
	ev := compile(t, e, newBundle("max", mod, bundle.Sandbox{Timeout: "2s", MemoryPages: 64, PoolSize: 2}))
	if ev.sb.timeout != 2*time.Second || ev.sb.pages != 64 || cap(ev.slots) != 2 {
		t.Errorf("sandbox = %s, %d pages, pool %d; want 2s, 64, 2", ev.sb.timeout, ev.sb.pages, cap(ev.slots))
	}
	wantError(t, ev, bigInput(), "memory limit of 64 pages (4 MiB) exhausted")
	// Nothing asked: the defaults.
	def := compile(t, e, newBundle("default", mod, bundle.Sandbox{}))
	if def.sb.timeout != 100*time.Millisecond || def.sb.pages != 16 || cap(def.slots) != 1 || def.sb.startTimeout != 2*time.Second {
		t.Errorf("default sandbox = %s, %d pages, pool %d, start %s; want 100ms, 16, 1, 2s", def.sb.timeout, def.sb.pages, cap(def.slots), def.sb.startTimeout)
	}
	wantError(t, def, bigInput(), "memory limit of 16 pages (1 MiB) exhausted")
}

// loopingStart returns a Wicket-ABI module whose start-up never ends: in
// _initialize, or in the start section.
func loopingStart(startSection bool) []byte {
	return rawModule(rawSpec{
		evaluate: outputAt(0, 0),
		extra: func(m *wasmModule) {
			m.funcs = append(m.funcs, wasmFunc{typeIndex: typeVoid, code: cat(infiniteLoop)})
			idx := uint32(2)
			if startSection {
				m.start = &idx
				return
			}
			m.exports = append(m.exports, wasmExport{name: "_initialize", kind: externFunc, index: idx})
		},
	})
}

// TestStartupDeadline: a module whose start-up loops is stopped at the
// kernel's largest timeout, whatever its manifest asks, and refused.
func TestStartupDeadline(t *testing.T) {
	lim := bundle.Limits{Timeout: 50 * time.Millisecond, MaxTimeout: 300 * time.Millisecond}
	e := newEngine(t, Config{Limits: lim})
	for _, c := range []struct {
		name  string
		start bool
		sb    bundle.Sandbox
	}{
		{"_initialize", false, bundle.Sandbox{}},
		{"start section", true, bundle.Sandbox{}},
		{"short timeout", false, bundle.Sandbox{Timeout: "10ms"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := e.Compile(context.Background(), newBundle("hang", loopingStart(c.start), c.sb))
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "wasm: instantiate: timed out after 300ms") {
					t.Fatalf("compile: %v, want the start-up deadline", err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("start-up not stopped within 60s")
			}
		})
	}
}

// TestBulkMemoryBounded: memory.fill and memory.copy work on at most the
// instance's memory (its cap), and a loop of them is stopped at the
// deadline: one instruction cannot outlast it by more than one pass over
// the capped memory.
func TestBulkMemoryBounded(t *testing.T) {
	memFill := []byte{opMisc, 0x0b, 0}
	memCopy := []byte{opMisc, 0x0a, 0, 0}
	forever := func(body []byte) []byte {
		return cat(growToCap, []byte{opLoop, blockEmpty}, body, []byte{opBr, 0, opEnd, opUnreachable})
	}
	e := newEngine(t, Config{Limits: bundle.Limits{MaxMemoryPages: 1024, MaxTimeout: 2 * time.Second}})
	for _, c := range []struct {
		name, want string
		bad        []byte
	}{
		{"fill past the end", "wasm: trap: out of bounds memory access",
			cat(i32Const(0), i32Const(0xab), i32Const(-1), memFill, []byte{opUnreachable})},
		{"copy past the end", "wasm: trap: out of bounds memory access",
			cat(i32Const(0), i32Const(1<<16), i32Const(-1), memCopy, []byte{opUnreachable})},
		{"fill the whole memory forever", "wasm: evaluation timed out after 200ms",
			forever(cat(i32Const(0), i32Const(0xab), memoryBytes, memFill))},
		{"copy the whole memory forever", "wasm: evaluation timed out after 200ms",
			forever(cat(i32Const(0), i32Const(0), memoryBytes, memCopy))},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev := compile(t, e, newBundle("bulk", conditional(c.bad), bundle.Sandbox{MemoryPages: 1024, Timeout: "200ms"}))
			wantDecision(t, ev, smallInput(), "allow", "ok")
			wantError(t, ev, bigInput(), c.want)
			wantDecision(t, ev, smallInput(), "allow", "ok")
		})
	}
}
