package bundle

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"
)

// Limits that protect the loaders from hostile input. A bundle beyond any of
// them is refused whole.
const (
	// MaxTotalSize caps the summed size of a bundle's files (32 MiB).
	MaxTotalSize = 32 << 20
	// MaxFiles caps the number of files in a bundle.
	MaxFiles = 1000
	// MaxArchiveSize caps the decompressed size of a .tar.gz (headers,
	// padding and skipped entries included) so that a gzip bomb is cut off
	// after a bounded amount of work.
	MaxArchiveSize = 2*MaxTotalSize + 4<<20
	// MaxPathLen caps the length of a file's path in bytes.
	MaxPathLen = 256
	// MaxYAMLSize caps the summed size of a bundle's YAML files (*.yaml,
	// *.yml: bundle.yaml, rules.yaml, data.yaml, tests/): they are parsed
	// whenever the bundle is loaded, and YAML costs about 100 times its
	// size in memory and some 4 µs a node to parse (32 MiB of "1," took
	// over 2 minutes and 3 GB). Large data belongs in data.json.
	MaxYAMLSize = 1 << 20
)

// maxEntries caps the entries (files, directories and skipped hidden
// entries) read from an archive or a directory.
const maxEntries = 4 * MaxFiles

// archiveLabel is the File of errors about an archive as a whole.
const archiveLabel = "archive"

// LoadDir reads the bundle rooted at directory dir and validates it like
// [LoadFiles].
//
// Every regular file below dir becomes a file of the bundle, named by its
// slash-separated path relative to dir. Hidden files and directories (any
// path element starting with ".", such as .git or .DS_Store) are skipped.
//
// # Errors
//
// A symlink, device, socket or other non-regular entry below dir is refused
// ([ErrUnsupportedEntry]); dir itself may be a symlink. The limits
// [MaxFiles] and [MaxTotalSize] apply ([ErrTooManyFiles], [ErrTooLarge]).
// Every error is an *[Error].
func LoadDir(dir string) (*Bundle, error) { return Options{}.LoadDir(dir) }

// LoadDir is [LoadDir] with these options.
func (o Options) LoadDir(dir string) (*Bundle, error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, &Error{File: dir, Err: err}
	}
	if fi, err := os.Stat(root); err != nil {
		return nil, &Error{File: dir, Err: err}
	} else if !fi.IsDir() {
		return nil, &Error{File: dir, Err: errors.New("not a directory")}
	}
	c := newCollector()
	entries := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if p == root {
			return err
		}
		rel, rerr := filepath.Rel(root, p)
		if rerr != nil {
			return &Error{File: p, Err: rerr}
		}
		rel = filepath.ToSlash(rel)
		if err != nil {
			return &Error{File: rel, Err: err}
		}
		if entries++; entries > maxEntries {
			return &Error{File: dir, Err: classed(ErrTooManyFiles, "more than %d entries", maxEntries)}
		}
		if strings.HasPrefix(d.Name(), ".") && (d.IsDir() || isHidden(rel)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return &Error{File: rel, Err: classed(ErrUnsupportedEntry, "%s is not a regular file", describeMode(d.Type()))}
		}
		info, err := d.Info()
		if err != nil {
			return &Error{File: rel, Err: err}
		}
		if err := c.reserve(rel, info.Size()); err != nil {
			return err
		}
		content, err := readFileLimited(p, info.Size())
		if err != nil {
			return &Error{File: rel, Err: err}
		}
		return c.add(rel, content)
	})
	if err != nil {
		return nil, err
	}
	return validate(c.files, o)
}

func readFileLimited(p string, size int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	content, err := io.ReadAll(io.LimitReader(f, size+1))
	if err != nil {
		return nil, err
	}
	if int64(len(content)) != size {
		return nil, errors.New("file changed size while being read")
	}
	return content, nil
}

func describeMode(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return "a special file (" + m.String() + ")"
}

// LoadTarGz reads a bundle from a gzip-compressed tar archive and validates
// it like [LoadFiles].
//
// Regular-file entries become the bundle's files; directory entries are
// accepted and ignored. Leading "./" is stripped from entry names, and
// hidden entries (any path element starting with ".") are skipped. When the
// archive has no bundle.yaml at its root but holds a single top-level
// directory that does (as "tar czf b.tgz mybundle/" produces), that
// directory is taken as the root.
//
// # Errors
//
// Refused, naming the entry: an unsafe name (absolute, "..", see
// [ErrUnsafePath]), a symlink, hard link, device, FIFO or sparse file
// ([ErrUnsupportedEntry]), a path that appears twice or as both a file and a
// directory ([ErrDuplicateFile]), more than [MaxFiles] files
// ([ErrTooManyFiles]), more than [MaxTotalSize] bytes of content or more
// than [MaxArchiveSize] decompressed bytes ([ErrTooLarge]), and a corrupt
// gzip or tar stream. Every error is an *[Error].
func LoadTarGz(r io.Reader) (*Bundle, error) { return Options{}.LoadTarGz(r) }

// LoadTarGz is [LoadTarGz] with these options.
func (o Options) LoadTarGz(r io.Reader) (*Bundle, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, &Error{File: archiveLabel, Err: fmt.Errorf("gzip: %w", err)}
	}
	defer zr.Close()
	cr := &capReader{r: zr, left: MaxArchiveSize}
	tr := tar.NewReader(cr)
	c := newCollector()
	entries := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, archiveError(err)
		}
		if entries++; entries > maxEntries {
			return nil, &Error{File: archiveLabel, Err: classed(ErrTooManyFiles, "more than %d entries", maxEntries)}
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue // PAX global header (git archive writes one): metadata only
		}
		name := hdr.Name
		for strings.HasPrefix(name, "./") || strings.HasPrefix(name, "/") {
			name = strings.TrimPrefix(strings.TrimPrefix(name, "./"), "/")
		}
		if hdr.Typeflag == tar.TypeDir {
			name = strings.TrimRight(name, "/")
		}
		if name == "" || name == "." {
			continue // the archive's root directory
		}
		if err := checkPath(name); err != nil {
			return nil, &Error{File: hdr.Name, Err: err}
		}
		if isHidden(name) {
			continue
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := c.addDir(name); err != nil {
				return nil, err
			}
			continue
		case tar.TypeReg:
		default:
			return nil, &Error{File: name, Err: classed(ErrUnsupportedEntry, "%s is not a regular file", describeTarType(hdr.Typeflag))}
		}
		if err := c.reserve(name, hdr.Size); err != nil {
			return nil, err
		}
		content := make([]byte, hdr.Size)
		if _, err := io.ReadFull(tr, content); err != nil {
			e := archiveError(err)
			e.File = name
			return nil, e
		}
		if err := c.add(name, content); err != nil {
			return nil, err
		}
	}
	// Read the rest of the gzip stream (tar padding, trailing members) so
	// that its checksum is verified; the cap still applies.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return nil, archiveError(err)
	}
	stripTopDir(c.files)
	return validate(c.files, o)
}

func archiveError(err error) *Error {
	if errors.Is(err, errArchiveCap) {
		return &Error{File: archiveLabel, Err: classed(ErrTooLarge, "decompresses to more than %d bytes", MaxArchiveSize)}
	}
	return &Error{File: archiveLabel, Err: fmt.Errorf("corrupt archive: %w", err)}
}

func describeTarType(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "a symlink"
	case tar.TypeLink:
		return "a hard link"
	case tar.TypeChar:
		return "a character device"
	case tar.TypeBlock:
		return "a block device"
	case tar.TypeFifo:
		return "a FIFO"
	case tar.TypeGNUSparse:
		return "a sparse file"
	}
	return fmt.Sprintf("an entry of type %q", t)
}

var errArchiveCap = errors.New("archive size cap reached")

// capReader fails with errArchiveCap once more than left bytes were read.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		// Probe for one more byte: reaching EOF exactly at the cap is fine.
		var one [1]byte
		n, err := c.r.Read(one[:])
		if n > 0 {
			return 0, errArchiveCap
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// stripTopDir re-roots files at their single top-level directory when the
// root has no manifest and that directory does.
func stripTopDir(files map[string][]byte) {
	if _, ok := files[ManifestFile]; ok || len(files) == 0 {
		return
	}
	if _, ok := files[OPAManifestFile]; ok {
		return
	}
	top := ""
	for p := range files {
		i := strings.IndexByte(p, '/')
		if i < 0 {
			return
		}
		if top == "" {
			top = p[:i+1]
		} else if p[:i+1] != top {
			return
		}
	}
	_, wicket := files[top+ManifestFile]
	_, opa := files[top+OPAManifestFile]
	if !wicket && !opa {
		return
	}
	for p, c := range files {
		delete(files, p)
		files[p[len(top):]] = c
	}
}

// LoadFiles validates the files of a bundle, keyed by slash-separated path
// relative to the bundle root, and returns the bundle. [LoadDir] and
// [LoadTarGz] end here too, so all three accept and refuse the same bundles.
//
// Paths must already be clean ("tests/basic.yaml", not "./tests//basic.yaml").
// Paths with a hidden element (starting with ".") are skipped, as the other
// loaders skip them. The returned bundle refers to the given byte slices;
// do not modify them afterwards.
//
// # Validation
//
//   - bundle.yaml, when present, is decoded strictly ([ParseManifest]);
//     without it the name comes from [Options.Name];
//   - OPA's bundle reader checks .manifest (roots, rego_version, wasm
//     entrypoints), parses every .rego file and merges every data.json,
//     data.yaml and data.yml under its directory's path ([Bundle.Data]);
//   - .signatures.json is verified when [Options.Keys] are given;
//   - the engine's files must be present: rules.yaml for rules, at least one
//     *.rego file for rego, policy.wasm (with the wasm magic number) for
//     wasm;
//   - a root data file must hold an object;
//   - every tests/**.yaml (or .yml) file must parse ([ParseTestFile]) and test
//     case names must be unique across files;
//   - for the rules engine, a default_action in both bundle.yaml and
//     rules.yaml must agree (see [Bundle.DefaultAction]); the rest of
//     rules.yaml is validated by the rules engine when it compiles the
//     bundle;
//   - paths must be safe ([ErrUnsafePath]), unique, and no path may be both a
//     file and a directory ([ErrDuplicateFile]); [MaxFiles] and
//     [MaxTotalSize] apply.
//
// # Errors
//
// A bundle that fails any check is refused whole with an *[Error] that names
// the file and, where there is one, the field.
func LoadFiles(files map[string][]byte) (*Bundle, error) { return Options{}.LoadFiles(files) }

// LoadFiles is [LoadFiles] with these options.
func (o Options) LoadFiles(files map[string][]byte) (*Bundle, error) {
	c := newCollector()
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths) // deterministic errors
	for _, p := range paths {
		if err := checkPath(p); err != nil {
			return nil, &Error{File: p, Err: err}
		}
		if isHidden(p) {
			continue
		}
		if err := c.reserve(p, int64(len(files[p]))); err != nil {
			return nil, err
		}
		if err := c.add(p, files[p]); err != nil {
			return nil, err
		}
	}
	return validate(c.files, o)
}

// collector gathers files under the limits.
type collector struct {
	files map[string][]byte
	dirs  map[string]bool
	total int64
	yaml  int64 // bytes of YAML files
}

func newCollector() *collector {
	return &collector{files: make(map[string][]byte), dirs: make(map[string]bool)}
}

// reserve checks that a file of size bytes may be added under name.
func (c *collector) reserve(name string, size int64) error {
	if _, dup := c.files[name]; dup {
		return &Error{File: name, Err: classed(ErrDuplicateFile, "appears more than once")}
	}
	if len(c.files) >= MaxFiles {
		return &Error{File: name, Err: classed(ErrTooManyFiles, "bundle has more than %d files", MaxFiles)}
	}
	if size < 0 || size > MaxTotalSize-c.total {
		return &Error{File: name, Err: classed(ErrTooLarge, "%d bytes would take the bundle past %d bytes", size, MaxTotalSize)}
	}
	if isYAML(name) && size > MaxYAMLSize-c.yaml {
		return &Error{File: name, Err: classed(ErrTooLarge, "%d bytes of YAML would take the bundle's YAML files past %d bytes (YAML is costly to parse; put large data in data.json)", size, MaxYAMLSize)}
	}
	return nil
}

// isYAML reports whether a bundle file is YAML, by its name.
func isYAML(name string) bool {
	return strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")
}

// add records a file that reserve accepted.
func (c *collector) add(name string, content []byte) error {
	if c.dirs[name] {
		return &Error{File: name, Err: classed(ErrDuplicateFile, "is both a file and a directory")}
	}
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		if _, clash := c.files[d]; clash {
			return &Error{File: name, Err: classed(ErrDuplicateFile, "%s is both a file and a directory", d)}
		}
		if c.dirs[d] {
			break // its ancestors were checked when it was recorded
		}
		c.dirs[d] = true
	}
	c.files[name] = content
	c.total += int64(len(content))
	if isYAML(name) {
		c.yaml += int64(len(content))
	}
	return nil
}

// addDir records an explicit directory entry.
func (c *collector) addDir(name string) error {
	if _, clash := c.files[name]; clash {
		return &Error{File: name, Err: classed(ErrDuplicateFile, "is both a file and a directory")}
	}
	for d := name; d != "."; d = path.Dir(d) {
		if _, clash := c.files[d]; clash {
			return &Error{File: name, Err: classed(ErrDuplicateFile, "%s is both a file and a directory", d)}
		}
		c.dirs[d] = true
	}
	return nil
}

// checkPath accepts clean, relative, slash-separated paths of valid UTF-8
// without "." or ".." elements, backslashes or control characters.
func checkPath(p string) error {
	switch {
	case p == "":
		return classed(ErrUnsafePath, "empty path")
	case len(p) > MaxPathLen:
		return classed(ErrUnsafePath, "path longer than %d bytes", MaxPathLen)
	case !utf8.ValidString(p):
		return classed(ErrUnsafePath, "path is not valid UTF-8")
	case strings.HasPrefix(p, "/"):
		return classed(ErrUnsafePath, "absolute path")
	case strings.ContainsRune(p, '\\'):
		return classed(ErrUnsafePath, "backslash in path")
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return classed(ErrUnsafePath, "control character in path")
		}
	}
	for _, el := range strings.Split(p, "/") {
		switch el {
		case "..":
			return classed(ErrUnsafePath, `".." in path`)
		case ".":
			return classed(ErrUnsafePath, `"." element in path`)
		case "":
			return classed(ErrUnsafePath, "empty path element")
		}
	}
	return nil
}

// isHidden reports whether a path element of the (checked) path p starts
// with ".", except for OPA's .manifest and .signatures.json at the root,
// which are part of the bundle.
func isHidden(p string) bool {
	if p == OPAManifestFile || p == SignaturesFile {
		return false
	}
	return strings.HasPrefix(p, ".") || strings.Contains(p, "/.")
}
