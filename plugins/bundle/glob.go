package bundle

import (
	"errors"
	"strings"
	"unicode/utf8"
)

// Glob is a compiled glob pattern over names such as step targets
// ("github.create_issue", "fs/read", "gpt-4o").
//
// The syntax is deliberately small and has no path semantics:
//
//   - '*' matches any run of characters, including none, and including '/'
//     and '.';
//   - '?' matches exactly one character (one UTF-8 encoded rune);
//   - '\' escapes the next character, so `\*`, `\?` and `\\` match a
//     literal '*', '?' and '\';
//   - every other character matches itself, case-sensitively.
//
// So "fs.read*" matches "fs.read" and "fs.read_file", "*" matches every
// name, "github.*" matches "github.create_issue", and "fs/*" matches
// "fs/a/b". A pattern must be non-empty, valid UTF-8, and must not end in an
// unpaired '\'.
//
// A Glob is immutable and safe for concurrent use; matching does not allocate.
type Glob struct {
	pattern string
	kind    globKind
	lit     string      // the literal for exact, prefix, suffix and contains
	toks    []globToken // the general form
}

type globKind uint8

const (
	globExact    globKind = iota // "abc"
	globAny                      // "*"
	globPrefix                   // "abc*"
	globSuffix                   // "*abc"
	globContains                 // "*abc*"
	globGeneral                  // anything else
)

type globToken struct {
	op  byte   // 'l' literal, '?' one rune, '*' any run
	lit string // for 'l'
}

// CompileGlob parses pattern (see [Glob] for the syntax).
func CompileGlob(pattern string) (*Glob, error) {
	if pattern == "" {
		return nil, errors.New("empty glob")
	}
	if !utf8.ValidString(pattern) {
		return nil, errors.New("glob is not valid UTF-8")
	}
	var toks []globToken
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			toks = append(toks, globToken{op: 'l', lit: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; c {
		case '\\':
			if i+1 == len(pattern) {
				return nil, errors.New(`glob ends in an unpaired '\'`)
			}
			i++
			lit.WriteByte(pattern[i])
		case '*':
			flush()
			if n := len(toks); n == 0 || toks[n-1].op != '*' { // "**" is "*"
				toks = append(toks, globToken{op: '*'})
			}
		case '?':
			flush()
			toks = append(toks, globToken{op: '?'})
		default:
			lit.WriteByte(c)
		}
	}
	flush()

	g := &Glob{pattern: pattern, kind: globGeneral, toks: toks}
	ops := make([]byte, len(toks))
	for i, t := range toks {
		ops[i] = t.op
	}
	switch string(ops) {
	case "l":
		g.kind, g.lit = globExact, toks[0].lit
	case "*":
		g.kind = globAny
	case "l*":
		g.kind, g.lit = globPrefix, toks[0].lit
	case "*l":
		g.kind, g.lit = globSuffix, toks[1].lit
	case "*l*":
		g.kind, g.lit = globContains, toks[1].lit
	}
	if g.kind != globGeneral {
		g.toks = nil
	}
	return g, nil
}

// MustCompileGlob is like [CompileGlob] but panics on an invalid pattern.
// It is meant for patterns known at compile time.
func MustCompileGlob(pattern string) *Glob {
	g, err := CompileGlob(pattern)
	if err != nil {
		panic("bundle: glob " + pattern + ": " + err.Error())
	}
	return g
}

// MatchGlob reports whether s matches pattern (see [Glob]). An invalid
// pattern matches nothing. Compile patterns once with [CompileGlob] when they
// are used more than once.
func MatchGlob(pattern, s string) bool {
	g, err := CompileGlob(pattern)
	if err != nil {
		return false
	}
	return g.Match(s)
}

// String returns the pattern as written.
func (g *Glob) String() string { return g.pattern }

// Match reports whether s matches the whole pattern.
func (g *Glob) Match(s string) bool {
	switch g.kind {
	case globExact:
		return s == g.lit
	case globAny:
		return true
	case globPrefix:
		return strings.HasPrefix(s, g.lit)
	case globSuffix:
		return strings.HasSuffix(s, g.lit)
	case globContains:
		return strings.Contains(s, g.lit)
	}
	return matchTokens(g.toks, s)
}

// matchTokens is the classic single-backtrack wildcard match: on a mismatch
// it retries from the most recent '*', which has swallowed one more rune.
// It runs in O(len(toks) × len(s)) at worst.
func matchTokens(toks []globToken, s string) bool {
	ti, si := 0, 0
	starT, starS := -1, 0
	for {
		if ti < len(toks) {
			switch t := toks[ti]; t.op {
			case '*':
				starT, starS = ti, si
				ti++
				continue
			case '?':
				if si < len(s) {
					_, w := utf8.DecodeRuneInString(s[si:])
					si += w
					ti++
					continue
				}
			default:
				if strings.HasPrefix(s[si:], t.lit) {
					si += len(t.lit)
					ti++
					continue
				}
			}
		} else if si == len(s) {
			return true
		}
		if starT < 0 || starS >= len(s) {
			return false
		}
		_, w := utf8.DecodeRuneInString(s[starS:])
		starS += w
		ti, si = starT+1, starS
	}
}
