package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	opabundle "github.com/open-policy-agent/opa/v1/bundle"
)

const authzDir = "testdata/opa-authz"

// wantAuthzData is the data document OPA makes of testdata/opa-authz.
const wantAuthzData = `{"agents":{"researcher":{"tools":["fs.read","shell.exec","http.get"]},"writer":{"tools":["fs.write"]}},"tools":{"guarded":["shell.exec"]}}`

// slashTarGz packs files as OPA's tarball writer names entries: "/path".
func slashTarGz(t testing.TB, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for p, c := range files {
		if err := tw.WriteHeader(&tar.Header{Name: "/" + p, Mode: 0o644, Size: int64(len(c)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func readDirFiles(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files[filepath.ToSlash(rel)], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func sameJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("data %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("data = %s\nwant   %s", got, want)
	}
}

// TestOPALayout loads the OPA bundle of testdata/opa-authz (no bundle.yaml,
// data at nested paths, .manifest) as a directory, as a tarball with
// OPA's leading "/" entry names, and as OPA's own bundle writer packs it.
func TestOPALayout(t *testing.T) {
	files := readDirFiles(t, authzDir)
	// OPA's own reader and writer, as `opa build` uses them.
	ob, err := opabundle.NewCustomReader(opabundle.NewDirectoryLoader(authzDir)).Read()
	if err != nil {
		t.Fatal(err)
	}
	var written bytes.Buffer
	if err := opabundle.NewWriter(&written).UseModulePath(true).Write(ob); err != nil {
		t.Fatal(err)
	}
	opts := Options{Name: "authz"}
	loads := map[string]func() (*Bundle, error){
		"directory":  func() (*Bundle, error) { return opts.LoadDir(authzDir) },
		"slash tar":  func() (*Bundle, error) { return opts.LoadTarGz(bytes.NewReader(slashTarGz(t, files))) },
		"OPA writer": func() (*Bundle, error) { return opts.LoadTarGz(bytes.NewReader(written.Bytes())) },
		"files":      func() (*Bundle, error) { return opts.LoadFiles(files) },
	}
	for name, load := range loads {
		t.Run(name, func(t *testing.T) {
			b, err := load()
			if err != nil {
				t.Fatal(err)
			}
			m := b.Manifest
			if m.Name != "authz" || m.Revision != "2026-12-01.1" || m.Engine != EngineRego || m.Entrypoint != "" {
				t.Errorf("manifest = %+v", m)
			}
			sameJSON(t, b.Data, wantAuthzData)
			if got := strings.Join(b.OPA.Roots, ","); got != "wicket,lib,agents,tools" {
				t.Errorf("roots = %s", got)
			}
			if b.OPA.Metadata["owner"] != "platform" {
				t.Errorf("metadata = %v", b.OPA.Metadata)
			}
			if b.Signature.State != SignatureNone {
				t.Errorf("signature = %+v", b.Signature)
			}
			if _, ok := b.Files[OPAManifestFile]; !ok {
				t.Errorf(".manifest not kept in Files")
			}
		})
	}
	t.Run("digest does not depend on the packing", func(t *testing.T) {
		d1, _ := opts.LoadDir(authzDir)
		d2, _ := opts.LoadTarGz(bytes.NewReader(slashTarGz(t, files)))
		if d1 == nil || d2 == nil || d1.Digest != d2.Digest {
			t.Errorf("digests differ")
		}
	})
}

func TestOPADataMerge(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"root and nested", map[string]string{"data.json": `{"a": {"x": 1}}`, "a/data.json": `{"y": 2}`, "b/c/data.yaml": "z: [3]\n"},
			`{"a": {"x": 1, "y": 2}, "b": {"c": {"z": [3]}}}`},
		{"yml too", map[string]string{"k/data.yml": "v: true\n"}, `{"k": {"v": true}}`},
		{"big numbers kept exact", map[string]string{"n/data.json": `{"id": 12345678901234567890}`}, `{"n": {"id": 12345678901234567890}}`},
		{"other json is not data", map[string]string{"a/config.json": `{"x": 1}`, "a/data.json": `{"y": 1}`}, `{"a": {"y": 1}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string][]byte{"p.rego": []byte("package p\n\nx := 1\n")}
			for p, c := range tt.files {
				files[p] = []byte(c)
			}
			b, err := Options{Name: "m"}.LoadFiles(files)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(tt.name, "big") {
				sameJSON(t, b.Data, tt.want)
			} else if !strings.Contains(string(b.Data), "12345678901234567890") {
				t.Errorf("data = %s: number not kept exactly", b.Data)
			}
		})
	}
	t.Run("no data files: nil", func(t *testing.T) {
		b, err := Options{Name: "m"}.LoadFiles(map[string][]byte{"p.rego": []byte("package p\n")})
		if err != nil || b.Data != nil {
			t.Fatalf("data = %s, %v", b.Data, err)
		}
	})
}

func TestOPALayoutRefusals(t *testing.T) {
	rego := "package wicket\n\ndecision := {\"decision\": \"allow\"}\n"
	tests := []struct {
		name  string
		files map[string]string
		file  string
		want  string
	}{
		{"data outside roots", map[string]string{".manifest": `{"roots": ["wicket"]}`, "p.rego": rego, "agents/data.json": `{}`}, ".manifest", "do not permit data at path '/agents'"},
		{"package outside roots", map[string]string{".manifest": `{"roots": ["wicket"]}`, "p.rego": rego, "q.rego": "package other\n"}, ".manifest", "do not permit"},
		{"overlapping roots", map[string]string{".manifest": `{"roots": ["a", "a/b"]}`, "p.rego": rego}, ".manifest", "overlapped roots"},
		{"bad rego_version", map[string]string{".manifest": `{"rego_version": 7}`, "p.rego": rego}, ".manifest", "rego_version"},
		{"manifest not JSON", map[string]string{".manifest": `{roots`, "p.rego": rego}, ".manifest", "manifest"},
		{"nested data not JSON", map[string]string{"p.rego": rego, "a/data.json": `{`}, "a/data.json", "invalid JSON"},
		{"nested data not YAML", map[string]string{"p.rego": rego, "a/data.yaml": "a: [\n"}, "a/data.yaml", "invalid YAML"},
		{"root data not an object", map[string]string{"p.rego": rego, "data.json": `[1]`}, "data.json", "JSON object"},
		{"data collides", map[string]string{"p.rego": rego, "data.json": `{"a": 1}`, "a/data.json": `{"b": 2}`}, "data.json", "collides"},
		{"v0 syntax in a v1 bundle", map[string]string{"p.rego": "package wicket\n\nallow { true }\n"}, "p.rego", "rego_parse_error"},
		{"delta bundle", map[string]string{"p.rego": rego, "patch.json": `{"data": []}`}, "patch.json", "delta"},
		{"revisions disagree", map[string]string{".manifest": `{"revision": "2"}`, "bundle.yaml": "revision: \"1\"\n", "p.rego": rego}, "bundle.yaml", "contradicts .manifest revision"},
		{"wasm entrypoints ambiguous", map[string]string{".manifest": `{"wasm": [{"entrypoint": "a/b", "module": "/policy.wasm"}, {"entrypoint": "a/c", "module": "/policy.wasm"}]}`, "policy.wasm": "\x00asm\x01\x00\x00\x00"}, "bundle.yaml", "(a/b, a/c): name the one to evaluate with entrypoint: in bundle.yaml, or build with one -e"},
		{"annotated entrypoints ambiguous", map[string]string{"p.rego": "package a\n\n# METADATA\n# entrypoint: true\nb := true\n\n# METADATA\n# entrypoint: true\nc := true\n"}, "bundle.yaml", "(data.a.b, data.a.c): name the one to evaluate with entrypoint: in bundle.yaml"},
		{"abi on a rego bundle", map[string]string{"bundle.yaml": "abi: opa\n", "p.rego": rego}, "bundle.yaml", "only wasm bundles"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string][]byte{}
			for p, c := range tt.files {
				files[p] = []byte(c)
			}
			_, err := Options{Name: "r"}.LoadFiles(files)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want an *Error", err)
			}
			if e.File != tt.file || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %q (file %q), want file %q and %q", err, e.File, tt.file, tt.want)
			}
		})
	}
}

func TestOPAInference(t *testing.T) {
	wasm := "\x00asm\x01\x00\x00\x00"
	tests := []struct {
		name                   string
		files                  map[string]string
		engine, abi, entry, rv string
	}{
		{"opa build -t wasm", map[string]string{".manifest": `{"revision": "9", "wasm": [{"entrypoint": "authz/allow", "module": "/policy.wasm"}]}`, "policy.wasm": wasm, "authz.rego": "package authz\n\nallow := true\n"},
			EngineWasm, ABIOPA, "authz/allow", "9"},
		{"bundle.yaml engine wasm, OPA manifest", map[string]string{"bundle.yaml": "engine: wasm\ndefault_action: allow\n", ".manifest": `{"wasm": [{"entrypoint": "w/d", "module": "/policy.wasm"}]}`, "policy.wasm": wasm},
			EngineWasm, ABIOPA, "w/d", ""},
		{"several wasm entrypoints, wicket/decision among them", map[string]string{".manifest": `{"wasm": [{"entrypoint": "wicket/decision", "module": "/policy.wasm"}, {"entrypoint": "wicket/tests/test_x", "module": "/policy.wasm"}]}`, "policy.wasm": wasm},
			EngineWasm, ABIOPA, "wicket/decision", ""},
		{"wicket wasm keeps its ABI", map[string]string{"bundle.yaml": "engine: wasm\n", "policy.wasm": wasm}, EngineWasm, "", "", ""},
		{"rego with an annotated entrypoint", map[string]string{"authz.rego": "# METADATA\n# entrypoint: true\npackage authz\n\nallow := true\n"}, EngineRego, "", "data.authz", ""},
		{"bundle.yaml entrypoint wins", map[string]string{"bundle.yaml": "entrypoint: data.x.y\n", "authz.rego": "# METADATA\n# entrypoint: true\npackage authz\n\nallow := true\n"}, EngineRego, "", "data.x.y", ""},
		{"rules", map[string]string{"rules.yaml": "default_action: allow\n"}, EngineRules, "", "", ""},
		{"rego v0 by .manifest", map[string]string{".manifest": `{"rego_version": 0}`, "p.rego": "package wicket\n\ndecision = {\"decision\": \"allow\"} { true }\n"}, EngineRego, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string][]byte{}
			for p, c := range tt.files {
				files[p] = []byte(c)
			}
			b, err := Options{Name: "i"}.LoadFiles(files)
			if err != nil {
				t.Fatal(err)
			}
			m := b.Manifest
			if m.Engine != tt.engine || m.ABI != tt.abi || m.Entrypoint != tt.entry || m.Revision != tt.rv {
				t.Errorf("manifest = %+v, want engine %s abi %q entrypoint %q revision %q", m, tt.engine, tt.abi, tt.entry, tt.rv)
			}
		})
	}
	t.Run("no name, no bundle.yaml", func(t *testing.T) {
		_, err := LoadFiles(map[string][]byte{"p.rego": []byte("package p\n")})
		if !errors.Is(err, ErrMissingFile) || !strings.Contains(err.Error(), "no name") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("rego version per file", func(t *testing.T) {
		b, err := Options{Name: "v"}.LoadFiles(map[string][]byte{
			".manifest":  []byte(`{"rego_version": 1, "file_rego_versions": {"/old/*.rego": 0}}`),
			"old/p.rego": []byte("package old\n\nallow { true }\n"),
			"new.rego":   []byte("package new\n\nallow if true\n"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if v := b.RegoVersion("old/p.rego").Int(); v != 0 {
			t.Errorf("old/p.rego: v%d, want v0", v)
		}
		if v := b.RegoVersion("new.rego").Int(); v != 1 {
			t.Errorf("new.rego: v%d, want v1", v)
		}
	})
}

// BenchmarkLoadOPABundle measures loading testdata/opa-authz from a
// tarball: our collector, then OPA's reader (parse, data merge, roots).
func BenchmarkLoadOPABundle(b *testing.B) {
	ar := slashTarGz(b, readDirFiles(b, authzDir))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := (Options{Name: "authz"}).LoadTarGz(bytes.NewReader(ar)); err != nil {
			b.Fatal(err)
		}
	}
}
