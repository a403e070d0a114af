package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/wicket-run/wicket/kernel"
)

// decode parses a JSON request body into v, strictly:
//
//   - the body must be valid UTF-8 and exactly one JSON object, with nothing
//     but whitespace after it; an empty body counts as {};
//   - no object, at any depth, may have the same key twice (compared after
//     unescaping): encoding/json would silently keep the last one, and what
//     a caller meant is then ambiguous;
//   - a field of the wrong type is an error that names the field.
//
// Unknown fields are ignored, so that a newer client works against an older
// kernel (DisallowUnknownFields would refuse every field added later). Free
// form values (args, input, result, ...) are canonicalised by the kernel,
// which also bounds their nesting and number literals and rejects lone
// surrogates (docs/identity.md). Every failure is a validation error whose message
// says what is wrong and where.
func decode(body []byte, v any) error {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		body = []byte("{}")
	} else if trimmed[0] != '{' {
		return errorf(kernel.CodeValidation, "request body must be a JSON object, got %s", jsonKind(trimmed[0]))
	}
	if !utf8.Valid(body) {
		return errorf(kernel.CodeValidation, "request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if rest := bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return errorf(kernel.CodeValidation, "malformed JSON: unexpected data after the top-level object at byte offset %d", dec.InputOffset())
	}
	if err := checkDuplicateKeys(body); err != nil {
		return err
	}
	return nil
}

// decodeError describes an encoding/json error for a client.
func decodeError(err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return errorf(kernel.CodeValidation, "malformed JSON at byte offset %d: %s", se.Offset, se.Error())
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "the body"
		}
		return errorf(kernel.CodeValidation, "field %s: expected %s, got JSON %s", field, goTypeName(te.Type.String()), te.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errorf(kernel.CodeValidation, "malformed JSON: unexpected end of input")
	default:
		// e.g. a time that is not RFC 3339, or a number out of range.
		return errorf(kernel.CodeValidation, "invalid request body: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
}

// goTypeName turns a Go type into words a client understands.
func goTypeName(t string) string {
	switch {
	case t == "string":
		return "a string"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "an integer"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "bool":
		return "a boolean"
	case strings.HasPrefix(t, "map[") || strings.HasPrefix(t, "wire.") || strings.HasPrefix(t, "*wire."):
		return "an object"
	case strings.HasPrefix(t, "[]"):
		return "an array"
	case t == "time.Time" || t == "*time.Time":
		return "an RFC 3339 time string"
	}
	return t
}

func jsonKind(c byte) string {
	switch {
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	case c == '-' || (c >= '0' && c <= '9'):
		return "a number"
	}
	return fmt.Sprintf("%q", c)
}

// checkDuplicateKeys scans valid JSON and reports the first object that has
// a key twice, naming the path of that object.
func checkDuplicateKeys(b []byte) error {
	type frame struct {
		obj  bool
		keys []string       // the object's keys so far, while few
		set  map[string]int // the same, once there are many
		path string
		idx  int // array index
	}
	var stack []frame
	var lastKey string
	i := 0
	childPath := func() string {
		if len(stack) == 0 {
			return ""
		}
		f := &stack[len(stack)-1]
		if f.obj {
			return joinPath(f.path, lastKey)
		}
		return fmt.Sprintf("%s[%d]", f.path, f.idx)
	}
	expectKey := false
	for i < len(b) {
		c := b[i]
		switch c {
		case '{', '[':
			p := childPath()
			stack = append(stack, frame{obj: c == '{', path: p})
			expectKey = c == '{'
			i++
		case '}', ']':
			stack = stack[:len(stack)-1]
			expectKey = false
			i++
		case ',':
			f := &stack[len(stack)-1]
			if f.obj {
				expectKey = true
			} else {
				f.idx++
			}
			i++
		case '"':
			j := i + 1
			esc := false
			for ; j < len(b); j++ {
				if b[j] == '\\' {
					esc = true
					j++
					continue
				}
				if b[j] == '"' {
					break
				}
			}
			if expectKey {
				key := string(b[i+1 : j])
				if esc {
					var s string
					if err := json.Unmarshal(b[i:j+1], &s); err == nil {
						key = s
					}
				}
				f := &stack[len(stack)-1]
				dup := false
				if f.set != nil {
					_, dup = f.set[key]
					f.set[key] = 0
				} else {
					for _, k := range f.keys {
						dup = dup || k == key
					}
					f.keys = append(f.keys, key)
					if len(f.keys) > 16 {
						f.set = make(map[string]int, 2*len(f.keys))
						for _, k := range f.keys {
							f.set[k] = 0
						}
						f.keys = nil
					}
				}
				if dup {
					where := f.path
					if where == "" {
						where = "the top-level object"
					}
					return errorf(kernel.CodeValidation, "malformed JSON: duplicate key %q in %s at byte offset %d", key, where, i)
				}
				lastKey = key
				expectKey = false
			}
			i = j + 1
		default:
			i++
		}
	}
	return nil
}

func joinPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}
