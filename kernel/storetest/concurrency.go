package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// writeEverything writes one record of every kind, for the rollback tests.
func writeEverything(tx kernel.Tx) error {
	e := newExecution("t", execID(1))
	e.IdempotencyKey = "k"
	e.Dispatch = kernel.DispatchState{ID: "d", State: kernel.DispatchQueued, DueAt: t0}
	if err := create(tx, e); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if err := tx.PutStep(&kernel.Step{ID: "s", ExecutionID: e.ID, Tenant: "t", Kind: "local", Target: "x", Seq: 1, CreatedAt: t0}); err != nil {
		return fmt.Errorf("PutStep: %w", err)
	}
	if err := tx.PutOccurrence("t", e.ID, "k", kernel.Occurrence{Count: 1}); err != nil {
		return fmt.Errorf("PutOccurrence: %w", err)
	}
	if err := tx.PutAgent(&kernel.Agent{ID: "a", Tenant: "t", CreatedAt: t0, UpdatedAt: t0}); err != nil {
		return fmt.Errorf("PutAgent: %w", err)
	}
	if err := tx.PutApproval(approval("t", "ap", 0, kernel.ApprovalPending, 0)); err != nil {
		return fmt.Errorf("PutApproval: %w", err)
	}
	if err := tx.PutBundle(&kernel.BundleRecord{Tenant: "t", Name: "b", UpdatedAt: t0}); err != nil {
		return fmt.Errorf("PutBundle: %w", err)
	}
	if err := tx.PutCounter("t", "c", []byte("1")); err != nil {
		return fmt.Errorf("PutCounter: %w", err)
	}
	if err := tx.PutTenant(&kernel.Tenant{ID: "t", CreatedAt: t0}); err != nil {
		return fmt.Errorf("PutTenant: %w", err)
	}
	if err := tx.PutAPIKey(&kernel.APIKey{ID: "key", Tenant: "t", Hash: "h", CreatedAt: t0}); err != nil {
		return fmt.Errorf("PutAPIKey: %w", err)
	}
	return nil
}

// wantNothing fails if anything writeEverything writes is visible.
func wantNothing(t *testing.T, s kernel.Store) {
	t.Helper()
	view(t, s, func(tx kernel.ReadTx) error {
		checks := []struct {
			name string
			fn   func() (bool, error)
		}{
			{"Execution", func() (bool, error) { return found(tx.Execution("t", execID(1))) }},
			{"ExecutionTenant", func() (bool, error) { return found(tx.ExecutionTenant(execID(1))) }},
			{"ExecutionByIdempotencyKey", func() (bool, error) { return found(tx.ExecutionByIdempotencyKey("t", "k")) }},
			{"ListExecutions", func() (bool, error) { return nonEmpty(tx.ListExecutions("t", kernel.ExecutionFilter{})) }},
			{"Events", func() (bool, error) { return nonEmpty(tx.Events("t", execID(1), 0, 0)) }},
			{"Step", func() (bool, error) { return found(tx.Step("t", execID(1), "s")) }},
			{"Occurrence", func() (bool, error) {
				o, err := tx.Occurrence("t", execID(1), "k")
				return o.Count != 0, err
			}},
			{"Agent", func() (bool, error) { return found(tx.Agent("t", "a")) }},
			{"Approval", func() (bool, error) { return found(tx.Approval("t", "ap")) }},
			{"ExpiredApprovals", func() (bool, error) { return nonEmpty(tx.ExpiredApprovals(at(time.Hour), 0)) }},
			{"DueDispatches", func() (bool, error) { return nonEmpty(tx.DueDispatches(at(time.Hour), 0)) }},
			{"Bundle", func() (bool, error) { return found(tx.Bundle("t", "b")) }},
			{"Counter", func() (bool, error) { v, err := tx.Counter("t", "c"); return v != nil, err }},
			{"Tenant", func() (bool, error) { return found(tx.Tenant("t")) }},
			{"APIKeyByHash", func() (bool, error) { return found(tx.APIKeyByHash("h")) }},
		}
		for _, c := range checks {
			if visible, err := c.fn(); visible || err != nil {
				t.Errorf("%s: a rolled-back write is visible (err %v)", c.name, err)
			}
		}
		return nil
	})
}

var errBoom = errors.New("boom")

func testRollbackOnError(t *testing.T, s kernel.Store) {
	err := s.Update(t.Context(), func(tx kernel.Tx) error {
		if err := writeEverything(tx); err != nil {
			return err
		}
		return fmt.Errorf("kernel gave up: %w", errBoom)
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("Update returned %v, want fn's error", err)
	}
	wantNothing(t, s)
}

func testRollbackOnPanic(t *testing.T, s kernel.Store) {
	err := s.Update(t.Context(), func(tx kernel.Tx) error {
		if err := writeEverything(tx); err != nil {
			return err
		}
		panic("kernel bug")
	})
	if err == nil {
		t.Fatal("Update of a panicking fn returned nil")
	}
	wantNothing(t, s)
	// The store still works.
	update(t, s, func(tx kernel.Tx) error { return tx.PutCounter("t", "after", []byte("1")) })
	view(t, s, func(tx kernel.ReadTx) error {
		v, err := tx.Counter("t", "after")
		if string(v) != "1" {
			t.Errorf("write after a panic: %q, %v", v, err)
		}
		return err
	})
}

func testCancelledContext(t *testing.T, s kernel.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutCounter("t", "c", []byte("1")) })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Update with a cancelled context: %v, want context.Canceled", err)
	}
	err = s.View(ctx, func(tx kernel.ReadTx) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("View with a cancelled context: %v, want context.Canceled", err)
	}
	view(t, s, func(tx kernel.ReadTx) error {
		if v, _ := tx.Counter("t", "c"); v != nil {
			t.Errorf("Update with a cancelled context wrote %q", v)
		}
		return nil
	})
}

// testHammer: P goroutines × N read-modify-write increments through Update;
// no increment may be lost or applied twice.
func testHammer(t *testing.T, s kernel.Store) {
	const p, n = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, p*n)
	for g := range p {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := "g" + strconv.Itoa(g)
			for range n {
				errs <- s.Update(context.Background(), func(tx kernel.Tx) error {
					if err := addInt(tx, "t", "total", 1); err != nil {
						return err
					}
					return addInt(tx, "t", mine, 1)
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Update: %v", err)
		}
	}
	view(t, s, func(tx kernel.ReadTx) error {
		total, err := readInt(tx, "t", "total")
		if err != nil {
			return fmt.Errorf("total: %w", err)
		}
		if total != p*n {
			t.Errorf("total = %d, want %d", total, p*n)
		}
		for g := range p {
			v, err := readInt(tx, "t", "g"+strconv.Itoa(g))
			if err != nil {
				return fmt.Errorf("per goroutine: %w", err)
			}
			if v != n {
				t.Errorf("goroutine %d: %d increments, want %d", g, v, n)
			}
		}
		return nil
	})
}

// testBatchWithFailures queues many Updates behind a slow one, so that a
// group-committing store takes them as one batch, and makes some of them
// fail or panic. The others must commit, each exactly once.
func testBatchWithFailures(t *testing.T, s kernel.Store) {
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	blocker := make(chan error, 1)
	go func() {
		blocker <- s.Update(context.Background(), func(tx kernel.Tx) error {
			once.Do(func() { close(started) })
			<-release
			return tx.PutCounter("t", "blocker", []byte("1"))
		})
	}()
	<-started

	const k = 24
	results := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = s.Update(context.Background(), func(tx kernel.Tx) error {
				if err := tx.PutCounter("t", "c"+strconv.Itoa(i), []byte("1")); err != nil {
					return err
				}
				if err := addInt(tx, "t", "sum", 1); err != nil {
					return err
				}
				switch i % 4 {
				case 1:
					return fmt.Errorf("update %d: %w", i, errBoom)
				case 3:
					panic(fmt.Sprintf("update %d", i))
				}
				return nil
			})
		}()
	}
	time.Sleep(50 * time.Millisecond) // let them queue up behind the blocker
	close(release)
	wg.Wait()
	if err := <-blocker; err != nil {
		t.Fatalf("blocker: %v", err)
	}
	ok := 0
	for i, err := range results {
		switch i % 4 {
		case 1:
			if !errors.Is(err, errBoom) {
				t.Errorf("update %d: %v, want its own error", i, err)
			}
		case 3:
			if err == nil {
				t.Errorf("update %d panicked but returned nil", i)
			}
		default:
			ok++
			if err != nil {
				t.Errorf("update %d: %v, want nil (another update of its batch failed)", i, err)
			}
		}
	}
	view(t, s, func(tx kernel.ReadTx) error {
		for i := range k {
			v, err := tx.Counter("t", "c"+strconv.Itoa(i))
			if err != nil {
				return fmt.Errorf("tx.Counter: %w", err)
			}
			if committed, want := v != nil, i%4 == 0 || i%4 == 2; committed != want {
				t.Errorf("update %d: committed %v, want %v", i, committed, want)
			}
		}
		sum, err := readInt(tx, "t", "sum")
		if err != nil {
			return fmt.Errorf("sum: %w", err)
		}
		if sum != ok {
			t.Errorf("sum = %d, want %d (a retried update was applied twice or lost)", sum, ok)
		}
		return nil
	})
}

// testSnapshotReads: readers running beside a writer always see both
// halves of each write.
func testSnapshotReads(t *testing.T, s kernel.Store) {
	const writes, readers = 40, 4
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				err := s.View(context.Background(), func(tx kernel.ReadTx) error {
					x, err := readInt(tx, "t", "x")
					if err != nil {
						return err
					}
					y, err := readInt(tx, "t", "y")
					if err != nil {
						return err
					}
					if x != y {
						return fmt.Errorf("torn read: x=%d y=%d", x, y)
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for i := 1; i <= writes; i++ {
		update(t, s, func(tx kernel.Tx) error {
			if err := tx.PutCounter("t", "x", []byte(strconv.Itoa(i))); err != nil {
				return err
			}
			return tx.PutCounter("t", "y", []byte(strconv.Itoa(i)))
		})
	}
	close(done)
	wg.Wait()
}
