// Package bundle is the policy bundle format (docs/bundles.md): OPA's bundle layout (.manifest,
// data files at any path, .signatures.json, read with OPA's own bundle
// package) plus an optional bundle.yaml for what OPA has no field for, one
// engine's policy files and test cases under tests/. A bundle is read from a
// directory or a .tar.gz of one and is identified by name, revision and the
// SHA-256 digest of its content.
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
//	bundle.yaml       optional manifest (see Manifest; decoded strictly)
//	.manifest         optional OPA manifest: revision, roots, rego_version, wasm, metadata
//	.signatures.json  optional OPA signature (see Options.Keys)
//	rules.yaml        rules engine policy    | *.rego (rego) | policy.wasm (wasm)
//	**/data.json      data, merged under the directory's path (also data.yaml, data.yml)
//	tests/*.yaml      cases: [...] (see TestCase)
//
// Name, revision and engine may be left out of bundle.yaml, or bundle.yaml
// left out altogether: the name is [Options.Name], the revision .manifest's,
// and the engine follows the files (policy.wasm: wasm with the OPA ABI;
// .rego: rego; rules.yaml: rules).
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
// (memory_pages, pool_size, timeout, grants: clock, random, env, stdout);
// rego bundles add entrypoint (e.g. data.wicket.decision). sandbox.timeout
// is accepted for every engine. The kernel's [Limits] cap what a sandbox
// section may ask for: [Limits.Apply] refuses more, naming the field and
// the ceiling.
//
// # Loading
//
// [LoadDir], [LoadTarGz] and [LoadFiles] all end in one validator, so they
// accept and refuse exactly the same bundles. A bundle that fails any check
// is refused whole. Hostile input is bounded: [MaxFiles], [MaxTotalSize],
// [MaxArchiveSize] (gzip bombs), [MaxPathLen]; unsafe paths, links and
// devices are refused. Hidden files (path elements starting with ".") are
// skipped by all three loaders, except .manifest and .signatures.json at the
// root. A tar entry's leading "/" (as OPA writes them) is dropped.
//
// # Identity
//
// [Digest] hashes the files, not the archive, so a directory, its .tar.gz
// and the reproducible archive of [Bundle.TarGz] share one digest.
package bundle
