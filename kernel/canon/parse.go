package canon

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// The parser validates the whole input in one recursive-descent pass and
// records it on a flat tape of nodes (one per value and per object key),
// sorting each object's members as the object closes. A second pass (emit)
// walks the tape and writes the canonical form into a buffer allocated once
// at its exact final size. Output is produced only after the whole input is
// known to be valid, and no byte is moved more than once, whatever the
// nesting: the cost is linear in the input (plus the sorting).

const (
	kLiteral uint8 = iota // true, false, null
	kNumber
	kString
	kArray
	kObject
)

const (
	// fEscaped: the string contains backslash escapes, so its decoded form
	// differs from its raw bytes (keys: the decoded form is in the arena).
	fEscaped uint8 = 1 << iota
	// fEncode: the raw bytes cannot be copied to the output as they are
	// (escapes to decode, or characters the output escapes).
	fEncode
)

type node struct {
	kind  uint8
	flags uint8
	// Scalars: the literal's bytes in the input are data[start:end]
	// (strings: without the quotes). Objects: the members' key indices,
	// in canonical order, are order[start:start+end] (end is the count).
	// Arrays: unused.
	start, end int32
	// Containers: the tape index just past this subtree. Escaped keys: the
	// offset in the arena of the decoded key, stored as a 4-byte
	// little-endian length and the bytes.
	aux int32
}

type parser struct {
	data   []byte
	pos    int
	depth  int
	outLen int // exact length of the canonical output
	tape   []node
	stack  []int32 // key indices of the members of the open objects
	order  []int32 // key indices of closed objects, each object's sorted
	arena  []byte  // decoded escaped keys
}

var parserPool = sync.Pool{New: func() any {
	return &parser{
		tape:  make([]node, 0, 64),
		stack: make([]int32, 0, 32),
		order: make([]int32, 0, 32),
		arena: make([]byte, 0, 64),
	}
}}

func getParser(data []byte) *parser {
	p := parserPool.Get().(*parser)
	p.data = data
	// A value takes at least one byte and usually several; start big
	// inputs with room for a share of their nodes.
	if n := len(data) / 16; n > cap(p.tape) {
		p.tape = make([]node, 0, n)
	}
	return p
}

func putParser(p *parser) {
	// Do not keep the memory of an unusually large input alive.
	if cap(p.tape) > 1<<14 || cap(p.order) > 1<<14 || cap(p.stack) > 1<<14 || cap(p.arena) > 1<<16 {
		return
	}
	p.data = nil
	p.pos, p.depth, p.outLen = 0, 0, 0
	p.tape = p.tape[:0]
	p.stack = p.stack[:0]
	p.order = p.order[:0]
	p.arena = p.arena[:0]
	parserPool.Put(p)
}

// push appends n to the tape and returns its index. The tape doubles when
// full (append grows large slices by only 1.25x, which for big inputs
// copies and allocates several times the final size).
func (p *parser) push(n node) int32 {
	if len(p.tape) == cap(p.tape) {
		t := make([]node, len(p.tape), 2*cap(p.tape)+64)
		copy(t, p.tape)
		p.tape = t
	}
	p.tape = append(p.tape, n)
	return int32(len(p.tape) - 1)
}

// parse checks that data is exactly one JSON value with optional whitespace
// around it and fills the tape.
func (p *parser) parse() error {
	p.skipWS()
	if err := p.value(); err != nil {
		return err
	}
	p.skipWS()
	if p.pos < len(p.data) {
		return newError(ErrTrailingData, p.pos,
			"trailing data after top-level value: unexpected "+quoteChar(p.data[p.pos]))
	}
	return nil
}

func (p *parser) skipWS() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) errEOF(context string) error {
	return newError(ErrSyntax, len(p.data), "invalid JSON: unexpected end of input "+context)
}

func (p *parser) errChar(off int, context string) error {
	return newError(ErrSyntax, off, "invalid JSON: unexpected "+quoteChar(p.data[off])+" "+context)
}

// value parses the value at p.pos (whitespace already skipped).
func (p *parser) value() error {
	if p.pos >= len(p.data) {
		return p.errEOF("looking for beginning of value")
	}
	switch c := p.data[p.pos]; c {
	case '{':
		return p.object()
	case '[':
		return p.array()
	case '"':
		_, err := p.str(false)
		return err
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return p.number()
		}
		return p.errChar(p.pos, "looking for beginning of value")
	}
}

func (p *parser) literal(lit string) error {
	d := p.data[p.pos:]
	for i := 0; i < len(lit); i++ {
		if i >= len(d) {
			return p.errEOF("in literal " + lit)
		}
		if d[i] != lit[i] {
			return p.errChar(p.pos+i, "in literal "+lit)
		}
	}
	p.push(node{kind: kLiteral, start: int32(p.pos), end: int32(p.pos + len(lit))})
	p.pos += len(lit)
	p.outLen += len(lit)
	return nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number checks a number literal against the JSON grammar
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? and records it verbatim.
func (p *parser) number() error {
	d := p.data
	start := p.pos
	i := start
	if d[i] == '-' {
		i++
	}
	switch {
	case i >= len(d):
		return p.errEOF("in numeric literal")
	case d[i] == '0':
		i++
		if i < len(d) && isDigit(d[i]) {
			return newError(ErrSyntax, i, "invalid JSON: invalid number literal: leading zero")
		}
	case isDigit(d[i]):
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		return p.errChar(i, "in numeric literal")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) {
			return p.errEOF("after decimal point in numeric literal")
		}
		if !isDigit(d[i]) {
			return p.errChar(i, "after decimal point in numeric literal")
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) {
			return p.errEOF("in exponent of numeric literal")
		}
		if !isDigit(d[i]) {
			return p.errChar(i, "in exponent of numeric literal")
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i-start > MaxNumberLen {
		return newError(ErrNumberTooLong, start,
			"number literal too long: "+strconv.Itoa(i-start)+" bytes, limit "+strconv.Itoa(MaxNumberLen))
	}
	p.push(node{kind: kNumber, start: int32(start), end: int32(i)})
	p.pos = i
	p.outLen += i - start
	return nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > MaxDepth {
		return newError(ErrTooDeep, p.pos, "nesting too deep: more than "+strconv.Itoa(MaxDepth)+" levels")
	}
	return nil
}

func (p *parser) array() error {
	if err := p.enter(); err != nil {
		return err
	}
	idx := p.push(node{kind: kArray})
	p.pos++ // '['
	p.skipWS()
	count := 0
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
	} else {
		for {
			if err := p.value(); err != nil {
				return err
			}
			count++
			p.skipWS()
			if p.pos >= len(p.data) {
				return p.errEOF("after array element")
			}
			c := p.data[p.pos]
			p.pos++
			if c == ']' {
				break
			}
			if c != ',' {
				return p.errChar(p.pos-1, "after array element (expecting ',' or ']')")
			}
			p.skipWS()
		}
	}
	p.tape[idx].aux = int32(len(p.tape))
	p.outLen += 2 + max(count-1, 0)
	p.depth--
	return nil
}

func (p *parser) object() error {
	if err := p.enter(); err != nil {
		return err
	}
	idx := p.push(node{kind: kObject})
	p.pos++ // '{'
	base := len(p.stack)
	p.skipWS()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
	} else {
		for {
			if p.pos >= len(p.data) {
				return p.errEOF("looking for object key")
			}
			if p.data[p.pos] != '"' {
				return p.errChar(p.pos, "looking for beginning of object key string")
			}
			k, err := p.str(true)
			if err != nil {
				return err
			}
			p.stack = append(p.stack, k)
			p.skipWS()
			if p.pos >= len(p.data) {
				return p.errEOF("after object key")
			}
			if p.data[p.pos] != ':' {
				return p.errChar(p.pos, "after object key (expecting ':')")
			}
			p.pos++
			p.skipWS()
			if err := p.value(); err != nil {
				return err
			}
			p.skipWS()
			if p.pos >= len(p.data) {
				return p.errEOF("after object member")
			}
			c := p.data[p.pos]
			p.pos++
			if c == '}' {
				break
			}
			if c != ',' {
				return p.errChar(p.pos-1, "after object member (expecting ',' or '}')")
			}
			p.skipWS()
		}
	}
	members := p.stack[base:]
	if err := p.sortMembers(members); err != nil {
		return err
	}
	count := len(members)
	n := &p.tape[idx]
	n.aux = int32(len(p.tape))
	n.start = int32(len(p.order))
	n.end = int32(count)
	p.order = append(p.order, members...)
	p.stack = p.stack[:base]
	p.outLen += 2 + count + max(count-1, 0) // braces, colons, commas
	p.depth--
	return nil
}

// key returns the decoded bytes of the key at tape index i.
func (p *parser) key(i int32) []byte {
	n := &p.tape[i]
	if n.flags&fEscaped != 0 {
		l := binary.LittleEndian.Uint32(p.arena[n.aux:])
		return p.arena[n.aux+4 : n.aux+4+int32(l)]
	}
	return p.data[n.start:n.end]
}

// cmpMembers orders key indices by key bytes, then by position in the input
// (key indices grow with the input offset), so equal keys end up adjacent
// and in input order.
func (p *parser) cmpMembers(a, b int32) int {
	if c := bytes.Compare(p.key(a), p.key(b)); c != 0 {
		return c
	}
	return int(a - b)
}

// sortMembers sorts the key indices of one object in place and rejects
// duplicate keys, reporting the second occurrence that comes first in the
// input.
func (p *parser) sortMembers(m []int32) error {
	if len(m) <= 12 {
		for i := 1; i < len(m); i++ {
			for j := i; j > 0 && p.cmpMembers(m[j-1], m[j]) > 0; j-- {
				m[j-1], m[j] = m[j], m[j-1]
			}
		}
	} else {
		slices.SortFunc(m, p.cmpMembers)
	}
	dup := int32(-1)
	for i := 1; i < len(m); i++ {
		if bytes.Equal(p.key(m[i-1]), p.key(m[i])) && (dup < 0 || m[i] < dup) {
			dup = m[i]
			// Skip the rest of this run: its first repeat is m[i].
			for i+1 < len(m) && bytes.Equal(p.key(m[i]), p.key(m[i+1])) {
				i++
			}
		}
	}
	if dup >= 0 {
		return newError(ErrDuplicateKey, int(p.tape[dup].start)-1,
			"duplicate object key "+quoteKey(p.key(dup)))
	}
	return nil
}

// plain[c] is true for the bytes that may appear in a string and are
// copied to the output unchanged: printable ASCII except '"', '\\' and the
// HTML-sensitive '<', '>', '&'.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = true
	}
	t['"'], t['\\'], t['<'], t['>'], t['&'] = false, false, false, false, false
	return t
}()

// encLen is the length of the canonical encoding of the rune r.
func encLen(r rune) int {
	switch {
	case r == '"' || r == '\\':
		return 2
	case r < 0x20:
		switch r {
		case '\b', '\f', '\n', '\r', '\t':
			return 2
		}
		return 6
	case r == '<' || r == '>' || r == '&':
		return 6
	case r < utf8.RuneSelf:
		return 1
	case r == '\u2028' || r == '\u2029':
		return 6
	default:
		return utf8.RuneLen(r)
	}
}

func hexVal(c byte) rune {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0')
	case c >= 'a' && c <= 'f':
		return rune(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// hex4 decodes the four hex digits of the \u escape starting at d[i] (the
// backslash). The caller has checked that d[i+1] is 'u'.
func (p *parser) hex4(i int) (rune, error) {
	d := p.data
	var r rune
	for j := i + 2; j < i+6; j++ {
		if j >= len(d) {
			return 0, p.errEOF(`in \u escape`)
		}
		v := hexVal(d[j])
		if v < 0 {
			return 0, p.errChar(j, `in \u escape (expecting a hex digit)`)
		}
		r = r<<4 | v
	}
	return r, nil
}

func surrogateError(off int, r rune) error {
	return newError(ErrLoneSurrogate, off,
		`lone surrogate \u`+strconv.FormatInt(int64(r), 16)+" in string (a surrogate must be escaped as a high+low pair)")
}

// str parses the string literal at p.pos (the opening quote), validating
// escapes, UTF-8 and surrogates, and appends its node. Keys with escapes
// are decoded into the arena for sorting. It returns the node's index.
func (p *parser) str(isKey bool) (int32, error) {
	d := p.data
	start := p.pos + 1
	i := start
	var flags uint8
	enc := 2 // the quotes
	for {
		j := i
		for j < len(d) && plain[d[j]] {
			j++
		}
		enc += j - i
		i = j
		if i >= len(d) {
			return 0, p.errEOF("in string literal")
		}
		c := d[i]
		switch {
		case c == '"':
			goto done
		case c == '\\':
			flags |= fEscaped | fEncode
			if i+1 >= len(d) {
				return 0, p.errEOF("in string escape")
			}
			switch e := d[i+1]; e {
			case '"', '\\', 'b', 'f', 'n', 'r', 't':
				enc += 2
				i += 2
			case '/':
				enc++
				i += 2
			case 'u':
				r, err := p.hex4(i)
				if err != nil {
					return 0, err
				}
				switch {
				case r >= 0xD800 && r < 0xDC00:
					if i+7 >= len(d) || d[i+6] != '\\' || d[i+7] != 'u' {
						return 0, surrogateError(i, r)
					}
					r2, err := p.hex4(i + 6)
					if err != nil {
						return 0, err
					}
					if r2 < 0xDC00 || r2 >= 0xE000 {
						return 0, surrogateError(i, r)
					}
					enc += 4 // a supplementary character: 4 bytes of UTF-8
					i += 12
				case r >= 0xDC00 && r < 0xE000:
					return 0, surrogateError(i, r)
				default:
					enc += encLen(r)
					i += 6
				}
			default:
				return 0, p.errChar(i+1, "in string escape")
			}
		case c < 0x20:
			return 0, newError(ErrSyntax, i,
				"invalid JSON: unescaped control character "+quoteChar(c)+" in string literal")
		case c < utf8.RuneSelf: // '<', '>', '&'
			flags |= fEncode
			enc += 6
			i++
		default:
			r, size := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && size == 1 {
				return 0, newError(ErrInvalidUTF8, i, "invalid UTF-8 in string literal")
			}
			if r == '\u2028' || r == '\u2029' {
				flags |= fEncode
				enc += 6
			} else {
				enc += size
			}
			i += size
		}
	}
done:
	n := node{kind: kString, flags: flags, start: int32(start), end: int32(i)}
	if isKey && flags&fEscaped != 0 {
		off := len(p.arena)
		n.aux = int32(off)
		p.arena = append(p.arena, 0, 0, 0, 0)
		p.arena = appendDecoded(p.arena, d[start:i])
		binary.LittleEndian.PutUint32(p.arena[off:], uint32(len(p.arena)-off-4))
	}
	idx := p.push(n)
	p.pos = i + 1
	p.outLen += enc
	return idx, nil
}

// nextRune decodes the first character of the validated string content s,
// resolving an escape. It returns the character and the number of input
// bytes it took.
func nextRune(s []byte) (rune, int) {
	c := s[0]
	if c != '\\' {
		if c < utf8.RuneSelf {
			return rune(c), 1
		}
		return utf8.DecodeRune(s)
	}
	switch s[1] {
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
		r := hexVal(s[2])<<12 | hexVal(s[3])<<8 | hexVal(s[4])<<4 | hexVal(s[5])
		if r >= 0xD800 && r < 0xDC00 {
			r2 := hexVal(s[8])<<12 | hexVal(s[9])<<8 | hexVal(s[10])<<4 | hexVal(s[11])
			return (r-0xD800)<<10 | (r2 - 0xDC00) + 0x10000, 12
		}
		return r, 6
	default: // '"', '\\', '/'
		return rune(s[1]), 2
	}
}

// appendDecoded appends the decoded form of the validated string content s.
func appendDecoded(dst, s []byte) []byte {
	for len(s) > 0 {
		if s[0] != '\\' {
			j := bytes.IndexByte(s, '\\')
			if j < 0 {
				return append(dst, s...)
			}
			dst = append(dst, s[:j]...)
			s = s[j:]
			continue
		}
		r, n := nextRune(s)
		dst = utf8.AppendRune(dst, r)
		s = s[n:]
	}
	return dst
}
