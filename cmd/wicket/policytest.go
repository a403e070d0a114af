package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/wicket-run/wicket/plugins/policytest"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/wasm"
)

// policyTestHelp is the --help text of `wicket policy test`.
const policyTestHelp = `A bundle is a directory with bundle.yaml or OPA's .manifest, or a .tar.gz.
Each is loaded and compiled exactly as the kernel does on upload, then its
tests/*.yaml cases and its Rego unit tests (test_ rules, OPA's runner) run,
and a block per bundle is printed in the style of go test: "--- FAIL:
bundle/case" with the case's file:line and expected vs got, then "ok" or
"FAIL" per bundle, then "N passed, N failed[, N skipped]".

Exit status: 0 when nothing failed; 1 when a test failed, a bundle was
refused or had no tests (without --allow-empty), or a PATH held no bundle;
2 for a usage mistake.`

// policyTestFlags defines the flags of `wicket policy test` on fs and
// returns what runs it with the paths.
func policyTestFlags(fs *flag.FlagSet) runFunc {
	verbose := fs.Bool("v", false, "print every test, not only failures")
	format := fs.String("format", "text", "report format: text, junit (JUnit XML) or json")
	output := fs.String("output", "", "write the junit or json report to this file (the text report still goes to stdout); default stdout")
	run := fs.String("run", "", "run only the tests whose bundle/case name matches this regular expression")
	target := fs.String("target", policytest.TargetRego, "Rego bundles run on: rego (OPA's evaluator), wasm (compiled by OPA's compiler, run by the wasm engine) or both (and fail on any disagreement)")
	coverage := fs.Bool("coverage", false, "report, per bundle, the rules (rules engine) and Rego lines no test reached")
	coverageMin := fs.Float64("coverage-min", 0, "fail a bundle whose coverage is below this percentage (implies --coverage)")
	allowEmpty := fs.Bool("allow-empty", false, "accept a bundle that has no tests (by default it fails)")
	timeout := fs.Duration("timeout", rego.DefaultTestTimeout, "deadline of one Rego unit test")
	vk := verificationFlags(fs)
	return func(ctx context.Context, paths []string, stdout, stderr io.Writer) error {
		opts := policytest.Options{Target: *target, AllowEmpty: *allowEmpty, Coverage: *coverage, CoverageMin: *coverageMin, RegoTestTimeout: *timeout}
		switch *format {
		case "text", "junit", "json":
		default:
			return usagef("policy test: --format %q: want text, junit or json", *format)
		}
		if *output != "" && *format == "text" {
			return usagef("policy test: --output takes the junit or json report: give --format junit or json")
		}
		if *run != "" {
			re, err := regexp.Compile(*run)
			if err != nil {
				return usagef("policy test: --run: %v", err)
			}
			opts.Run = re
		}
		keys, err := vk.keys()
		if err != nil {
			return err
		}
		opts.Keys = keys
		w := wasm.New(wasm.Config{CacheDir: cliWasmCache(), Builtins: rego.NewHostBuiltins()})
		defer w.Close()
		runner, err := policytest.NewRunner(w, opts)
		if err != nil {
			return usagef("policy test: %v", err)
		}
		if len(paths) == 0 {
			paths = []string{"."}
		}
		found, err := policytest.Discover(paths...)
		if err != nil {
			return err
		}

		// The text report streams to stdout unless the machine report
		// takes stdout; then only the summary line goes to stderr.
		text, summary := stdout, stdout
		if *format != "text" && *output == "" {
			text, summary = io.Discard, stderr
		}
		start := time.Now()
		var rep policytest.Report
		for _, f := range found {
			if err := ctx.Err(); err != nil {
				return err
			}
			b := runner.Run(ctx, f)
			rep.Add(b)
			if err := policytest.WriteText(text, b, *verbose); err != nil {
				return err
			}
		}
		rep.Duration = time.Since(start)
		if *format != "text" {
			out := stdout
			var file *os.File
			if *output != "" {
				if file, err = os.Create(*output); err != nil {
					return err
				}
				out = file
			}
			if *format == "junit" {
				err = rep.WriteJUnit(out)
			} else {
				err = rep.WriteJSON(out)
			}
			if file != nil {
				if cerr := file.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				return fmt.Errorf("write the %s report: %w", *format, err)
			}
		}
		fmt.Fprintln(summary, rep.Summary())
		if !rep.OK() {
			return fmt.Errorf("policy test: %d failed", rep.Failed)
		}
		return nil
	}
}

// refused formats a bundle's load or compile error: every problem on its
// own line, each naming its file (under path) and line.
func refused(path string, err error) error {
	context, problems := policytest.Problems(err)
	if len(problems) == 0 {
		return fmt.Errorf("%s: %w", path, err)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s: bundle refused: %s%d problem(s):", path, context, len(problems))
	for _, p := range problems {
		if p.File != "" {
			q := *p
			q.File = joinBundlePath(path, p.File)
			p = &q
		}
		sb.WriteString("\n  ")
		sb.WriteString(p.Error())
	}
	return &refusedError{msg: sb.String(), err: err}
}

// refusedError is a refused bundle's error, printed in full.
type refusedError struct {
	msg string
	err error
}

func (e *refusedError) Error() string { return e.msg }
func (e *refusedError) Unwrap() error { return e.err }

// joinBundlePath is a bundle file's path as a user finds it.
func joinBundlePath(bundlePath, file string) string {
	if policytest.IsArchive(bundlePath) {
		return bundlePath + "#" + file
	}
	return filepath.Join(bundlePath, filepath.FromSlash(file))
}
