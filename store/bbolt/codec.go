package bbolt

import (
	"bytes"
	"encoding/json"
)

// The record encoding lives here and only here, so that it can change (with
// a migration) without touching the rest of the package.

// encode returns the stored form of a record. HTML characters are not
// escaped, so that raw JSON fields keep their bytes; they are compacted.
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// decode parses a stored record into a new T. The result shares no memory
// with b, which bbolt owns only for the life of the transaction.
func decode[T any](b []byte) (*T, error) {
	v := new(T)
	if err := json.Unmarshal(b, v); err != nil {
		return nil, err
	}
	return v, nil
}
