package wasm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
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
	// kernel passes <data dir>/wasm-cache). It is created if missing, with
	// mode 0700; an existing directory that group or others may write is
	// refused. Empty means an in-memory cache only.
	CacheDir string
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
}

// Engine compiles wasm bundles into evaluators. It is safe for concurrent
// use. Close it to release the wazero runtimes; evaluators it produced stop
// working then.
type Engine struct {
	cfg Config

	mu       sync.Mutex // guards the fields below
	cache    wazero.CompilationCache
	runtimes map[uint32]*sandboxRuntime // by memory cap in pages
	closed   bool
}

// sandboxRuntime is one wazero runtime, with WASI and the OPA host functions
// instantiated, for one memory cap.
type sandboxRuntime struct {
	r     wazero.Runtime
	pages uint32
}

// New returns an engine configured by cfg, with defaults filled in. Nothing
// is created on disk until the first Compile.
func New(cfg Config) *Engine {
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Engine{cfg: cfg, runtimes: map[uint32]*sandboxRuntime{}}
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
	rt, err := e.runtime(ctx, sb.pages)
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
		idle:   make(chan instance, sb.pool),
		slots:  make(chan struct{}, sb.pool),
	}
	switch sb.abi {
	case bundle.ABIWicket:
		ev.drv, err = newWicketDriver(cm)
	case bundle.ABIOPA:
		ev.drv, err = newOPADriver(ctx, rt, cm, b)
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

// runtime returns the wazero runtime for a memory cap, creating it (and the
// shared compilation cache) on first use.
func (e *Engine) runtime(ctx context.Context, pages uint32) (*sandboxRuntime, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("wasm: engine closed")
	}
	if rt, ok := e.runtimes[pages]; ok {
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
		WithCloseOnContextDone(true).
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
	rt := &sandboxRuntime{r: r, pages: pages}
	e.runtimes[pages] = rt
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
