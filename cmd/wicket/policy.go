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
	"github.com/wicket-run/wicket/server/wire"
)

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
	w := wasm.New(wasm.Config{CacheDir: cache, Builtins: rego.NewHostBuiltins()})
	h := plugins.NewHost(plugins.Options{}, rules.New(), rego.New(), w)
	return h, func() { h.Close(); _ = w.Close() }
}

func policyTest(ctx context.Context, paths []string, verbose bool, stdout io.Writer) error {
	host, closeHost := cliHost()
	defer closeHost()
	passed, failed := 0, 0
	for _, path := range paths {
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
				if verbose {
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

// policyEvalOffline evaluates one input document against a bundle on disk.
func policyEvalOffline(ctx context.Context, bpath, input string, stdout io.Writer) error {
	raw, err := readInput(input)
	if err != nil {
		return fmt.Errorf("read input: %w", err)
	}
	var in policy.Input
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return fmt.Errorf("input is not a policy input document: %w", err)
	}
	b, err := loadBundle(bpath)
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

func policyBuild(path, out string, stdout io.Writer) error {
	b, err := loadBundle(path)
	if err != nil {
		return err
	}
	data, err := b.TarGz()
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %s rev %s sha256:%s (%d bytes)\n", out, b.Manifest.Name, b.Manifest.Revision, b.Digest, len(data))
	return nil
}

func policyInspect(path string, stdout io.Writer) error {
	b, err := loadBundle(path)
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

func init() {
	register(
		&command{name: "policy test", args: "BUNDLE...", min: 1, max: -1, summary: "run each bundle's tests/*.yaml cases; exit 1 on a failure",
			help: "BUNDLE is a bundle directory or a .tar.gz of one.",
			setup: func(fs *flag.FlagSet, _ *clientOpts) runFunc {
				verbose := fs.Bool("v", false, "print every case, not only failures")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					return policyTest(ctx, pos, *verbose, stdout)
				}
			}},
		&command{name: "policy eval", client: true, max: 0, summary: "evaluate a step: offline against a bundle, or by a running kernel",
			help: `Offline (--bundle): evaluates one policy input document (docs/policy.md;
--input, a file or - for stdin) against a bundle directory or .tar.gz and prints the decision.

Online (--agent, or --url): asks the kernel at --url what the agent's policy (its tenant's
guards, its bundle, the kernel default) decides for one step, without recording
anything: POST /v0/policy/eval. The step comes from --kind, --target, --args,
--effect and --idempotency, or whole from --input (a {"agent_id", "step", "labels"}
document; --agent, when given, names the agent).`,
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				bpath := fs.String("bundle", "", "offline: bundle directory or .tar.gz")
				input := fs.String("input", "", "offline: the input document (file, or - for stdin; default -); online: the request document")
				agent := fs.String("agent", "", "online: the agent whose policy decides")
				kind := fs.String("kind", "tool_call", "online: step kind (tool_call, llm_call or local)")
				target := fs.String("target", "", "online: step target")
				args := fs.String("args", "", "online: step args (JSON)")
				effect := fs.String("effect", "", "online: step effect class")
				idem := fs.String("idempotency", "", "online: step idempotency class")
				var labels labelFlag
				fs.Var(&labels, "label", "online: an execution label key=value (repeatable)")
				return func(ctx context.Context, _ []string, stdout, _ io.Writer) error {
					online := *agent != "" || flagSet(fs, "url")
					switch {
					case *bpath != "" && online:
						return usagef("policy eval: give --bundle (offline) or --agent/--url (the kernel's eval), not both")
					case *bpath != "":
						in := *input
						if in == "" {
							in = "-"
						}
						return policyEvalOffline(ctx, *bpath, in, stdout)
					case !online:
						return usagef("policy eval: give --bundle BUNDLE (offline) or --agent AGENT (the kernel's eval at --url)")
					case *agent == "" && *input == "":
						return usagef("policy eval: --agent AGENT is required (or an --input document naming agent_id)")
					}
					req := wire.PolicyEvalRequest{AgentID: *agent, Step: wire.EvalStep{Kind: *kind, Target: *target, Effect: *effect, Idempotency: *idem}, Labels: labels.m}
					if *input != "" {
						raw, err := readInput(*input)
						if err != nil {
							return fmt.Errorf("read input: %w", err)
						}
						req = wire.PolicyEvalRequest{}
						dec := json.NewDecoder(bytes.NewReader(raw))
						dec.DisallowUnknownFields()
						if err := dec.Decode(&req); err != nil {
							return fmt.Errorf("--input is not a policy eval request: %w", err)
						}
						if *agent != "" {
							req.AgentID = *agent
						}
					} else if *args != "" {
						if !json.Valid([]byte(*args)) {
							return usagef("policy eval: --args is not valid JSON")
						}
						req.Step.Args = json.RawMessage(*args)
					}
					r, err := o.client().EvalPolicy(ctx, req)
					return printAnswer(stdout, r, err)
				}
			}},
		&command{name: "policy build", args: "BUNDLE", min: 1, max: 1, summary: "write a bundle's reproducible archive and print its digest",
			setup: func(fs *flag.FlagSet, _ *clientOpts) runFunc {
				out := fs.String("o", "", "output .tar.gz (required)")
				return func(_ context.Context, pos []string, stdout, _ io.Writer) error {
					if *out == "" {
						return usagef("policy build: -o OUT.tar.gz is required")
					}
					return policyBuild(pos[0], *out, stdout)
				}
			}},
		&command{name: "policy inspect", args: "BUNDLE", min: 1, max: 1, summary: "print a bundle's manifest, digest, files and test count",
			setup: func(*flag.FlagSet, *clientOpts) runFunc {
				return func(_ context.Context, pos []string, stdout, _ io.Writer) error {
					return policyInspect(pos[0], stdout)
				}
			}},
	)
}

// labelFlag collects repeated key=value flags.
type labelFlag struct{ m map[string]string }

func (l *labelFlag) String() string { return "" }

func (l *labelFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", s)
	}
	if l.m == nil {
		l.m = map[string]string{}
	}
	l.m[k] = v
	return nil
}
