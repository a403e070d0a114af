package kernel_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// countingStore counts the ListSteps and OpenSteps calls of its write
// transactions; with plain set, they do not offer OpenSteps.
type countingStore struct {
	*bbolt.Store
	plain      bool
	list, open *atomic.Int64
}

type countingTx struct {
	kernel.Tx
	s countingStore
}

func (t countingTx) ListSteps(tenant, id string) ([]*kernel.Step, error) {
	t.s.list.Add(1)
	return t.Tx.ListSteps(tenant, id)
}

type openingTx struct{ countingTx }

func (t openingTx) OpenSteps(tenant, id string) ([]*kernel.Step, error) {
	t.s.open.Add(1)
	return t.Tx.(kernel.OpenStepsLister).OpenSteps(tenant, id)
}

func (s countingStore) Update(ctx context.Context, fn func(kernel.Tx) error) error {
	return s.Store.Update(ctx, func(tx kernel.Tx) error {
		c := countingTx{tx, s}
		if s.plain {
			return fn(c)
		}
		return fn(openingTx{c})
	})
}

// TestFinishReadsOpenStepsOnly: ending an execution cancels its open
// steps. It read every step to find them, arguments and results included,
// in the write transaction all tenants share (150 steps of 1 MB: the
// writer held 100 ms, another tenant's step waiting as long). With the
// metrics' observer wrapping the transaction, as `wicket serve` runs, it
// now asks the store for the open steps only; a store that cannot answer
// that still gets its open steps cancelled through ListSteps.
func TestFinishReadsOpenStepsOnly(t *testing.T) {
	for _, plain := range []bool{false, true} {
		bst, err := bbolt.Open(filepath.Join(t.TempDir(), "wicket.db"), bbolt.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		cs := countingStore{Store: bst, plain: plain, list: new(atomic.Int64), open: new(atomic.Int64)}
		k, calls := runningKernel(t, bst, cs, 1, nil)
		ctx := context.Background()
		var open string
		for i, target := range []string{"a", "b", "c"} {
			d, err := k.SubmitStep(ctx, kernel.StepRequest{AgentCall: calls[0], Kind: "tool_call", Target: target, Args: json.RawMessage(`{"i":1}`)})
			if err != nil {
				t.Fatal(err)
			}
			if i < 2 {
				if _, err := k.CompleteStep(ctx, kernel.StepOutcome{AgentCall: calls[0], StepID: d.StepID, Result: json.RawMessage(`"done"`)}); err != nil {
					t.Fatal(err)
				}
			} else {
				open = d.StepID
			}
		}
		cs.list.Store(0)
		if err := k.CancelExecution(ctx, kernel.DefaultTenant, calls[0].ExecutionID, "test"); err != nil {
			t.Fatal(err)
		}
		s, err := k.GetStep(ctx, kernel.DefaultTenant, calls[0].ExecutionID, open)
		if err != nil || s.Status != kernel.StepCancelled {
			t.Fatalf("plain %v: the open step is %v after the cancel, %v", plain, s, err)
		}
		if plain {
			if cs.list.Load() == 0 {
				t.Error("a store without OpenSteps: ListSteps was not read, yet the step was cancelled?")
			}
			continue
		}
		if cs.open.Load() == 0 || cs.list.Load() != 0 {
			t.Errorf("ending the execution read OpenSteps %d times and ListSteps %d times; want OpenSteps only", cs.open.Load(), cs.list.Load())
		}
	}
}
