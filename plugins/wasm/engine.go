package wasm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

const (
	// maxOutputBytes bounds a module's output.
	maxOutputBytes = 1 << 20
)

// PolicyFile is the file a wasm bundle must contain.
const PolicyFile = "policy.wasm"

// Config configures an [Engine]. The zero value is usable: no disk cache and
// the default limits.
type Config struct {
	// CacheDir is where compiled modules are cached across restarts (the
	// kernel passes <data dir>/wasm-cache), one subdirectory per module
	// (named by the SHA-256 of its bytes). It is created if missing, with
	// mode 0700; a directory that group or others may write is refused (its
	// files are machine code the kernel runs). Empty means an in-memory
	// cache only. See [Engine.PruneCache].
	CacheDir string
	// CacheMaxBytes caps the size of CacheDir (zero: DefaultCacheMaxBytes).
	CacheMaxBytes int64
	// Limits are the kernel's ceilings and defaults for sandbox.timeout,
	// sandbox.memory_pages and sandbox.pool_size (zero fields: the
	// defaults of [bundle.Limits]). A bundle asking for more is refused.
	// Instances start under Limits.MaxTimeout.
	Limits bundle.Limits
	// Env holds the environment variables visible to modules granted "env".
	// Nil means none: the kernel's own environment is never passed through.
	Env map[string]string
	// Logger receives module output of bundles granted "stdout" (nil:
	// slog.Default()).
	Logger *slog.Logger
	// Builtins implements the builtins OPA-compiled modules import from
	// their host (sprintf, time.*, …): rego.NewHostBuiltins(). Nil refuses
	// every OPA module that imports one.
	Builtins HostBuiltins
}

// Engine compiles wasm bundles into evaluators. It is safe for concurrent
// use. Close it to release the wazero runtimes; evaluators it produced stop
// working then.
type Engine struct {
	cfg Config

	mu      sync.Mutex         // guards the fields below
	modules map[string]*module // by digest, while an evaluator uses them
	closed  bool
}

// sandboxRuntime is one wazero runtime, with WASI and the OPA host functions
// instantiated, for one module and memory cap.
type sandboxRuntime struct {
	r     wazero.Runtime
	pages uint32
	// fuel is set for the runtime of modules that check their deadline
	// themselves (instrumentFuel): it compiles without wazero's per-loop
	// check.
	fuel bool
}

// runtimeKey identifies a runtime: a memory cap, and whether its modules
// are instrumented with fuel.
type runtimeKey struct {
	pages uint32
	fuel  bool
}

// New returns an engine configured by cfg, with defaults filled in. Nothing
// is created on disk until the first Compile.
func New(cfg Config) *Engine {
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.CacheMaxBytes <= 0 {
		cfg.CacheMaxBytes = DefaultCacheMaxBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Engine{cfg: cfg, modules: map[string]*module{}}
}

// Name returns "wasm", the manifest engine this engine serves.
func (e *Engine) Name() string { return bundle.EngineWasm }

// Compile validates and prepares a wasm bundle: it compiles policy.wasm (or
// loads it from the disk cache), checks imports, exports and grants against
// the bundle's ABI and sandbox, and instantiates one instance.
//
// # Errors
//
// Compile refuses, with an error naming the cause: a bundle that is not a
// wasm bundle or has no policy.wasm; an unknown ABI or grant; an invalid
// sandbox timeout, memory cap or pool size, or one over the engine's
// [Config.Limits] (matching [bundle.ErrCeiling]); a module that does not decode or validate,
// declares more memory than the cap, imports anything the ABI and grants do
// not allow ("wasm: module imports env.http_get, which is not granted"),
// lacks a required export, or fails to initialise.
func (e *Engine) Compile(ctx context.Context, b *bundle.Bundle) (policy.Evaluator, error) {
	if b == nil {
		return nil, errors.New("wasm: nil bundle")
	}
	if b.Manifest.Engine != bundle.EngineWasm {
		return nil, fmt.Errorf("wasm: bundle engine is %q, not %q", b.Manifest.Engine, bundle.EngineWasm)
	}
	sb, err := e.sandboxFor(&b.Manifest)
	if err != nil {
		return nil, err
	}
	bin, ok := b.Files[PolicyFile]
	if !ok {
		return nil, fmt.Errorf("wasm: bundle has no %s", PolicyFile)
	}
	// Tables are outside the memory cap: bound them (tables.go).
	capped, err := capTables(bin)
	if err != nil {
		return nil, fmt.Errorf("wasm: %s: %w", PolicyFile, err)
	}
	// The cache entry is named by the module as uploaded.
	mod, err := e.acquire(bin)
	if err != nil {
		return nil, err
	}
	// OPA modules check their own deadline (instrument.go); the others, and
	// an OPA module that cannot be instrumented, rely on wazero's check.
	bin, fuel := capped, false
	if sb.abi == bundle.ABIOPA {
		if fueled, err := instrumentFuel(bin); err == nil {
			bin, fuel = fueled, true
		}
	}
	rt, err := e.runtime(ctx, mod, sb.pages, fuel)
	if err != nil {
		e.release(mod)
		return nil, err
	}
	// Go modules take about a second to compile: use every CPU.
	cctx := experimental.WithCompilationWorkers(ctx, runtime.GOMAXPROCS(0))
	cm, err := rt.r.CompileModule(cctx, bin)
	if err != nil && mod.dir != "" && strings.Contains(err.Error(), "compilationcache:") {
		// The machine code on disk is damaged (a truncated or corrupted
		// file: wazero checks its length and checksum): drop it and
		// compile again, rather than refuse a good module for ever.
		e.cfg.Logger.Warn("wasm: compilation cache entry unreadable, compiling again", "dir", mod.dir, "err", err)
		if rerr := e.forgetCompiled(mod); rerr != nil {
			err = fmt.Errorf("%w (and removing it: %v)", err, rerr)
		} else {
			cm, err = rt.r.CompileModule(cctx, bin)
		}
	}
	e.compiled(mod)
	if err != nil {
		e.release(mod)
		return nil, fmt.Errorf("wasm: compile %s: %w", PolicyFile, err)
	}
	ev := &evaluator{
		engine: e,
		mod:    mod,
		rt:     rt,
		cm:     cm,
		sb:     sb,
		ref:    b.Ref(),
		idle:   make(chan instance, sb.pool),
		slots:  make(chan struct{}, sb.pool),
	}
	switch sb.abi {
	case bundle.ABIWicket:
		ev.drv, err = newWicketDriver(cm)
	case bundle.ABIOPA:
		ev.drv, err = newOPADriver(ctx, rt, cm, b, e.cfg.Builtins, sb)
	}
	if err != nil {
		_ = cm.Close(ctx)
		e.release(mod)
		return nil, err
	}
	// Prove the module starts (and, for OPA, that data.json and the
	// entrypoint are usable) now, so a bad bundle is refused whole.
	inst, err := ev.instantiate(ctx)
	if err != nil {
		_ = ev.Close()
		return nil, err
	}
	ev.idle <- inst
	return ev, nil
}

// runtime returns mod's wazero runtime for a memory cap and kind of
// deadline check, creating it on first use.
func (e *Engine) runtime(ctx context.Context, mod *module, pages uint32, fuel bool) (*sandboxRuntime, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("wasm: engine closed")
	}
	key := runtimeKey{pages: pages, fuel: fuel}
	if rt, ok := mod.runtimes[key]; ok {
		return rt, nil
	}
	// NewRuntimeConfig picks wazero's optimising compiler where it is
	// supported (amd64, arm64) and the interpreter elsewhere.
	rc := wazero.NewRuntimeConfig().
		WithCloseOnContextDone(!fuel).
		WithMemoryLimitPages(pages).
		WithCompilationCache(mod.cache)
	r := wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r); err != nil {
		_ = r.Close(ctx)
		return nil, fmt.Errorf("wasm: instantiate WASI: %w", err)
	}
	if err := instantiateOPAHost(ctx, r); err != nil {
		_ = r.Close(ctx)
		return nil, err
	}
	rt := &sandboxRuntime{r: r, pages: pages, fuel: fuel}
	mod.runtimes[key] = rt
	return rt, nil
}

// Close releases every runtime and in-memory compilation cache (the disk
// cache stays). Evaluators compiled by e fail after Close. It is safe to
// call more than once.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	var errs []error
	for _, m := range e.modules {
		errs = append(errs, m.close())
	}
	e.modules = nil
	return errors.Join(errs...)
}
