package main

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeFlagsHaveEnvTwins: every flag of `wicket serve` has an
// environment twin, WICKET_ and its name (--max-body: WICKET_MAX_BODY),
// that its help names and that sets its default; a flag given on the
// command line wins over its twin.
func TestServeFlagsHaveEnvTwins(t *testing.T) {
	parse := func(args ...string) *flag.FlagSet {
		t.Helper()
		var o serveOptions
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		serveFlags(&o, fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	// One of these parses as each kind of flag serve has (string, int,
	// bool, duration, size, address prefix list) and differs from every
	// default.
	samples := []string{"1", "37s", "3MiB", "10.9.0.0/16"}
	n := 0
	parse().VisitAll(func(f *flag.Flag) {
		n++
		env := envName(f.Name)
		if !strings.Contains(f.Usage, env) {
			t.Errorf("--%s: its help does not name %s: %q", f.Name, env, f.Usage)
		}
		moved := false
		for _, v := range samples {
			t.Setenv(env, v)
			if got := parse().Lookup(f.Name).Value.String(); got != f.DefValue {
				moved = true
				if got := parse("--" + f.Name + "=" + f.DefValue).Lookup(f.Name).Value.String(); got != f.DefValue && f.DefValue != "" {
					t.Errorf("--%s %s given with %s=%s set: %q, want the flag's value", f.Name, f.DefValue, env, v, got)
				}
				break
			}
		}
		t.Setenv(env, "")
		if !moved {
			t.Errorf("--%s: setting %s to any of %q leaves its default %q", f.Name, env, samples, f.DefValue)
		}
	})
	if n < 40 {
		t.Fatalf("only %d serve flags: the flag set was not built", n)
	}
}

// TestBadEnvTwinIsAUsageError: a twin whose value the flag would refuse
// stops serve with a usage error naming the variable and the flag, instead
// of silently keeping the default (WICKET_RETENTION=30days would keep every
// execution); the flag given on the command line replaces a bad twin.
func TestBadEnvTwinIsAUsageError(t *testing.T) {
	for _, c := range []struct{ env, val, flag string }{
		{"WICKET_RETENTION", "30days", "--retention"},
		{"WICKET_MAX_CONNS", "lots", "--max-conns"},
		{"WICKET_WASM_TENANT_MEMORY", "half a gig", "--wasm-tenant-memory"},
		{"WICKET_UNSAFE_NO_FSYNC", "yes", "--unsafe-no-fsync"},
	} {
		t.Run(c.env, func(t *testing.T) {
			t.Setenv(c.env, c.val)
			// Were the twin accepted, serve would run until the deadline.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _, err := runCmd(t, ctx, "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0")
			if _, ok := err.(usageError); !ok || !strings.Contains(err.Error(), c.env) || !strings.Contains(err.Error(), c.flag) {
				t.Fatalf("%s=%s: %T %v, want a usage error naming %s and %s", c.env, c.val, err, err, c.env, c.flag)
			}
		})
	}
	// Given on the command line, the flag replaces the bad twin: serve
	// gets past the twins (and stops at the next thing the test set up,
	// the cancelled context).
	t.Setenv("WICKET_RETENTION", "30days")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := runCmd(t, ctx, "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--retention", "720h")
	if _, ok := err.(usageError); ok {
		t.Fatalf("--retention given: %v", err)
	}
}

// TestServeRefusesNonPositiveLimits: a size, count or timeout flag of zero
// or less is a usage error naming the flag, refused before the store is
// opened, rather than silently the default (or, for a negative approval
// timeout, approvals that expire as they are made); so is a flag whose
// value is malformed whatever the store holds.
func TestServeRefusesNonPositiveLimits(t *testing.T) {
	for _, args := range [][]string{
		{"--max-body", "0"}, {"--max-bundle-body", "-1"}, {"--llm-max-body", "0"}, {"--max-conns", "-5"},
		{"--max-streams-per-tenant", "0"}, {"--dispatch-max-attempts", "0"}, {"--lease-timeout", "0s"},
		{"--dispatch-timeout", "-1s"}, {"--approval-timeout", "-1h"}, {"--read-header-timeout", "0s"},
		{"--read-timeout", "-1s"}, {"--idle-timeout", "0s"}, {"--llm-upstream-timeout", "-1s"}, {"--retention-interval", "0s"},
		// and the values malformed whatever the store holds
		{"--retention", "30s"}, {"--approval-expiry", "never"}, {"--rego-isolation", "bogus"},
		{"--store", "mysql://x"}, {"--default-policy", "BAD!"},
	} {
		data := filepath.Join(t.TempDir(), "data")
		_, _, err := runCmd(t, context.Background(), append([]string{"serve", "--data", data, "--addr", "127.0.0.1:0"}, args...)...)
		if _, ok := err.(usageError); !ok || !strings.Contains(err.Error(), args[0]+" ") || !strings.Contains(err.Error(), "want ") {
			t.Errorf("%v: %T %v, want a usage error naming %s", args, err, err, args[0])
		}
		if _, err := os.Stat(data); !os.IsNotExist(err) {
			t.Errorf("%v: the data directory was created before the flags were checked", args)
		}
	}
}
