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
	"github.com/wicket-run/wicket/plugins/policytest"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/plugins/wasm"
	"github.com/wicket-run/wicket/server/wire"
)

// loadBundle reads a bundle directory or archive. A bundle without a
// bundle.yaml (OPA's layout) is named after the directory or archive.
func loadBundle(path string, keys ...bundle.Key) (*bundle.Bundle, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	opts := bundle.Options{Name: policytest.NameFromPath(path), Keys: keys}
	if st.IsDir() {
		return opts.LoadDir(path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return opts.LoadTarGz(bytes.NewReader(data))
}

// verifyFlags are --verification-key and its companions.
type verifyFlags struct{ file, id, alg *string }

func verificationFlags(fs *flag.FlagSet) verifyFlags {
	return verifyFlags{
		file: fs.String("verification-key", "", "verify .signatures.json with this PEM public key (or HMAC secret) file; an unsigned or tampered bundle is then refused"),
		id:   fs.String("verification-key-id", bundle.DefaultKeyID, "key id (kid) of --verification-key"),
		alg:  fs.String("verification-alg", bundle.DefaultAlgorithm, "algorithm of --verification-key"),
	}
}

func (v verifyFlags) keys() ([]bundle.Key, error) {
	if *v.file == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(*v.file)
	if err != nil {
		return nil, fmt.Errorf("--verification-key: %w", err)
	}
	keys := []bundle.Key{{ID: *v.id, Algorithm: *v.alg, Key: string(pem)}}
	if err := bundle.ValidateKeys(keys); err != nil {
		return nil, fmt.Errorf("--verification-key %s: %w", *v.file, err)
	}
	return keys, nil
}

// cliWasmCache is the directory offline commands keep compiled wasm
// modules in, so that repeated runs do not recompile: wicket/wasm-cache
// under the user cache dir. It is "" (modules are compiled in memory) when
// there is no such dir or it cannot be used — a CI runner with a read-only
// or missing home still tests and builds bundles, only slower.
func cliWasmCache() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	dir := filepath.Join(d, "wicket", "wasm-cache")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return ""
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm()&0o022 != 0 {
		return ""
	}
	return dir
}

// cliHost builds an engine host for offline use; wasm modules are cached
// in cliWasmCache.
func cliHost() (*plugins.Host, func()) {
	w := wasm.New(wasm.Config{CacheDir: cliWasmCache(), Builtins: rego.NewHostBuiltins()})
	h := plugins.NewHost(plugins.Options{}, rules.New(), rego.New(), w)
	return h, func() { h.Close(); _ = w.Close() }
}

// prepareBundle loads the bundle at path and compiles it exactly as the
// kernel takes a bundle in (plugins.Host.Prepare): what this accepts, an
// upload accepts. Close the result with the returned function.
func prepareBundle(ctx context.Context, path string, keys ...bundle.Key) (*plugins.Prepared, func(), error) {
	b, err := loadBundle(path, keys...)
	if err != nil {
		return nil, nil, refused(path, err)
	}
	host, closeHost := cliHost()
	p, err := host.Prepare(ctx, b)
	if err != nil {
		closeHost()
		return nil, nil, refused(path, err)
	}
	return p, func() { _ = p.Close(); closeHost() }, nil
}

// policyEvalOffline evaluates one input document against a bundle on disk.
func policyEvalOffline(ctx context.Context, bpath, input string, keys []bundle.Key, stdout io.Writer) error {
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
	p, done, err := prepareBundle(ctx, bpath, keys...)
	if err != nil {
		return err
	}
	defer done()
	b := p.Bundle
	start := time.Now()
	d, err := p.Evaluator().Evaluate(ctx, &in)
	if err != nil {
		return fmt.Errorf("evaluate (the kernel would deny this step, fail closed): %w", err)
	}
	matched := d != nil
	d = policy.ApplyDefault(d, b.DefaultAction(), in.Step.Kind)
	out, _ := json.MarshalIndent(map[string]any{"decision": d, "matched": matched, "bundle": b.Ref(), "eval_ns": time.Since(start).Nanoseconds()}, "", "  ")
	fmt.Fprintln(stdout, string(out))
	return nil
}

func policyBuild(ctx context.Context, path, out string, sk bundle.SigningKey, stdout io.Writer) error {
	p, done, err := prepareBundle(ctx, path)
	if err != nil {
		return err
	}
	done()
	b := p.Bundle
	if sk.Key != "" {
		if _, err := os.Stat(sk.Key); err != nil {
			return fmt.Errorf("--signing-key: %w", err)
		}
		if b, err = b.Signed(sk); err != nil {
			return err
		}
	}
	data, err := b.TarGz()
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		return err
	}
	signed := ""
	if sk.Key != "" {
		signed = ", signed " + sk.Algorithm + " kid " + sk.KeyID
	}
	fmt.Fprintf(stdout, "%s %s rev %s sha256:%s (%d bytes%s)\n", out, b.Manifest.Name, b.Manifest.Revision, b.Digest, len(data), signed)
	return nil
}

func policyInspect(ctx context.Context, path string, keys []bundle.Key, stdout io.Writer) error {
	p, done, err := prepareBundle(ctx, path, keys...)
	if err != nil {
		return err
	}
	done()
	b := p.Bundle
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
	if o := b.OPA; o != nil {
		if _, ok := b.Files[bundle.OPAManifestFile]; ok {
			roots := "(all of data)"
			if len(o.Roots) > 0 {
				roots = strings.Join(o.Roots, ", ")
			}
			fmt.Fprintf(stdout, "roots:          %s\n", roots)
			if o.RegoVersion != nil {
				fmt.Fprintf(stdout, "rego_version:   %d\n", *o.RegoVersion)
			}
			if len(o.Metadata) > 0 {
				md, _ := json.Marshal(o.Metadata)
				fmt.Fprintf(stdout, "metadata:       %s\n", md)
			}
		}
		for _, f := range o.DataFiles {
			under := "data"
			if d := filepath.ToSlash(filepath.Dir(f)); d != "." {
				under += "." + strings.ReplaceAll(d, "/", ".")
			}
			fmt.Fprintf(stdout, "data:           %s → %s\n", f, under)
		}
	}
	switch b.Signature.State {
	case bundle.SignatureVerified:
		fmt.Fprintf(stdout, "signature:      verified (%d files)\n", b.Signature.Files)
	case bundle.SignatureUnverified:
		fmt.Fprintln(stdout, "signature:      unverified (.signatures.json present, not checked: give --verification-key)")
	default:
		fmt.Fprintln(stdout, "signature:      none")
	}
	fmt.Fprintln(stdout, "files:")
	for _, n := range names {
		fmt.Fprintf(stdout, "  %-40s %d bytes\n", n, len(b.Files[n]))
	}
	fmt.Fprintf(stdout, "tests:          %d cases\n", len(cases))
	return nil
}

func init() {
	register(
		&command{name: "policy test", args: "[PATH...]", max: -1, summary: "find the bundles below the paths (default .) and run their cases and Rego unit tests",
			help: policyTestHelp, setup: func(fs *flag.FlagSet, _ *clientOpts) runFunc { return policyTestFlags(fs) }},
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
				vk := verificationFlags(fs)
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
						keys, err := vk.keys()
						if err != nil {
							return err
						}
						return policyEvalOffline(ctx, *bpath, in, keys, stdout)
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
		&command{name: "policy build", args: "BUNDLE", min: 1, max: 1, summary: "check a bundle as an upload would, write its reproducible archive (signed with --signing-key) and print its digest",
			setup: func(fs *flag.FlagSet, _ *clientOpts) runFunc {
				out := fs.String("o", "", "output .tar.gz (required)")
				var sk bundle.SigningKey
				fs.StringVar(&sk.Key, "signing-key", "", "sign the bundle (.signatures.json) with this PEM private key or HMAC secret file, as opa build --signing-key")
				fs.StringVar(&sk.Algorithm, "signing-alg", bundle.DefaultAlgorithm, "signature algorithm (RS256, PS256, ES256, HS256, ...)")
				fs.StringVar(&sk.KeyID, "signing-key-id", bundle.DefaultKeyID, "key id (kid) verifiers look the key up by")
				fs.StringVar(&sk.ClaimsFile, "claims-file", "", "JSON file of extra claims (e.g. scope)")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					if *out == "" {
						return usagef("policy build: -o OUT.tar.gz is required")
					}
					return policyBuild(ctx, pos[0], *out, sk, stdout)
				}
			}},
		&command{name: "policy inspect", args: "BUNDLE", min: 1, max: 1, summary: "check a bundle as an upload would; print its manifest, roots, data, signature state, digest, files and tests",
			setup: func(fs *flag.FlagSet, _ *clientOpts) runFunc {
				vk := verificationFlags(fs)
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					keys, err := vk.keys()
					if err != nil {
						return err
					}
					return policyInspect(ctx, pos[0], keys, stdout)
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
