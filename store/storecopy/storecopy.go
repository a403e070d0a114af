// Package storecopy moves a kernel's state from one store to another (the
// embedded bbolt file into PostgreSQL, and back) and proves the copy: both
// stores' checkers pass, and a digest of every record read back from the
// destination equals the digest of the source.
//
// A store that can be copied implements Source: it exports every record,
// in one snapshot, as Records; a Record writes itself through kernel.Tx, so
// any kernel.Store is a destination.
package storecopy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strings"

	"github.com/wicket-run/wicket/kernel"
)

// Source is a store that can export its records.
type Source interface {
	// Export calls fn with every record, read in one snapshot: tenants, API
	// keys, agents, bundles, approvals and counters, then each execution
	// followed by its events (in seq order), steps and occurrence counters.
	// It stops at fn's first error and returns it.
	Export(ctx context.Context, fn func(Record) error) error
}

// Record is one stored record; exactly one field is set.
type Record struct {
	Tenant     *kernel.Tenant
	APIKey     *kernel.APIKey
	Agent      *kernel.Agent
	Bundle     *kernel.BundleRecord
	Approval   *kernel.Approval
	Counter    *Counter
	Execution  *kernel.Execution
	Event      *Event
	Step       *kernel.Step
	Occurrence *Occurrence
}

// Counter is a rate-limit counter.
type Counter struct {
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
	Value  []byte `json:"value"`
}

// Event is an event with its tenant.
type Event struct {
	Tenant string       `json:"tenant"`
	Event  kernel.Event `json:"event"`
}

// Occurrence is an occurrence counter with its key.
type Occurrence struct {
	Tenant      string            `json:"tenant"`
	ExecutionID string            `json:"execution_id"`
	Key         string            `json:"key"`
	Occurrence  kernel.Occurrence `json:"occurrence"`
}

// Kind names the record's kind ("execution", "event", ...).
func (r Record) Kind() string {
	switch {
	case r.Tenant != nil:
		return "tenant"
	case r.APIKey != nil:
		return "api_key"
	case r.Agent != nil:
		return "agent"
	case r.Bundle != nil:
		return "bundle"
	case r.Approval != nil:
		return "approval"
	case r.Counter != nil:
		return "counter"
	case r.Execution != nil:
		return "execution"
	case r.Event != nil:
		return "event"
	case r.Step != nil:
		return "step"
	case r.Occurrence != nil:
		return "occurrence"
	}
	return ""
}

// value is the record itself, for the digest.
func (r Record) value() any {
	switch {
	case r.Tenant != nil:
		return r.Tenant
	case r.APIKey != nil:
		return r.APIKey
	case r.Agent != nil:
		return r.Agent
	case r.Bundle != nil:
		return r.Bundle
	case r.Approval != nil:
		return r.Approval
	case r.Counter != nil:
		return r.Counter
	case r.Execution != nil:
		return r.Execution
	case r.Event != nil:
		return r.Event
	case r.Step != nil:
		return r.Step
	case r.Occurrence != nil:
		return r.Occurrence
	}
	return nil
}

// Write writes the record in tx.
func (r Record) Write(tx kernel.Tx) error {
	switch {
	case r.Tenant != nil:
		return tx.PutTenant(r.Tenant)
	case r.APIKey != nil:
		return tx.PutAPIKey(r.APIKey)
	case r.Agent != nil:
		return tx.PutAgent(r.Agent)
	case r.Bundle != nil:
		return tx.PutBundle(r.Bundle)
	case r.Approval != nil:
		return tx.PutApproval(r.Approval)
	case r.Counter != nil:
		return tx.PutCounter(r.Counter.Tenant, r.Counter.Key, r.Counter.Value)
	case r.Execution != nil:
		return tx.PutExecution(r.Execution)
	case r.Event != nil:
		return tx.AppendEvent(r.Event.Tenant, r.Event.Event)
	case r.Step != nil:
		return tx.PutStep(r.Step)
	case r.Occurrence != nil:
		o := r.Occurrence
		return tx.PutOccurrence(o.Tenant, o.ExecutionID, o.Key, o.Occurrence)
	}
	return errors.New("storecopy: empty record")
}

// Counts are how many records of each kind a store holds.
type Counts map[string]int

// String lists the counts, kinds in order.
func (c Counts) String() string {
	kinds := make([]string, 0, len(c))
	for k := range c {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, c[k])
	}
	return strings.Join(parts, ", ")
}

// Summary is what Digest reads from a store.
type Summary struct {
	Counts Counts
	// Digest is sha256 over each record's kind and JSON, in a canonical
	// order (records sorted by their JSON within each kind).
	Digest string
}

// isCopyMark reports whether r is the mark a copy leaves in the store it
// fills (kernel.CopyMarkKey): it is the copy's own, never copied on nor
// part of a digest.
func (r Record) isCopyMark() bool {
	return r.Counter != nil && r.Counter.Tenant == kernel.DefaultTenant && r.Counter.Key == kernel.CopyMarkKey
}

// Digest reads every record of src but a copy's mark and summarizes them.
func Digest(ctx context.Context, src Source) (Summary, error) {
	byKind := map[string][]string{}
	err := src.Export(ctx, func(r Record) error {
		if r.isCopyMark() {
			return nil
		}
		b, err := json.Marshal(r.value())
		if err != nil {
			return fmt.Errorf("encode %s: %w", r.Kind(), err)
		}
		byKind[r.Kind()] = append(byKind[r.Kind()], string(b))
		return nil
	})
	if err != nil {
		return Summary{}, err
	}
	s := Summary{Counts: Counts{}}
	h := sha256.New()
	kinds := make([]string, 0, len(byKind))
	for k := range byKind {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		recs := byKind[k]
		slices.Sort(recs)
		s.Counts[k] = len(recs)
		for _, r := range recs {
			writeItem(h, k, r)
		}
	}
	s.Digest = hex.EncodeToString(h.Sum(nil))
	return s, nil
}

func writeItem(h hash.Hash, kind, rec string) {
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write([]byte(rec))
	h.Write([]byte{'\n'})
}

// ErrNotEmpty is returned by Copy for a destination that holds records.
var ErrNotEmpty = errors.New("the destination store is not empty")

// errStop ends an Export early.
var errStop = errors.New("stop")

// Empty reports whether src holds no record.
func Empty(ctx context.Context, src Source) (bool, error) {
	empty := true
	err := src.Export(ctx, func(Record) error { empty = false; return errStop })
	if err != nil && !errors.Is(err, errStop) {
		return false, err
	}
	return empty, nil
}

// batchSize is how many records one destination transaction writes.
const batchSize = 500

// Copy writes every record of src into dst, which must be empty (dstSrc
// is dst read as a Source, to check that), in transactions of batchSize
// records; an execution and its events, steps and counters are kept in one
// transaction when they fit. It returns the counts of records copied.
func Copy(ctx context.Context, src Source, dst kernel.Store, dstSrc Source) (Counts, error) {
	empty, err := Empty(ctx, dstSrc)
	if err != nil {
		return nil, fmt.Errorf("storecopy: read destination: %w", err)
	}
	if !empty {
		return nil, fmt.Errorf("storecopy: %w (copy into a new database or directory)", ErrNotEmpty)
	}
	// Marked before the first record, so that a copy stopped anywhere
	// leaves a store the kernel refuses to start on (kernel.CopyMarkKey).
	if err := dst.Update(ctx, func(tx kernel.Tx) error {
		return tx.PutCounter(kernel.DefaultTenant, kernel.CopyMarkKey, []byte(kernel.CopyMarkIncomplete))
	}); err != nil {
		return nil, fmt.Errorf("storecopy: mark the destination: %w", err)
	}
	counts := Counts{}
	var pending []Record
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		batch := pending
		err := dst.Update(ctx, func(tx kernel.Tx) error {
			for _, r := range batch {
				if err := r.Write(tx); err != nil {
					return fmt.Errorf("write %s: %w", r.Kind(), err)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, r := range batch {
			counts[r.Kind()]++
		}
		pending = nil
		return nil
	}
	err = src.Export(ctx, func(r Record) error {
		if r.isCopyMark() {
			return nil // the source's own, from the copy that made it
		}
		// Start a new transaction at an execution when the current one
		// is full, so that the execution and its records travel together.
		if len(pending) >= batchSize && (r.Execution != nil || len(pending) >= 4*batchSize) {
			if err := flush(); err != nil {
				return err
			}
		}
		pending = append(pending, r)
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return counts, fmt.Errorf("storecopy: %w", err)
	}
	return counts, nil
}

// Finish marks dst, filled by Copy and then verified, as a finished copy:
// note (what it was copied from) replaces the mark that makes the kernel
// refuse it.
func Finish(ctx context.Context, dst kernel.Store, note string) error {
	if note == "" || note == kernel.CopyMarkIncomplete {
		return fmt.Errorf("storecopy: finish: the note %q would not mark the copy finished", note)
	}
	if err := dst.Update(ctx, func(tx kernel.Tx) error {
		return tx.PutCounter(kernel.DefaultTenant, kernel.CopyMarkKey, []byte(note))
	}); err != nil {
		return fmt.Errorf("storecopy: finish: %w", err)
	}
	return nil
}
