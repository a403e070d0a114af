// Package wasm is Wicket's WebAssembly policy engine: it runs a bundle's
// policy.wasm under wazero in a sandbox that grants nothing by default.
//
//	eng := wasm.New(wasm.Config{CacheDir: filepath.Join(dataDir, "wasm-cache")})
//	defer eng.Close()
//	ev, err := eng.Compile(ctx, b) // b.Manifest.Engine == "wasm"
//	if err != nil { ... }          // refused: bad module, forbidden import, init trap
//	defer ev.Close()
//	d, err := ev.Evaluate(ctx, in) // err: trap, timeout, bad output → deny the step
//
// # Basics
//
// Two ABIs are supported, chosen by the manifest's abi field: Wicket's own
// JSON-in/JSON-out ABI (policy-sdk/ABI.md, the default) and OPA's wasm ABI
// (modules built with `opa build -t wasm`). [Engine.Compile] compiles a
// module once per bundle revision, checks its imports and exports against the
// ABI and the bundle's grants, and instantiates one instance to prove it
// starts. The returned evaluator keeps a pool of instances; each evaluation
// borrows one, so concurrent evaluations never share an instance.
//
// # Sandbox
//
//   - Imports: only wasi_snapshot_preview1 functions (Wicket ABI) or OPA's
//     env.* functions and memory (OPA ABI). Anything else is refused at
//     Compile, naming the import.
//   - WASI grants nothing: no files, sockets, arguments or environment; stdout
//     and stderr discarded; a fake deterministic clock; random bytes from a
//     fixed seed. The manifest's sandbox.grants ("clock", "random", "env",
//     "stdout") widen this one capability at a time.
//   - Memory: sandbox.memory_pages (default [Config.DefaultMemoryPages]) caps
//     linear memory; memory.grow beyond it fails.
//   - Time: sandbox.timeout (default [Config.DefaultTimeout]) bounds each
//     evaluation; running code is interrupted when it passes.
//
// An evaluation that traps, times out, exits, or returns output that is not a
// valid decision returns an error saying which; the instance is closed and
// never reused.
//
// # Caching
//
// Compiled machine code is cached on disk under [Config.CacheDir], keyed by
// the module's content (and wazero version and CPU features), so a restart does
// not recompile. Go modules take about a second to compile cold.
//
// # Notes
//
// wazero applies a memory cap per runtime, when a module is compiled. The
// engine therefore keeps one wazero runtime per distinct memory cap; all of
// them share one compilation cache, so a module used with two caps is still
// compiled once.
package wasm
