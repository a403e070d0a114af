// Package bundle is the policy bundle format (docs/bundles.md): a manifest
// (bundle.yaml), one engine's policy files, optional data.json and test cases
// under tests/. A bundle is read from a directory or a .tar.gz of one and is
// identified by name, revision and the SHA-256 digest of its content.
//
// # Basics
//
//	b, err := bundle.LoadDir("bundles/guard/rules") // or LoadTarGz(r), LoadFiles(m)
//	if err != nil {
//		return err // an *bundle.Error naming the file (and field) at fault
//	}
//	ev, err := engine.Compile(ctx, b) // rules, rego or wasm, chosen by b.Manifest.Engine
//	d, err := ev.Evaluate(ctx, in)
//	d = policy.ApplyDefault(d, b.DefaultAction(), in.Step.Kind)
//
// # Layout
//
//	bundle.yaml     manifest (see Manifest; decoded strictly)
//	rules.yaml      rules engine policy    | *.rego (rego) | policy.wasm (wasm)
//	data.json       optional JSON object
//	tests/*.yaml    cases: [...] (see TestCase)
//
// A minimal manifest:
//
//	name: guard                 # ^[a-z0-9][a-z0-9_.-]{0,62}$
//	revision: "7"               # free text, optional
//	engine: rules               # rules | rego | wasm
//	default_action: deny        # allow | deny; empty: rules.yaml's, else deny
//	rate_limits:
//	  - id: github-writes       # unique
//	    targets: ["github.*"]   # globs (see Glob); empty: every target
//	    step_kind: tool_call    # optional
//	    max_calls: 10
//	    window: 1m
//	    per: execution          # execution | agent | tenant
//	    algorithm: sliding      # sliding | fixed
//	    on_limiter_error: fail_closed
//
// wasm bundles may add abi (wicket | opa), entrypoint, and sandbox
// (memory_pages, timeout, grants: clock, random, env, stdout); rego bundles
// add entrypoint (e.g. data.wicket.decision). sandbox.timeout is accepted
// for every engine.
//
// # Loading
//
// [LoadDir], [LoadTarGz] and [LoadFiles] all end in one validator, so they
// accept and refuse exactly the same bundles. A bundle that fails any check
// is refused whole. Hostile input is bounded: [MaxFiles], [MaxTotalSize],
// [MaxArchiveSize] (gzip bombs), [MaxPathLen]; unsafe paths, links and
// devices are refused. Hidden files (path elements starting with ".") are
// skipped by all three loaders.
//
// # Identity
//
// [Digest] hashes the files, not the archive, so a directory, its .tar.gz
// and the reproducible archive of [Bundle.TarGz] share one digest.
package bundle
