package main

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/wasm"
)

// TestMain lets this test binary stand for wicket where serve starts
// itself for a hidden command (isolatedWasm's wasm-compile process).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == wasmCompileCommand {
		if err := wasmCompile(os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// wicketModule is a module of Wicket's ABI (memory, wicket_alloc,
// wicket_evaluate) whose wicket_evaluate has body (its locals and code,
// without the trailing end).
func wicketModule(body []byte) []byte {
	section := func(id byte, content []byte) []byte {
		return append(append([]byte{id}, binary.AppendUvarint(nil, uint64(len(content)))...), content...)
	}
	types := []byte{0x04, 0x60, 0x01, 0x7f, 0x01, 0x7f, 0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7e, 0x60, 0x00, 0x00, 0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7f}
	exports := []byte{0x03}
	for _, e := range []struct {
		name string
		kind byte
		idx  byte
	}{{"memory", 2, 0}, {"wicket_alloc", 0, 0}, {"wicket_evaluate", 0, 1}} {
		exports = append(append(append(exports, byte(len(e.name))), e.name...), e.kind, e.idx)
	}
	alloc := []byte{0x05, 0x00, 0x41, 0x80, 0x08, 0x0b}
	eval := append(body, 0x0b)
	code := append(append([]byte{0x02}, alloc...), binary.AppendUvarint(nil, uint64(len(eval)))...)
	code = append(code, eval...)
	m := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	m = append(m, section(0x01, types)...)
	m = append(m, section(0x03, []byte{0x02, 0x00, 0x01})...)
	m = append(m, section(0x05, []byte{0x01, 0x00, 0x01})...)
	m = append(m, section(0x07, exports)...)
	return append(m, section(0x0a, code)...)
}

// brTableBomb is a wicket_evaluate whose one br_table has n targets, all to
// the same block: wazero's compile of it is quadratic in n (2,000,000 took
// over ten minutes here).
func brTableBomb(n int) []byte {
	b := []byte{0x00, 0x02, 0x40, 0x20, 0x00, 0x0e}
	b = binary.AppendUvarint(b, uint64(n))
	b = append(b, make([]byte, n+1)...) // every target and the default: label 0
	return append(b, 0x0b, 0x42, 0x00)
}

// addChain is a wicket_evaluate of n additions in one expression: its
// compile holds about 500 bytes per addition (1M took 558 MB here).
func addChain(n int) []byte {
	b := []byte{0x00, 0x41, 0x00}
	for range n {
		b = append(b, 0x41, 0x01, 0x6a)
	}
	return append(b, 0x1a, 0x42, 0x00)
}

func wasmBundle(t *testing.T, name string, module []byte) *bundle.Bundle {
	t.Helper()
	b, err := bundle.LoadFiles(map[string][]byte{"bundle.yaml": []byte("name: " + name + "\nengine: wasm\n"), "policy.wasm": module})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWasmCompileIsolated: serve compiles a wasm module first in a process
// of its own. A good module compiles and evaluates (the kernel's compile
// then loads the process's machine code from the disk cache); a module
// whose compile does not end in time, or needs more memory than the cap,
// is refused with the flag to change, and the kernel never compiles it.
func TestWasmCompileIsolated(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(t.TempDir(), "wasm-cache")
	limits := bundle.Limits{}.WithDefaults()
	inner := wasm.New(wasm.Config{CacheDir: cache, Limits: limits})
	defer inner.Close()
	e := newIsolatedWasm(inner, exe, cache, limits, 256<<20, 5*time.Second)
	ctx := plugins.WithTenant(context.Background(), "acme")

	// The good module: a tiny wicket_evaluate returning 0 (no answer).
	ev, err := e.Compile(ctx, wasmBundle(t, "good", wicketModule([]byte{0x00, 0x42, 0x00})))
	if err != nil {
		t.Fatalf("good module: %v", err)
	}
	_ = ev.Close()
	if entries, err := os.ReadDir(cache); err != nil || len(entries) == 0 {
		t.Errorf("the compiling process left nothing in the disk cache: %v %v", entries, err)
	}

	start := time.Now()
	_, err = e.Compile(ctx, wasmBundle(t, "slow", wicketModule(brTableBomb(2_000_000))))
	if err == nil || !strings.Contains(err.Error(), "not done within 5s (serve --wasm-compile-timeout): the module is refused") {
		t.Fatalf("compile bomb: %v", err)
	}
	if took := time.Since(start); took > time.Minute {
		t.Errorf("the refusal took %s", took)
	}

	// The memory cap is measured without the race detector, whose shadow
	// memory counts against it (.ci/run runs this test without it too).
	if !raceEnabled {
		_, err = e.Compile(ctx, wasmBundle(t, "fat", wicketModule(addChain(1_000_000))))
		if err == nil || !strings.Contains(err.Error(), "over the compile memory limit of 256 MiB (serve --wasm-compile-memory)") {
			t.Fatalf("memory bomb: %v", err)
		}
	}

	// A module the engine refuses is refused with the engine's own words.
	_, err = e.Compile(ctx, wasmBundle(t, "broken", []byte("\x00asm\x01\x00\x00\x00\x05")))
	if err == nil || !strings.Contains(err.Error(), "wasm:") {
		t.Fatalf("broken module: %v", err)
	}
}

// TestTenantSlots: one wasm compile per tenant at a time: a second of the
// same tenant waits (here: gives up with its context), another tenant's
// does not, and the slot is free again once released.
func TestTenantSlots(t *testing.T) {
	s := newTenantSlots()
	release, err := s.take(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.take(done, "acme"); err == nil {
		t.Fatal("a second compile of the tenant did not wait")
	}
	other, err := s.take(done, "globex")
	if err != nil {
		t.Fatalf("another tenant waited: %v", err)
	}
	other()
	waited := make(chan error, 1)
	go func() {
		r, err := s.take(context.Background(), "acme")
		if err == nil {
			r()
		}
		waited <- err
	}()
	release()
	if err := <-waited; err != nil {
		t.Fatalf("after the release: %v", err)
	}
}
