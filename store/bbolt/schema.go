package bbolt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
)

// SchemaVersion is the schema version this binary writes: the number of
// migrations it knows.
const SchemaVersion = 7

// ErrNewerSchema is returned by Open for a file written by a newer binary.
var ErrNewerSchema = errors.New("store schema is newer than this binary supports")

// migrations[v] takes a file from schema version v to v+1. They are applied
// in order, all in the one transaction Open runs, and never edited once
// released: a change of layout or encoding is a new entry.
var migrations = []func(tx *bolt.Tx) error{
	0: migrateCreateBuckets,
	1: migrateBinaryRecords, // codec_v1.go
	2: migrateAgentSigning,  // migrate_signing.go
	3: migrateBundleOwners,
	4: migrateSessions,
	5: migrateStepLog, // and migrateInputs
	6: migrateFormat3,
}

// migrateFormat3 (schema 7) changes nothing stored: events, step records
// and occurrence counters are written in binary format 3 from now on (no
// tenant, execution id, step id nor event seq, which their keys hold; an
// event's type as a number; payloads and strings packed, pack.go), and the
// records already stored read as before (they are rewritten in format 3
// only when the kernel writes them again). The version moves so that a
// schema 6 binary, which cannot read format 3, refuses the file instead
// of misreading it.
func migrateFormat3(*bolt.Tx) error { return nil }

// migrateInputs (schema 6, with migrateStepLog) moves every execution's
// input out of its record, to inputKey; the record keeps null.
func migrateInputs(tx *bolt.Tx) error {
	execs := tx.Bucket(bExecutions)
	type kv struct{ k, v []byte }
	var out []kv
	err := execs.ForEach(func(k, v []byte) error {
		e, err := decodeExecution(v)
		if err != nil {
			return fmt.Errorf("execution %q: %w", k, err)
		}
		if len(e.Input) == 0 || string(e.Input) == "null" {
			return nil
		}
		out = append(out, kv{inputKey(k), e.Input})
		e.Input = nil
		out = append(out, kv{bytes.Clone(k), encodeExecution(e)})
		return nil
	})
	if err != nil {
		return err
	}
	for _, x := range out {
		if err := execs.Put(x.k, x.v); err != nil {
			return fmt.Errorf("execution %q: %w", x.k, err)
		}
	}
	return nil
}

// migrateStepLog (schema 6) moves every step record from the steps bucket
// into its execution's log, the events bucket, under stepLogKey (right
// after the step's first event), and turns the steps bucket into slots
// (slot.go): the step's seq there, and the occurrence counters of the occ
// bucket, which it deletes, under the same keys as before. The records
// themselves are unchanged. Then migrateInputs.
func migrateStepLog(tx *bolt.Tx) error {
	if err := migrateInputs(tx); err != nil {
		return err
	}
	idx, log := tx.Bucket(bSteps), tx.Bucket(bEvents)
	log.FillPercent = eventsFill
	slots := map[string]slot{}
	var keys []string // in key order
	c := idx.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		// A record migration 2 just wrote is in the current format, which
		// leaves the ids to the key.
		parts := bytes.SplitN(k, []byte{sep}, 3)
		if len(parts) != 3 {
			return fmt.Errorf("step %q: malformed key", k)
		}
		s, err := decodeStepAt(v, string(parts[0]), string(parts[1]), string(parts[2]))
		if err != nil {
			return fmt.Errorf("step %q: %w", k, err)
		}
		if !bytes.Equal(k, key(s.Tenant, s.ExecutionID, s.ID)) {
			return fmt.Errorf("step %q: the record names %s/%s/%s", k, s.Tenant, s.ExecutionID, s.ID)
		}
		if err := log.Put(stepLogKey(s.Tenant, s.ExecutionID, s.Seq, s.ID), bytes.Clone(v)); err != nil {
			return fmt.Errorf("step %q: %w", k, err)
		}
		keys = append(keys, string(k))
		slots[string(k)] = slot{seq: s.Seq, hasSeq: true}
	}
	if occ := tx.Bucket(bOcc); occ != nil {
		err := occ.ForEach(func(k, v []byte) error {
			if _, err := decodeOccurrence(v); err != nil {
				return fmt.Errorf("occurrence %q: %w", k, err)
			}
			sl, ok := slots[string(k)]
			if !ok {
				keys = append(keys, string(k))
			}
			sl.occ = bytes.Clone(v)
			slots[string(k)] = sl
			return nil
		})
		if err != nil {
			return err
		}
		if err := tx.DeleteBucket(bOcc); err != nil {
			return fmt.Errorf("delete bucket occ: %w", err)
		}
	}
	for _, k := range keys {
		if err := idx.Put([]byte(k), slots[k].encode()); err != nil {
			return fmt.Errorf("step index %q: %w", k, err)
		}
	}
	return nil
}

// migrateSessions (schema 5) changes nothing stored: executions and steps
// are written in binary format 2 from now on (a session's holder, a step's
// on_interrupted), and format 1 records read as before, with the new
// fields zero. The version moves so that a schema 4 binary, which cannot
// read format 2, refuses the file instead of misreading it.
func migrateSessions(*bolt.Tx) error { return nil }

// migrateBundleOwners gives every stored bundle an owner (schema 4): the
// bundles a tenant names as its guards become the admin's, so that the
// tenant cannot replace or delete them; every other bundle is the tenant's,
// so that tenant-admins keep managing the bundles they stored. The records
// stay JSON; a schema 3 binary would drop the owner when rewriting one,
// which is why the version moves.
func migrateBundleOwners(tx *bolt.Tx) error {
	guards := map[string]bool{} // tenant␀name
	err := tx.Bucket(bTenants).ForEach(func(_, v []byte) error {
		t, err := decodeJSON[kernel.Tenant](v)
		if err != nil {
			return fmt.Errorf("tenant record: %w", err)
		}
		for _, g := range t.Guards {
			guards[string(key(t.ID, g))] = true
		}
		return nil
	})
	if err != nil {
		return err
	}
	b := tx.Bucket(bBundles)
	type kv struct{ k, v []byte }
	var out []kv
	err = b.ForEach(func(k, v []byte) error {
		rec, err := decodeJSON[kernel.BundleRecord](v)
		if err != nil {
			return fmt.Errorf("bundle %q: %w", k, err)
		}
		if rec.Owner != "" {
			return nil
		}
		rec.Owner = kernel.BundleOwnerTenant
		if guards[string(k)] {
			rec.Owner = kernel.BundleOwnerAdmin
		}
		raw, err := encodeJSON(rec)
		if err != nil {
			return err
		}
		out = append(out, kv{bytes.Clone(k), raw})
		return nil
	})
	if err != nil {
		return err
	}
	for _, x := range out {
		if err := b.Put(x.k, x.v); err != nil {
			return fmt.Errorf("bundle %q: %w", x.k, err)
		}
	}
	return nil
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

// checkSchema refuses a file (opened read-only) whose schema is not
// SchemaVersion: it cannot be migrated without writing.
func checkSchema(db *bolt.DB) error {
	return db.View(func(tx *bolt.Tx) error {
		v, err := schemaVersion(tx)
		if err != nil {
			return err
		}
		switch {
		case v > SchemaVersion:
			return fmt.Errorf("file has schema version %d, this binary supports up to %d (upgrade wicket): %w", v, SchemaVersion, ErrNewerSchema)
		case v < SchemaVersion:
			return fmt.Errorf("file has schema version %d, this binary reads %d: start `wicket serve` on it once to migrate it", v, SchemaVersion)
		}
		return nil
	})
}
