package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/wasm"
	"github.com/wicket-run/wicket/plugins/worker"
)

// wasmCompileCommand is the hidden command serve runs to compile a wasm
// bundle in a process of its own before the kernel does (isolatedWasm).
const wasmCompileCommand = "wasm-compile"

// Defaults of serve --wasm-compile-timeout and --wasm-compile-memory.
const (
	defaultWasmCompileTimeout = time.Minute
	defaultWasmCompileMemory  = 1 << 30
)

// wasmCompileJob is what serve sends the wasm-compile process on its
// standard input: the bundle's files and the engine's configuration.
type wasmCompileJob struct {
	Name     string            `json:"name"`
	Files    map[string][]byte `json:"files"`
	CacheDir string            `json:"cache_dir,omitempty"`
	Limits   bundle.Limits     `json:"limits"`
	Memory   int64             `json:"memory"`
}

// wasmCompileAnswer is what it prints on its standard output.
type wasmCompileAnswer struct {
	Error string `json:"error,omitempty"`
}

// wasmCompile is the wasm-compile command: it confines itself to the job's
// memory, compiles the bundle with the wasm engine serve uses (the same
// disk cache, so that the kernel's own compile then loads the result) and
// instantiates it, and answers whether that worked. Started by serve,
// never by hand.
func wasmCompile(stdin io.Reader, stdout io.Writer) error {
	var job wasmCompileJob
	if err := json.NewDecoder(stdin).Decode(&job); err != nil {
		return fmt.Errorf("wasm-compile: read the job: %w", err)
	}
	if err := worker.Confine(job.Memory); err != nil {
		return err
	}
	answer := wasmCompileAnswer{}
	b, err := bundle.Options{Name: job.Name}.LoadFiles(job.Files)
	if err == nil {
		e := wasm.New(wasm.Config{CacheDir: job.CacheDir, Limits: job.Limits, Builtins: rego.NewHostBuiltins(),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		var ev policy.Evaluator
		if ev, err = e.Compile(context.Background(), b); err == nil {
			err = ev.Close()
		}
		_ = e.Close()
	}
	if err != nil {
		answer.Error = err.Error()
	}
	return json.NewEncoder(stdout).Encode(answer)
}

// isolatedWasm is serve's wasm engine: each bundle is compiled first in a
// wasm-compile process under --wasm-compile-memory and
// --wasm-compile-timeout, and only once that worked by the kernel, which
// then loads the machine code the process left in the disk cache. wazero
// cannot stop inside the compilation of one function, and some small
// modules take minutes or gigabytes to compile: in the kernel, one
// tenant's upload would take the cores and memory every tenant shares.
// At most one such process runs per tenant, and at most GOMAXPROCS in all.
type isolatedWasm struct {
	*wasm.Engine
	exe      string
	cacheDir string
	limits   bundle.Limits
	memory   int64
	timeout  time.Duration

	all     chan struct{}
	tenants *tenantSlots
}

func newIsolatedWasm(e *wasm.Engine, exe, cacheDir string, limits bundle.Limits, memory int64, timeout time.Duration) *isolatedWasm {
	return &isolatedWasm{Engine: e, exe: exe, cacheDir: cacheDir, limits: limits, memory: memory, timeout: timeout,
		all: make(chan struct{}, runtime.GOMAXPROCS(0)), tenants: newTenantSlots()}
}

// Compile compiles b in a wasm-compile process, then in the kernel.
func (w *isolatedWasm) Compile(ctx context.Context, b *bundle.Bundle) (policy.Evaluator, error) {
	if b == nil || b.Manifest.Engine != bundle.EngineWasm {
		return w.Engine.Compile(ctx, b) // its own precise refusal
	}
	release, err := w.tenants.take(ctx, plugins.TenantFrom(ctx))
	if err != nil {
		return nil, fmt.Errorf("wasm: waiting for the tenant's other compile: %w", err)
	}
	defer release()
	select {
	case w.all <- struct{}{}:
		defer func() { <-w.all }()
	case <-ctx.Done():
		return nil, fmt.Errorf("wasm: waiting to compile: %w", ctx.Err())
	}
	if err := w.precompile(ctx, b); err != nil {
		return nil, err
	}
	return w.Engine.Compile(ctx, b)
}

// precompile runs the wasm-compile process for b and returns its refusal,
// or why it did not finish.
func (w *isolatedWasm) precompile(ctx context.Context, b *bundle.Bundle) error {
	job, err := json.Marshal(wasmCompileJob{Name: b.Manifest.Name, Files: b.Files, CacheDir: w.cacheDir, Limits: w.limits, Memory: w.memory})
	if err != nil {
		return fmt.Errorf("wasm: compile job: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, w.exe, wasmCompileCommand)
	cmd.Env = []string{} // as a Rego worker's: nothing of the kernel's environment (keys) reaches it
	cmd.Stdin = bytes.NewReader(job)
	var out bytes.Buffer
	stderr := &worker.Stderr{}
	cmd.Stdout, cmd.Stderr = &out, stderr
	runErr := cmd.Run()
	var answer wasmCompileAnswer
	if runErr == nil && json.Unmarshal(out.Bytes(), &answer) == nil {
		if answer.Error != "" {
			return errors.New(answer.Error)
		}
		return nil
	}
	switch {
	case errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
		return fmt.Errorf("wasm: compile %s: not done within %s (serve --wasm-compile-timeout): the module is refused", wasm.PolicyFile, w.timeout)
	case ctx.Err() != nil:
		return fmt.Errorf("wasm: compile %s: %w", wasm.PolicyFile, ctx.Err())
	case stderr.DiedOfMemory():
		return fmt.Errorf("wasm: compile %s: over the compile memory limit of %s (serve --wasm-compile-memory): the module is refused", wasm.PolicyFile, bundle.BytesString(w.memory))
	}
	return fmt.Errorf("wasm: compile %s: the compiling process failed (%v): %s", wasm.PolicyFile, runErr, stderr.Summary())
}

// tenantSlots lets one job per tenant run at a time.
type tenantSlots struct {
	mu   sync.Mutex
	busy map[string]chan struct{} // closed when the tenant's job ends
}

func newTenantSlots() *tenantSlots { return &tenantSlots{busy: map[string]chan struct{}{}} }

// take waits for tenant's slot; release gives it back.
func (s *tenantSlots) take(ctx context.Context, tenant string) (release func(), err error) {
	for {
		s.mu.Lock()
		done, busy := s.busy[tenant]
		if !busy {
			mine := make(chan struct{})
			s.busy[tenant] = mine
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.busy, tenant)
				s.mu.Unlock()
				close(mine)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// isolateWasm returns the wasm engine serve uses: compiles isolated in
// wasm-compile processes (the default), or in the kernel with
// --wasm-isolation none.
func isolateWasm(o *limitOptions, e *wasm.Engine, cacheDir string, limits bundle.Limits) (plugins.Engine, error) {
	switch o.wasmIsolation {
	case "none":
		return e, nil
	case "process":
	default:
		return nil, usageError{fmt.Sprintf("serve: --wasm-isolation %q: want process or none", o.wasmIsolation)}
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("serve: find the wicket executable for wasm compiles: %w", err)
	}
	return newIsolatedWasm(e, exe, cacheDir, limits, int64(o.wasmCompileMemory), o.wasmCompileTimeout), nil
}
