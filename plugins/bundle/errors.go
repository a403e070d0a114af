package bundle

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Sentinel errors a caller can branch on with errors.Is. Every load error is
// an *[Error]; it also matches one of these when it belongs to their class.
var (
	// ErrUnsafePath: a path is absolute, contains "." or ".." elements, a
	// backslash, a NUL byte, invalid UTF-8, or is too long.
	ErrUnsafePath = errors.New("unsafe path")
	// ErrUnsupportedEntry: an archive or directory entry is neither a
	// regular file nor a directory (symlink, hard link, device, FIFO...).
	ErrUnsupportedEntry = errors.New("unsupported entry type")
	// ErrDuplicateFile: two entries have the same path, or a path is used as
	// both a file and a directory.
	ErrDuplicateFile = errors.New("duplicate file")
	// ErrTooLarge: the bundle exceeds [MaxTotalSize] bytes of content or
	// [MaxYAMLSize] bytes of YAML, or an archive decompresses to more than
	// [MaxArchiveSize] bytes.
	ErrTooLarge = errors.New("bundle too large")
	// ErrTooManyFiles: the bundle has more than [MaxFiles] files.
	ErrTooManyFiles = errors.New("too many files")
	// ErrMissingFile: a file the manifest's engine requires is absent.
	ErrMissingFile = errors.New("missing file")
)

// Error is a load error. It names the file at fault and, when known, the line,
// the entry within the file (a rule, a test case) and the field.
//
// Its message reads
//
//	FILE[:LINE]: [ITEM: ][FIELD: ]REASON
//
// for example
//
//	bundle.yaml: rate_limits[1].window: must be a positive Go duration, got "0s"
//	rules.yaml:12: rule "allow-reads": when.arguments.command: regex: error parsing regexp: ...
//
// Parts that are empty are left out.
type Error struct {
	// File is the slash-separated path of the file within the bundle
	// ("bundle.yaml", "rules.yaml", "tests/basic.yaml"), or a label such as
	// "archive" when the bundle as a whole is at fault.
	File string
	// Line is the 1-based line within File, or 0 when unknown.
	Line int
	// Item names the entry within File that is at fault, such as
	// `rule "allow-reads"`, `rules[3]` or `case "reads are allowed"`.
	Item string
	// Field is the dotted path of the field at fault within Item (or within
	// File when Item is empty), such as "rate_limits[1].window" or
	// "when.arguments.command".
	Field string
	// Err is the reason. It wraps one of the sentinel errors of this
	// package when the error belongs to one of their classes.
	Err error
}

// Error returns "FILE[:LINE]: [ITEM: ][FIELD: ]REASON". A file, item or field
// with non-printable characters is quoted, and one longer than 256 bytes is
// shortened, so that a hostile archive entry name cannot garble a log line.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(printable(e.File))
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	for _, s := range []string{e.Item, e.Field} {
		if s == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.WriteString(printable(s))
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("invalid")
	}
	return b.String()
}

// Unwrap returns the reason.
func (e *Error) Unwrap() error { return e.Err }

// printable returns s, quoted when it has non-printable characters and
// shortened when it is long.
func printable(s string) string {
	const max = 256
	long := len(s) > max
	if long {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || r == utf8.RuneError {
			s = strconv.Quote(s)
			break
		}
	}
	if long {
		s += "..."
	}
	return s
}

// classed returns an error that reads like fmt.Errorf(format, args...) and
// also matches class with errors.Is; the class's own text is not repeated.
// It is one problem: it unwraps to its reason alone (a list would read, to
// a caller listing a bundle's problems, as two).
func classed(class error, format string, args ...any) error {
	return &reason{err: fmt.Errorf(format, args...), class: class}
}

type reason struct {
	err   error
	class error
}

func (r *reason) Error() string        { return r.err.Error() }
func (r *reason) Unwrap() error        { return r.err }
func (r *reason) Is(target error) bool { return target == r.class }

// Errors is every problem found in a bundle, each an *[Error] naming the
// file and, where known, the line, item and field, ordered by file and
// line. The loaders and engines return one (through [Join]) when they find
// more than one problem, so that a single run shows all of them.
//
// errors.Is and errors.As see every element: errors.As(err, &e) with e an
// *Error finds the first.
type Errors []*Error

// Error returns the elements' messages, one per line.
func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap returns the elements.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Join collects problems: nil values are dropped, an [Errors] is flattened,
// an *[Error] is kept and any other error becomes an *Error with no file.
// It returns nil when there is none, the *Error when there is one, and an
// [Errors] sorted by file and line (stably) otherwise.
func Join(errs ...error) error {
	list := List(errs...)
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	slices.SortStableFunc(list, func(a, b *Error) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		return a.Line - b.Line
	})
	return list
}

// List returns the problems errs hold, in order, as [Join] collects them
// (unsorted). An error that wraps an *Error or an Errors with more context
// is kept whole, as one *Error with no file, so that its context stays.
func List(errs ...error) Errors {
	var out Errors
	for _, err := range errs {
		switch e := err.(type) {
		case nil:
		case Errors:
			out = append(out, e...)
		case *Error:
			out = append(out, e)
		default:
			out = append(out, &Error{Err: err})
		}
	}
	return out
}
