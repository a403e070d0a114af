package rules

import (
	"bytes"
	"unicode/utf8"
)

// This file reads values out of a step's args without decoding them: the
// args of a submitted step are canonical JSON (kernel/canon), and a rule only
// needs a few values at known paths, so scanning the raw bytes is both
// allocation-free and much faster than json.Unmarshal. The scanner is
// lenient: on malformed input it reports "not found" rather than failing,
// and it never reads out of bounds.

// pathSeg is one element of a dotted argument path: an object key, and,
// when the element is a decimal integer, an array index.
type pathSeg struct {
	key string
	idx int // -1 when key is not an index
}

// lookup returns the bounds of the raw JSON value at path within doc.
func lookup(doc []byte, path []pathSeg) (start, end int, found bool) {
	lo, hi := 0, len(doc) // the current value is doc[lo:hi], maybe padded with spaces
	for _, s := range path {
		i := skipWS(doc[:hi], lo)
		if i >= hi {
			return 0, 0, false
		}
		var ok bool
		switch doc[i] {
		case '{':
			lo, hi, ok = objectGet(doc[:hi], i, s.key)
		case '[':
			if s.idx >= 0 {
				lo, hi, ok = arrayGet(doc[:hi], i, s.idx)
			}
		}
		if !ok {
			return 0, 0, false
		}
	}
	i := skipWS(doc[:hi], lo)
	if i >= hi {
		return 0, 0, false
	}
	e, ok := valueEnd(doc[:hi], i)
	if !ok {
		return 0, 0, false
	}
	return i, e, true
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the index of the closing quote of the string whose
// opening quote is at b[i], and whether the string contains escapes.
func stringEnd(b []byte, i int) (end int, escaped, ok bool) {
	for j := i + 1; j < len(b); {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, false, false
		}
		q := j + k
		n := 0 // backslashes right before the quote
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q, bytes.IndexByte(b[i+1:q], '\\') >= 0, true
		}
		j = q + 1
	}
	return 0, false, false
}

// valueEnd returns the index just past the value that starts at b[i].
func valueEnd(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		e, _, ok := stringEnd(b, i)
		if !ok {
			return 0, false
		}
		return e + 1, true
	case '{', '[':
		depth := 0
		for j := i; j < len(b); {
			k := bytes.IndexAny(b[j:], `"{}[]`)
			if k < 0 {
				return 0, false
			}
			j += k
			switch b[j] {
			case '"':
				e, _, ok := stringEnd(b, j)
				if !ok {
					return 0, false
				}
				j = e + 1
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, true
				}
			}
			j++
		}
		return 0, false
	case '}', ']', ',', ':':
		return 0, false
	}
	j := i
	for j < len(b) {
		switch b[j] {
		case ',', '}', ']', ':', ' ', '\t', '\n', '\r', '"', '{', '[':
			return j, j > i
		}
		j++
	}
	return j, j > i
}

// iter walks the members of an object or the elements of an array without
// allocating. Start it at the opening '{' or '[' with newIter, then call
// next until it reports false; bad is set when the input was malformed.
type iter struct {
	b     []byte
	i     int
	obj   bool
	first bool
	done  bool
	bad   bool
}

func newIter(b []byte, i int) iter {
	return iter{b: b, i: i + 1, obj: b[i] == '{', first: true}
}

// next returns the next member (key is the raw key body, escaped whether it
// has escapes; both empty for arrays) and the bounds of its value in b.
func (it *iter) next() (key []byte, escaped bool, vs, ve int, ok bool) {
	if it.done {
		return nil, false, 0, 0, false
	}
	b, i := it.b, skipWS(it.b, it.i)
	closer := byte(']')
	if it.obj {
		closer = '}'
	}
	if !it.first {
		switch {
		case i < len(b) && b[i] == ',':
			i = skipWS(b, i+1)
		case i < len(b) && b[i] == closer:
			it.done = true
			return nil, false, 0, 0, false
		default:
			return it.fail()
		}
	} else if i < len(b) && b[i] == closer {
		it.done = true
		return nil, false, 0, 0, false
	}
	it.first = false
	if it.obj {
		if i >= len(b) || b[i] != '"' {
			return it.fail()
		}
		ke, esc, ok := stringEnd(b, i)
		if !ok {
			return it.fail()
		}
		key, escaped = b[i+1:ke], esc
		i = skipWS(b, ke+1)
		if i >= len(b) || b[i] != ':' {
			return it.fail()
		}
		i = skipWS(b, i+1)
	}
	ve, ok = valueEnd(b, i)
	if !ok {
		return it.fail()
	}
	it.i = ve
	return key, escaped, i, ve, true
}

func (it *iter) fail() ([]byte, bool, int, int, bool) {
	it.done, it.bad = true, true
	return nil, false, 0, 0, false
}

func objectGet(b []byte, i int, key string) (start, end int, found bool) {
	it := newIter(b, i)
	for {
		k, esc, vs, ve, ok := it.next()
		if !ok {
			return 0, 0, false
		}
		if keyEqual(k, esc, key) {
			return vs, ve, true
		}
	}
}

func arrayGet(b []byte, i int, idx int) (start, end int, found bool) {
	it := newIter(b, i)
	for n := 0; ; n++ {
		_, _, vs, ve, ok := it.next()
		if !ok {
			return 0, 0, false
		}
		if n == idx {
			return vs, ve, true
		}
	}
}

// keyEqual compares a raw JSON string body with s.
func keyEqual(raw []byte, escaped bool, s string) bool {
	if !escaped {
		return string(raw) == s
	}
	return unescapedEqual(raw, s)
}

// unescapedEqual reports whether the JSON string body raw, once unescaped,
// equals s. It does not allocate.
func unescapedEqual(raw []byte, s string) bool {
	k := 0
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			if k >= len(s) || s[k] != c {
				return false
			}
			i++
			k++
			continue
		}
		r, n := decodeEscape(raw, i)
		if n == 0 {
			return false
		}
		i += n
		var buf [utf8.UTFMax]byte
		w := utf8.EncodeRune(buf[:], r)
		if k+w > len(s) || s[k:k+w] != string(buf[:w]) {
			return false
		}
		k += w
	}
	return k == len(s)
}

// unescape returns the JSON string body raw unescaped.
func unescape(raw []byte) []byte {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		r, n := decodeEscape(raw, i)
		if n == 0 {
			return out
		}
		i += n
		out = utf8.AppendRune(out, r)
	}
	return out
}

// decodeEscape decodes the escape sequence at raw[i] ('\\') and returns the
// rune and the number of bytes consumed (0 when malformed). Lone surrogates
// decode to U+FFFD, as encoding/json does.
func decodeEscape(raw []byte, i int) (rune, int) {
	if i+1 >= len(raw) {
		return 0, 0
	}
	switch raw[i+1] {
	case '"', '\\', '/':
		return rune(raw[i+1]), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r, ok := hex4(raw, i+2)
		if !ok {
			return 0, 0
		}
		if r >= 0xD800 && r < 0xDC00 {
			if i+11 < len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
				if lo, ok := hex4(raw, i+8); ok && lo >= 0xDC00 && lo < 0xE000 {
					return (r-0xD800)<<10 | (lo - 0xDC00) + 0x10000, 12
				}
			}
			return utf8.RuneError, 6
		}
		if r >= 0xDC00 && r < 0xE000 {
			return utf8.RuneError, 6
		}
		return r, 6
	}
	return 0, 0
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// stringBody returns the body of the JSON string raw (quotes removed) and
// whether raw is a string at all.
func stringBody(raw []byte) (body []byte, escaped, ok bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false, false
	}
	body = raw[1 : len(raw)-1]
	return body, bytes.IndexByte(body, '\\') >= 0, true
}

// numEqual reports whether two JSON number literals denote the same value
// (1 == 1.0 == 10e-1, -0 == 0), exactly, without floating point.
func numEqual(a, b []byte) bool {
	na, ok1 := parseNum(a)
	nb, ok2 := parseNum(b)
	if !ok1 || !ok2 {
		return bytes.Equal(a, b)
	}
	if na.zero() || nb.zero() {
		return na.zero() && nb.zero()
	}
	if na.neg != nb.neg || na.point != nb.point || na.n != nb.n {
		return false
	}
	for k := 0; k < na.n; k++ {
		if na.digit(k) != nb.digit(k) {
			return false
		}
	}
	return true
}

// decNum is a number literal as 0.d1d2…dn × 10^point with d1 != 0, the digits
// read in place from the literal's integer and fraction parts.
type decNum struct {
	neg       bool
	int, frac []byte
	first, n  int // significant digits: positions first … first+n-1 of int+frac
	point     int
}

func (d *decNum) zero() bool { return d.n == 0 }

func (d *decNum) digit(k int) byte {
	k += d.first
	if k < len(d.int) {
		return d.int[k]
	}
	return d.frac[k-len(d.int)]
}

func parseNum(s []byte) (decNum, bool) {
	var d decNum
	i := 0
	if i < len(s) && s[i] == '-' {
		d.neg = true
		i++
	}
	st := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == st {
		return d, false
	}
	d.int = s[st:i]
	if i < len(s) && s[i] == '.' {
		i++
		st = i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == st {
			return d, false
		}
		d.frac = s[st:i]
	}
	exp := 0
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		eneg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			eneg = s[i] == '-'
			i++
		}
		st = i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			if i-st >= 9 {
				return d, false // exponent too large to compare exactly here
			}
			exp = exp*10 + int(s[i]-'0')
			i++
		}
		if i == st {
			return d, false
		}
		if eneg {
			exp = -exp
		}
	}
	if i != len(s) {
		return d, false
	}
	total := len(d.int) + len(d.frac)
	lz := 0
	for lz < total && d.digitRaw(lz) == '0' {
		lz++
	}
	tz := 0
	for tz < total-lz && d.digitRaw(total-1-tz) == '0' {
		tz++
	}
	d.first = lz
	d.n = total - lz - tz
	d.point = len(d.int) + exp - lz
	return d, true
}

func (d *decNum) digitRaw(k int) byte {
	if k < len(d.int) {
		return d.int[k]
	}
	return d.frac[k-len(d.int)]
}
