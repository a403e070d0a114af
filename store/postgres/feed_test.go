package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/postgres"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
)

// follow runs s.Follow until the test ends and returns the changes it hears.
func follow(t *testing.T, s *postgres.Store) <-chan kernel.Change {
	t.Helper()
	ch := make(chan kernel.Change, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Follow(ctx, func(c kernel.Change) { ch <- c })
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

func next(t *testing.T, ch <-chan kernel.Change) kernel.Change {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(30 * time.Second):
		t.Fatal("no change heard")
		return kernel.Change{}
	}
}

// TestFeed: what one store commits, another store sharing the database
// hears, once committed; a rolled-back write is never heard, and a store
// does not hear itself.
func TestFeed(t *testing.T) {
	_, dsn := pgtest.Schema(t)
	a, b := open(t, dsn, postgres.Options{}), open(t, dsn, postgres.Options{})
	heardByB, heardByA := follow(t, b), follow(t, a)
	if c := next(t, heardByB); !c.All {
		t.Fatalf("first change %+v, want All (the feed just connected)", c)
	}
	if c := next(t, heardByA); !c.All {
		t.Fatalf("first change %+v, want All", c)
	}

	// Rolled back: nothing is sent.
	_ = a.Update(context.Background(), func(tx kernel.Tx) error {
		if err := create(tx, "t", "rolled-back"); err != nil {
			return err
		}
		return context.Canceled
	})
	update(t, a, func(tx kernel.Tx) error {
		if err := create(tx, "t", "e1"); err != nil {
			return err
		}
		e, err := tx.Execution("t", "e1")
		if err != nil {
			return err
		}
		e.Dispatch = kernel.DispatchState{ID: "d", State: kernel.DispatchQueued, DueAt: time.Now()}
		if err := tx.PutExecution(e); err != nil {
			return err
		}
		if err := tx.PutAgent(&kernel.Agent{ID: "ag", Tenant: "t"}); err != nil {
			return err
		}
		return tx.PutBundle(&kernel.BundleRecord{Tenant: "t", Name: "bu"})
	})
	c := next(t, heardByB)
	if !slices.Equal(c.Executions, []string{"e1"}) || !c.Dispatch || c.All ||
		!slices.Equal(c.Agents, []kernel.Ref{{Tenant: "t", Name: "ag"}}) || !slices.Equal(c.Bundles, []kernel.Ref{{Tenant: "t", Name: "bu"}}) {
		t.Errorf("B heard %+v", c)
	}
	// A dispatch queued and claimed in one transaction is no news to the
	// other dispatchers.
	update(t, a, func(tx kernel.Tx) error {
		if err := create(tx, "t", "e2"); err != nil {
			return err
		}
		e, err := tx.Execution("t", "e2")
		if err != nil {
			return err
		}
		e.Dispatch = kernel.DispatchState{ID: "d", State: kernel.DispatchQueued, DueAt: time.Now()}
		if err := tx.PutExecution(e); err != nil {
			return err
		}
		e.Dispatch.State, e.Dispatch.Attempt = kernel.DispatchDelivering, 1
		return tx.PutExecution(e)
	})
	if c := next(t, heardByB); !slices.Equal(c.Executions, []string{"e2"}) || c.Dispatch {
		t.Errorf("B heard %+v, want e2 and no queued dispatch", c)
	}
	// Many executions in one commit are split across notifications, all heard.
	const n = 400
	update(t, a, func(tx kernel.Tx) error {
		for i := range n {
			if err := create(tx, "t", fmt.Sprintf("bulk-%03d", i)); err != nil {
				return err
			}
		}
		return nil
	})
	seen := 0
	for seen < n {
		seen += len(next(t, heardByB).Executions)
	}
	if seen != n {
		t.Errorf("B heard %d executions, want %d", seen, n)
	}
	// B's own writes are heard by A, not by B.
	update(t, b, func(tx kernel.Tx) error { return tx.DeleteAgent("t", "ag") })
	if c := next(t, heardByA); !slices.Equal(c.Agents, []kernel.Ref{{Tenant: "t", Name: "ag"}}) {
		t.Errorf("A heard %+v", c)
	}
	select {
	case c := <-heardByB:
		t.Errorf("B heard its own write or a rolled-back one: %+v", c)
	case <-time.After(200 * time.Millisecond):
	}
}
