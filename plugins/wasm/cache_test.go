package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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

// variant returns mod with a custom section appended: the same module to
// run, but other bytes, hence another cache entry.
func variant(mod []byte, n byte) []byte {
	return append(append([]byte(nil), mod...), 0x00, 0x03, 0x01, 'v', n) // section 0: name "v", payload n
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func entryExists(t *testing.T, dir string, mod []byte) bool {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, digestOf(mod))); err != nil {
		return false
	}
	return len(cacheFiles(t, filepath.Join(dir, digestOf(mod)))) > 0
}

// TestPruneCache: each module's machine code lives in a directory named by
// its digest; PruneCache removes the entries no evaluator uses (and the
// single directory of earlier versions), keeps the others and files that
// are not the cache's, and a restart then finds what it kept.
func TestPruneCache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wasm-cache")
	c := cPolicy(t)
	kept, dropped := variant(c, 1), variant(c, 2)
	e := newEngine(t, Config{CacheDir: dir})
	keep := compile(t, e, newBundle("keep", kept, bundle.Sandbox{}))
	drop, err := e.Compile(context.Background(), newBundle("drop", dropped, bundle.Sandbox{}))
	if err != nil {
		t.Fatal(err)
	}
	if !entryExists(t, dir, kept) || !entryExists(t, dir, dropped) {
		t.Fatalf("no cache entries named by digest under %s: %v", dir, cacheFiles(t, dir))
	}
	legacy := filepath.Join(dir, "wazero-v1.0.0-amd64-linux")
	other := filepath.Join(dir, "README")
	if err := os.MkdirAll(legacy, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(filepath.Join(legacy, "0123")); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(other); err != nil {
		t.Fatal(err)
	}
	if err := e.PruneCache(); err != nil {
		t.Fatal(err)
	}
	if !entryExists(t, dir, dropped) {
		t.Fatal("an entry in use was pruned")
	}
	_ = drop.Close()
	if err := e.PruneCache(); err != nil {
		t.Fatal(err)
	}
	if entryExists(t, dir, dropped) {
		t.Error("the entry of a closed evaluator survived PruneCache")
	}
	if _, err := os.Stat(legacy); err == nil {
		t.Error("the old one-directory cache survived PruneCache")
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("PruneCache removed a file that is not the cache's: %v", err)
	}
	wantDecision(t, keep, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule)

	// A restart reads the kept entry instead of compiling again.
	before := cacheFiles(t, dir)
	e2 := newEngine(t, Config{CacheDir: dir})
	ev := compile(t, e2, newBundle("keep", kept, bundle.Sandbox{}))
	wantDecision(t, ev, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule)
	for path, mt := range before {
		if now, ok := cacheFiles(t, dir)[path]; !ok || !now.Equal(mt) {
			t.Errorf("%s rewritten or removed by the restart", path)
		}
	}
}

// TestCacheCap: past CacheMaxBytes the least recently used entries go,
// unused ones first; an entry in use loses its files (the next restart
// recompiles it) but keeps working.
func TestCacheCap(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wasm-cache")
	c := cPolicy(t)
	mods := [][]byte{variant(c, 1), variant(c, 2), variant(c, 3)}
	// Learn an entry's size with an uncapped engine.
	probe := New(Config{CacheDir: filepath.Join(t.TempDir(), "probe")})
	ev, err := probe.Compile(context.Background(), newBundle("p", mods[0], bundle.Sandbox{}))
	if err != nil {
		t.Fatal(err)
	}
	size := probe.CacheSize()
	_ = ev.Close()
	_ = probe.Close()
	if size == 0 {
		t.Fatal("an entry has no size")
	}

	e := newEngine(t, Config{CacheDir: dir, CacheMaxBytes: 2*size + size/2}) // room for two
	first, err := e.Compile(context.Background(), newBundle("a", mods[0], bundle.Sandbox{}))
	if err != nil {
		t.Fatal(err)
	}
	_ = first.Close() // unused from now on
	second := compile(t, e, newBundle("b", mods[1], bundle.Sandbox{}))
	third := compile(t, e, newBundle("c", mods[2], bundle.Sandbox{}))
	if got := e.CacheSize(); got > 2*size+size/2 {
		t.Errorf("cache holds %d bytes, over its cap of %d", got, 2*size+size/2)
	}
	if entryExists(t, dir, mods[0]) || !entryExists(t, dir, mods[1]) || !entryExists(t, dir, mods[2]) {
		t.Errorf("want the unused entry evicted and the two in use kept: %v", cacheFiles(t, dir))
	}

	// A cap smaller than one entry: entries in use lose their files and
	// still run; new compilations still work.
	tiny := newEngine(t, Config{CacheDir: filepath.Join(t.TempDir(), "tiny"), CacheMaxBytes: 1})
	ev1 := compile(t, tiny, newBundle("a", mods[0], bundle.Sandbox{}))
	ev2 := compile(t, tiny, newBundle("b", mods[1], bundle.Sandbox{}))
	if got := tiny.CacheSize(); got > 1 {
		t.Errorf("cache capped at 1 byte holds %d", got)
	}
	ev3 := compile(t, tiny, newBundle("a2", mods[0], bundle.Sandbox{MemoryPages: 64}))
	for _, ev := range []*evaluator{second, third, ev1, ev2, ev3} {
		wantDecision(t, ev, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule)
	}
}

// TestCacheDirPermissions: a cache directory (or a module's directory in
// it) that group or others may write is refused: its files are machine code
// the kernel runs.
func TestCacheDirPermissions(t *testing.T) {
	root := t.TempDir()
	open := filepath.Join(root, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	c := cPolicy(t)
	_, err := New(Config{CacheDir: open}).Compile(context.Background(), newBundle("c", c, bundle.Sandbox{}))
	if err == nil || !strings.Contains(err.Error(), "is writable by group or others (mode 0777): chmod 700 it") {
		t.Errorf("cache dir 0777: %v", err)
	}
	closed := filepath.Join(root, "closed")
	if err := os.MkdirAll(filepath.Join(closed, digestOf(c)), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(closed, digestOf(c)), 0o775); err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{CacheDir: closed}).Compile(context.Background(), newBundle("c", c, bundle.Sandbox{}))
	if err == nil || !strings.Contains(err.Error(), "is writable by group or others (mode 0775)") {
		t.Errorf("module dir 0775: %v", err)
	}
	// A fresh directory is created 0700.
	fresh := filepath.Join(root, "fresh", "cache")
	e := newEngine(t, Config{CacheDir: fresh})
	compile(t, e, newBundle("c", c, bundle.Sandbox{}))
	for _, d := range []string{fresh, filepath.Join(fresh, digestOf(c))} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want mode 0700", d, fi.Mode(), err)
		}
	}
}

// TestDamagedCacheRecompiles: a cache entry that is truncated, corrupted
// or empty (a disk fault, a copy cut short) is compiled again at the next
// start, not held against the module: before, every bundle of that module
// was refused ("compilationcache: checksum mismatch …") — skipped at boot,
// its agents denied — until the entry was removed by hand.
func TestDamagedCacheRecompiles(t *testing.T) {
	for _, damage := range []string{"truncated", "flipped", "empty"} {
		t.Run(damage, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "wasm-cache")
			b := newBundle("c", cPolicy(t), bundle.Sandbox{})
			e1 := New(Config{CacheDir: dir})
			ev, err := e1.Compile(context.Background(), b)
			if err != nil {
				t.Fatal(err)
			}
			_ = ev.Close()
			if err := e1.Close(); err != nil {
				t.Fatal(err)
			}
			sizes := map[string]int{}
			for path := range cacheFiles(t, dir) {
				data, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				sizes[path] = len(data)
				switch damage {
				case "truncated":
					data = data[:len(data)/2]
				case "flipped":
					data[len(data)/2] ^= 0xff
				case "empty":
					data = nil
				}
				if err := os.WriteFile(path, data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			e2 := newEngine(t, Config{CacheDir: dir})
			ev2 := compile(t, e2, b)
			wantDecision(t, ev2, sdkCases[0].in, sdkCases[0].action, sdkCases[0].rule)
			for path, n := range sizes {
				fi, err := os.Stat(path)
				if err != nil || fi.Size() != int64(n) {
					t.Errorf("%s after the recompile: %v, size %d, want %d", path, err, fi.Size(), n)
				}
			}
		})
	}
}
