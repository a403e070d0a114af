package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/plugins/wasm"
)

const policyUsage = `usage: wicket policy <test|eval|build|inspect> ...

  test    BUNDLE...                 run each bundle's tests/*.yaml cases; exit 1 on a failure
  eval    --bundle BUNDLE [--input FILE|-]
                                    evaluate one input document (docs/policy.md) and print the decision
  build   BUNDLE -o OUT.tar.gz      write the bundle's reproducible archive and print its digest
  inspect BUNDLE                    print the manifest, digest, files and test count

BUNDLE is a bundle directory or a .tar.gz of one.
`

func policyCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, policyUsage)
		return usageError{"policy: no subcommand"}
	}
	switch args[0] {
	case "test":
		return policyTest(ctx, args[1:], stdout, stderr)
	case "eval":
		return policyEval(ctx, args[1:], stdout, stderr)
	case "build":
		return policyBuild(args[1:], stdout, stderr)
	case "inspect":
		return policyInspect(args[1:], stdout, stderr)
	default:
		fmt.Fprint(stderr, policyUsage)
		return usageError{fmt.Sprintf("policy: unknown subcommand %q", args[0])}
	}
}

// loadBundle reads a bundle directory or archive.
func loadBundle(path string) (*bundle.Bundle, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return bundle.LoadDir(path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return bundle.LoadTarGz(bytes.NewReader(data))
}

// cliHost builds an engine host for offline use; wasm modules are cached
// under the user cache dir so repeated runs do not recompile.
func cliHost() (*plugins.Host, func()) {
	cache := ""
	if d, err := os.UserCacheDir(); err == nil {
		cache = filepath.Join(d, "wicket", "wasm-cache")
	}
	w := wasm.New(wasm.Config{CacheDir: cache})
	h := plugins.NewHost(plugins.Options{}, rules.New(), rego.New(), w)
	return h, func() { h.Close(); _ = w.Close() }
}

func policyTest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("policy test", flag.ContinueOnError)
	fs.SetOutput(stderr)
	verbose := fs.Bool("v", false, "print every case, not only failures")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usageError{"policy test: give at least one bundle"}
	}
	host, closeHost := cliHost()
	defer closeHost()
	passed, failed := 0, 0
	for _, path := range fs.Args() {
		b, err := loadBundle(path)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		cases, err := b.TestCases()
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		ev, err := host.CompileBundle(ctx, b)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, tc := range cases {
			err := checkCase(ctx, ev, b.DefaultAction(), tc)
			name := fmt.Sprintf("%s/%s", b.Manifest.Name, tc.Name)
			if err != nil {
				failed++
				fmt.Fprintf(stdout, "FAIL %s (%s): %v\n", name, tc.SourceFile, err)
			} else {
				passed++
				if *verbose {
					fmt.Fprintf(stdout, "ok   %s\n", name)
				}
			}
		}
		_ = ev.Close()
	}
	fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return fmt.Errorf("policy test: %d case(s) failed", failed)
	}
	return nil
}

// checkCase evaluates one test case and compares it with its expectation.
func checkCase(ctx context.Context, ev policy.Evaluator, def policy.Action, tc bundle.TestCase) error {
	in, err := tc.Input()
	if err != nil {
		return fmt.Errorf("input: %w", err)
	}
	d, err := ev.Evaluate(ctx, in)
	if err != nil {
		return fmt.Errorf("evaluate: %w", err)
	}
	d = policy.ApplyDefault(d, def, in.Step.Kind)
	if d.Decision != tc.Expect.Decision {
		return fmt.Errorf("decision %s (rule %q: %s), want %s", d.Decision, d.RuleID, d.Reason, tc.Expect.Decision)
	}
	if tc.Expect.RuleID != "" && d.RuleID != tc.Expect.RuleID {
		return fmt.Errorf("rule_id %q, want %q", d.RuleID, tc.Expect.RuleID)
	}
	return nil
}

func policyEval(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("policy eval", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bpath := fs.String("bundle", "", "bundle directory or .tar.gz")
	input := fs.String("input", "-", "input document (JSON file, or - for stdin)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bpath == "" {
		return usageError{"policy eval: --bundle is required"}
	}
	var raw []byte
	var err error
	if *input == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(*input)
	}
	if err != nil {
		return fmt.Errorf("read input: %w", err)
	}
	var in policy.Input
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return fmt.Errorf("input is not a policy input document: %w", err)
	}
	b, err := loadBundle(*bpath)
	if err != nil {
		return err
	}
	host, closeHost := cliHost()
	defer closeHost()
	ev, err := host.CompileBundle(ctx, b)
	if err != nil {
		return err
	}
	defer ev.Close()
	start := time.Now()
	d, err := ev.Evaluate(ctx, &in)
	if err != nil {
		return fmt.Errorf("evaluate (the kernel would deny this step, fail closed): %w", err)
	}
	matched := d != nil
	d = policy.ApplyDefault(d, b.DefaultAction(), in.Step.Kind)
	out, _ := json.MarshalIndent(map[string]any{"decision": d, "matched": matched, "bundle": b.Ref(), "eval_ns": time.Since(start).Nanoseconds()}, "", "  ")
	fmt.Fprintln(stdout, string(out))
	return nil
}

func policyBuild(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("policy build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "output .tar.gz")
	// Accept the bundle before or after the flags.
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != 1 || *out == "" {
		return usageError{"policy build: want BUNDLE -o OUT.tar.gz"}
	}
	b, err := loadBundle(pos[0])
	if err != nil {
		return err
	}
	data, err := b.TarGz()
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %s rev %s sha256:%s (%d bytes)\n", *out, b.Manifest.Name, b.Manifest.Revision, b.Digest, len(data))
	return nil
}

func policyInspect(args []string, stdout, stderr io.Writer) error {
	if len(args) != 1 {
		return usageError{"policy inspect: want one BUNDLE"}
	}
	b, err := loadBundle(args[0])
	if err != nil {
		return err
	}
	cases, err := b.TestCases()
	if err != nil {
		return err
	}
	m := b.Manifest
	fmt.Fprintf(stdout, "name:           %s\nrevision:       %s\nengine:         %s\nsha256:         %s\ndefault_action: %s\n", m.Name, m.Revision, m.Engine, b.Digest, b.DefaultAction())
	if m.Entrypoint != "" {
		fmt.Fprintf(stdout, "entrypoint:     %s\n", m.Entrypoint)
	}
	if m.ABI != "" {
		fmt.Fprintf(stdout, "abi:            %s\n", m.ABI)
	}
	for _, rl := range m.RateLimits {
		fmt.Fprintf(stdout, "rate_limit:     %s %d/%s per %s targets=%s\n", rl.ID, rl.MaxCalls, rl.Window, rl.Per, strings.Join(rl.Targets, ","))
	}
	names := make([]string, 0, len(b.Files))
	for n := range b.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(stdout, "files:")
	for _, n := range names {
		fmt.Fprintf(stdout, "  %-40s %d bytes\n", n, len(b.Files[n]))
	}
	fmt.Fprintf(stdout, "tests:          %d cases\n", len(cases))
	return nil
}
