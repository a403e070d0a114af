package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
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
//   - a field of the wrong type is an error that names the field;
//   - field names are matched exactly: encoding/json matches them without
//     regard to case, so {"agent_id": "a", "AGENT_ID": "b"} would decode as
//     "b"; a key that differs from a field's name only in case (Unicode
//     case folding, as encoding/json folds) is an error naming both, at any
//     depth of the request type.
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
	if decodeFast(body, v) {
		return checkKeys(body, schemaOf(reflect.TypeOf(v)))
	}
	return decodeFull(body, v)
}

// decodeFull is decode's path through encoding/json, for a body that is
// UTF-8 and starts as an object.
func decodeFull(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if rest := bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return errorf(kernel.CodeValidation, "malformed JSON: unexpected data after the top-level object at byte offset %d", dec.InputOffset())
	}
	if err := checkKeys(body, schemaOf(reflect.TypeOf(v))); err != nil {
		return err
	}
	return nil
}

// schema is what decode knows of a JSON value from the Go type it decodes
// into: for a struct, its fields by exact JSON name; for a slice or array,
// its elements. A nil *schema is a free-form value (maps, raw JSON, scalars).
type schema struct {
	fields map[string]*schema
	names  []string // the keys of fields, for case-folded comparisons
	elem   *schema
}

var schemas sync.Map // reflect.Type → *schema

// schemaOf returns the schema of values of type t (cached).
func schemaOf(t reflect.Type) *schema {
	if t == nil {
		return nil
	}
	if sc, ok := schemas.Load(t); ok {
		return sc.(*schema)
	}
	sc := buildSchema(t, map[reflect.Type]bool{})
	schemas.Store(t, sc)
	return sc
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

func buildSchema(t reflect.Type, seen map[reflect.Type]bool) *schema {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) || seen[t] {
		return nil // decodes itself (time.Time, json.RawMessage…), or recursive
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return nil // []byte: base64
		}
		if e := buildSchema(t.Elem(), seen); e != nil {
			return &schema{elem: e}
		}
		return nil
	case reflect.Struct:
	default:
		return nil
	}
	seen[t] = true
	defer delete(seen, t)
	sc := &schema{fields: map[string]*schema{}}
	var add func(st reflect.Type)
	add = func(st reflect.Type) {
		for i := range st.NumField() {
			f := st.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := strings.Cut(tag, ",")
			if f.Anonymous && name == "" {
				ft := f.Type
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if ft.Kind() == reflect.Struct {
					add(ft) // promoted fields
					continue
				}
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			sc.fields[name] = buildSchema(f.Type, seen)
			sc.names = append(sc.names, name)
		}
	}
	add(t)
	return sc
}

// foldedField returns the field of sc whose name equals key without regard
// to case, when key is not itself a field.
func (sc *schema) foldedField(key []byte) (string, bool) {
	if sc == nil || sc.fields == nil {
		return "", false
	}
	if _, ok := sc.fields[string(key)]; ok {
		return "", false
	}
	for _, n := range sc.names {
		if strings.EqualFold(n, string(key)) {
			return n, true
		}
	}
	return "", false
}

// child returns the schema of the value under key (objects) or of an
// element (arrays).
func (sc *schema) child(key []byte, obj bool) *schema {
	switch {
	case sc == nil:
		return nil
	case obj:
		return sc.fields[string(key)]
	default:
		return sc.elem
	}
}

// checkDuplicateKeys is checkKeys without a schema.
func checkDuplicateKeys(b []byte) error { return checkKeys(b, nil) }

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

// checkKeys scans valid JSON and reports the first object that has a key
// twice, or a key that matches a field of sc (the schema of the top-level
// value) only without regard to case, naming the path of that object.
//
// It runs on every request body, so it allocates nothing for a body of
// usual shape: keys are compared as slices of b (unescaped only when they
// hold an escape), an object's keys sit in one buffer shared by the
// nesting (a set only past 16 keys), and a path is spelled out only for
// an error (keyPath).
func checkKeys(b []byte, sc *schema) error {
	var stackBuf [8]keyFrame
	stack := stackBuf[:0]
	var keyBuf [32][]byte
	keys := keyBuf[:0] // the keys of the open objects, innermost last
	var lastKey []byte
	expectKey := false
	for i := 0; i < len(b); {
		c := b[i]
		switch c {
		case '{', '[':
			fr := keyFrame{obj: c == '{', keys0: len(keys), sc: sc}
			if len(stack) > 0 {
				f := &stack[len(stack)-1]
				fr.sc = f.sc.child(lastKey, f.obj)
				if f.obj {
					fr.via = lastKey
				} else {
					fr.at = f.idx
				}
			}
			stack = append(stack, fr)
			expectKey = c == '{'
			i++
		case '}', ']':
			keys = keys[:stack[len(stack)-1].keys0]
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
			if esc {
				if off, ok := loneSurrogate(b[i+1 : j]); ok {
					return errorf(kernel.CodeValidation, "malformed JSON: lone surrogate %s in a string in %s at byte offset %d (a surrogate must be escaped as a high+low pair)",
						b[i+1+off:i+1+off+6], where(stack), i+1+off)
				}
			}
			if expectKey {
				key := b[i+1 : j]
				if esc {
					var s string
					if err := json.Unmarshal(b[i:j+1], &s); err == nil {
						key = []byte(s)
					}
				}
				f := &stack[len(stack)-1]
				dup := false
				if f.set != nil {
					_, dup = f.set[string(key)]
					f.set[string(key)] = struct{}{}
				} else {
					for _, k := range keys[f.keys0:] {
						dup = dup || bytes.Equal(k, key)
					}
					keys = append(keys, key)
					if len(keys)-f.keys0 > 16 {
						f.set = make(map[string]struct{}, 2*(len(keys)-f.keys0))
						for _, k := range keys[f.keys0:] {
							f.set[string(k)] = struct{}{}
						}
						keys = keys[:f.keys0]
					}
				}
				if dup {
					return errorf(kernel.CodeValidation, "malformed JSON: duplicate key %q in %s at byte offset %d", key, where(stack), i)
				}
				if name, ok := f.sc.foldedField(key); ok {
					return errorf(kernel.CodeValidation, "field %q in %s is not %q: field names are case-sensitive", key, where(stack), name)
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

// loneSurrogate finds the first \u escape in the inside of a JSON string
// (well formed: the body parsed) that is half of no surrogate pair, and
// returns its offset. encoding/json reads one as U+FFFD, so two
// different strings would decode as one (a step's target, and with it
// its id), and a value would be recorded that the caller never sent;
// kernel/canon refuses them in free-form values for the same reason
// (docs/identity.md), and raw invalid UTF-8 is refused before this.
func loneSurrogate(s []byte) (int, bool) {
	for k := 0; k < len(s); k++ {
		if s[k] != '\\' {
			continue
		}
		if k+1 < len(s) && s[k+1] != 'u' {
			k++ // a two-byte escape, \\ included
			continue
		}
		if k+6 > len(s) {
			return 0, false // not JSON: the parser refuses it
		}
		r := hex4(s[k+2 : k+6])
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if k+12 <= len(s) && s[k+6] == '\\' && s[k+7] == 'u' {
				if lo := hex4(s[k+8 : k+12]); lo >= 0xdc00 && lo < 0xe000 {
					k += 11
					continue
				}
			}
			return k, true
		case r >= 0xdc00 && r < 0xe000:
			return k, true
		}
		k += 5
	}
	return 0, false
}

// hex4 is the value of four hex digits (already known to be hex).
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// keyFrame is an open object or array of checkKeys.
type keyFrame struct {
	obj   bool
	keys0 int                 // where the object's keys start in checkKeys' buffer
	set   map[string]struct{} // the object's keys, once there are many
	idx   int                 // array index
	sc    *schema             // what the object's keys or the array's elements are
	via   []byte              // the key this value is under (in an object)
	at    int                 // the index this value is at (in an array)
}

// where names the innermost frame of stack for an error: its path, or
// "the top-level object".
func where(stack []keyFrame) string {
	if p := keyPath(stack); p != "" {
		return p
	}
	return "the top-level object"
}

// keyPath is the path of the innermost frame of stack: keys joined with
// ".", array indexes as "[n]".
func keyPath(stack []keyFrame) string {
	if len(stack) <= 1 {
		return ""
	}
	parent := keyPath(stack[:len(stack)-1])
	f := &stack[len(stack)-1]
	if stack[len(stack)-2].obj {
		return joinPath(parent, string(f.via))
	}
	return fmt.Sprintf("%s[%d]", parent, f.at)
}

func joinPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}
