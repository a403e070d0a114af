package kernel

import (
	"errors"
	"fmt"
)

// Error codes that cross the wire (docs/protocol.md). The server maps each to one
// HTTP status.
const (
	CodeValidation      = "validation"
	CodeUnauthenticated = "unauthenticated"
	CodeForbidden       = "forbidden"
	CodeNotFound        = "not_found"
	CodeConflict        = "conflict"
	CodeLeaseSuperseded = "lease_superseded"
	// CodeStepIDDivergence: the step id the agent computed and sent is not
	// the kernel's (409); nothing was recorded.
	CodeStepIDDivergence = "step_id_divergence"
	// CodeExecutionLeased: a session attach while its lease is live (409);
	// details name lease_until.
	CodeExecutionLeased = "execution_leased"
	CodeTooLarge        = "too_large"
	CodeRateLimited     = "rate_limited"
	CodeInternal        = "internal"
	CodeUnavailable     = "unavailable"
)

// Sentinel errors callers branch on with errors.Is. Each matches a *Error
// with the same code.
var (
	// ErrNotFound: no such record (or not visible to the caller).
	ErrNotFound = &Error{Code: CodeNotFound, Message: "not found"}
	// ErrConflict: the change conflicts with recorded state.
	ErrConflict = &Error{Code: CodeConflict, Message: "conflict"}
	// ErrLeaseSuperseded: the caller's (dispatch_id, dispatch_attempt) is not the current lease.
	ErrLeaseSuperseded = &Error{Code: CodeLeaseSuperseded, Message: "lease superseded"}
	// ErrValidation: the request is malformed.
	ErrValidation = &Error{Code: CodeValidation, Message: "invalid request"}
	// ErrForbidden: the caller may not do this.
	ErrForbidden = &Error{Code: CodeForbidden, Message: "forbidden"}
	// ErrUnavailable: the kernel is shutting down or not ready.
	ErrUnavailable = &Error{Code: CodeUnavailable, Message: "unavailable"}
)

// Error is an error with a stable code, a message for humans and optional
// details. Is matches any *Error with the same code.
type Error struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
	// Err is the wrapped cause, if any (not sent over the wire).
	Err error `json:"-"`
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Code + ": " + e.Message + ": " + e.Err.Error()
	}
	return e.Code + ": " + e.Message
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches on the code.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// Errorf builds an *Error with a code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// WithDetails returns a copy of e with details set.
func (e *Error) WithDetails(kv map[string]any) *Error {
	c := *e
	c.Details = kv
	return &c
}

// CodeOf returns the code of err: the code of the first *Error in its chain,
// or internal.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}
