// Package wasmwarm fills a wazero disk cache from a normal (non-race) build,
// for tests: under -race wazero's compiler is about ten times slower (20 s
// and more for a Go SDK module), and a test binary would otherwise compile
// every module itself.
package wasmwarm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
)

// Warm compiles the module at wasmPath into the wazero disk cache cacheDir
// by running plugins/wasm/testdata/warmcache with `go run`, built without
// the race detector. The engine under test then loads the machine code
// instead of compiling it; tests still work, only slower, if Warm fails.
//
// wazero keys its disk cache by its own version, which it reads from the
// binary's build info; test binaries carry none and so say "dev". The
// helper is told the version this binary sees with -X.
func Warm(cacheDir, wasmPath string) error {
	ldflags := "-ldflags=-X=github.com/tetratelabs/wazero/internal/version.version=" + wazeroVersionSeen()
	cmd := exec.Command("go", "run", ldflags, "./plugins/wasm/testdata/warmcache", cacheDir, wasmPath)
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("warm wazero cache: %w\n%s", err, b)
	}
	return nil
}

// moduleRoot is the repository's root: two directories above this file.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// wazeroVersionSeen returns the version wazero finds for itself in this
// binary (internal/version.GetWazeroVersion's rule).
func wazeroVersionSeen() string {
	missing := func(v string) bool { return v == "" || v == "(devel)" }
	v := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if strings.Contains(d.Path, "github.com/tetratelabs/wazero") {
				v = d.Version
			}
		}
		if missing(v) {
			v = info.Main.Version
		}
	}
	if missing(v) {
		return "dev"
	}
	return v
}
