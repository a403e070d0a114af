// Package bundles holds Wicket's stock policy bundles as data: allowlist,
// safe-shell and effect-classes, each in the three engine forms
// <name>/rules, <name>/rego and <name>/wasm (see README.md).
//
// The package has no code. Its tests load every bundle, run its tests/*.yaml
// cases through the matching engine, require the three forms of a bundle to
// give the same decisions, and require each policy.wasm to be byte-identical
// to a fresh, reproducible build of its Go source (wasm/src, a module of its
// own so that the main module never compiles it).
//
// Regenerate the test copies and the wasm modules with:
//
//	go generate ./bundles
package bundles

//go:generate sh build.sh
