package canon

import "unicode/utf8"

// emit appends the canonical form of the value at tape index i.
func (p *parser) emit(out []byte, i int32) []byte {
	n := &p.tape[i]
	switch n.kind {
	case kLiteral, kNumber:
		return append(out, p.data[n.start:n.end]...)
	case kString:
		return p.emitString(out, n)
	case kArray:
		out = append(out, '[')
		for j := i + 1; j < n.aux; {
			if j > i+1 {
				out = append(out, ',')
			}
			out = p.emit(out, j)
			if c := &p.tape[j]; c.kind >= kArray {
				j = c.aux // skip the element's subtree
			} else {
				j++
			}
		}
		return append(out, ']')
	default: // kObject
		out = append(out, '{')
		for k, key := range p.order[n.start : n.start+n.end] {
			if k > 0 {
				out = append(out, ',')
			}
			out = p.emitString(out, &p.tape[key])
			out = append(out, ':')
			out = p.emit(out, key+1)
		}
		return append(out, '}')
	}
}

func (p *parser) emitString(out []byte, n *node) []byte {
	s := p.data[n.start:n.end]
	out = append(out, '"')
	if n.flags&fEncode == 0 {
		out = append(out, s...)
	} else {
		out = appendEncoded(out, s)
	}
	return append(out, '"')
}

const hexDigits = "0123456789abcdef"

// appendEncoded decodes the validated string content s and appends it
// escaped as encoding/json's Marshal escapes strings (see Canonical).
func appendEncoded(out, s []byte) []byte {
	for len(s) > 0 {
		// Copy the run that needs no change.
		j := 0
		for j < len(s) && plain[s[j]] {
			j++
		}
		out = append(out, s[:j]...)
		s = s[j:]
		if len(s) == 0 {
			break
		}
		r, size := nextRune(s)
		s = s[size:]
		switch {
		case r == '"' || r == '\\':
			out = append(out, '\\', byte(r))
		case r < 0x20:
			switch r {
			case '\b':
				out = append(out, '\\', 'b')
			case '\f':
				out = append(out, '\\', 'f')
			case '\n':
				out = append(out, '\\', 'n')
			case '\r':
				out = append(out, '\\', 'r')
			case '\t':
				out = append(out, '\\', 't')
			default:
				out = append(out, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xF])
			}
		case r == '<' || r == '>' || r == '&':
			out = append(out, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xF])
		case r < utf8.RuneSelf:
			out = append(out, byte(r))
		case r == '\u2028' || r == '\u2029':
			out = append(out, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			out = utf8.AppendRune(out, r)
		}
	}
	return out
}
