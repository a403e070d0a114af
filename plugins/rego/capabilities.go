package rego

import (
	"github.com/open-policy-agent/opa/v1/ast"
)

// forbidden lists the builtins a Wicket policy may not call, with the reason
// shown in the compile error. Any other builtin OPA marks nondeterministic is
// forbidden too (reason: nondeterministic).
var forbidden = map[string]string{
	"http.send":          "it reaches the network",
	"net.lookup_ip_addr": "it reaches the network (DNS)",
	"opa.runtime":        "it exposes the host's environment and configuration",
	"time.now_ns":        "it reads the wall clock, which breaks determinism (use input.execution.created_at)",
	"rand.intn":          "it is random, which breaks determinism",
	"uuid.rfc4122":       "it is random, which breaks determinism",

	"io.jwt.decode_verify":   "it reads the wall clock (exp/nbf), which breaks determinism",
	"io.jwt.encode_sign":     "its signatures may be randomised, which breaks determinism",
	"io.jwt.encode_sign_raw": "its signatures may be randomised, which breaks determinism",
	"json.match_schema":      "it may fetch remote $ref schemas over the network",
	"json.verify_schema":     "it may fetch remote $ref schemas over the network",

	"crypto.x509.parse_and_verify_certificates":              "it reads the wall clock (certificate validity), which breaks determinism",
	"crypto.x509.parse_and_verify_certificates_with_options": "it reads the wall clock (certificate validity), which breaks determinism",
}

// capabilities returns OPA's capabilities for this version minus the
// forbidden builtins, and with no host allowed for remote schema fetches.
// It also returns the reason for every builtin it removed.
func capabilities() (*ast.Capabilities, map[string]string) {
	c := ast.CapabilitiesForThisVersion()
	removed := make(map[string]string)
	kept := c.Builtins[:0:0]
	for _, b := range c.Builtins {
		if why, ok := forbidden[b.Name]; ok {
			removed[b.Name] = why
			continue
		}
		if b.Nondeterministic {
			removed[b.Name] = "it is nondeterministic"
			continue
		}
		kept = append(kept, b)
	}
	c.Builtins = kept
	c.AllowNet = []string{} // empty, not nil: no host at all
	return c, removed
}
