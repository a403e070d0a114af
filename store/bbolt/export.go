package bbolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/storecopy"
)

var _ storecopy.Source = (*Store)(nil)

// Export implements storecopy.Source: every record, read in one bbolt read
// transaction, in the order storecopy.Source documents. ctx is checked
// between records.
func (s *Store) Export(ctx context.Context, fn func(storecopy.Record) error) error {
	if s.closed() {
		return errClosed("export")
	}
	if err := s.flush(); err != nil {
		return err
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		emit := func(r storecopy.Record) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fn(r)
		}
		simple := []struct {
			bucket []byte
			rec    func(v []byte) (storecopy.Record, error)
		}{
			{bTenants, decodeAs(func(t *kernel.Tenant) storecopy.Record { return storecopy.Record{Tenant: t} })},
			{bAPIKeys, decodeAs(func(k *kernel.APIKey) storecopy.Record { return storecopy.Record{APIKey: k} })},
			{bAgents, decodeAs(func(a *kernel.Agent) storecopy.Record { return storecopy.Record{Agent: a} })},
			{bBundles, decodeAs(func(b *kernel.BundleRecord) storecopy.Record { return storecopy.Record{Bundle: b} })},
			{bApprovals, decodeAs(func(a *kernel.Approval) storecopy.Record { return storecopy.Record{Approval: a} })},
		}
		for _, b := range simple {
			err := tx.Bucket(b.bucket).ForEach(func(k, v []byte) error {
				r, err := b.rec(v)
				if err != nil {
					return fmt.Errorf("%s %q: %w", b.bucket, k, err)
				}
				return emit(r)
			})
			if err != nil {
				return err
			}
		}
		err := tx.Bucket(bCounters).ForEach(func(k, v []byte) error {
			tenant, key, ok := splitPair(k)
			if !ok {
				return fmt.Errorf("counters: malformed key %q", k)
			}
			return emit(storecopy.Record{Counter: &storecopy.Counter{Tenant: tenant, Key: key, Value: bytes.Clone(v)}})
		})
		if err != nil {
			return err
		}
		r := &readTx{tx: tx}
		return tx.Bucket(bExecutions).ForEach(func(k, v []byte) error {
			if isInputKey(k) {
				return nil // with its execution
			}
			e, err := r.decodeExecutionIn(k, v)
			if err != nil {
				return fmt.Errorf("execution %q: %w", k, err)
			}
			if err := emit(storecopy.Record{Execution: e}); err != nil {
				return err
			}
			return exportExecution(tx, e, emit)
		})
	})
	if err != nil {
		return fmt.Errorf("bbolt: export %s: %w", s.path, err)
	}
	return nil
}

// decodeAs decodes a JSON record and wraps it.
func decodeAs[T any](wrap func(*T) storecopy.Record) func([]byte) (storecopy.Record, error) {
	return func(v []byte) (storecopy.Record, error) {
		x, err := decode[T](v)
		if err != nil {
			return storecopy.Record{}, err
		}
		return wrap(x), nil
	}
}

// exportExecution emits the events, steps and occurrence counters of e.
func exportExecution(tx *bolt.Tx, e *kernel.Execution, emit func(storecopy.Record) error) error {
	pfx := prefix(e.Tenant, e.ID)
	c := tx.Bucket(bEvents).Cursor()
	for k, v := c.Seek(pfx); k != nil && bytes.HasPrefix(k, pfx); k, v = c.Next() {
		if len(k) != len(pfx)+8 {
			continue // a step's record: exported below
		}
		ev := storecopy.Event{Tenant: e.Tenant}
		if err := decodeEvent(v, e.ID, binary.BigEndian.Uint64(k[len(pfx):]), &ev.Event); err != nil {
			return fmt.Errorf("event %d of %s: %w", binary.BigEndian.Uint64(k[len(k)-8:]), e.ID, err)
		}
		if err := emit(storecopy.Record{Event: &ev}); err != nil {
			return err
		}
	}
	err := forEachStep(tx, e.Tenant, e.ID, func(id string, raw []byte) error {
		st, err := decodeStepAt(raw, e.Tenant, e.ID, id)
		if err != nil {
			return err
		}
		return emit(storecopy.Record{Step: st})
	})
	if err != nil {
		return err
	}
	c = tx.Bucket(bSteps).Cursor()
	for k, v := c.Seek(pfx); k != nil && bytes.HasPrefix(k, pfx); k, v = c.Next() {
		sl, err := decodeSlot(v)
		if err != nil {
			return fmt.Errorf("step index entry %q: %w", k, err)
		}
		if sl.occ == nil {
			continue
		}
		o, err := decodeOccurrence(sl.occ)
		if err != nil {
			return fmt.Errorf("occurrence %q: %w", k, err)
		}
		rec := &storecopy.Occurrence{Tenant: e.Tenant, ExecutionID: e.ID, Key: string(k[len(pfx):]), Occurrence: o}
		if err := emit(storecopy.Record{Occurrence: rec}); err != nil {
			return err
		}
	}
	return nil
}
