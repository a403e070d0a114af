package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/plugins/bundle"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"65536": 65536, "64KiB": 64 << 10, "16MiB": 16 << 20, "1GiB": 1 << 30, "16 MiB": 16 << 20, "512MB": 512 << 20, "2G": 2 << 30, "100B": 100} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1MiB", "1.5GiB", "lots", "99999999999GiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

func TestLimitFlags(t *testing.T) {
	parse := func(t *testing.T, env map[string]string, args ...string) (bundle.Limits, error) {
		for k, v := range env {
			t.Setenv(k, v)
		}
		var o limitOptions
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		limitFlags(&o, fs)
		if err := fs.Parse(args); err != nil {
			return bundle.Limits{}, err
		}
		return o.limits()
	}
	l, err := parse(t, nil)
	if err != nil || l != (bundle.Limits{}).WithDefaults() {
		t.Fatalf("defaults: %+v, %v", l, err)
	}
	t.Run("flags and environment", func(t *testing.T) {
		l, err := parse(t, map[string]string{"WICKET_WASM_TENANT_MEMORY": "1GiB", "WICKET_SANDBOX_MAX_TIMEOUT": "5s"},
			"--wasm-memory", "8MiB", "--wasm-max-memory", "32MiB", "--wasm-pool-size", "1", "--wasm-max-pool-size", "3", "--sandbox-timeout", "250ms")
		want := bundle.Limits{Timeout: 250 * time.Millisecond, MaxTimeout: 5 * time.Second, MemoryPages: 128, MaxMemoryPages: 512, PoolSize: 1, MaxPoolSize: 3, TenantMemory: 1 << 30}
		if err != nil || l != want {
			t.Fatalf("got %+v, %v\nwant %+v", l, err, want)
		}
	})
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--wasm-memory", "100000"}, "--wasm-memory 100000 B: want a positive multiple of 64KiB"},
		{[]string{"--wasm-max-memory", "8GiB"}, "wasm32 memory is at most 4GiB"},
		{[]string{"--sandbox-timeout", "3s"}, "default timeout 3s exceeds the largest timeout 2s"},
		{[]string{"--wasm-memory", "128MiB"}, "default memory 2048 pages (128 MiB) exceeds the largest memory 1024 pages (64 MiB)"},
		{[]string{"--bundle-load-timeout", "0s"}, "--bundle-load-timeout must be positive"},
		{[]string{"--bundle-load-tenant-budget", "-1s"}, "--bundle-load-tenant-budget must be positive"},
	} {
		_, err := parse(t, nil, c.args...)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
}
