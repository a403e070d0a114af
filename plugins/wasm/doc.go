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
//     Compile, naming the import. The builtins an OPA module calls on its
//     host are answered by [Config.Builtins] (rego.NewHostBuiltins: OPA's own
//     implementations); a module calling a builtin the sandbox forbids
//     (http.send, time.now_ns without the clock grant, …) is refused,
//     naming it.
//   - WASI grants nothing: no files, sockets, arguments or environment; stdout
//     and stderr discarded; a fake deterministic clock; random bytes from a
//     fixed seed. The manifest's sandbox.grants ("clock", "random", "env",
//     "stdout") widen this one capability at a time.
//   - Memory: sandbox.memory_pages caps linear memory; memory.grow beyond it
//     fails, and memory.fill/memory.copy touch at most that memory.
//   - Time: sandbox.timeout bounds each evaluation; running code is
//     interrupted when it passes. Start-up (start section, _initialize, OPA
//     data loading) is bounded by Limits.MaxTimeout.
//   - Concurrency: sandbox.pool_size instances per revision; more
//     evaluations wait for one.
//
// Defaults and ceilings of the three come from [Config.Limits]: a manifest
// asking for more than a ceiling is refused at Compile.
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
// # Performance
//
// Interrupting a module at its deadline is not free: with wazero's
// WithCloseOnContextDone, compiled code checks for a closed module at every
// loop iteration by calling into Go, which costs roughly 0.1 µs per
// iteration. Measured on a 2-vCPU machine: a module that does no looping
// answers in under 1 µs; the C SDK example in tens of µs (4 µs without the
// checks); a Go SDK module in about 0.5 ms. Deadlines are therefore a matter
// of milliseconds, not microseconds: the default deadline is 1s, so a
// loaded host does not push a Go module past it, and a module stuck in a loop
// is stopped within a second. Bundles may set another sandbox.timeout, up to
// the ceiling.
//
// OPA-ABI modules avoid that cost: the engine rewrites them at Compile to
// count loop iterations and calls in a global of their own and to ask the
// host for the time every 16,384 of them (instrument.go), and runs them
// without wazero's check. An instance also keeps its heap between
// evaluations, so OPA's cache of compiled regular expressions and globs
// survives; the heap is set back to its base once it has grown by a quarter
// of the free memory, and an evaluation that runs out of memory above
// earlier garbage runs again on a fresh instance. OPA-compiled policies
// evaluate as fast as OPA's own evaluator (docs/benchmarks.md).
//
// # Notes
//
// wazero applies a memory cap per runtime, when a module is compiled. The
// engine therefore keeps one wazero runtime per distinct memory cap; all of
// them share one compilation cache, so a module used with two caps is still
// compiled once.
package wasm
