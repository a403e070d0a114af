package bbolt

import (
	"bytes"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
)

// Schema 1 stored every record as JSON. Migration 1 → 2
// (migrateBinaryRecords) rewrites the hot records in the binary form of
// codec.go; decodeV1 is the schema 1 decoder it reads them with. Both are
// frozen: a later change of encoding is a new migration, not an edit here.

// decodeV1 parses a schema 1 (JSON) record into a new T.
func decodeV1[T any](b []byte) (*T, error) {
	v := new(T)
	if err := json.Unmarshal(b, v); err != nil {
		return nil, err
	}
	return v, nil
}

// migrateBinaryRecords rewrites the executions, steps, occurrence counters
// and events of a schema 1 file in binary record format 1.
func migrateBinaryRecords(tx *bolt.Tx) error {
	for _, m := range []struct {
		bucket []byte
		conv   func([]byte) ([]byte, error)
	}{
		{bExecutions, func(v []byte) ([]byte, error) {
			e, err := decodeV1[kernel.Execution](v)
			if err != nil {
				return nil, err
			}
			return encodeExecution(e), nil
		}},
		{bSteps, func(v []byte) ([]byte, error) {
			s, err := decodeV1[kernel.Step](v)
			if err != nil {
				return nil, err
			}
			return encodeStep(s), nil
		}},
		{bOcc, func(v []byte) ([]byte, error) {
			o, err := decodeV1[kernel.Occurrence](v)
			if err != nil {
				return nil, err
			}
			return encodeOccurrence(*o), nil
		}},
		{bEvents, func(v []byte) ([]byte, error) {
			ev, err := decodeV1[kernel.Event](v)
			if err != nil {
				return nil, err
			}
			return encodeEvent(ev), nil
		}},
	} {
		if err := rewrite(tx.Bucket(m.bucket), m.conv); err != nil {
			return fmt.Errorf("bucket %s: %w", m.bucket, err)
		}
	}
	return nil
}

// rewrite replaces every value of b by conv(value). It works in batches,
// re-seeking after each, since a bbolt cursor is not to be used across
// writes to its bucket.
func rewrite(b *bolt.Bucket, conv func([]byte) ([]byte, error)) error {
	const batch = 1024
	type kv struct{ k, v []byte }
	todo := make([]kv, 0, batch)
	var from []byte
	for {
		c := b.Cursor()
		k, v := c.First()
		if from != nil {
			k, v = c.Seek(from)
		}
		todo = todo[:0]
		for ; k != nil && len(todo) < batch; k, v = c.Next() {
			if v == nil {
				continue // a nested bucket: there are none
			}
			nv, err := conv(v)
			if err != nil {
				return fmt.Errorf("key %q: %w", k, err)
			}
			todo = append(todo, kv{bytes.Clone(k), nv})
		}
		from = bytes.Clone(k) // the first key not done; nil at the end
		for _, x := range todo {
			if err := b.Put(x.k, x.v); err != nil {
				return fmt.Errorf("key %q: %w", x.k, err)
			}
		}
		if from == nil {
			return nil
		}
	}
}
