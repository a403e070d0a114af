package postgres

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/wicket-run/wicket/kernel"
)

// The record encoding lives here. A record is stored as the JSON of its
// kernel type in a bytea column (doc), beside the columns the queries and
// indexes need (keys, status, times). JSON follows the kernel types by
// itself: a field another change adds to a kernel record is carried without
// a migration. Raw JSON fields (input, args, result, payloads) keep their
// bytes: the encoder does not escape HTML characters, and the kernel stores
// compact canonical JSON only.

// encode returns the JSON of v without HTML escaping and without the
// encoder's trailing newline.
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// decode decodes a stored record.
func decode[T any](b []byte) (*T, error) {
	v := new(T)
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("undecodable record: %w", err)
	}
	return v, nil
}

var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

// nanos is t in Unix nanoseconds, clamped to the range of int64 (the zero
// time is the smallest value): the form of every time column, exact to the
// nanosecond, whose numeric order is time order.
func nanos(t time.Time) int64 {
	switch {
	case t.Before(minTime):
		return math.MinInt64
	case t.After(maxTime):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// fromNanos decodes nanos; the smallest value decodes as the zero time.
func fromNanos(n int64) time.Time {
	if n == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// checkIDs returns a validation error when an identifier cannot be a key:
// empty, containing NUL (PostgreSQL text cannot hold it) or not UTF-8.
func checkIDs(what string, ids ...string) error {
	for _, id := range ids {
		switch {
		case id == "":
			return fmt.Errorf("postgres: %s: empty identifier: %w", what, kernel.ErrValidation)
		case strings.IndexByte(id, 0) >= 0:
			return fmt.Errorf("postgres: %s: identifier %q contains NUL: %w", what, id, kernel.ErrValidation)
		case !utf8.ValidString(id):
			return fmt.Errorf("postgres: %s: identifier %q is not UTF-8: %w", what, id, kernel.ErrValidation)
		}
	}
	return nil
}

// readable reports whether ids can name a stored record (see checkIDs).
func readable(ids ...string) bool {
	for _, id := range ids {
		if id == "" || strings.IndexByte(id, 0) >= 0 || !utf8.ValidString(id) {
			return false
		}
	}
	return true
}

// Dispatch-state helpers: which executions the due and lease indexes hold.

func queued(state kernel.DispatchStatus) bool { return state == kernel.DispatchQueued }

func leased(state kernel.DispatchStatus) bool {
	return state == kernel.DispatchDelivering || state == kernel.DispatchAcked
}

// validText reports whether s can be stored in a text column: UTF-8
// without NUL (empty is fine).
func validText(s string) bool {
	return strings.IndexByte(s, 0) < 0 && utf8.ValidString(s)
}

// checkText returns a validation error for a value validText refuses.
func checkText(what, field, s string) error {
	if !validText(s) {
		return fmt.Errorf("postgres: %s: %s %q is not UTF-8 without NUL: %w", what, field, s, kernel.ErrValidation)
	}
	return nil
}
