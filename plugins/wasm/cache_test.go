package wasm

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// cacheFiles lists the regular files under dir with their modification times.
func cacheFiles(t *testing.T, dir string) map[string]time.Time {
	t.Helper()
	files := map[string]time.Time{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files[path] = info.ModTime()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestDiskCache: a compile writes machine code under CacheDir; a new engine
// on the same directory (a restart) reads it instead of writing anew.
func TestDiskCache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wasm-cache")
	b := newBundle("c", cPolicy(t), bundle.Sandbox{})

	e1 := New(Config{CacheDir: dir})
	start := time.Now()
	ev, err := e1.Compile(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	cold := time.Since(start)
	_ = ev.Close()
	if err := e1.Close(); err != nil {
		t.Fatal(err)
	}
	before := cacheFiles(t, dir)
	if len(before) == 0 {
		t.Fatalf("no files under %s after a compile", dir)
	}

	e2 := newEngine(t, Config{CacheDir: dir})
	start = time.Now()
	ev2 := compile(t, e2, b)
	cached := time.Since(start)
	wantDecision(t, ev2, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule)
	after := cacheFiles(t, dir)
	if len(after) != len(before) {
		t.Errorf("cache files %d → %d: the restart compiled again", len(before), len(after))
	}
	for path, mt := range before {
		if !after[path].Equal(mt) {
			t.Errorf("%s rewritten by the restart", path)
		}
	}
	t.Logf("C module: cold compile %s, cached %s (see BenchmarkCompileCold/Cached for the Go module)", cold, cached)
}

func TestCacheDirUnusable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := writeFile(file); err != nil {
		t.Fatal(err)
	}
	e := New(Config{CacheDir: filepath.Join(file, "sub")})
	defer e.Close()
	_, err := e.Compile(context.Background(), newBundle("c", cPolicy(t), bundle.Sandbox{}))
	if err == nil {
		t.Fatal("compiled with a cache dir under a regular file")
	}
	t.Log(err)
}

func writeFile(path string) error { return os.WriteFile(path, []byte("x"), 0o600) }
