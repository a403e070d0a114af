package server

import (
	"encoding/json"

	"github.com/wicket-run/wicket/server/wire"
)

// decodeFast is decode's fast path for the two bodies every step sends (a
// submission, a completion): a flat object whose keys are exactly the
// fields' names, each once, with string values without escapes, raw
// values (args, result) that are valid JSON, and a literal for reconcile.
// It fills v and returns true only for such a body; for anything else
// (another type, an escape, an unknown or case-folded key, a duplicate, a
// value of the wrong type, usage, trailing data) it leaves v alone and
// returns false, and decode's full path decides, with its errors. What it
// fills is what encoding/json fills (FuzzDecodeFast compares the two); the
// caller has checked that body is UTF-8 and still runs checkKeys (which
// finds duplicate keys inside raw values).
func decodeFast(body []byte, v any) bool {
	switch x := v.(type) {
	case *wire.StepSubmitRequest:
		var out wire.StepSubmitRequest
		if !fastObject(body, func(p *fastScanner, key []byte) bool {
			switch string(key) {
			case "kind":
				return p.str(&out.Kind)
			case "target":
				return p.str(&out.Target)
			case "idempotency":
				return p.str(&out.Idempotency)
			case "effect":
				return p.str(&out.Effect)
			case "args":
				return p.raw(&out.Args)
			case "result":
				return p.raw(&out.Result)
			case "reconcile":
				return p.boolean(&out.Reconcile)
			}
			return false
		}) {
			return false
		}
		*x = out
		return true
	case *wire.StepCompleteRequest:
		var out wire.StepCompleteRequest
		if !fastObject(body, func(p *fastScanner, key []byte) bool {
			return string(key) == "result" && p.raw(&out.Result)
		}) {
			return false
		}
		*x = out
		return true
	}
	return false
}

// fastObject scans body as one flat object, calling member for each key
// (the scanner then sits before the value, which member must read); a key
// seen twice, or one member refuses, makes it return false.
func fastObject(body []byte, member func(p *fastScanner, key []byte) bool) bool {
	p := &fastScanner{b: body}
	if !p.next('{') {
		return false
	}
	var keys [8][]byte
	n := 0
	if !p.next('}') {
		for {
			k, ok := p.plain()
			if !ok || !p.next(':') {
				return false
			}
			for _, seen := range keys[:n] {
				if string(seen) == string(k) {
					return false
				}
			}
			if n == len(keys) || !member(p, k) {
				return false
			}
			keys[n] = k
			n++
			if p.next(',') {
				continue
			}
			if p.next('}') {
				break
			}
			return false
		}
	}
	p.space()
	return p.i == len(p.b)
}

// fastScanner reads b from i.
type fastScanner struct {
	b []byte
	i int
}

func (p *fastScanner) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// next consumes c after optional whitespace.
func (p *fastScanner) next(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// plain reads a string without escapes or control characters and returns
// the bytes between its quotes.
func (p *fastScanner) plain() ([]byte, bool) {
	p.space()
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return nil, false
	}
	start := p.i + 1
	for j := start; j < len(p.b); j++ {
		switch c := p.b[j]; {
		case c == '"':
			p.i = j + 1
			return p.b[start:j], true
		case c == '\\' || c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

func (p *fastScanner) str(dst *string) bool {
	s, ok := p.plain()
	if ok {
		*dst = string(s)
	}
	return ok
}

func (p *fastScanner) boolean(dst *bool) bool {
	p.space()
	rest := p.b[p.i:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		*dst, p.i = true, p.i+4
	case len(rest) >= 5 && string(rest[:5]) == "false":
		*dst, p.i = false, p.i+5
	default:
		return false
	}
	// A literal ends at a delimiter ("truex" is not true).
	return p.i == len(p.b) || isDelim(p.b[p.i])
}

func isDelim(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', ',', '}':
		return true
	}
	return false
}

// raw reads one JSON value and stores its bytes (a subslice of the body,
// capacity-limited), after checking it is valid JSON.
func (p *fastScanner) raw(dst *json.RawMessage) bool {
	p.space()
	start, depth := p.i, 0
	for p.i < len(p.b) {
		switch c := p.b[p.i]; c {
		case '"':
			j := p.i + 1
			for j < len(p.b) && p.b[j] != '"' {
				if p.b[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(p.b) {
				return false
			}
			p.i = j + 1
			if depth == 0 {
				return p.keep(dst, start)
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 { // the end of the enclosing object: a scalar ended
				return p.keep(dst, start)
			}
			if depth--; depth == 0 {
				p.i++
				return p.keep(dst, start)
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return p.keep(dst, start)
			}
		}
		p.i++
	}
	return false
}

func (p *fastScanner) keep(dst *json.RawMessage, start int) bool {
	v := p.b[start:p.i:p.i]
	if len(v) == 0 || !json.Valid(v) {
		return false
	}
	*dst = v
	return true
}
