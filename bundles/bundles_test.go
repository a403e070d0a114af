package bundles_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/enginetest"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/plugins/wasm"
)

var update = flag.Bool("update", false, "rewrite each form's tests/cases.yaml and each policy.wasm from their sources")

// forms are the three engine forms every stock bundle ships, as
// <name>/<form>/ directories; a form is named by its engine.
var forms = []string{bundle.EngineRules, bundle.EngineRego, bundle.EngineWasm}

// stock are the bundles this package must hold; bundleNames also picks up
// any other directory with a tests/cases.yaml.
var stock = []string{"allowlist", "effect-classes", "safe-shell"}

// casesFile is each bundle's canonical test file, relative to the bundle's
// directory, and also the path of its copy in every form.
const casesFile = "tests/cases.yaml"

// wasmEnv and wasmBuild are the reproducible build of a policy.wasm, run in
// <name>/wasm/src with the output flag appended. build.sh and README.md must
// spell out the same command (TestBuildCommandDocumented).
//
//   - -trimpath drops the checkout's and GOROOT's paths from the binary;
//   - -buildvcs=false stops the go command stamping the commit, its time
//     and the dirty flag (the source directory is inside this repository's
//     git checkout);
//   - -ldflags=-buildid= leaves the Go build ID out;
//   - GOFLAGS= and GOWORK=off keep a caller's flags and any go.work out.
var (
	wasmEnv   = []string{"GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off"}
	wasmBuild = []string{"go", "build", "-buildmode=c-shared", "-trimpath", "-buildvcs=false", "-ldflags=-buildid="}
)

// wasmBuildLine is the build command as build.sh and README.md write it.
func wasmBuildLine() string {
	return strings.Join(wasmEnv, " ") + " " + strings.Join(wasmBuild, " ") + " -o ../policy.wasm ."
}

// shared holds the engines and compiled evaluators every test of the binary
// uses, so that each wasm module is compiled by wazero once (about a second,
// much more under -race).
var shared struct {
	dir   string // temporary; removed by TestMain
	rules *rules.Engine
	rego  *rego.Engine
	wasm  *wasm.Engine

	mu       sync.Mutex
	compiled map[string]*compiled // by "name/form"
}

type compiled struct {
	once sync.Once
	b    *bundle.Bundle
	ev   policy.Evaluator
	err  error
}

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "wicket-bundles-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared.dir = dir
	shared.rules = rules.New()
	shared.rego = rego.New()
	shared.wasm = wasm.New(wasm.Config{CacheDir: filepath.Join(dir, "wasm-cache"), Builtins: rego.NewHostBuiltins()})
	shared.compiled = make(map[string]*compiled)

	code := m.Run()

	for key, c := range shared.compiled {
		if c.ev != nil {
			if err := c.ev.Close(); err != nil {
				fmt.Fprintf(os.Stderr, "close %s: %v\n", key, err)
				code = 1
			}
		}
	}
	if err := shared.wasm.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "close wasm engine: %v\n", err)
		code = 1
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func engine(form string) enginetest.Engine {
	switch form {
	case bundle.EngineRules:
		return shared.rules
	case bundle.EngineRego:
		return shared.rego
	case bundle.EngineWasm:
		return shared.wasm
	}
	panic("unknown form " + form)
}

// bundleNames lists the stock bundles: every directory here with a
// tests/cases.yaml. It fails the test when one of stock is missing.
func bundleNames(t *testing.T) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join("*", filepath.FromSlash(casesFile)))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range matches {
		names = append(names, filepath.Base(filepath.Dir(filepath.Dir(m))))
	}
	slices.Sort(names)
	for _, want := range stock {
		if !slices.Contains(names, want) {
			t.Fatalf("stock bundle %s has no %s (found %v)", want, casesFile, names)
		}
	}
	return names
}

// load loads and compiles the form of bundle name once per test binary; the
// evaluator is closed by TestMain.
func load(tb testing.TB, name, form string) (*bundle.Bundle, policy.Evaluator) {
	tb.Helper()
	key := name + "/" + form
	shared.mu.Lock()
	c := shared.compiled[key]
	if c == nil {
		c = new(compiled)
		shared.compiled[key] = c
	}
	shared.mu.Unlock()
	c.once.Do(func() {
		c.b, c.err = bundle.LoadDir(filepath.Join(name, form))
		if c.err != nil {
			return
		}
		if c.b.Manifest.Engine != form {
			c.err = fmt.Errorf("%s: bundle.yaml says engine %q, want %q", key, c.b.Manifest.Engine, form)
			return
		}
		// Compile outlives any one test, so it gets a background context.
		c.ev, c.err = engine(form).Compile(context.Background(), c.b)
		if c.err != nil {
			c.err = fmt.Errorf("%s: compile: %w", key, c.err)
		}
	})
	if c.err != nil {
		tb.Fatal(c.err)
	}
	return c.b, c.ev
}

// TestBundles runs every form of every stock bundle through its engine with
// its own tests/*.yaml cases.
func TestBundles(t *testing.T) {
	for _, name := range bundleNames(t) {
		for _, form := range forms {
			t.Run(name+"/"+form, func(t *testing.T) {
				t.Parallel()
				b, ev := load(t, name, form)
				cases, err := enginetest.LoadCases(b)
				if err != nil {
					t.Fatal(err)
				}
				if len(cases) < 10 {
					t.Errorf("%d test cases, want at least 10", len(cases))
				}
				enginetest.RunCases(t, ev, b.DefaultAction(), cases, nil)
			})
		}
	}
}

// TestCaseCopies requires each form's tests/ to hold exactly one file, a
// byte-identical copy of the bundle's canonical tests/cases.yaml. With
// -update it rewrites the copies.
func TestCaseCopies(t *testing.T) {
	for _, name := range bundleNames(t) {
		want, err := os.ReadFile(filepath.Join(name, casesFile))
		if err != nil {
			t.Fatal(err)
		}
		for _, form := range forms {
			dir := filepath.Join(name, form, "tests")
			copyPath := filepath.Join(name, form, casesFile)
			if *update {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(copyPath, want, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Error(err)
				continue
			}
			for _, e := range entries {
				if e.Name() != filepath.Base(casesFile) {
					t.Errorf("%s: unexpected %s: a form's tests/ holds only the copy of %s", dir, e.Name(), filepath.Join(name, casesFile))
				}
			}
			got, err := os.ReadFile(copyPath)
			if err != nil {
				t.Error(err)
				continue
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from %s: edit the canonical file, then run bundles/build.sh (or go test ./bundles -run TestCaseCopies -update)",
					copyPath, filepath.Join(name, casesFile))
			}
		}
	}
}

// TestFormsAgree requires the three forms of a bundle to describe the same
// bundle and to give, for every test case, the same final decision after
// policy.ApplyDefault: same action, rule_id, reason, approval and rate limit.
func TestFormsAgree(t *testing.T) {
	for _, name := range bundleNames(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bs, evs := loadForms(t, name)
			for _, b := range bs[1:] {
				m0, m := bs[0].Manifest, b.Manifest
				if m.Name != m0.Name || m.Revision != m0.Revision || b.DefaultAction() != bs[0].DefaultAction() || !reflect.DeepEqual(m.RateLimits, m0.RateLimits) {
					t.Errorf("%s form: name %q revision %q default_action %s rate_limits %v; %s form: %q %q %s %v",
						m.Engine, m.Name, m.Revision, b.DefaultAction(), m.RateLimits,
						m0.Engine, m0.Name, m0.Revision, bs[0].DefaultAction(), m0.RateLimits)
				}
			}
			cases, err := enginetest.LoadCases(bs[0])
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range cases {
				in, err := tc.Input()
				if err != nil {
					t.Fatal(err)
				}
				if msg := disagreement(t.Context(), bs, evs, in); msg != "" {
					t.Errorf("case %q: %s", tc.Name, msg)
				}
			}
		})
	}
}

// TestFormsAgreeOnGeneratedInputs extends TestFormsAgree beyond the written
// cases with inputs chosen near the bundles' edges: every kind × target ×
// effect with one safe command, and every target × arguments pair with a
// kind and an effect taken in turn. All forms must give the same decision.
func TestFormsAgreeOnGeneratedInputs(t *testing.T) {
	kinds := []string{policy.KindToolCall, policy.KindLLMCall, policy.KindLocal}
	targets := []string{
		"search", "search2", "Search", "fs.read", "fs.read_file", "fs.reader", "fs.rea", "xfs.read",
		"http.get", "http.get.x", "http.ge", "shell", "shell.exec", "shell.exec2", "Shell", "sh",
		"*", "fs.read*", "ѕearch", "日本語", "a.b/c",
	}
	effects := []string{"", policy.EffectReadOnly, policy.EffectLocalMutation, policy.EffectRemoteMutation,
		policy.EffectDestructive, "READ_ONLY", "unknown"}
	args := []string{
		`{}`, `[]`, `"ls"`, `null`, `{"cmd":"ls"}`, `{"command":null}`, `{"command":0}`, `{"command":true}`,
		`{"command":["ls"]}`, `{"command":{"command":"ls"}}`, `{"command":""}`, `{"command":"ls"}`,
		`{"command":"ls "}`, `{"command":"ls  -la"}`, `{"command":"wc -l *"}`, `{"command":"echo ~ % ^ ( ) { } [ ] ! # = + , . : @"}`,
		`{"command":"cat a; b"}`, `{"command":"cat a & b"}`, `{"command":"cat a | b"}`, `{"command":"cat a > b"}`,
		`{"command":"cat a < b"}`, `{"command":"echo $x"}`, "{\"command\":\"echo `x`\"}", `{"command":"echo a\\b"}`,
		`{"command":"echo \"a'b\""}`, `{"command":"ls\nx"}`, `{"command":"ls\tx"}`, `{"command":"ls \u0000"}`,
		`{"command":"ls \u007f"}`, `{"command":"ls \u0085"}`, `{"command":"ls \u2028"}`, `{"command":"ls \ud83d\ude00"}`,
		`{"command":"ｌｓ"}`, `{"command":"ls；rm"}`, `{"command":"ls -la","command2":"rm"}`,
		`{"command":"lsof"}`, `{"command":"grep"}`, `{"command":"tail -f /var/log/syslog"}`, `{"command":"pwd\n"}`,
	}
	type argv struct {
		canonical []byte
		hash      string
	}
	cargs := make([]argv, len(args))
	for i, a := range args {
		c, h, err := canon.ArgsHash([]byte(a))
		if err != nil {
			t.Fatalf("args %s: %v", a, err)
		}
		cargs[i] = argv{c, h}
	}
	var inputs []*policy.Input
	safe := cargs[slices.Index(args, `{"command":"ls"}`)]
	for _, kind := range kinds {
		for _, target := range targets {
			for _, effect := range effects {
				inputs = append(inputs, testInput(kind, target, effect, safe.canonical, safe.hash))
			}
		}
	}
	for ti, target := range targets {
		for ai, a := range cargs {
			n := ti*len(cargs) + ai
			inputs = append(inputs, testInput(kinds[n%len(kinds)], target, effects[n%len(effects)], a.canonical, a.hash))
		}
	}
	for _, name := range bundleNames(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bs, evs := loadForms(t, name)
			failed := 0
			for _, in := range inputs {
				if msg := disagreement(t.Context(), bs, evs, in); msg != "" {
					t.Errorf("kind %s target %q effect %q args %s: %s", in.Step.Kind, in.Step.Target, in.Step.Effect, in.Step.Args, msg)
					if failed++; failed >= 10 {
						t.Fatal("too many disagreements")
					}
				}
			}
		})
	}
}

// FuzzFormsAgree looks for an input on which the three forms of a stock
// bundle disagree. The seeds are the written test cases; without -fuzz only
// they run.
func FuzzFormsAgree(f *testing.F) {
	names := stock
	for i, name := range names {
		// Compile up front: the fuzzing engine gives up on a worker whose
		// first input takes seconds (wazero compiling three Go modules).
		bs, _ := loadForms(f, name)
		cases, err := bs[0].TestCases()
		if err != nil {
			f.Fatal(err)
		}
		for _, tc := range cases {
			in, err := tc.Input()
			if err != nil {
				f.Fatal(err)
			}
			f.Add(uint8(i), in.Step.Kind, in.Step.Target, in.Step.Effect, string(in.Step.Args))
		}
	}
	f.Fuzz(func(t *testing.T, i uint8, kind, target, effect, args string) {
		switch kind {
		case policy.KindToolCall, policy.KindLLMCall, policy.KindLocal:
		default:
			t.Skip("the kernel only submits the three step kinds")
		}
		canonical, hash, err := canon.ArgsHash([]byte(args))
		if err != nil {
			t.Skip("the kernel refuses args that are not canonicalisable JSON")
		}
		bs, evs := loadForms(t, names[int(i)%len(names)])
		in := testInput(kind, target, effect, canonical, hash)
		if msg := disagreement(t.Context(), bs, evs, in); msg != "" {
			t.Errorf("kind %q target %q effect %q args %s: %s", kind, target, effect, canonical, msg)
		}
	})
}

// loadForms loads and compiles the three forms of bundle name, in forms order.
func loadForms(tb testing.TB, name string) ([]*bundle.Bundle, []policy.Evaluator) {
	tb.Helper()
	bs := make([]*bundle.Bundle, len(forms))
	evs := make([]policy.Evaluator, len(forms))
	for i, form := range forms {
		bs[i], evs[i] = load(tb, name, form)
	}
	return bs, evs
}

// testInput builds an input document the way bundle.TestCase.Input does.
func testInput(kind, target, effect string, canonicalArgs []byte, hash string) *policy.Input {
	return &policy.Input{
		Tenant:      bundle.DefaultTestTenant,
		ExecutionID: bundle.DefaultTestExecutionID,
		Step: policy.Step{
			Kind:     kind,
			Target:   target,
			Args:     canonicalArgs,
			ArgsHash: hash,
			Effect:   effect,
		},
		Execution: policy.Execution{Status: bundle.DefaultTestStatus, Labels: map[string]string{}},
	}
}

// disagreement evaluates in with every form and returns "" when all of them
// give the same final decision (after policy.ApplyDefault with each form's
// default action), or a description of the answers otherwise. An
// evaluation error or an invalid answer is a disagreement too.
func disagreement(ctx context.Context, bs []*bundle.Bundle, evs []policy.Evaluator, in *policy.Input) string {
	answers := make([]string, len(evs))
	var first *policy.Answer
	same := true
	for i, ev := range evs {
		d, err := ev.Evaluate(ctx, in)
		if err == nil {
			err = d.Validate()
		}
		if err != nil {
			answers[i] = fmt.Sprintf("%s: error %v", forms[i], err)
			same = false
			continue
		}
		d = policy.ApplyDefault(d, bs[i].DefaultAction(), in.Step.Kind)
		js, _ := json.Marshal(d)
		answers[i] = fmt.Sprintf("%s: %s", forms[i], js)
		if i == 0 {
			first = d
		} else if first == nil || !reflect.DeepEqual(d, first) {
			same = false
		}
	}
	if same {
		return ""
	}
	return "forms disagree:\n\t" + strings.Join(answers, "\n\t")
}

// TestWasmReproducible rebuilds every policy.wasm from its Go source with
// the local toolchain and the reproducible build command, and requires the
// result to be byte-identical to the checked-in module. With -update it
// rewrites the checked-in module instead.
//
// A module built by another Go release differs in its runtime, so the test
// is skipped when the checked-in module does not name the local release.
func TestWasmReproducible(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the drift check needs the go command: %v", err)
	}
	out, err := exec.Command(gobin, "env", "GOVERSION").Output()
	if err != nil {
		t.Fatalf("go env GOVERSION: %v", err)
	}
	goVersion := strings.TrimSpace(string(out))
	for _, name := range bundleNames(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			built := filepath.Join(t.TempDir(), "policy.wasm")
			cmd := exec.Command(gobin, append(wasmBuild[1:], "-o", built, ".")...)
			cmd.Dir = filepath.Join(name, bundle.EngineWasm, "src")
			cmd.Env = append(os.Environ(), wasmEnv...)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("in %s: %s: %v\n%s", cmd.Dir, wasmBuildLine(), err, b)
			}
			got, err := os.ReadFile(built)
			if err != nil {
				t.Fatal(err)
			}
			checkedIn := filepath.Join(name, bundle.EngineWasm, bundle.WasmFile)
			if *update {
				if err := os.WriteFile(checkedIn, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(checkedIn)
			if err != nil {
				t.Fatalf("%v (build it with bundles/build.sh)", err)
			}
			if bytes.Equal(got, want) {
				return
			}
			if !bytes.Contains(want, []byte(goVersion)) {
				t.Skipf("%s was not built by the local Go release %s: rebuild with that module's Go release to compare (see bundles/README.md)", checkedIn, goVersion)
			}
			t.Errorf("%s (%d bytes) differs from a fresh build of %s (%d bytes) with %s: the source, policy-sdk/go or the build command changed; run bundles/build.sh and commit the result",
				checkedIn, len(want), cmd.Dir, len(got), goVersion)
		})
	}
}

// TestBuildCommandDocumented requires build.sh and README.md to spell out the
// build command TestWasmReproducible runs.
func TestBuildCommandDocumented(t *testing.T) {
	line := wasmBuildLine()
	for _, f := range []string{"build.sh", "README.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(line)) {
			t.Errorf("%s does not contain the build command\n\t%s", f, line)
		}
	}
}
