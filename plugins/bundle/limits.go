package bundle

import (
	"errors"
	"fmt"
	"runtime"
	"time"
)

// ErrCeiling: a manifest asks for more than the kernel's [Limits] allow.
var ErrCeiling = errors.New("over the kernel's ceiling")

// PageSize is the size of a wasm memory page (64 KiB).
const PageSize = 64 << 10

// Defaults of [Limits], applied by [Limits.WithDefaults] to zero fields.
const (
	DefaultTimeout        = time.Second
	DefaultMaxTimeout     = 2 * time.Second
	DefaultMemoryPages    = 256  // 16 MiB
	DefaultMaxMemoryPages = 1024 // 64 MiB
	// DefaultPoolSize is the most instances kept per wasm bundle revision
	// when neither the manifest nor the kernel says otherwise (capped by
	// GOMAXPROCS: more instances than CPUs cannot run at once).
	DefaultPoolSize = 4
	// DefaultTenantMemory is the most wasm linear memory one tenant's
	// bundles may reserve (512 MiB).
	DefaultTenantMemory = 512 << 20
)

// Limits are a kernel's ceilings on what a bundle's manifest may ask for,
// and the values a bundle gets when its manifest asks for nothing. Every
// engine is given the same Limits (serve builds one value from its flags),
// so sandbox.timeout means the same deadline for Rego and wasm.
//
// The zero value means the defaults (see [Limits.WithDefaults]).
type Limits struct {
	// Timeout is the per-evaluation deadline of a bundle whose manifest
	// sets no sandbox.timeout (default 1s).
	Timeout time.Duration
	// MaxTimeout is the largest sandbox.timeout a manifest may ask for
	// (default 2s). It is also the deadline of a wasm instance's start-up
	// (its start section, _initialize and, for OPA modules, loading
	// data.json), whatever the manifest asks.
	MaxTimeout time.Duration
	// MemoryPages caps the linear memory of a wasm instance whose manifest
	// sets no sandbox.memory_pages, in 64 KiB pages (default 256 = 16 MiB).
	MemoryPages uint32
	// MaxMemoryPages is the largest sandbox.memory_pages a manifest may ask
	// for (default 1024 = 64 MiB).
	MaxMemoryPages uint32
	// PoolSize is the number of instances a wasm bundle revision may keep
	// (hence the most evaluations it runs at once) when its manifest sets no
	// sandbox.pool_size (default min(4, GOMAXPROCS)).
	PoolSize int
	// MaxPoolSize is the largest sandbox.pool_size a manifest may ask for
	// (default max(PoolSize, GOMAXPROCS)).
	MaxPoolSize int
	// TenantMemory is the most wasm linear memory, in bytes, one tenant's
	// bundles may reserve together (default 512 MiB). A wasm bundle
	// reserves its memory cap times its pool size: the most its instances
	// can hold at once. A bundle that would take its tenant past this is
	// refused; the revision it replaces does not count.
	TenantMemory int64
}

// WithDefaults returns l with zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	if l.Timeout <= 0 {
		l.Timeout = DefaultTimeout
	}
	if l.MaxTimeout <= 0 {
		l.MaxTimeout = max(DefaultMaxTimeout, l.Timeout)
	}
	if l.MemoryPages == 0 {
		l.MemoryPages = DefaultMemoryPages
	}
	if l.MaxMemoryPages == 0 {
		l.MaxMemoryPages = max(DefaultMaxMemoryPages, l.MemoryPages)
	}
	if l.PoolSize <= 0 {
		l.PoolSize = min(DefaultPoolSize, runtime.GOMAXPROCS(0))
	}
	if l.MaxPoolSize <= 0 {
		l.MaxPoolSize = max(l.PoolSize, runtime.GOMAXPROCS(0))
	}
	if l.TenantMemory <= 0 {
		l.TenantMemory = DefaultTenantMemory
	}
	return l
}

// Validate checks that each default is within its ceiling and that the
// ceilings are possible (memory within wasm32's 4 GiB).
func (l Limits) Validate() error {
	l = l.WithDefaults()
	switch {
	case l.Timeout > l.MaxTimeout:
		return fmt.Errorf("limits: default timeout %s exceeds the largest timeout %s", l.Timeout, l.MaxTimeout)
	case l.MaxMemoryPages > MaxMemoryPages:
		return fmt.Errorf("limits: largest memory %s exceeds wasm32's 4 GiB", PagesString(l.MaxMemoryPages))
	case l.MemoryPages > l.MaxMemoryPages:
		return fmt.Errorf("limits: default memory %s exceeds the largest memory %s", PagesString(l.MemoryPages), PagesString(l.MaxMemoryPages))
	case l.PoolSize > l.MaxPoolSize:
		return fmt.Errorf("limits: default pool size %d exceeds the largest pool size %d", l.PoolSize, l.MaxPoolSize)
	case l.TenantMemory < int64(l.MemoryPages)*PageSize:
		return fmt.Errorf("limits: tenant memory %s is less than one instance of the default memory %s", BytesString(l.TenantMemory), PagesString(l.MemoryPages))
	}
	return nil
}

// Sandbox values a bundle runs with: its manifest's, with the defaults of
// [Limits] filled in.
type Effective struct {
	// Timeout is the per-evaluation deadline.
	Timeout time.Duration
	// StartTimeout is the deadline of a wasm instance's start-up.
	StartTimeout time.Duration
	// MemoryPages caps each wasm instance's linear memory (0 for other engines).
	MemoryPages uint32
	// PoolSize is the most wasm instances of the revision (0 for other engines).
	PoolSize int
}

// Reserved is the wasm linear memory the bundle may hold at once, in bytes:
// memory cap × pool size (0 for other engines).
func (e Effective) Reserved() int64 { return int64(e.MemoryPages) * PageSize * int64(e.PoolSize) }

// Apply returns the sandbox values of m under l. A manifest asking for more
// than a ceiling is refused with an *[Error] naming the field, what it asked
// and the ceiling, matching [ErrCeiling]:
//
//	bundle.yaml: sandbox.timeout: 87600h0m0s exceeds the kernel's ceiling of 2s (serve --sandbox-max-timeout)
func (l Limits) Apply(m *Manifest) (Effective, error) {
	l = l.WithDefaults()
	over := func(field, asked, ceiling, flag string) error {
		return &Error{File: ManifestFile, Field: field,
			Err: ceilingError(fmt.Sprintf("%s exceeds the kernel's ceiling of %s (serve %s)", asked, ceiling, flag))}
	}
	e := Effective{Timeout: l.Timeout, StartTimeout: l.MaxTimeout}
	if t := m.Sandbox.Timeout; t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d <= 0 {
			return e, &Error{File: ManifestFile, Field: "sandbox.timeout", Err: fmt.Errorf("must be a positive Go duration (e.g. 50ms), got %q", t)}
		}
		if d > l.MaxTimeout {
			return e, over("sandbox.timeout", d.String(), l.MaxTimeout.String(), "--sandbox-max-timeout")
		}
		e.Timeout = d
	}
	if m.Engine != EngineWasm {
		return e, nil
	}
	e.MemoryPages, e.PoolSize = l.MemoryPages, l.PoolSize
	if p := m.Sandbox.MemoryPages; p != 0 {
		if p > l.MaxMemoryPages {
			return e, over("sandbox.memory_pages", fmt.Sprint(p), PagesString(l.MaxMemoryPages), "--wasm-max-memory")
		}
		e.MemoryPages = p
	}
	if n := m.Sandbox.PoolSize; n != 0 {
		if n > l.MaxPoolSize {
			return e, over("sandbox.pool_size", fmt.Sprint(n), fmt.Sprint(l.MaxPoolSize), "--wasm-max-pool-size")
		}
		e.PoolSize = n
	}
	if r := e.Reserved(); r > l.TenantMemory {
		return e, &Error{File: ManifestFile, Field: "sandbox",
			Err: ceilingError(fmt.Sprintf("%s × %d instances = %s exceeds the kernel's ceiling of %s of wasm memory per tenant (serve --wasm-tenant-memory)",
				PagesString(e.MemoryPages), e.PoolSize, BytesString(r), BytesString(l.TenantMemory)))}
	}
	return e, nil
}

// ceilingError is a reason that matches [ErrCeiling].
type ceilingError string

func (e ceilingError) Error() string        { return string(e) }
func (e ceilingError) Is(target error) bool { return target == ErrCeiling }

// CeilingError returns an error with the given reason that matches
// [ErrCeiling] (for ceilings enforced outside [Limits.Apply], such as a
// tenant's total).
func CeilingError(reason string) error { return ceilingError(reason) }

// PagesString formats a number of wasm pages with its size: "256 pages (16 MiB)".
func PagesString(pages uint32) string {
	return fmt.Sprintf("%d pages (%s)", pages, BytesString(int64(pages)*PageSize))
}

// BytesString formats a size in the largest binary unit that divides it:
// "512 MiB", "64 KiB", "100 B".
func BytesString(n int64) string {
	for _, u := range []struct {
		unit  string
		shift uint
	}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if n != 0 && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.unit)
		}
	}
	return fmt.Sprintf("%d B", n)
}
