package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeDir(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, c, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestTarGzRoundTrip(t *testing.T) {
	b, err := LoadFiles(rulesFiles())
	if err != nil {
		t.Fatal(err)
	}
	gz, err := b.TarGz()
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.TarGz()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gz, again) {
		t.Error("TarGz is not reproducible: two calls differ")
	}
	b2, err := LoadTarGz(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	if b2.Digest != b.Digest {
		t.Errorf("digest after round trip %s, want %s", b2.Digest, b.Digest)
	}
	if len(b2.Files) != len(b.Files) {
		t.Errorf("files after round trip: %d, want %d", len(b2.Files), len(b.Files))
	}
	for p, c := range b.Files {
		if !bytes.Equal(b2.Files[p], c) {
			t.Errorf("%s differs after round trip", p)
		}
	}

	// The archive of the reloaded bundle is byte-identical.
	gz2, err := b2.TarGz()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gz, gz2) {
		t.Error("TarGz of the reloaded bundle differs")
	}

	// Metadata is fixed.
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() || zr.Comment != "" {
		t.Errorf("gzip header: name %q, mtime %v, comment %q", zr.Name, zr.ModTime, zr.Comment)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Typeflag != tar.TypeReg || h.Mode != 0o644 || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("entry %s: type %c mode %o uid %d gid %d uname %q gname %q mtime %v", h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime)
		}
	}
	if want := sortedKeys(b.Files); strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("entries %v, want sorted %v", names, want)
	}
}

func TestDigestSameAcrossLoaders(t *testing.T) {
	files := rulesFiles()
	fromFiles, err := LoadFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	dir := writeDir(t, withFiles(files, ".git/HEAD", "ref: main", ".DS_Store", "x"))
	fromDir, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// An archive as tar(1) makes it: "./" prefixes, directory entries,
	// owners and times, in no particular order.
	entries := []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755}}, {hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./tests/", Mode: 0o755}}}
	for _, e := range bundleEntries("./") {
		e.hdr.Uid, e.hdr.Uname, e.hdr.ModTime = 1000, "dev", time.Now()
		entries = append([]tarEntry{e}, entries...)
	}
	fromTar, err := LoadTarGz(bytes.NewReader(makeTarGz(t, entries...)))
	if err != nil {
		t.Fatal(err)
	}
	// And one with a single top-level directory.
	fromTopDir, err := LoadTarGz(bytes.NewReader(makeTarGz(t, bundleEntries("guard/")...)))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*Bundle{"dir": fromDir, "tar": fromTar, "top-level dir": fromTopDir} {
		if b.Digest != fromFiles.Digest {
			t.Errorf("%s: digest %s, want %s", name, b.Digest, fromFiles.Digest)
		}
	}
}

func TestDigestScheme(t *testing.T) {
	// Computed independently: printf '1:a1:x2:bc0:' | sha256sum
	got := Digest(map[string][]byte{"bc": nil, "a": []byte("x")})
	if want := "310c86c7db6642531ad25daab5db349273f0cacf05e84c4fe69a83fa7c493217"; got != want {
		t.Errorf("Digest = %s, want %s", got, want)
	}
	if Digest(map[string][]byte{"ab": []byte("c")}) == Digest(map[string][]byte{"a": []byte("bc")}) {
		t.Error("length prefixes do not separate path and content")
	}
	if Digest(map[string][]byte{"a": []byte("x"), "b": nil}) == Digest(map[string][]byte{"a": []byte("x")}) {
		t.Error("an empty file does not count")
	}
	if Digest(nil) != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Errorf("Digest(nil) = %s, want sha256 of nothing", Digest(nil))
	}
}

func TestLoadDirRefusesSymlinks(t *testing.T) {
	dir := writeDir(t, rulesFiles())
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "tests", "evil.yaml")); err != nil {
		t.Skip("symlinks unsupported:", err)
	}
	_, err := LoadDir(dir)
	wantErr(t, err, ErrUnsupportedEntry, "tests/evil.yaml", "", "symlink")
}

func TestLoadDirRootSymlink(t *testing.T) {
	dir := writeDir(t, rulesFiles())
	link := filepath.Join(t.TempDir(), "current")
	if err := os.Symlink(dir, link); err != nil {
		t.Skip("symlinks unsupported:", err)
	}
	if _, err := LoadDir(link); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDirErrors(t *testing.T) {
	_, err := LoadDir(filepath.Join(t.TempDir(), "nope"))
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing dir: %v", err)
	}
	f := filepath.Join(t.TempDir(), "f")
	os.WriteFile(f, nil, 0o644)
	if _, err := LoadDir(f); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("file as dir: %v", err)
	}
}

// TestLoadDirNotABundle: a directory with nothing of a bundle in it is
// "not a bundle", blamed on no file; one with a bundle.yaml but no policy
// is blamed on bundle.yaml's engine.
func TestLoadDirNotABundle(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Options{Name: "x"}.LoadDir(dir)
	var e *Error
	if !errors.As(err, &e) || e.File != "" || !errors.Is(err, ErrMissingFile) || !strings.Contains(err.Error(), "not a bundle: no bundle.yaml or .manifest") {
		t.Errorf("a directory that is no bundle: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), []byte("name: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Options{Name: "x"}.LoadDir(dir)
	if !errors.As(err, &e) || e.File != ManifestFile || e.Field != "engine" {
		t.Errorf("a bundle.yaml with no policy: %v", err)
	}
}

// TestHostileTarballs feeds archives an attacker could upload and checks
// that each is refused with a precise error before any damage is done.
func TestHostileTarballs(t *testing.T) {
	valid := bundleEntries("")
	with := func(extra ...tarEntry) []byte {
		return makeTarGz(t, append(append([]tarEntry{}, valid...), extra...)...)
	}
	big := func(name string, size int64) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size}, short: true}
	}
	tests := []struct {
		name  string
		gz    []byte
		class error
		file  string
		want  string
	}{
		{"path traversal", with(file("../../etc/cron.d/x", "* * * * * root sh")), ErrUnsafePath, "../../etc/cron.d/x", `".."`},
		{"nested traversal", with(file("tests/../../x", "x")), ErrUnsafePath, "tests/../../x", `".."`},
		{"symlink", with(tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "data.json.link", Linkname: "/etc/shadow"}}), ErrUnsupportedEntry, "data.json.link", "symlink"},
		{"hard link", with(tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "l", Linkname: "bundle.yaml"}}), ErrUnsupportedEntry, "l", "hard link"},
		{"char device", with(tarEntry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Devmajor: 1, Devminor: 3}}), ErrUnsupportedEntry, "dev/null", "character device"},
		{"block device", with(tarEntry{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda"}}), ErrUnsupportedEntry, "sda", "block device"},
		{"fifo", with(tarEntry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "pipe"}}), ErrUnsupportedEntry, "pipe", "FIFO"},
		{"duplicate entry", with(file("rules.yaml", "default_action: allow\n")), ErrDuplicateFile, "rules.yaml", "more than once"},
		{"duplicate via ./", with(file("./bundle.yaml", "name: other\nengine: rules\n")), ErrDuplicateFile, "bundle.yaml", "more than once"},
		{"file then dir", with(file("x", "1"), tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "x/"}}), ErrDuplicateFile, "x", "both a file and a directory"},
		{"file under file", with(file("rules.yaml/x", "1")), ErrDuplicateFile, "rules.yaml/x", "both a file and a directory"},
		{"file too big", with(big("huge.bin", MaxTotalSize+1)), ErrTooLarge, "huge.bin", "past"},
		{"declared 1 TiB", with(big("huge.bin", 1<<40)), ErrTooLarge, "huge.bin", "past"},
		{"total too big", with(file("a.bin", strings.Repeat("a", MaxTotalSize/2)), big("b.bin", MaxTotalSize/2)), ErrTooLarge, "b.bin", "past"},
		{"not gzip", []byte("PK\x03\x04 this is a zip"), nil, "archive", "gzip"},
		{"truncated", func() []byte { g := with(); return g[:len(g)/2] }(), nil, "", "corrupt archive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadTarGz(bytes.NewReader(tt.gz))
			wantErr(t, err, tt.class, tt.file, "", tt.want)
		})
	}
}

func TestTarTooManyFiles(t *testing.T) {
	entries := bundleEntries("")
	for i := 0; len(entries) <= MaxFiles; i++ {
		entries = append(entries, file(fmt.Sprintf("f/%04d", i), ""))
	}
	_, err := LoadTarGz(bytes.NewReader(makeTarGz(t, entries...)))
	if !errors.Is(err, ErrTooManyFiles) {
		t.Fatalf("err = %v, want ErrTooManyFiles", err)
	}
}

// TestGzipBomb: a small archive that decompresses to far more than any
// bundle may hold is cut off after MaxArchiveSize bytes, whether the bytes
// hide in a skipped entry or after the end of the tar stream.
func TestGzipBomb(t *testing.T) {
	if testing.Short() {
		t.Skip("decompresses ~140 MiB")
	}
	// Gzip readers decompress concatenated members as one stream, so one
	// compressed MiB of zeros repeated makes a bomb of any size cheaply.
	zeroMiB := gzipBytes(t, make([]byte, 1<<20))
	bomb := func(prefix []byte, n int) []byte {
		out := gzipBytes(t, prefix)
		for i := 0; i < n; i++ {
			out = append(out, zeroMiB...)
		}
		return out
	}
	t.Run("hidden entry", func(t *testing.T) {
		// A hidden entry is skipped but its bytes are still read.
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: ".pad", Size: MaxArchiveSize + 1<<20, Mode: 0o644})
		gz := bomb(tb.Bytes(), MaxArchiveSize>>20+2)
		if len(gz) > 1<<20 {
			t.Fatalf("bomb is %d bytes, want a small one", len(gz))
		}
		_, err := LoadTarGz(bytes.NewReader(gz))
		wantErr(t, err, ErrTooLarge, "archive", "", "decompresses to more than")
	})
	t.Run("trailing zeros", func(t *testing.T) {
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		for _, e := range bundleEntries("") {
			tw.WriteHeader(&e.hdr)
			tw.Write(e.body)
		}
		tw.Close()
		_, err := LoadTarGz(bytes.NewReader(bomb(tb.Bytes(), MaxArchiveSize>>20+2)))
		wantErr(t, err, ErrTooLarge, "archive", "", "decompresses to more than")
	})
}
