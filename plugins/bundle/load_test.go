package bundle

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
)

func TestLoadFilesValid(t *testing.T) {
	b, err := LoadFiles(rulesFiles())
	if err != nil {
		t.Fatal(err)
	}
	if b.Manifest.Name != "guard" || b.Manifest.Revision != "3" || b.Manifest.Engine != EngineRules {
		t.Errorf("manifest = %+v", b.Manifest)
	}
	if string(b.Data) != `{"owners":["alice"]}` {
		t.Errorf("Data = %s", b.Data)
	}
	if len(b.Digest) != 64 || strings.ToLower(b.Digest) != b.Digest {
		t.Errorf("Digest = %q, want 64 lowercase hex digits", b.Digest)
	}
	if b.Digest != Digest(rulesFiles()) {
		t.Errorf("Digest differs from Digest(files)")
	}
	if got := b.DefaultAction(); got != policy.Deny {
		t.Errorf("DefaultAction = %s, want deny (from rules.yaml)", got)
	}
	ref := b.Ref()
	if ref.Name != "guard" || ref.Revision != "3" || ref.Digest != b.Digest || ref.Engine != "rules" {
		t.Errorf("Ref = %+v", ref)
	}
}

func TestManifestFull(t *testing.T) {
	src := `name: sandboxed.policy-1
revision: "2026-11-29"
engine: wasm
abi: opa
entrypoint: wicket/decision
default_action: allow
rate_limits:
  - id: llm
    step_kind: llm_call
    max_calls: 100
    window: 1h
    per: tenant
    algorithm: fixed
    on_limiter_error: fail_open
  - id: all
    max_calls: 1
    window: 1s
sandbox:
  memory_pages: 512
  timeout: 50ms
  grants: [clock, random]
`
	m, err := ParseManifest([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := ManifestRateLimit{ID: "llm", StepKind: "llm_call", RateLimit: policy.RateLimit{MaxCalls: 100, Window: "1h", Per: "tenant", Algorithm: "fixed", OnLimiterError: "fail_open"}}
	if len(m.RateLimits) != 2 || fmt.Sprint(m.RateLimits[0]) != fmt.Sprint(want) {
		t.Errorf("rate limits = %+v", m.RateLimits)
	}
	if m.Sandbox.MemoryPages != 512 || m.Sandbox.Timeout != "50ms" || len(m.Sandbox.Grants) != 2 {
		t.Errorf("sandbox = %+v", m.Sandbox)
	}
	if m.ABI != ABIOPA || m.Entrypoint != "wicket/decision" || m.DefaultAction != policy.Allow {
		t.Errorf("manifest = %+v", m)
	}
}

// TestLoadErrors covers every class of load error: each names the file and,
// where there is one, the field.
func TestLoadErrors(t *testing.T) {
	man := func(extra string) string { return testManifest + extra }
	rl := func(body string) string { return man("rate_limits:\n  - " + body + "\n") }
	wasm := "name: w\nengine: wasm\n"
	rego := "name: r\nengine: rego\n"
	tests := []struct {
		name         string
		files        map[string][]byte
		class        error
		file, field  string
		wantContains []string
	}{
		// bundle.yaml as a whole
		{"missing manifest", withFiles(rulesFiles(), "bundle.yaml", "<delete>"), ErrMissingFile, "bundle.yaml", "", nil},
		{"empty manifest", withFiles(rulesFiles(), "bundle.yaml", ""), nil, "bundle.yaml", "", []string{"empty manifest"}},
		{"unknown field", withFiles(rulesFiles(), "bundle.yaml", man("color: blue\n")), nil, "bundle.yaml", "", []string{"bundle.yaml:4: ", `unknown field "color"`}},
		{"unknown nested field", withFiles(rulesFiles(), "bundle.yaml", rl("{id: a, max_calls: 1, window: 1m, burst: 3}")), nil, "bundle.yaml", "", []string{"bundle.yaml:5: ", `unknown field "burst"`}},
		{"duplicate key", withFiles(rulesFiles(), "bundle.yaml", man("name: other\n")), nil, "bundle.yaml", "", []string{`"name" already defined`}},
		{"wrong type", withFiles(rulesFiles(), "bundle.yaml", "name: [a]\nengine: rules\n"), nil, "bundle.yaml", "", []string{"cannot unmarshal"}},
		{"two documents", withFiles(rulesFiles(), "bundle.yaml", testManifest+"---\nname: x\n"), nil, "bundle.yaml", "", []string{"more than one YAML document"}},
		{"syntax", withFiles(rulesFiles(), "bundle.yaml", "name: [\n"), nil, "bundle.yaml", "", []string{"bundle.yaml:1: "}},
		// fields
		{"name missing", withFiles(rulesFiles(), "bundle.yaml", "engine: rules\n"), nil, "bundle.yaml", "name", []string{"required"}},
		{"name uppercase", withFiles(rulesFiles(), "bundle.yaml", "name: Guard\nengine: rules\n"), nil, "bundle.yaml", "name", []string{`"Guard"`}},
		{"name too long", withFiles(rulesFiles(), "bundle.yaml", "name: "+strings.Repeat("a", 64)+"\nengine: rules\n"), nil, "bundle.yaml", "name", nil},
		{"revision control char", withFiles(rulesFiles(), "bundle.yaml", "name: g\nrevision: \"a\\tb\"\nengine: rules\n"), nil, "bundle.yaml", "revision", []string{"control character"}},
		{"engine not inferable", withFiles(rulesFiles(), "bundle.yaml", "name: g\n", "rules.yaml", "<delete>"), ErrMissingFile, "bundle.yaml", "engine", []string{"cannot tell"}},
		{"engine unknown", withFiles(rulesFiles(), "bundle.yaml", "name: g\nengine: lua\n"), nil, "bundle.yaml", "engine", []string{`"lua"`}},
		{"entrypoint on rules", withFiles(rulesFiles(), "bundle.yaml", man("entrypoint: data.x\n")), nil, "bundle.yaml", "entrypoint", []string{"not used by the rules engine"}},
		{"abi on rules", withFiles(rulesFiles(), "bundle.yaml", man("abi: opa\n")), nil, "bundle.yaml", "abi", []string{"only wasm"}},
		{"abi unknown", map[string][]byte{"bundle.yaml": []byte(wasm + "abi: wasi\n"), "policy.wasm": []byte("\x00asm\x01\x00\x00\x00")}, nil, "bundle.yaml", "abi", []string{`"wasi"`}},
		{"default_action", withFiles(rulesFiles(), "bundle.yaml", man("default_action: abort\n")), nil, "bundle.yaml", "default_action", []string{`"abort"`}},
		{"rate limit id missing", withFiles(rulesFiles(), "bundle.yaml", rl("{max_calls: 1, window: 1m}")), nil, "bundle.yaml", "rate_limits[0].id", []string{"required"}},
		{"rate limit id invalid", withFiles(rulesFiles(), "bundle.yaml", rl("{id: 'a b', max_calls: 1, window: 1m}")), nil, "bundle.yaml", "rate_limits[0].id", nil},
		{"rate limit id duplicate", withFiles(rulesFiles(), "bundle.yaml", man("rate_limits:\n  - {id: a, max_calls: 1, window: 1m}\n  - {id: a, max_calls: 2, window: 1m}\n")), nil, "bundle.yaml", "rate_limits[1].id", []string{"duplicate", "rate_limits[0]"}},
		{"rate limit max_calls", withFiles(rulesFiles(), "bundle.yaml", rl("{id: a, max_calls: 0, window: 1m}")), nil, "bundle.yaml", "rate_limits[0].max_calls", []string{"> 0"}},
		{"rate limit window zero", withFiles(rulesFiles(), "bundle.yaml", rl("{id: a, max_calls: 1, window: 0s}")), nil, "bundle.yaml", "rate_limits[0].window", []string{"positive"}},
		{"rate limit window bad", withFiles(rulesFiles(), "bundle.yaml", rl("{id: a, max_calls: 1, window: 1 minute}")), nil, "bundle.yaml", "rate_limits[0].window", nil},
		{"rate limit window missing", withFiles(rulesFiles(), "bundle.yaml", rl("{id: a, max_calls: 1}")), nil, "bundle.yaml", "rate_limits[0].window", nil},
		{"rate limit per", withFiles(rulesFiles(), "bundle.yaml", rl("{id: a, max_calls: 1, window: 1m, per: user}")), nil, "bundle.yaml", "rate_limits[0].per", []string{`"user"`}},
		{"rate limit algorithm", withFiles(rulesFiles(), "bundle.yaml", rl("{id: a, max_calls: 1, window: 1m, algorithm: leaky}")), nil, "bundle.yaml", "rate_limits[0].algorithm", nil},
		{"rate limit on_limiter_error", withFiles(rulesFiles(), "bundle.yaml", rl("{id: a, max_calls: 1, window: 1m, on_limiter_error: retry}")), nil, "bundle.yaml", "rate_limits[0].on_limiter_error", nil},
		{"rate limit target glob", withFiles(rulesFiles(), "bundle.yaml", rl(`{id: a, max_calls: 1, window: 1m, targets: ["ok.*", "bad\\"]}`)), nil, "bundle.yaml", "rate_limits[0].targets[1]", []string{"unpaired"}},
		{"rate limit empty target", withFiles(rulesFiles(), "bundle.yaml", rl(`{id: a, max_calls: 1, window: 1m, targets: [""]}`)), nil, "bundle.yaml", "rate_limits[0].targets[0]", []string{"empty glob"}},
		{"rate limit step_kind", withFiles(rulesFiles(), "bundle.yaml", rl("{id: a, max_calls: 1, window: 1m, step_kind: tool}")), nil, "bundle.yaml", "rate_limits[0].step_kind", nil},
		{"sandbox timeout", withFiles(rulesFiles(), "bundle.yaml", man("sandbox: {timeout: -1s}\n")), nil, "bundle.yaml", "sandbox.timeout", []string{"positive"}},
		{"grants on rules", withFiles(rulesFiles(), "bundle.yaml", man("sandbox: {grants: [clock]}\n")), nil, "bundle.yaml", "sandbox.grants[0]", []string{"only wasm"}},
		{"memory on rules", withFiles(rulesFiles(), "bundle.yaml", man("sandbox: {memory_pages: 10}\n")), nil, "bundle.yaml", "sandbox.memory_pages", nil},
		{"grant unknown", map[string][]byte{"bundle.yaml": []byte(wasm + "sandbox: {grants: [clock, network]}\n"), "policy.wasm": []byte("\x00asm")}, nil, "bundle.yaml", "sandbox.grants[1]", []string{`"network"`}},
		{"grant duplicate", map[string][]byte{"bundle.yaml": []byte(wasm + "sandbox: {grants: [env, env]}\n"), "policy.wasm": []byte("\x00asm")}, nil, "bundle.yaml", "sandbox.grants[1]", []string{"duplicate"}},
		{"pool on rules", withFiles(rulesFiles(), "bundle.yaml", man("sandbox: {pool_size: 2}\n")), nil, "bundle.yaml", "sandbox.pool_size", []string{"only wasm"}},
		{"pool negative", map[string][]byte{"bundle.yaml": []byte(wasm + "sandbox: {pool_size: -1}\n"), "policy.wasm": []byte("\x00asm")}, nil, "bundle.yaml", "sandbox.pool_size", []string{"positive"}},
		{"memory too large", map[string][]byte{"bundle.yaml": []byte(wasm + "sandbox: {memory_pages: 70000}\n"), "policy.wasm": []byte("\x00asm")}, nil, "bundle.yaml", "sandbox.memory_pages", nil},
		// engine files
		{"rules.yaml missing", withFiles(rulesFiles(), "rules.yaml", "<delete>"), ErrMissingFile, "rules.yaml", "", nil},
		{"no rego file", map[string][]byte{"bundle.yaml": []byte(rego), "policy.txt": []byte("x")}, ErrMissingFile, "*.rego", "", nil},
		{"no wasm file", map[string][]byte{"bundle.yaml": []byte(wasm)}, ErrMissingFile, "policy.wasm", "", nil},
		{"wasm magic", map[string][]byte{"bundle.yaml": []byte(wasm), "policy.wasm": []byte("MZ\x90\x00")}, nil, "policy.wasm", "", []string{"magic"}},
		{"default_action conflict", withFiles(rulesFiles(), "bundle.yaml", man("default_action: allow\n")), nil, "rules.yaml", "default_action", []string{`"deny" contradicts`}},
		{"rules default_action bad", withFiles(rulesFiles(), "rules.yaml", "default_action: maybe\n"), nil, "rules.yaml", "default_action", []string{`"maybe"`}},
		{"rules not YAML", withFiles(rulesFiles(), "rules.yaml", "rules: [{bad\n"), nil, "rules.yaml", "", []string{"rules.yaml: line 1: "}},
		// data.json
		{"data.json invalid", withFiles(rulesFiles(), "data.json", `{"a": }`), nil, "data.json", "", []string{"invalid JSON"}},
		{"data.json not object", withFiles(rulesFiles(), "data.json", `[1]`), nil, "data.json", "", []string{"JSON object"}},
		// tests
		{"test unknown field", withFiles(rulesFiles(), "tests/x.yaml", "cases:\n  - {name: a, step: {kind: local, target: t}, expect: {decision: allow}, expected: 1}\n"), nil, "tests/x.yaml", "", []string{"cases[0]", `unknown field "expected"`}},
		{"test name missing", withFiles(rulesFiles(), "tests/x.yaml", "cases:\n  - {step: {kind: local, target: t}, expect: {decision: allow}}\n"), nil, "tests/x.yaml", "name", []string{"cases[0]"}},
		{"test decision bad", withFiles(rulesFiles(), "tests/x.yaml", "cases:\n  - {name: a, step: {kind: local, target: t}, expect: {decision: permit}}\n"), nil, "tests/x.yaml", "expect.decision", []string{`case "a"`, `"permit"`}},
		{"test kind bad", withFiles(rulesFiles(), "tests/x.yaml", "cases:\n  - {name: a, step: {kind: tool, target: t}, expect: {decision: allow}}\n"), nil, "tests/x.yaml", "step.kind", nil},
		{"test target missing", withFiles(rulesFiles(), "tests/x.yaml", "cases:\n  - {name: a, step: {kind: local}, expect: {decision: allow}}\n"), nil, "tests/x.yaml", "step.target", nil},
		{"test name duplicate across files", withFiles(rulesFiles(), "tests/x.yaml", testCases), nil, "tests/x.yaml", "name", []string{"also in tests/basic.yaml"}},
		{"test file not a mapping", withFiles(rulesFiles(), "tests/x.yaml", "- a\n"), nil, "tests/x.yaml", "", []string{"want a mapping"}},
		{"test file unknown key", withFiles(rulesFiles(), "tests/x.yaml", "case: []\n"), nil, "tests/x.yaml", "case", []string{"unknown field"}},
		{"test alias", withFiles(rulesFiles(), "tests/x.yaml", "cases:\n  - {name: a, step: {kind: local, target: t, args: {x: &v 1, y: *v}}, expect: {decision: allow}}\n"), nil, "tests/x.yaml", "", []string{"aliases"}},
		{"test args inf", withFiles(rulesFiles(), "tests/x.yaml", "cases:\n  - {name: a, step: {kind: local, target: t, args: {x: .inf}}, expect: {decision: allow}}\n"), nil, "tests/x.yaml", "", []string{"no JSON form"}},
		// paths
		{"absolute path", withFiles(rulesFiles(), "/etc/passwd", "x"), ErrUnsafePath, "/etc/passwd", "", nil},
		{"dot dot", withFiles(rulesFiles(), "a/../b", "x"), ErrUnsafePath, "a/../b", "", []string{`".."`}},
		{"dot element", withFiles(rulesFiles(), "./a", "x"), ErrUnsafePath, "./a", "", nil},
		{"empty element", withFiles(rulesFiles(), "a//b", "x"), ErrUnsafePath, "a//b", "", nil},
		{"backslash", withFiles(rulesFiles(), `a\b`, "x"), ErrUnsafePath, `a\b`, "", nil},
		{"control char", withFiles(rulesFiles(), "a\nb", "x"), ErrUnsafePath, "a\nb", "", []string{`"a\nb": control character`}},
		{"long path", withFiles(rulesFiles(), strings.Repeat("a", MaxPathLen+1), "x"), ErrUnsafePath, strings.Repeat("a", MaxPathLen+1), "", nil},
		{"file and dir", withFiles(rulesFiles(), "tests", "x"), ErrDuplicateFile, "tests/basic.yaml", "", []string{"both a file and a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := LoadFiles(tt.files)
			if err == nil {
				t.Fatalf("loaded %+v, want an error", b.Manifest)
			}
			wantErr(t, err, tt.class, tt.file, tt.field, tt.wantContains...)
		})
	}
}

func TestLoadFilesLimits(t *testing.T) {
	t.Run("too large", func(t *testing.T) {
		files := withFiles(rulesFiles(), "big/a.bin", strings.Repeat("x", MaxTotalSize/2), "big/b.bin", strings.Repeat("x", MaxTotalSize/2))
		_, err := LoadFiles(files)
		wantErr(t, err, ErrTooLarge, "big/b.bin", "", nil...)
	})
	t.Run("too many files", func(t *testing.T) {
		files := rulesFiles()
		for i := 0; len(files) <= MaxFiles; i++ {
			files[fmt.Sprintf("extra/%04d", i)] = nil
		}
		_, err := LoadFiles(files)
		if !errors.Is(err, ErrTooManyFiles) {
			t.Fatalf("err = %v, want ErrTooManyFiles", err)
		}
	})
	t.Run("at the file limit", func(t *testing.T) {
		files := rulesFiles()
		for i := 0; len(files) < MaxFiles; i++ {
			files[fmt.Sprintf("extra/%04d", i)] = nil
		}
		if _, err := LoadFiles(files); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLoadFilesSkipsHidden(t *testing.T) {
	files := withFiles(rulesFiles(), ".git/config", "[core]", "tests/.DS_Store", "\x00", ".hidden", "x")
	b, err := LoadFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	if b.Digest != Digest(rulesFiles()) {
		t.Errorf("hidden files changed the digest")
	}
	for p := range b.Files {
		if isHidden(p) {
			t.Errorf("hidden file %q kept", p)
		}
	}
}

func TestDefaultAction(t *testing.T) {
	tests := []struct {
		manifest, rules string
		want            policy.Action
	}{
		{"", "default_action: allow\n", policy.Allow},
		{"default_action: allow\n", "rules: []\n", policy.Allow},
		{"default_action: allow\n", "default_action: allow\n", policy.Allow},
		{"", "rules: []\n", policy.Deny},
		{"", "default_action: null\n", policy.Deny},
	}
	for _, tt := range tests {
		b, err := LoadFiles(map[string][]byte{"bundle.yaml": []byte(testManifest + tt.manifest), "rules.yaml": []byte(tt.rules)})
		if err != nil {
			t.Fatal(err)
		}
		if got := b.DefaultAction(); got != tt.want {
			t.Errorf("manifest %q, rules %q: DefaultAction = %s, want %s", tt.manifest, tt.rules, got, tt.want)
		}
	}
	rego := &Bundle{Manifest: Manifest{Engine: EngineRego}}
	if got := rego.DefaultAction(); got != policy.Deny {
		t.Errorf("rego without default: %s, want deny", got)
	}
}

func TestErrorMessage(t *testing.T) {
	e := &Error{File: "rules.yaml", Line: 12, Item: `rule "allow-reads"`, Field: "when.arguments.command", Err: errors.New("regex: bad")}
	if got, want := e.Error(), `rules.yaml:12: rule "allow-reads": when.arguments.command: regex: bad`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	e = &Error{File: "bundle.yaml", Field: "name", Err: errors.New("required")}
	if got, want := e.Error(), "bundle.yaml: name: required"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if err := classed(ErrTooLarge, "x is %d", 3); err.Error() != "x is 3" || !errors.Is(err, ErrTooLarge) {
		t.Errorf("classed: %v", err)
	}
}

// TestYAMLCeiling: a bundle's YAML files together hold at most MaxYAMLSize
// bytes (they are parsed at every load, at about 100 times their size):
// one byte more is ErrTooLarge naming the file that crosses it, whatever
// the directory; other files do not count.
func TestYAMLCeiling(t *testing.T) {
	comment := func(n int) []byte { return []byte("#" + strings.Repeat("x", n-2) + "\n") }
	base := func() map[string][]byte {
		return map[string][]byte{"bundle.yaml": []byte("name: y\nengine: rules\n"), "rules.yaml": []byte("default_action: allow\n"),
			"docs/big.txt": comment(4 << 20)}
	}
	ok := base()
	used := len(ok["bundle.yaml"]) + len(ok["rules.yaml"])
	ok["docs/a.yml"] = comment(MaxYAMLSize - used)
	if _, err := LoadFiles(ok); err != nil {
		t.Fatalf("exactly %d bytes of YAML: %v", MaxYAMLSize, err)
	}
	over := base()
	over["x/data.yaml"] = comment(MaxYAMLSize / 2)
	over["x/z.yaml"] = comment(MaxYAMLSize - used - MaxYAMLSize/2 + 1)
	_, err := LoadFiles(over)
	wantErr(t, err, ErrTooLarge, "x/z.yaml", "", "of YAML would take the bundle's YAML files past 1048576 bytes")
}
