package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/wasm"
	"github.com/wicket-run/wicket/plugins/worker"
)

// checkPrivateDir refuses a directory of the data dir (the data dir itself,
// its wasm cache) that group or others may write, as the store file is
// refused: whoever can write there can replace the store or plant machine
// code the kernel runs. A missing directory is fine (it is created 0700).
func checkPrivateDir(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("serve: %s is not a directory", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("serve: %s is writable by group or others (mode %04o): chmod 700 it", dir, perm)
	}
	return nil
}

// limitOptions are the serve flags of the kernel's ceilings on what a
// bundle's manifest may ask for (bundle.Limits).
type limitOptions struct {
	timeout, maxTimeout   time.Duration
	memory, maxMemory     byteSize
	poolSize, maxPoolSize int
	tenantMemory          byteSize
	bundleLoadTimeout     time.Duration
	// bundleLoadTenantBudget: kernel.Config.BundleLoadTenantBudget.
	bundleLoadTenantBudget time.Duration
	cacheMax               byteSize
	regoIsolation          string
	regoMemory             byteSize
	// wasmIsolation, wasmCompileMemory and wasmCompileTimeout: how serve
	// compiles wasm modules (isolateWasm).
	wasmIsolation      string
	wasmCompileMemory  byteSize
	wasmCompileTimeout time.Duration
	// tenantBundles and tenantBundleBytes: kernel.Config.MaxTenantBundles
	// and MaxTenantBundleBytes.
	tenantBundles     int
	tenantBundleBytes byteSize
	// tenantAgents and tenantKeys: kernel.Config.MaxTenantAgents and
	// MaxTenantKeys.
	tenantAgents, tenantKeys int
}

func limitFlags(o *limitOptions, fs *flag.FlagSet) {
	d := bundle.Limits{}.WithDefaults()
	fs.DurationVar(&o.timeout, "sandbox-timeout", envDuration("WICKET_SANDBOX_TIMEOUT", d.Timeout), "per-evaluation deadline of a bundle whose manifest sets no sandbox.timeout (WICKET_SANDBOX_TIMEOUT)")
	fs.DurationVar(&o.maxTimeout, "sandbox-max-timeout", envDuration("WICKET_SANDBOX_MAX_TIMEOUT", d.MaxTimeout), "largest sandbox.timeout a bundle may ask for; also the deadline of a wasm instance's start-up (WICKET_SANDBOX_MAX_TIMEOUT)")
	o.memory = byteSize(int64(d.MemoryPages) * bundle.PageSize)
	o.maxMemory = byteSize(int64(d.MaxMemoryPages) * bundle.PageSize)
	o.tenantMemory = byteSize(d.TenantMemory)
	envSize("WICKET_WASM_MEMORY", &o.memory)
	envSize("WICKET_WASM_MAX_MEMORY", &o.maxMemory)
	envSize("WICKET_WASM_TENANT_MEMORY", &o.tenantMemory)
	o.cacheMax = byteSize(wasm.DefaultCacheMaxBytes)
	envSize("WICKET_WASM_CACHE_MAX", &o.cacheMax)
	fs.Var(&o.cacheMax, "wasm-cache-max", "size cap of DATA/wasm-cache, the compiled wasm modules kept across restarts (WICKET_WASM_CACHE_MAX)")
	fs.Var(&o.memory, "wasm-memory", "memory cap of a wasm instance whose manifest sets no sandbox.memory_pages, e.g. 16MiB (WICKET_WASM_MEMORY)")
	fs.Var(&o.maxMemory, "wasm-max-memory", "largest memory cap a wasm bundle may ask for (WICKET_WASM_MAX_MEMORY)")
	fs.IntVar(&o.poolSize, "wasm-pool-size", envInt("WICKET_WASM_POOL_SIZE", d.PoolSize), "instances per wasm bundle revision when its manifest sets no sandbox.pool_size (WICKET_WASM_POOL_SIZE)")
	fs.IntVar(&o.maxPoolSize, "wasm-max-pool-size", envInt("WICKET_WASM_MAX_POOL_SIZE", d.MaxPoolSize), "largest sandbox.pool_size a wasm bundle may ask for (WICKET_WASM_MAX_POOL_SIZE)")
	fs.Var(&o.tenantMemory, "wasm-tenant-memory", "most wasm memory one tenant's bundles may reserve together (memory cap × pool size of each) (WICKET_WASM_TENANT_MEMORY)")
	fs.StringVar(&o.regoIsolation, "rego-isolation", envString("WICKET_REGO_ISOLATION", "process"), "process: evaluate each tenant's Rego in a worker process with --rego-memory; none: in the kernel (trusted policies only) (WICKET_REGO_ISOLATION)")
	o.regoMemory = byteSize(worker.DefaultMemory)
	envSize("WICKET_REGO_MEMORY", &o.regoMemory)
	fs.Var(&o.regoMemory, "rego-memory", "memory cap of each tenant's Rego worker process (WICKET_REGO_MEMORY)")
	fs.StringVar(&o.wasmIsolation, "wasm-isolation", envString("WICKET_WASM_ISOLATION", "process"), "process: compile each wasm module first in a process of its own under --wasm-compile-memory and --wasm-compile-timeout; none: in the kernel only (trusted modules only) (WICKET_WASM_ISOLATION)")
	o.wasmCompileMemory = byteSize(defaultWasmCompileMemory)
	envSize("WICKET_WASM_COMPILE_MEMORY", &o.wasmCompileMemory)
	fs.Var(&o.wasmCompileMemory, "wasm-compile-memory", "memory cap of the process that compiles a wasm module; a module that needs more is refused (WICKET_WASM_COMPILE_MEMORY)")
	fs.DurationVar(&o.wasmCompileTimeout, "wasm-compile-timeout", envDuration("WICKET_WASM_COMPILE_TIMEOUT", defaultWasmCompileTimeout), "a wasm module that does not compile within this, in its own process, is refused (WICKET_WASM_COMPILE_TIMEOUT)")
	kd := kernel.DefaultConfig()
	fs.IntVar(&o.tenantBundles, "max-tenant-bundles", envInt("WICKET_MAX_TENANT_BUNDLES", kd.MaxTenantBundles), "most bundles a tenant's own keys may store in it (bundles the admin stores count, and are never refused) (WICKET_MAX_TENANT_BUNDLES)")
	o.tenantBundleBytes = byteSize(kd.MaxTenantBundleBytes)
	envSize("WICKET_MAX_TENANT_BUNDLE_BYTES", &o.tenantBundleBytes)
	fs.Var(&o.tenantBundleBytes, "max-tenant-bundle-bytes", "most bytes of bundles a tenant's own keys may take it to, each counting the larger of its archive and its unpacked files (WICKET_MAX_TENANT_BUNDLE_BYTES)")
	fs.IntVar(&o.tenantAgents, "max-tenant-agents", envInt("WICKET_MAX_TENANT_AGENTS", kd.MaxTenantAgents), "most agents a tenant may have (WICKET_MAX_TENANT_AGENTS)")
	fs.IntVar(&o.tenantKeys, "max-tenant-keys", envInt("WICKET_MAX_TENANT_KEYS", kd.MaxTenantKeys), "most API keys a tenant may have (WICKET_MAX_TENANT_KEYS)")
	fs.DurationVar(&o.bundleLoadTimeout, "bundle-load-timeout", envDuration("WICKET_BUNDLE_LOAD_TIMEOUT", 10*time.Second), "at boot, a stored bundle that does not compile within this is skipped (WICKET_BUNDLE_LOAD_TIMEOUT)")
	fs.DurationVar(&o.bundleLoadTenantBudget, "bundle-load-tenant-budget", envDuration("WICKET_BUNDLE_LOAD_TENANT_BUDGET", kd.BundleLoadTenantBudget), "at boot, once one tenant's stored bundles have spent this compiling, its others are skipped (WICKET_BUNDLE_LOAD_TENANT_BUDGET)")
}

// limits returns the bundle.Limits of the flags, or a usage error naming
// the flag at fault.
func (o *limitOptions) limits() (bundle.Limits, error) {
	pages := func(name string, b byteSize) (uint32, error) {
		if b <= 0 || int64(b)%bundle.PageSize != 0 {
			return 0, usageError{fmt.Sprintf("serve: --%s %s: want a positive multiple of 64KiB (a wasm page)", name, b)}
		}
		if int64(b)/bundle.PageSize > bundle.MaxMemoryPages {
			return 0, usageError{fmt.Sprintf("serve: --%s %s: wasm32 memory is at most 4GiB", name, b)}
		}
		return uint32(int64(b) / bundle.PageSize), nil
	}
	mem, err := pages("wasm-memory", o.memory)
	if err != nil {
		return bundle.Limits{}, err
	}
	maxMem, err := pages("wasm-max-memory", o.maxMemory)
	if err != nil {
		return bundle.Limits{}, err
	}
	switch {
	case o.timeout <= 0:
		return bundle.Limits{}, usageError{"serve: --sandbox-timeout must be positive"}
	case o.maxTimeout <= 0:
		return bundle.Limits{}, usageError{"serve: --sandbox-max-timeout must be positive"}
	case o.poolSize <= 0 || o.maxPoolSize <= 0:
		return bundle.Limits{}, usageError{"serve: --wasm-pool-size and --wasm-max-pool-size must be positive"}
	case o.tenantMemory <= 0:
		return bundle.Limits{}, usageError{"serve: --wasm-tenant-memory must be positive"}
	case o.bundleLoadTimeout <= 0:
		return bundle.Limits{}, usageError{"serve: --bundle-load-timeout must be positive"}
	case o.bundleLoadTenantBudget <= 0:
		return bundle.Limits{}, usageError{"serve: --bundle-load-tenant-budget must be positive"}
	case o.cacheMax <= 0:
		return bundle.Limits{}, usageError{"serve: --wasm-cache-max must be positive"}
	case o.tenantBundles <= 0:
		return bundle.Limits{}, usageError{"serve: --max-tenant-bundles must be positive"}
	case o.tenantAgents <= 0 || o.tenantKeys <= 0:
		return bundle.Limits{}, usageError{"serve: --max-tenant-agents and --max-tenant-keys must be positive"}
	case o.tenantBundleBytes <= 0:
		return bundle.Limits{}, usageError{"serve: --max-tenant-bundle-bytes must be positive"}
	case o.wasmCompileMemory < 64<<20:
		return bundle.Limits{}, usageError{"serve: --wasm-compile-memory must be at least 64MiB"}
	case o.wasmCompileTimeout <= 0:
		return bundle.Limits{}, usageError{"serve: --wasm-compile-timeout must be positive"}
	case o.regoMemory < 32<<20:
		return bundle.Limits{}, usageError{"serve: --rego-memory must be at least 32MiB (a worker needs about 20MiB to start)"}
	}
	l := bundle.Limits{Timeout: o.timeout, MaxTimeout: o.maxTimeout, MemoryPages: mem, MaxMemoryPages: maxMem,
		PoolSize: o.poolSize, MaxPoolSize: o.maxPoolSize, TenantMemory: int64(o.tenantMemory)}
	if err := l.Validate(); err != nil {
		return bundle.Limits{}, usageError{"serve: " + err.Error()}
	}
	return l, nil
}

// byteSize is a flag holding a size in bytes, written with an optional
// binary unit: 65536, 64KiB, 16MiB, 1GiB (KB, MB and GB mean the same).
type byteSize int64

func (b byteSize) String() string { return bundle.BytesString(int64(b)) }

func (b *byteSize) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a size (e.g. 64MiB)", s)
	}
	return n * mult, nil
}

// envSize reads a size from the environment, keeping the default when the
// variable is unset or invalid (as the other WICKET_* twins do).
func envSize(name string, b *byteSize) {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := parseSize(v); err == nil {
			*b = byteSize(n)
		}
	}
}
