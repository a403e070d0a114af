// Package policy is the Go SDK for Wicket wasm policies (policy-sdk/ABI.md).
//
// A policy is a Go package main that registers one handler from init and is
// built as a WASI reactor:
//
//	package main
//
//	import "github.com/wicket-run/wicket/policy-sdk/go/policy"
//
//	func init() {
//		policy.Handle(func(in *policy.Input) *policy.Decision {
//			if in.Step.Effect == policy.EffectDestructive {
//				return policy.Deny("destructive steps need a human").WithRule("no-destructive")
//			}
//			return nil // no match: the bundle's default_action applies
//		})
//	}
//
//	func main() {}
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o policy.wasm .
//
// # Basics
//
// The package exports wicket_alloc, wicket_evaluate and wicket_abi_version
// with //go:wasmexport. The host calls the module's _initialize export once
// per instance, which runs package initialisers: main.main is never run in a
// c-shared module, so [Handle] must be called from init (or a package-level
// variable initialiser).
//
// The handler receives the decoded [Input] and returns a [*Decision], or nil
// for "no match". A panic in the handler is recovered and reported to the host
// as a policy error, which denies the step.
//
// # Caveats
//
//   - Instances are pooled and reused: do not keep state between evaluations.
//   - The sandbox grants nothing by default: the clock is fake, random bytes
//     are deterministic, there is no filesystem, network or environment.
//   - The module's memory is capped by the bundle's sandbox.memory_pages
//     (default 256 pages = 16 MiB).
//
// The structs here mirror github.com/wicket-run/wicket/kernel/policy field for
// field (JSON names included); this module re-declares them so that a wasm
// build imports nothing but the standard library.
package policy
