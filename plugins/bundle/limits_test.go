package bundle

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLimitsDefaults(t *testing.T) {
	l := Limits{}.WithDefaults()
	want := Limits{Timeout: time.Second, MaxTimeout: 2 * time.Second, MemoryPages: 256, MaxMemoryPages: 1024,
		PoolSize: min(4, runtime.GOMAXPROCS(0)), MaxPoolSize: max(min(4, runtime.GOMAXPROCS(0)), runtime.GOMAXPROCS(0)), TenantMemory: 512 << 20}
	if l != want {
		t.Fatalf("defaults = %+v, want %+v", l, want)
	}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	// A default above the default ceiling raises the ceiling.
	if l := (Limits{Timeout: 5 * time.Second, MemoryPages: 2048}).WithDefaults(); l.MaxTimeout != 5*time.Second || l.MaxMemoryPages != 2048 {
		t.Errorf("ceilings under their defaults: %+v", l)
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, c := range []struct {
		l    Limits
		want string
	}{
		{Limits{Timeout: 3 * time.Second, MaxTimeout: 2 * time.Second}, "default timeout 3s exceeds the largest timeout 2s"},
		{Limits{MaxMemoryPages: 65537}, "largest memory 65537 pages"},
		{Limits{MemoryPages: 512, MaxMemoryPages: 256}, "default memory 512 pages (32 MiB) exceeds the largest memory 256 pages (16 MiB)"},
		{Limits{PoolSize: 8, MaxPoolSize: 2}, "default pool size 8 exceeds the largest pool size 2"},
		{Limits{TenantMemory: 1 << 20}, "tenant memory 1 MiB is less than one instance of the default memory 256 pages (16 MiB)"},
	} {
		if err := c.l.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.l, err, c.want)
		}
	}
}

func TestLimitsApply(t *testing.T) {
	l := Limits{Timeout: 100 * time.Millisecond, MaxTimeout: time.Second, MemoryPages: 16, MaxMemoryPages: 64, PoolSize: 2, MaxPoolSize: 4, TenantMemory: 8 << 20}
	wasm := func(sb Sandbox) *Manifest { return &Manifest{Name: "w", Engine: EngineWasm, Sandbox: sb} }
	for _, c := range []struct {
		name string
		m    *Manifest
		want Effective
		err  string
	}{
		{"wasm defaults", wasm(Sandbox{}), Effective{Timeout: 100 * time.Millisecond, StartTimeout: time.Second, MemoryPages: 16, PoolSize: 2}, ""},
		{"wasm at the ceilings", wasm(Sandbox{Timeout: "1s", MemoryPages: 32, PoolSize: 4}), Effective{Timeout: time.Second, StartTimeout: time.Second, MemoryPages: 32, PoolSize: 4}, ""},
		{"rego", &Manifest{Engine: EngineRego, Sandbox: Sandbox{Timeout: "250ms"}}, Effective{Timeout: 250 * time.Millisecond, StartTimeout: time.Second}, ""},
		{"rego over", &Manifest{Engine: EngineRego, Sandbox: Sandbox{Timeout: "87600h"}}, Effective{}, "bundle.yaml: sandbox.timeout: 87600h0m0s exceeds the kernel's ceiling of 1s (serve --sandbox-max-timeout)"},
		{"bad timeout", wasm(Sandbox{Timeout: "soon"}), Effective{}, `bundle.yaml: sandbox.timeout: must be a positive Go duration (e.g. 50ms), got "soon"`},
		{"memory over", wasm(Sandbox{MemoryPages: 65}), Effective{}, "bundle.yaml: sandbox.memory_pages: 65 exceeds the kernel's ceiling of 64 pages (4 MiB) (serve --wasm-max-memory)"},
		{"pool over", wasm(Sandbox{PoolSize: 5}), Effective{}, "bundle.yaml: sandbox.pool_size: 5 exceeds the kernel's ceiling of 4 (serve --wasm-max-pool-size)"},
		{"tenant over", wasm(Sandbox{MemoryPages: 64, PoolSize: 3}), Effective{}, "bundle.yaml: sandbox: 64 pages (4 MiB) × 3 instances = 12 MiB exceeds the kernel's ceiling of 8 MiB of wasm memory per tenant (serve --wasm-tenant-memory)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := l.Apply(c.m)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("got %v\nwant %s", err, c.err)
				}
				var be *Error
				if !errors.As(err, &be) {
					t.Errorf("%T is not a *bundle.Error", err)
				}
				if strings.Contains(c.err, "ceiling") != errors.Is(err, ErrCeiling) {
					t.Errorf("errors.Is(%v, ErrCeiling) = %v", err, errors.Is(err, ErrCeiling))
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
	if r := (Effective{MemoryPages: 16, PoolSize: 2}).Reserved(); r != 2<<20 {
		t.Errorf("reserved = %d, want 2 MiB", r)
	}
}

func TestBytesString(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 100: "100 B", 64 << 10: "64 KiB", 3 << 20: "3 MiB", 2 << 30: "2 GiB", 1<<20 + 1: "1048577 B"} {
		if got := BytesString(n); got != want {
			t.Errorf("BytesString(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestRateLimitsCeiling: every rate limit a bundle declares is a counter
// written in the step's transaction on the store's one writer, so a bundle
// declaring 20,000 of them made each of its tenant's steps hold that writer
// for about 100 ms, and every other tenant's steps waited behind it. A
// manifest may declare at most MaxRateLimits; one more is refused, naming
// the field and the ceiling.
func TestRateLimitsCeiling(t *testing.T) {
	manifest := func(n int) []byte {
		var b strings.Builder
		b.WriteString("name: limited\nengine: rules\nrate_limits:\n")
		for i := range n {
			fmt.Fprintf(&b, "  - {id: r%d, max_calls: 10, window: 1m}\n", i)
		}
		return []byte(b.String())
	}
	m, err := ParseManifest(manifest(MaxRateLimits))
	if err != nil || len(m.RateLimits) != MaxRateLimits {
		t.Fatalf("%d rate limits: %d parsed, %v", MaxRateLimits, len(m.RateLimits), err)
	}
	_, err = ParseManifest(manifest(MaxRateLimits + 1))
	if err == nil || !strings.Contains(err.Error(), "rate_limits") || !strings.Contains(err.Error(), strconv.Itoa(MaxRateLimits)) {
		t.Fatalf("%d rate limits: %v, want an error naming rate_limits and the ceiling", MaxRateLimits+1, err)
	}
}
