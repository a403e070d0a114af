package bundle

import (
	"errors"
	"fmt"
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
	// ErrTooLarge: the bundle exceeds [MaxTotalSize] bytes of content, or an
	// archive decompresses to more than [MaxArchiveSize] bytes.
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
func classed(class error, format string, args ...any) error {
	return &reason{err: fmt.Errorf(format, args...), class: class}
}

type reason struct {
	err   error
	class error
}

func (r *reason) Error() string   { return r.err.Error() }
func (r *reason) Unwrap() []error { return []error{r.class, r.err} }
