package wasm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// Defaults applied by [New] to zero Config fields.
const (
	// DefaultMemoryPages is the default memory cap: 256 pages of 64 KiB = 16 MiB.
	// A Go SDK module starts at 37 pages and levels off near 130 (its heap
	// never shrinks below Go's 4 MiB GC goal); a C SDK module needs 2.
	DefaultMemoryPages = 256
	// DefaultTimeout is the default per-evaluation deadline.
	DefaultTimeout = time.Second
	// MaxMemoryPages is the largest cap a bundle may ask for (4 GiB, wasm32's limit).
	MaxMemoryPages = 65536
	// minInstantiateTimeout is the least time an instantiation (including
	// _initialize and, for OPA, loading data.json) is given.
	minInstantiateTimeout = 5 * time.Second
	// maxOutputBytes bounds a module's output.
	maxOutputBytes = 1 << 20
)

// PolicyFile is the file a wasm bundle must contain.
const PolicyFile = "policy.wasm"

// Config configures an [Engine]. The zero value is usable: no disk cache and
// the defaults below.
type Config struct {
	// CacheDir is where compiled modules are cached across restarts (the
	// kernel passes <data dir>/wasm-cache). It is created if missing. Empty
	// means an in-memory cache only.
	CacheDir string
	// DefaultMemoryPages caps linear memory, in 64 KiB pages, for bundles
	// whose manifest sets no sandbox.memory_pages. Zero means
	// DefaultMemoryPages (256 = 16 MiB).
	DefaultMemoryPages uint32
	// DefaultTimeout is the per-evaluation deadline for bundles whose manifest
	// sets no sandbox.timeout. Zero means DefaultTimeout (1s).
	DefaultTimeout time.Duration
	// PoolSize is the most instances kept per bundle revision, which is also
	// the most concurrent evaluations of one revision; more wait. Zero means
	// runtime.GOMAXPROCS(0).
	PoolSize int
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

	mu       sync.Mutex // guards the fields below
	cache    wazero.CompilationCache
	runtimes map[runtimeKey]*sandboxRuntime
	closed   bool
}

// sandboxRuntime is one wazero runtime, with WASI and the OPA host functions
// instantiated, for one memory cap.
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
	if cfg.DefaultMemoryPages == 0 {
		cfg.DefaultMemoryPages = DefaultMemoryPages
	}
	if cfg.DefaultMemoryPages > MaxMemoryPages {
		cfg.DefaultMemoryPages = MaxMemoryPages
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = DefaultTimeout
	}
	if cfg.PoolSize <= 0 {
		cfg.PoolSize = runtime.GOMAXPROCS(0)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Engine{cfg: cfg, runtimes: map[runtimeKey]*sandboxRuntime{}}
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
// sandbox timeout or memory cap; a module that does not decode or validate,
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
	// OPA modules check their own deadline (instrument.go); the others, and
	// an OPA module that cannot be instrumented, rely on wazero's check.
	fuel := false
	if sb.abi == bundle.ABIOPA {
		if fueled, err := instrumentFuel(bin); err == nil {
			bin, fuel = fueled, true
		}
	}
	rt, err := e.runtime(ctx, sb.pages, fuel)
	if err != nil {
		return nil, err
	}
	// Go modules take about a second to compile: use every CPU.
	cctx := experimental.WithCompilationWorkers(ctx, runtime.GOMAXPROCS(0))
	cm, err := rt.r.CompileModule(cctx, bin)
	if err != nil {
		return nil, fmt.Errorf("wasm: compile %s: %w", PolicyFile, err)
	}
	ev := &evaluator{
		engine: e,
		rt:     rt,
		cm:     cm,
		sb:     sb,
		ref:    b.Ref(),
		idle:   make(chan instance, e.cfg.PoolSize),
		slots:  make(chan struct{}, e.cfg.PoolSize),
	}
	switch sb.abi {
	case bundle.ABIWicket:
		ev.drv, err = newWicketDriver(cm)
	case bundle.ABIOPA:
		ev.drv, err = newOPADriver(ctx, rt, cm, b, e.cfg.Builtins, sb)
	}
	if err != nil {
		_ = cm.Close(ctx)
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

// runtime returns the wazero runtime for a memory cap and kind of deadline
// check, creating it (and the shared compilation cache) on first use.
func (e *Engine) runtime(ctx context.Context, pages uint32, fuel bool) (*sandboxRuntime, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("wasm: engine closed")
	}
	key := runtimeKey{pages: pages, fuel: fuel}
	if rt, ok := e.runtimes[key]; ok {
		return rt, nil
	}
	if e.cache == nil {
		if e.cfg.CacheDir == "" {
			e.cache = wazero.NewCompilationCache()
		} else {
			c, err := wazero.NewCompilationCacheWithDir(e.cfg.CacheDir)
			if err != nil {
				return nil, fmt.Errorf("wasm: compilation cache %s: %w", e.cfg.CacheDir, err)
			}
			e.cache = c
		}
	}
	// NewRuntimeConfig picks wazero's optimising compiler where it is
	// supported (amd64, arm64) and the interpreter elsewhere.
	rc := wazero.NewRuntimeConfig().
		WithCloseOnContextDone(!fuel).
		WithMemoryLimitPages(pages).
		WithCompilationCache(e.cache)
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
	e.runtimes[key] = rt
	return rt, nil
}

// Close releases every runtime and the in-memory compilation cache (the
// disk cache stays). Evaluators compiled by e fail after Close. It is safe to
// call more than once.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	ctx := context.Background()
	var errs []error
	for _, rt := range e.runtimes {
		if err := rt.r.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("wasm: close runtime (%d pages): %w", rt.pages, err))
		}
	}
	e.runtimes = nil
	if e.cache != nil {
		if err := e.cache.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("wasm: close compilation cache: %w", err))
		}
	}
	return errors.Join(errs...)
}
