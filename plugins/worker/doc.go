// Package worker runs a policy engine (the Rego engine, in wicket serve) in
// child processes, one per tenant, so that what a tenant's policies cost is
// bounded by the operating system rather than by hope.
//
// # Basics
//
//	exe, _ := os.Executable()
//	eng := worker.New(worker.Config{Name: "rego", Command: []string{exe, "policy-worker"},
//		Limits: limits, Memory: 256 << 20})
//	host := plugins.NewHost(opts, rules.New(), eng, wasmEngine)
//
// and, in the program's "policy-worker" command:
//
//	worker.Serve(os.Stdin, os.Stdout, func(l bundle.Limits) plugins.Engine {
//		return rego.New(rego.WithLimits(l))
//	})
//
// # Isolation
//
// A worker starts on the first Compile for its tenant (the tenant comes from
// [plugins.TenantFrom]; the host sets it) and stops when the tenant's last
// evaluator closes. It caps its own data segment (RLIMIT_DATA on Linux) at
// Config.Memory and lowers its priority (nice 10). Bundles are compiled and
// evaluated in the worker; the kernel keeps their files and the answers.
//
// A worker dies when its policies exceed the memory cap, and is killed when
// an evaluation has not answered Config.Grace after its deadline (a builtin
// that ignores cancellation). Either way the evaluations it was running fail
// with the reason, the death is logged, and the tenant's next evaluation
// starts a new worker, which compiles the tenant's bundles again. Other
// tenants' workers are not affected.
//
// # Protocol
//
// Length-prefixed JSON frames over the worker's stdin and stdout: init
// (limits, memory), compile (files), eval (bundle, input), close (bundle);
// each answered with the request's id, evaluations concurrently.
package worker
