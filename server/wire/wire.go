package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Header names of the protocol.
const (
	// HeaderAgentID names the agent making a signed request.
	HeaderAgentID = "Rebuno-Agent-Id"
	// HeaderSignature carries "sha256=<lowercase hex HMAC-SHA256(agent secret,
	// raw body)>": the signature of agents registered with SigningBody. v1
	// agents use HeaderWicketSignature.
	HeaderSignature = "Rebuno-Signature"
	// HeaderDispatchID is the dispatch id of the caller's lease.
	HeaderDispatchID = "Rebuno-Dispatch-Id"
	// HeaderDispatchAttempt is the dispatch attempt (a decimal integer >= 1) of the caller's lease.
	HeaderDispatchAttempt = "Rebuno-Dispatch-Attempt"
	// HeaderStepID is the step id an agent computed for a submission; the
	// kernel refuses the submission with CodeStepIDDivergence when its own
	// id differs.
	HeaderStepID = "Rebuno-Step-Id"
	// HeaderIdempotencyKey makes a retried POST /v0/executions return the first execution.
	HeaderIdempotencyKey = "Idempotency-Key"
)

// SignaturePrefix starts every signature header value.
const SignaturePrefix = "sha256="

// Sign returns the signature header value of body under secret:
// "sha256=" followed by the lowercase hex HMAC-SHA256 of body.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return SignaturePrefix + hex.EncodeToString(m.Sum(nil))
}

// WellFormed reports whether header has the form of a HeaderSignature
// value: "sha256=" followed by exactly 64 hex digits (the check of Verify
// that needs no secret).
func WellFormed(header string) bool {
	_, ok := parseSignature(header)
	return ok
}

// parseSignature decodes a HeaderSignature value: "sha256=" followed by
// exactly 64 hex digits.
func parseSignature(header string) ([]byte, bool) {
	hexSig, ok := strings.CutPrefix(header, SignaturePrefix)
	if !ok || len(hexSig) != 2*sha256.Size {
		return nil, false
	}
	sig, err := hex.DecodeString(hexSig)
	return sig, err == nil
}

// Verify reports whether header is a valid signature of body under secret.
// The comparison runs in constant time (hmac.Equal). A header that is not
// "sha256=" followed by exactly 64 hex digits is rejected, as is an empty
// secret.
func Verify(secret, body []byte, header string) bool {
	if len(secret) == 0 {
		return false
	}
	got, ok := parseSignature(header)
	if !ok {
		return false
	}
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return hmac.Equal(got, m.Sum(nil))
}

// Error codes of ErrorBody.Code (docs/protocol.md), each with one HTTP status.
const (
	CodeValidation       = "validation"         // 400
	CodeUnauthenticated  = "unauthenticated"    // 401
	CodeForbidden        = "forbidden"          // 403
	CodeNotFound         = "not_found"          // 404
	CodeMethodNotAllowed = "method_not_allowed" // 405
	CodeConflict         = "conflict"           // 409
	CodeLeaseSuperseded  = "lease_superseded"   // 409
	CodeStepIDDivergence = "step_id_divergence" // 409
	CodeExecutionLeased  = "execution_leased"   // 409: a session's lease is live
	CodeTooLarge         = "too_large"          // 413
	CodeRateLimited      = "rate_limited"       // 429
	CodeInternal         = "internal"           // 500
	CodeUnavailable      = "unavailable"        // 503
)

// ErrorBody is the body of every error answer.
type ErrorBody struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// Error makes an ErrorBody usable as an error (for clients).
func (e *ErrorBody) Error() string { return e.Code + ": " + e.Message }
