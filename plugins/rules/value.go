package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// value is an operand of a predicate, decoded once at load time into the
// shape the matcher compares raw JSON against.
type value struct {
	kind kind
	s    string // string value, or number literal
	bs   []byte // s as bytes (strings and numbers)
	b    bool
	arr  []*value
	obj  map[string]*value
}

type kind uint8

const (
	kNull kind = iota
	kBool
	kNumber
	kString
	kArray
	kObject
)

func (k kind) String() string {
	return [...]string{"null", "boolean", "number", "string", "array", "object"}[k]
}

// parseValue decodes JSON text (as produced by bundle.JSONFromYAML).
func parseValue(raw []byte) (*value, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return fromAny(v)
}

func fromAny(v any) (*value, error) {
	switch t := v.(type) {
	case nil:
		return &value{kind: kNull}, nil
	case bool:
		return &value{kind: kBool, b: t}, nil
	case json.Number:
		return &value{kind: kNumber, s: string(t), bs: []byte(t)}, nil
	case string:
		return &value{kind: kString, s: t, bs: []byte(t)}, nil
	case []any:
		out := &value{kind: kArray, arr: make([]*value, len(t))}
		for i, e := range t {
			c, err := fromAny(e)
			if err != nil {
				return nil, err
			}
			out.arr[i] = c
		}
		return out, nil
	case map[string]any:
		out := &value{kind: kObject, obj: make(map[string]*value, len(t))}
		for k, e := range t {
			c, err := fromAny(e)
			if err != nil {
				return nil, err
			}
			out.obj[k] = c
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported value %T", v)
}

// equal reports whether the raw JSON value raw equals v: same type and same
// value, numbers compared exactly by value (1 equals 1.0), strings after
// unescaping, arrays element by element, objects by key set and values.
// It does not allocate, except for object keys that contain escapes.
func equal(raw []byte, v *value) bool {
	if len(raw) == 0 {
		return false
	}
	switch v.kind {
	case kString:
		body, esc, ok := stringBody(raw)
		if !ok {
			return false
		}
		if !esc {
			return string(body) == v.s
		}
		return unescapedEqual(body, v.s)
	case kNumber:
		c := raw[0]
		if c != '-' && (c < '0' || c > '9') {
			return false
		}
		return numEqual(raw, v.bs)
	case kBool:
		if v.b {
			return string(raw) == "true"
		}
		return string(raw) == "false"
	case kNull:
		return string(raw) == "null"
	case kArray:
		if raw[0] != '[' {
			return false
		}
		it := newIter(raw, 0)
		n := 0
		for {
			_, _, vs, ve, ok := it.next()
			if !ok {
				break
			}
			if n >= len(v.arr) || !equal(raw[vs:ve], v.arr[n]) {
				return false
			}
			n++
		}
		return !it.bad && n == len(v.arr)
	case kObject:
		if raw[0] != '{' {
			return false
		}
		it := newIter(raw, 0)
		n := 0
		for {
			k, esc, vs, ve, ok := it.next()
			if !ok {
				break
			}
			var child *value
			if esc {
				child = v.obj[string(unescape(k))]
			} else {
				child = v.obj[string(k)]
			}
			if child == nil || !equal(raw[vs:ve], child) {
				return false
			}
			n++
		}
		// Canonical args have no duplicate keys, so counting members is
		// enough to know every key of v was seen.
		return !it.bad && n == len(v.obj)
	}
	return false
}
