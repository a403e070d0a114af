package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
)

// DefaultCacheMaxBytes is the default cap of the compilation cache on disk
// (1 GiB: about seventy Go SDK modules, whose machine code is ~14 MB each).
const DefaultCacheMaxBytes = 1 << 30

// module is one distinct wasm module, identified by the SHA-256 of its
// bytes: its compilation cache (a directory of its own under
// Config.CacheDir, so that its machine code can be found and removed) and
// its runtimes, one per memory cap. Evaluators of that module hold a
// reference; the last one to go releases the runtimes and the in-memory
// code (the disk entry stays until [Engine.PruneCache]).
type module struct {
	digest    string
	dir       string // "" for an in-memory cache
	cache     wazero.CompilationCache
	runtimes  map[runtimeKey]*sandboxRuntime
	refs      int
	compiling int // compilations under way, whose entry must not be touched
}

func (m *module) close() error {
	ctx := context.Background()
	var errs []error
	for _, rt := range m.runtimes {
		if err := rt.r.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("wasm: close runtime (%d pages): %w", rt.pages, err))
		}
	}
	m.runtimes = nil
	if err := m.cache.Close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("wasm: close compilation cache: %w", err))
	}
	return errors.Join(errs...)
}

// acquire returns the module of bin with one more reference, marked as
// compiling until [Engine.compiled].
func (e *Engine) acquire(bin []byte) (*module, error) {
	sum := sha256.Sum256(bin)
	digest := hex.EncodeToString(sum[:])
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("wasm: engine closed")
	}
	m := e.modules[digest]
	if m == nil {
		m = &module{digest: digest, runtimes: map[runtimeKey]*sandboxRuntime{}}
		if e.cfg.CacheDir == "" {
			m.cache = wazero.NewCompilationCache()
		} else {
			if err := secureDir(e.cfg.CacheDir); err != nil {
				return nil, fmt.Errorf("wasm: compilation cache: %w", err)
			}
			m.dir = filepath.Join(e.cfg.CacheDir, digest)
			if err := secureDir(m.dir); err != nil {
				return nil, fmt.Errorf("wasm: compilation cache: %w", err)
			}
			c, err := wazero.NewCompilationCacheWithDir(m.dir)
			if err != nil {
				return nil, fmt.Errorf("wasm: compilation cache %s: %w", m.dir, err)
			}
			m.cache = c
		}
		e.modules[digest] = m
	}
	m.refs++
	m.compiling++
	if m.dir != "" {
		now := time.Now()
		_ = os.Chtimes(m.dir, now, now) // recently used: evicted last
	}
	return m, nil
}

// compiled marks the end of one compilation of m, and enforces the size
// cap of the cache (a compilation may have added an entry).
func (e *Engine) compiled(m *module) {
	e.mu.Lock()
	m.compiling--
	e.mu.Unlock()
	if m.dir != "" {
		_ = e.prune(false)
	}
}

// forgetCompiled removes the machine code of m from the disk cache (its
// entries, not the temporary files of a compilation writing one).
func (e *Engine) forgetCompiled(m *module) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	err := filepath.WalkDir(m.dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && !strings.HasSuffix(path, ".tmp") {
			errs = append(errs, os.Remove(path))
		}
		return err
	})
	return errors.Join(append(errs, err)...)
}

// release drops a reference to m; the last one closes its runtimes.
func (e *Engine) release(m *module) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m.refs--
	if m.refs > 0 || e.closed {
		return
	}
	delete(e.modules, m.digest)
	_ = m.close()
}

// secureDir creates dir (mode 0700) if missing and refuses one that is not
// a directory or that group or others may write: the cache holds machine
// code the kernel maps and runs.
func secureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("%s is writable by group or others (mode %04o): chmod 700 it", dir, perm)
	}
	return nil
}

// PruneCache removes from the disk cache the machine code of every module
// no evaluator of this engine uses (bundles deleted or replaced, stored
// bundles that no longer load, entries of an older wazero), then, while the
// cache is larger than Config.CacheMaxBytes, the least recently used of the
// rest (a module still in use only loses its disk copy: the next restart
// compiles it again). Modules being compiled are left alone.
//
// The kernel calls it after boot (everything stored is compiled by then)
// and whenever a bundle revision is removed or replaced. It does nothing
// without a CacheDir.
func (e *Engine) PruneCache() error { return e.prune(true) }

// cacheEntry is one subdirectory of the cache.
type cacheEntry struct {
	name  string
	size  int64
	mtime time.Time
	used  bool // some evaluator uses the module
}

func (e *Engine) prune(unused bool) error {
	if e.cfg.CacheDir == "" {
		return nil
	}
	// Hold the lock throughout: a module acquired meanwhile must not lose
	// the directory its compilation cache writes into.
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	des, err := os.ReadDir(e.cfg.CacheDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("wasm: prune cache: %w", err)
	}
	var entries []cacheEntry
	var total int64
	var errs []error
	for _, de := range des {
		name := de.Name()
		legacy := strings.HasPrefix(name, "wazero-") // the one-directory layout of earlier versions
		if !de.IsDir() || (!isDigest(name) && !legacy) {
			continue // not ours
		}
		m := e.modules[name]
		path := filepath.Join(e.cfg.CacheDir, name)
		if m != nil && m.compiling > 0 {
			continue
		}
		if (unused || legacy) && m == nil {
			errs = append(errs, os.RemoveAll(path))
			continue
		}
		ce := cacheEntry{name: name, used: m != nil}
		if fi, err := de.Info(); err == nil {
			ce.mtime = fi.ModTime()
		}
		ce.size = dirSize(path)
		total += ce.size
		entries = append(entries, ce)
	}
	// Over the cap: unused entries first, then the least recently used.
	slices.SortFunc(entries, func(a, b cacheEntry) int {
		if a.used != b.used {
			if a.used {
				return 1
			}
			return -1
		}
		return a.mtime.Compare(b.mtime)
	})
	for _, ce := range entries {
		if total <= e.cfg.CacheMaxBytes {
			break
		}
		path := filepath.Join(e.cfg.CacheDir, ce.name)
		if ce.used {
			// Keep the directories the open cache writes into.
			errs = append(errs, removeFiles(path))
		} else {
			errs = append(errs, os.RemoveAll(path))
		}
		total -= ce.size
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("wasm: prune cache: %w", err)
	}
	return nil
}

// CacheSize returns the bytes of regular files under Config.CacheDir.
func (e *Engine) CacheSize() int64 {
	if e.cfg.CacheDir == "" {
		return 0
	}
	return dirSize(e.cfg.CacheDir)
}

func isDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// removeFiles removes the regular files under dir, keeping directories.
func removeFiles(dir string) error {
	var errs []error
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			errs = append(errs, os.Remove(path))
		}
		return nil
	})
	return errors.Join(errs...)
}
