package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
)

const testManifest = `name: guard
revision: "3"
engine: rules
`

const testRules = `default_action: deny
rules:
  - id: allow-reads
    when: {target: "fs.read*"}
    then: {decision: allow}
`

const testCases = `cases:
  - name: reads are allowed
    step: {kind: tool_call, target: fs.read, args: {path: /tmp/x}}
    expect: {decision: allow, rule_id: allow-reads}
`

// rulesFiles returns a valid rules bundle's files.
func rulesFiles() map[string][]byte {
	return map[string][]byte{
		"bundle.yaml":      []byte(testManifest),
		"rules.yaml":       []byte(testRules),
		"data.json":        []byte(`{"owners": ["alice"]}`),
		"tests/basic.yaml": []byte(testCases),
		"README.md":        []byte("# guard\n"),
	}
}

func withFiles(base map[string][]byte, kv ...string) map[string][]byte {
	m := maps.Clone(base)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "<delete>" {
			delete(m, kv[i])
			continue
		}
		m[kv[i]] = []byte(kv[i+1])
	}
	return m
}

// wantErr checks that err is an *Error for file (and field, when not
// empty) whose message contains every want, and that it matches class when
// class is not nil.
func wantErr(t *testing.T, err error, class error, file, field string, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", want)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *bundle.Error", err, err)
	}
	if file != "" && e.File != file {
		t.Errorf("File = %q, want %q (error: %v)", e.File, file, err)
	}
	if field != "" && e.Field != field {
		t.Errorf("Field = %q, want %q (error: %v)", e.Field, field, err)
	}
	if class != nil && !errors.Is(err, class) {
		t.Errorf("error %v does not match %v", err, class)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

// tarEntry describes one entry of a hand-made archive.
type tarEntry struct {
	hdr  tar.Header
	body []byte
	// short writes the header only and stops the archive there, for
	// entries whose declared size is never meant to be read.
	short bool
}

func file(name, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}, body: []byte(body)}
}

// makeTarGz builds a .tar.gz from entries.
func makeTarGz(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	closed := false
	for _, e := range entries {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %s: %v", h.Name, err)
		}
		if e.short {
			closed = true
			break
		}
		if len(e.body) > 0 {
			if _, err := tw.Write(e.body); err != nil {
				t.Fatalf("tar body %s: %v", h.Name, err)
			}
		}
	}
	if !closed {
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return gzipBytes(t, tb.Bytes())
}

func gzipBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	var gb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gb, gzip.BestSpeed)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return gb.Bytes()
}

// bundleEntries returns tar entries for the files of a valid bundle, under
// prefix.
func bundleEntries(prefix string) []tarEntry {
	var out []tarEntry
	files := rulesFiles()
	for _, p := range sortedKeys(files) {
		out = append(out, file(prefix+p, string(files[p])))
	}
	return out
}

func sortedKeys(m map[string][]byte) []string { return slices.Sorted(maps.Keys(m)) }
