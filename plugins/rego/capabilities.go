package rego

import (
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Grants that lift a builtin's ban (the wasm manifest's sandbox.grants).
const (
	grantClock  = "clock"
	grantRandom = "random"
)

// banned is why a builtin may not be called, and the sandbox grant, if any,
// that lifts the ban.
type banned struct {
	reason string
	grant  string // "": no grant lifts it
}

// forbidden lists the builtins a Wicket policy may not call, in either
// engine: the Rego engine leaves them out of the compiler's capabilities and
// the OPA-ABI wasm host refuses a module that imports them (see
// [HostBuiltins]). Any other builtin OPA marks nondeterministic is forbidden
// too (reason: nondeterministic), with no grant.
var forbidden = map[string]banned{
	"http.send":          {reason: "it reaches the network"},
	"net.lookup_ip_addr": {reason: "it reaches the network (DNS)"},
	"opa.runtime":        {reason: "it exposes the host's environment and configuration"},
	"time.now_ns":        {reason: "it reads the wall clock, which breaks determinism (use input.execution.created_at)", grant: grantClock},
	"rand.intn":          {reason: "it is random, which breaks determinism", grant: grantRandom},
	"uuid.rfc4122":       {reason: "it is random, which breaks determinism", grant: grantRandom},

	"io.jwt.decode_verify":   {reason: "it reads the wall clock (exp/nbf), which breaks determinism", grant: grantClock},
	"io.jwt.encode_sign":     {reason: "its signatures may be randomised, which breaks determinism", grant: grantRandom},
	"io.jwt.encode_sign_raw": {reason: "its signatures may be randomised, which breaks determinism", grant: grantRandom},
	"json.match_schema":      {reason: "it may fetch remote $ref schemas over the network"},
	"json.verify_schema":     {reason: "it may fetch remote $ref schemas over the network"},

	"crypto.x509.parse_and_verify_certificates":              {reason: "it reads the wall clock (certificate validity), which breaks determinism", grant: grantClock},
	"crypto.x509.parse_and_verify_certificates_with_options": {reason: "it reads the wall clock (certificate validity), which breaks determinism", grant: grantClock},
}

// Forbidden reports why a bundle granted grants may not call the builtin
// name, or "" when it may. The list is the one both engines apply: the Rego
// engine (which takes no grants) and the OPA-ABI wasm host.
func Forbidden(name string, grants []string) string {
	b, ok := forbidden[name]
	if !ok {
		bi, known := ast.BuiltinMap[name]
		if !known || !bi.Nondeterministic {
			return ""
		}
		b = banned{reason: "it is nondeterministic"}
	}
	if b.grant != "" && slices.Contains(grants, b.grant) {
		return ""
	}
	if b.grant != "" {
		return b.reason + "; the sandbox grant " + b.grant + " allows it in wasm bundles"
	}
	return b.reason
}

// capabilities returns OPA's capabilities for this version minus the
// forbidden builtins, and with no host allowed for remote schema fetches.
// It also returns the reason for every builtin it removed.
func capabilities() (*ast.Capabilities, map[string]string) {
	c := ast.CapabilitiesForThisVersion()
	removed := make(map[string]string)
	kept := c.Builtins[:0:0]
	for _, b := range c.Builtins {
		if why := Forbidden(b.Name, nil); why != "" {
			removed[b.Name] = why
			continue
		}
		kept = append(kept, b)
	}
	c.Builtins = kept
	c.AllowNet = []string{} // empty, not nil: no host at all
	return c, removed
}
