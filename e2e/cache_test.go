package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
)

// moduleVariant returns mod with a custom section appended: the same policy,
// other bytes, hence its own cache entry.
func moduleVariant(mod []byte, n byte) []byte {
	return append(append([]byte(nil), mod...), 0x00, 0x03, 0x01, 'v', n)
}

// cacheEntry reports whether DATA/wasm-cache holds machine code for mod.
func cacheEntry(t *testing.T, dir string, mod []byte) bool {
	t.Helper()
	sum := sha256.Sum256(mod)
	found := false
	_ = filepath.WalkDir(filepath.Join(dir, "wasm-cache", hex.EncodeToString(sum[:])), func(_ string, d os.DirEntry, err error) error {
		found = found || (err == nil && d.Type().IsRegular())
		return nil
	})
	return found
}

// waitCache polls until the cache entry of mod is present (or absent).
func waitCache(t *testing.T, dir string, mod []byte, present bool, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for cacheEntry(t, dir, mod) != present {
		if time.Now().After(deadline) {
			t.Fatalf("%s: cache entry present = %v, want %v", what, !present, present)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWasmCacheFollowsBundles: against a real `wicket serve`, the compiled
// code of a wasm module stays in DATA/wasm-cache only while a stored bundle
// uses it: DELETE removes it, a new revision with another module replaces
// it, a bundle removed while the kernel was down loses it at the next boot,
// and a module two bundles share stays until the last one goes.
func TestWasmCacheFollowsBundles(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	p := startServe(t, dir, addr)
	c := cWasm(t)
	m1, m2, m3, m4 := moduleVariant(c, 1), moduleVariant(c, 2), moduleVariant(c, 3), moduleVariant(c, 4)
	put := func(name string, mod []byte) {
		t.Helper()
		if _, err := uploadArchive(p.url, "default", name, wasmArchive(t, "name: "+name+"\nengine: wasm\n", mod)); err != nil {
			t.Fatal(err)
		}
	}
	del := func(name string) {
		t.Helper()
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "DELETE", "/v0/bundles/"+name, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	put("a", m1)
	put("shared1", m2)
	put("shared2", m2)
	waitCache(t, dir, m1, true, "after upload")
	del("a")
	waitCache(t, dir, m1, false, "after DELETE")
	put("b", m1)
	put("b", m3) // a new revision with another module
	waitCache(t, dir, m1, false, "after the module was replaced")
	waitCache(t, dir, m3, true, "new revision")
	del("shared1")
	put("probe", m4) // a prune that surely ran after shared1 went
	del("probe")
	waitCache(t, dir, m4, false, "probe deleted")
	if !cacheEntry(t, dir, m2) {
		t.Fatal("the module of shared2 was pruned when shared1 was deleted")
	}
	del("shared2")
	waitCache(t, dir, m2, false, "both users deleted")

	// Removed while the kernel is down (by hand here; `wicket bundle rm`
	// offline): gone after the next boot.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
	storeDelete(t, dir, "default", "b")
	p = startServe(t, dir, addr)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	waitCache(t, dir, m3, false, "bundle removed offline, after the boot")
}

// TestDataDirPermissions: `wicket serve` refuses a data directory, or a wasm
// cache in it, that group or others may write, as it refuses such a store
// file: whoever writes there can replace the store or plant machine code the
// kernel would run.
func TestDataDirPermissions(t *testing.T) {
	for _, c := range []struct {
		name, path, want string
	}{
		{"data dir", "", "is writable by group or others (mode 0777): chmod 700 it"},
		{"cache dir", "wasm-cache", "wasm-cache is writable by group or others (mode 0777): chmod 700 it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			target := filepath.Join(dir, c.path)
			if err := os.MkdirAll(target, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(target, 0o777); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(wicketBinary(t), "serve", "--data", dir, "--addr", freeAddr(t), "--admin-key", testkit.AdminKey).CombinedOutput()
			if err == nil || !strings.Contains(string(out), c.want) {
				t.Fatalf("serve: %v\n%s\nwant an error with %q", err, out, c.want)
			}
		})
	}
}
