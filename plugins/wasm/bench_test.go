package wasm

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/wicket-run/wicket/internal/cpubench"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

func benchEvaluate(b *testing.B, bd *bundle.Bundle, in *policy.Input, action policy.Action) {
	e := newEngine(b, Config{})
	ev := compile(b, e, bd)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	cpubench.Report(b)
	for b.Loop() {
		d, err := ev.Evaluate(ctx, in)
		if err != nil || d == nil || d.Action != action {
			b.Fatalf("evaluate: %+v, %v", d, err)
		}
	}
}

var benchInput = input("tool_call", "shell.exec", "", map[string]any{"cmd": "rm -rf /tmp/x"})

// BenchmarkWasmEvaluateGo evaluates the Go SDK test policy.
func BenchmarkWasmEvaluateGo(b *testing.B) {
	benchEvaluate(b, newBundle("go", goPolicy(b), relaxed), benchInput, policy.RequireApproval)
}

// BenchmarkWasmEvaluateC evaluates the C SDK example.
func BenchmarkWasmEvaluateC(b *testing.B) {
	benchEvaluate(b, newBundle("c", cPolicy(b), relaxed), benchInput, policy.RequireApproval)
}

// BenchmarkWasmEvaluateOPA evaluates Rego compiled to wasm, under the OPA ABI.
func BenchmarkWasmEvaluateOPA(b *testing.B) {
	mod, _ := opaModules(b)
	benchEvaluate(b, opaBundle(mod, "wicket/decision", trusted), input("tool_call", "fs.delete", "destructive", nil), policy.Deny)
}

// BenchmarkWasmEvaluateCParallel evaluates the C example from GOMAXPROCS goroutines.
func BenchmarkWasmEvaluateCParallel(b *testing.B) {
	ev := compile(b, newEngine(b, Config{}), newBundle("c", cPolicy(b), relaxed))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := ev.Evaluate(context.Background(), benchInput); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// compileOnce runs one Compile of the Go test policy in a new engine on dir
// (a process start) and closes everything.
func compileOnce(b *testing.B, dir string) {
	e := New(Config{CacheDir: dir})
	ev, err := e.Compile(context.Background(), newBundle("go", goPolicy(b), relaxed))
	if err != nil {
		b.Fatal(err)
	}
	_ = ev.Close()
	_ = e.Close()
}

// BenchmarkCompileCold compiles the Go test policy with an empty disk cache.
func BenchmarkCompileCold(b *testing.B) {
	goPolicy(b)
	root := b.TempDir()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		dir, err := os.MkdirTemp(root, "cold-")
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		compileOnce(b, dir)
	}
}

// BenchmarkCompileCached compiles the Go test policy with a warm disk cache,
// as after a restart.
func BenchmarkCompileCached(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "warm")
	compileOnce(b, dir)
	b.ResetTimer()
	for b.Loop() {
		compileOnce(b, dir)
	}
}
