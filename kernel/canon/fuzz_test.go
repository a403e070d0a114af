package canon

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// FuzzCanonical checks, for any input: accepted inputs are valid JSON for
// encoding/json, the output is valid JSON of the same value, a fixed point
// of Canonical and byte-identical to encoding/json's re-marshalling;
// rejected inputs are rejected with a well-formed *Error, and for grammar
// errors encoding/json rejects them too.
func FuzzCanonical(f *testing.F) {
	vf := loadVectors(f)
	for _, v := range vf.Canonical {
		f.Add([]byte(v.Input))
	}
	for _, v := range vf.Rejected {
		f.Add(v.bytes(f))
	}
	f.Fuzz(func(t *testing.T, x []byte) {
		out, err := Canonical(x)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || ce.Kind == nil || ce.Offset < 0 || ce.Offset > len(x) {
				t.Fatalf("bad error %#v for %q", err, x)
			}
			if out != nil {
				t.Fatalf("output with error")
			}
			// Grammar errors must be real: encoding/json agrees the input
			// is not JSON. (The other classes are deliberate extra
			// strictness.)
			if (ce.Kind == ErrSyntax || ce.Kind == ErrTrailingData) && json.Valid(x) {
				t.Fatalf("%v, but encoding/json finds %q valid", err, x)
			}
			return
		}
		// Encoding/json must not reject what we accept.
		if !json.Valid(x) {
			t.Fatalf("accepted input encoding/json rejects: %q", x)
		}
		if len(out) != cap(out) {
			t.Fatalf("output length %d != precomputed %d for %q", len(out), cap(out), x)
		}
		if !json.Valid(out) {
			t.Fatalf("output is not valid JSON: %q -> %q", x, out)
		}
		// Idempotent.
		again, err := Canonical(out)
		if err != nil {
			t.Fatalf("Canonical(Canonical(x)) failed: %v; x=%q out=%q", err, x, out)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q -> %q -> %q", x, out, again)
		}
		// Same value (Canonical accepted x, so it has no duplicate keys).
		vx, err := decodeUseNumber(x)
		if err != nil {
			t.Fatalf("encoding/json cannot decode accepted input %q: %v", x, err)
		}
		vo, err := decodeUseNumber(out)
		if err != nil {
			t.Fatalf("encoding/json cannot decode output %q: %v", out, err)
		}
		if !reflect.DeepEqual(vx, vo) {
			t.Fatalf("value changed: %q -> %q", x, out)
		}
		// And the very bytes encoding/json produces for it.
		ej, err := json.Marshal(vx)
		if err != nil {
			t.Fatalf("json.Marshal: %v", err)
		}
		if !bytes.Equal(ej, out) {
			t.Fatalf("differs from encoding/json for %q:\n got %q\nwant %q", x, out, ej)
		}
	})
}

func decodeUseNumber(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}
