package policytest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// Found is a bundle [Discover] found: a directory or an archive.
type Found struct {
	// Path is the bundle's path as found below the path given (a
	// directory, or a .tar.gz file).
	Path string
	// Archive reports whether Path is a .tar.gz (or .tgz) file.
	Archive bool
}

// ErrNoBundles is returned (wrapped, naming the path) by [Discover] for a
// path below which no bundle was found.
var ErrNoBundles = errors.New("no bundles found (a bundle is a directory with bundle.yaml or .manifest, or a .tar.gz)")

// IsArchive reports whether the file name p names a bundle archive.
func IsArchive(p string) bool {
	l := strings.ToLower(p)
	return strings.HasSuffix(l, ".tar.gz") || strings.HasSuffix(l, ".tgz")
}

// Discover finds every bundle below each path, in path order then walk
// order (lexical), each once:
//
//   - a directory holding bundle.yaml or OPA's .manifest is a bundle, and
//     nothing below it is looked at (its files are the bundle's);
//   - a .tar.gz or .tgz file is a bundle;
//   - below a path, directories whose name starts with "." or "_", and
//     directories named testdata, are skipped, as the go tool skips them;
//   - a path that is itself a directory with a policy at its root
//     (rules.yaml, a .rego file or policy.wasm) but no manifest and no
//     bundle below it is a bundle too: OPA's layout without .manifest, as
//     `opa build DIR` takes it.
//
// A path that does not exist is an error, and so is one below which no
// bundle is found ([ErrNoBundles]).
func Discover(paths ...string) ([]Found, error) {
	var out []Found
	seen := make(map[string]bool)
	for _, root := range paths {
		found, err := discover(root)
		if err != nil {
			return nil, err
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("%s: %w", root, ErrNoBundles)
		}
		for _, f := range found {
			key, err := filepath.Abs(f.Path)
			if err != nil {
				key = f.Path
			}
			if !seen[key] {
				seen[key] = true
				out = append(out, f)
			}
		}
	}
	return out, nil
}

func discover(root string) ([]Found, error) {
	st, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		if !IsArchive(root) {
			return nil, fmt.Errorf("%s: not a directory or a .tar.gz bundle", root)
		}
		return []Found{{Path: root, Archive: true}}, nil
	}
	var out []Found
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root {
				name := d.Name()
				if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" {
					return filepath.SkipDir
				}
			}
			if isBundleDir(p) {
				out = append(out, Found{Path: p})
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() && IsArchive(d.Name()) && !strings.HasPrefix(d.Name(), ".") {
			out = append(out, Found{Path: p, Archive: true})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 && hasPolicyFiles(root) {
		out = append(out, Found{Path: root})
	}
	return out, nil
}

// isBundleDir reports whether dir holds bundle.yaml or .manifest.
func isBundleDir(dir string) bool {
	for _, name := range []string{bundle.ManifestFile, bundle.OPAManifestFile} {
		if st, err := os.Stat(filepath.Join(dir, name)); err == nil && st.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// hasPolicyFiles reports whether dir holds, at its root, a policy file of
// one of the engines.
func hasPolicyFiles(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && (n == bundle.RulesFile || n == bundle.WasmFile || filepath.Ext(n) == ".rego") {
			return true
		}
	}
	return false
}
