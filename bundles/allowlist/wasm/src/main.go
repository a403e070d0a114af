// Command src is the allowlist bundle's wasm policy (Wicket ABI, Go SDK):
// deny by default; tool calls to the listed tools are allowed.
//
// It gives the same decisions as ../../rules and ../../rego. Build it with
// bundles/build.sh (the exact command is in bundles/README.md); the build is
// reproducible and bundles_test.go checks ../policy.wasm against it.
package main

import (
	"unicode/utf8"

	"github.com/wicket-run/wicket/policy-sdk/go/policy"
)

// tools are the allowed tool names, as globs: '*' matches any run of
// characters (dots included) and '?' exactly one, as the rules engine's globs
// do. Keep in step with ../../rules/rules.yaml and ../../rego/data.json.
var tools = []string{"search", "fs.read*", "http.get"}

func init() {
	policy.Handle(decide)
}

func decide(in *policy.Input) *policy.Decision {
	s := &in.Step
	if s.Kind != policy.KindToolCall {
		return nil
	}
	for _, p := range tools {
		if match(p, s.Target) {
			return policy.Allow("tool is on the allow-list").WithRule("allow-listed-tools")
		}
	}
	return nil // default_action (deny) applies; local steps are allowed by the kernel
}

// match reports whether name matches the glob pattern: '*' matches any run of
// characters, '?' one rune, anything else itself.
func match(pattern, name string) bool {
	px, nx := 0, 0
	// Where to resume after the last '*': pattern just past it, and the name
	// position it currently absorbs up to.
	starP, starN := -1, 0
	for px < len(pattern) || nx < len(name) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				starP, starN = px+1, nx
				px++
				continue
			case '?':
				if nx < len(name) {
					_, n := utf8.DecodeRuneInString(name[nx:])
					px++
					nx += n
					continue
				}
			default:
				if nx < len(name) && name[nx] == c {
					px++
					nx++
					continue
				}
			}
		}
		if starP >= 0 && starN < len(name) {
			_, n := utf8.DecodeRuneInString(name[starN:])
			starN += n
			px, nx = starP, starN
			continue
		}
		return false
	}
	return true
}

// main is never called in a c-shared module; package main must declare it.
func main() {}
