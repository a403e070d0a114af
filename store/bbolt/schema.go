package bbolt

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// SchemaVersion is the schema version this binary writes: the number of
// migrations it knows.
const SchemaVersion = 3

// ErrNewerSchema is returned by Open for a file written by a newer binary.
var ErrNewerSchema = errors.New("store schema is newer than this binary supports")

// migrations[v] takes a file from schema version v to v+1. They are applied
// in order, all in the one transaction Open runs, and never edited once
// released: a change of layout or encoding is a new entry.
var migrations = []func(tx *bolt.Tx) error{
	0: migrateCreateBuckets,
	1: migrateBinaryRecords, // codec_v1.go
	2: migrateAgentSigning,  // migrate_signing.go
}

// migrateCreateBuckets creates the version 1 layout (see doc.go).
func migrateCreateBuckets(tx *bolt.Tx) error {
	for _, name := range [][]byte{
		bExecutions, bExecTenant, bIdem, bSteps, bOcc, bEvents, bAgents,
		bApprovals, bBundles, bCounters, bTenants, bAPIKeys, bAPIKeyHash,
		bDue, bLeases, bApprovalExp,
	} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// schemaVersion reads the version stored in tx (0 for a new file).
func schemaVersion(tx *bolt.Tx) (uint64, error) {
	meta := tx.Bucket(bMeta)
	if meta == nil {
		return 0, nil
	}
	v := meta.Get(keySchemaVersion)
	if v == nil {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("malformed schema_version (%d bytes)", len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// migrate brings the file to SchemaVersion in one transaction, or refuses a
// file whose schema is newer than this binary's.
func migrate(db *bolt.DB) error {
	return db.Update(func(tx *bolt.Tx) error {
		v, err := schemaVersion(tx)
		if err != nil {
			return err
		}
		if v > uint64(len(migrations)) {
			return fmt.Errorf("file has schema version %d, this binary supports up to %d (upgrade wicket): %w",
				v, len(migrations), ErrNewerSchema)
		}
		if v == uint64(len(migrations)) {
			return nil
		}
		meta, err := tx.CreateBucketIfNotExists(bMeta)
		if err != nil {
			return fmt.Errorf("create meta bucket: %w", err)
		}
		for ; v < uint64(len(migrations)); v++ {
			if err := migrations[v](tx); err != nil {
				return fmt.Errorf("migrate schema %d → %d: %w", v, v+1, err)
			}
		}
		return meta.Put(keySchemaVersion, binary.BigEndian.AppendUint64(nil, v))
	})
}
