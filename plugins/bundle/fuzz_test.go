package bundle

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzManifest loads a bundle whose bundle.yaml is fuzzed: loading must
// never panic, errors must be *Error, and an accepted bundle must load again
// from its own files to the same digest. (TarGz is left out: its compressor
// set-up dominates the run time; TestTarGzRoundTrip covers it.)
func FuzzManifest(f *testing.F) {
	// The manifests of the repository's bundles seed the corpus.
	seeds, _ := filepath.Glob("../rules/testdata/*/bundle.yaml")
	stock, _ := filepath.Glob("../../bundles/*/*/bundle.yaml")
	for _, p := range append(seeds, stock...) {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		testManifest,
		testManifest + "default_action: allow\n",
		"name: w\nengine: wasm\nabi: opa\nentrypoint: x\nsandbox: {memory_pages: 2, timeout: 1s, grants: [clock]}\n",
		"name: r\nengine: rego\nentrypoint: data.wicket.decision\nrate_limits:\n  - {id: a, targets: ['x*'], max_calls: 1, window: 1m, per: agent}\n",
		"name: g\nengine: rules\nrate_limits: [{id: a, max_calls: 0}]\n",
		"{name: [1, {a: *x}]}",
		"name: &a g\nengine: *a\n",
		"---\n...\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, manifest []byte) {
		files := map[string][]byte{
			"bundle.yaml":    manifest,
			"rules.yaml":     []byte(testRules),
			"policy.rego":    []byte("package wicket\n"),
			"policy.wasm":    []byte("\x00asm\x01\x00\x00\x00"),
			"tests/a.yaml":   []byte(testCases),
			"data.json":      []byte(`{}`),
			"docs/notes.txt": []byte("x"),
		}
		b, err := LoadFiles(files)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %v is a %T, want *Error", err, err)
			}
			return
		}
		_ = b.DefaultAction()
		b2, err := LoadFiles(b.Files)
		if err != nil {
			t.Fatalf("reload: %v", err)
		}
		if b2.Digest != b.Digest || b2.Manifest.Name != b.Manifest.Name {
			t.Fatalf("reload changed the bundle")
		}
	})
}

// FuzzLoadTarGz feeds arbitrary bytes to the archive reader: it must never
// panic and must only return *Error.
func FuzzLoadTarGz(f *testing.F) {
	b, err := LoadFiles(rulesFiles())
	if err != nil {
		f.Fatal(err)
	}
	gz, err := b.TarGz()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(gz)
	f.Add(gz[:len(gz)/2])
	f.Add([]byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := LoadTarGz(bytes.NewReader(data))
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %v is a %T, want *Error", err, err)
			}
		}
	})
}

// FuzzTestFile parses fuzzed test files; every accepted case must build an
// input.
func FuzzTestFile(f *testing.F) {
	f.Add([]byte(testCases))
	f.Add([]byte("cases:\n  - {name: a, step: {kind: llm_call, target: m, args: [1, {a: 0x10}]}, expect: {decision: abort}}\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		cases, err := ParseTestFile("tests/f.yaml", src)
		if err != nil {
			return
		}
		for _, c := range cases {
			if _, err := c.Input(); err != nil {
				t.Fatalf("accepted case %q has no input: %v", c.Name, err)
			}
		}
	})
}

// FuzzOPAManifest loads an OPA-layout bundle whose .manifest and nested
// data file are fuzzed: no panic, errors are *Error, and an accepted bundle
// reloads to the same digest and data.
func FuzzOPAManifest(f *testing.F) {
	f.Add([]byte(`{"revision": "1", "roots": ["wicket", "agents"]}`), []byte(`{"a": {"tools": ["x"]}}`))
	f.Add([]byte(`{"roots": [""], "rego_version": 0, "metadata": {"k": [1, 2]}}`), []byte(`[1]`))
	f.Add([]byte(`{"wasm": [{"entrypoint": "wicket/decision", "module": "/policy.wasm"}]}`), []byte(`{}`))
	f.Add([]byte(`{"roots": ["a", "a/b"]}`), []byte(`{"x": 1e400}`))
	f.Add([]byte(`{"file_rego_versions": {"/*.rego": 0}}`), []byte(`null`))
	f.Fuzz(func(t *testing.T, manifest, data []byte) {
		files := map[string][]byte{
			".manifest":        manifest,
			"wicket/p.rego":    []byte("package wicket\n\ndecision := {\"decision\": \"allow\"}\n"),
			"agents/data.json": data,
		}
		b, err := Options{Name: "f"}.LoadFiles(files)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %v is a %T, want *Error", err, err)
			}
			return
		}
		b2, err := Options{Name: "f"}.LoadFiles(b.Files)
		if err != nil {
			t.Fatalf("reload: %v", err)
		}
		if b2.Digest != b.Digest || !bytes.Equal(b2.Data, b.Data) {
			t.Fatalf("reload changed the bundle")
		}
	})
}

// FuzzSignatures verifies a fuzzed .signatures.json against a key: no
// panic, and every refusal is an *Error.
func FuzzSignatures(f *testing.F) {
	files := map[string][]byte{"wicket/p.rego": []byte("package wicket\n\ndecision := {\"decision\": \"allow\"}\n")}
	good, err := Sign(files, SigningKey{Key: "fuzz-secret-0123456789", Algorithm: "HS256"})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"signatures": ["a.b.c"]}`))
	f.Add([]byte(`{"signatures": []}`))
	f.Add([]byte(`{"signatures": ["eyJhbGciOiJub25lIn0.e30."], "plugin": "x"}`))
	keys := []Key{{Algorithm: "HS256", Key: "fuzz-secret-0123456789"}}
	f.Fuzz(func(t *testing.T, sig []byte) {
		fs := map[string][]byte{SignaturesFile: sig}
		for p, c := range files {
			fs[p] = c
		}
		_, err := Options{Name: "s", Keys: keys}.LoadFiles(fs)
		if err == nil {
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %v is a %T, want *Error", err, err)
		}
	})
}
