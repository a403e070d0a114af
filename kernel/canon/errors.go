package canon

import (
	"errors"
	"strconv"
)

// Error classes. Every error returned by [Canonical] and [ArgsHash] is an
// *[Error] whose Kind is one of these, so callers can branch with
// errors.Is(err, canon.ErrDuplicateKey) and so on. All of them describe a
// client mistake (an HTTP 400 at the API).
var (
	// ErrSyntax: the input is not JSON (unexpected character, unexpected end
	// of input, malformed number, literal or escape, raw control character
	// in a string).
	ErrSyntax = errors.New("invalid JSON")
	// ErrTrailingData: a complete JSON value is followed by something other
	// than whitespace.
	ErrTrailingData = errors.New("trailing data after top-level value")
	// ErrTooDeep: arrays and objects are nested more than [MaxDepth] levels.
	ErrTooDeep = errors.New("nesting too deep")
	// ErrDuplicateKey: an object has the same key twice (compared after
	// unescaping, so "a" and "\u0061" are the same key).
	ErrDuplicateKey = errors.New("duplicate object key")
	// ErrInvalidUTF8: a string contains bytes that are not valid UTF-8
	// (including UTF-8-encoded surrogates and overlong forms).
	ErrInvalidUTF8 = errors.New("invalid UTF-8")
	// ErrLoneSurrogate: a \u escape names a UTF-16 surrogate that is not
	// part of a high+low pair.
	ErrLoneSurrogate = errors.New("lone surrogate")
	// ErrNumberTooLong: a number literal is longer than [MaxNumberLen] bytes.
	ErrNumberTooLong = errors.New("number literal too long")
	// ErrTooLarge: the input is longer than [MaxInputLen] bytes.
	ErrTooLarge = errors.New("input too large")
)

// Error reports why an input cannot be canonicalised, and where.
//
// Its message reads "canon: <what> at byte offset <n>", for example
//
//	canon: duplicate object key "a" at byte offset 9
type Error struct {
	// Kind is the error class: one of the Err* variables of this package.
	Kind error
	// Offset is the byte offset in the input at which the problem was
	// detected (for a duplicate key: the opening quote of its second
	// occurrence; for a bad number: its first byte).
	Offset int
	// Detail says what was found, e.g. `unexpected character 'x' looking
	// for beginning of value`. It includes the Kind's text.
	Detail string
}

// Error returns "canon: <detail> at byte offset <offset>".
func (e *Error) Error() string {
	return "canon: " + e.Detail + " at byte offset " + strconv.Itoa(e.Offset)
}

// Unwrap returns the error class, so errors.Is works with the Err* values.
func (e *Error) Unwrap() error { return e.Kind }

func newError(kind error, off int, detail string) *Error {
	return &Error{Kind: kind, Offset: off, Detail: detail}
}

// quoteChar renders one input byte for an error message.
func quoteChar(c byte) string {
	switch {
	case c == '\'':
		return `'\''`
	case c == '"':
		return `'"'`
	case c >= 0x20 && c < 0x7f:
		return "'" + string(rune(c)) + "'"
	default:
		return "byte 0x" + strconv.FormatUint(uint64(c)|0x100, 16)[1:]
	}
}

// quoteKey renders a (decoded, valid UTF-8) key for an error message,
// shortened if long.
func quoteKey(k []byte) string {
	const max = 64
	if len(k) > max {
		cut := max
		for cut > 0 && k[cut]&0xC0 == 0x80 { // do not split a rune
			cut--
		}
		return strconv.Quote(string(k[:cut])) + "..."
	}
	return strconv.Quote(string(k))
}
