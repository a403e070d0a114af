package bbolt

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// migrateAgentSigning (schema 2 → 3) writes "signing": "body" into every
// agent record that has no signing field: those agents were registered
// when the body signature was the only scheme, and their SDKs sign that
// way. Agents registered later carry "v1" or "body" explicitly. The
// record is edited as raw JSON (keys come back sorted), so the migration
// does not depend on kernel.Agent as it may change later. Frozen.
func migrateAgentSigning(tx *bolt.Tx) error {
	b := tx.Bucket(bAgents)
	if b == nil {
		return fmt.Errorf("bucket %s missing", bAgents)
	}
	err := rewrite(b, func(v []byte) ([]byte, error) {
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(v, &rec); err != nil {
			return nil, err
		}
		if _, ok := rec["signing"]; ok {
			return v, nil
		}
		rec["signing"] = json.RawMessage(`"body"`)
		return json.Marshal(rec)
	})
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bAgents, err)
	}
	return nil
}
