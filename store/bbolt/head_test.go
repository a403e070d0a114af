package bbolt

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/wicket-run/wicket/kernel"
)

// TestExecutionHead checks that ExecutionHead reads what Execution reads
// but the input in a read transaction, everything in a write transaction
// (whose executions may be written back), and misses as Execution does
// (another tenant's execution included).
func TestExecutionHead(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, false)
	ctx := context.Background()
	e := benchExec("0196a000-0000-7000-8000-000000000001")
	if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutExecution(e) }); err != nil {
		t.Fatal(err)
	}
	check := func(tx kernel.ReadTx, writable bool) error {
		full, err := tx.Execution(e.Tenant, e.ID)
		if err != nil {
			return err
		}
		head, err := tx.(kernel.ExecutionHeadReader).ExecutionHead(e.Tenant, e.ID)
		if err != nil {
			return err
		}
		if len(full.Input) == 0 || !reflect.DeepEqual(full.Input, e.Input) {
			t.Errorf("Execution's input %q, stored %q", full.Input, e.Input)
		}
		if writable {
			if !reflect.DeepEqual(head, full) {
				t.Errorf("in a write transaction, ExecutionHead %+v\nExecution %+v", head, full)
			}
			return nil
		}
		if head.Input != nil {
			t.Errorf("ExecutionHead read the input: %q", head.Input)
		}
		full.Input = nil
		if !reflect.DeepEqual(head, full) {
			t.Errorf("ExecutionHead %+v\nExecution without input %+v", head, full)
		}
		for _, c := range []struct{ tenant, id string }{{e.Tenant, "0196a000-0000-7000-8000-000000000002"}, {"other", e.ID}, {e.Tenant, ""}} {
			if _, err := tx.(kernel.ExecutionHeadReader).ExecutionHead(c.tenant, c.id); !errors.Is(err, kernel.ErrNotFound) {
				t.Errorf("ExecutionHead(%q, %q): %v, want not found", c.tenant, c.id, err)
			}
		}
		return nil
	}
	if err := s.View(ctx, func(tx kernel.ReadTx) error { return check(tx, false) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(tx kernel.Tx) error { return check(tx, true) }); err != nil {
		t.Fatal(err)
	}
}
