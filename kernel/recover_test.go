package kernel_test

// Recovery at start: the deliveries a stopped kernel left in flight are
// delivered again, and only those, never one the new process has just
// started.

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// recoveryGate is a store that holds the kernel's recovery scan
// (ExpiredLeases asked about a time far past the clock: every lease,
// expired or not) until the test releases it, and reports when the
// dispatcher first looks for due dispatches (which it does only after
// recovery). The scan is held outside any transaction (a read transaction
// held open would stall a writer that grows the file): its first run is
// abandoned, and the read runs again, in a new transaction, once released.
type recoveryGate struct {
	kernel.Store
	clock    *clock
	entered  chan struct{} // closed when the recovery scan is reached
	release  chan struct{} // closed by the test to let it run
	claiming chan struct{} // closed when the dispatcher first looks for due dispatches
	held     atomic.Bool
	claimed  sync.Once
}

// errHeld abandons the first run of the recovery scan's read.
var errHeld = errors.New("recovery scan held by the test")

func (g *recoveryGate) View(ctx context.Context, fn func(tx kernel.ReadTx) error) error {
	err := g.Store.View(ctx, func(tx kernel.ReadTx) error { return fn(gatedTx{tx, g}) })
	if !errors.Is(err, errHeld) {
		return err
	}
	close(g.entered)
	<-g.release
	return g.Store.View(ctx, func(tx kernel.ReadTx) error { return fn(gatedTx{tx, g}) })
}

type gatedTx struct {
	kernel.ReadTx
	g *recoveryGate
}

func (t gatedTx) ExpiredLeases(now time.Time, limit int) ([]kernel.DispatchRef, error) {
	if now.After(t.g.clock.Now().Add(50*365*24*time.Hour)) && t.g.held.CompareAndSwap(false, true) {
		return nil, errHeld
	}
	return t.ReadTx.ExpiredLeases(now, limit)
}

func (t gatedTx) DueDispatches(now time.Time, limit int) ([]kernel.DispatchRef, error) {
	t.g.claimed.Do(func() { close(t.g.claiming) })
	return t.ReadTx.DueDispatches(now, limit)
}

// heldDeliverer reports each webhook and holds it until open is closed or
// the kernel stops.
type heldDeliverer struct {
	got  chan kernel.Delivery
	open chan struct{}
}

func (d *heldDeliverer) Deliver(ctx context.Context, dl kernel.Delivery) error {
	d.got <- dl
	select {
	case <-d.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func openStore(t *testing.T, path string) kernel.Store {
	t.Helper()
	st, err := bbolt.Open(path, bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func dispatchEvents(t *testing.T, k *kernel.Kernel, id string) (claimed, superseded []map[string]any) {
	t.Helper()
	evs, err := k.Events(context.Background(), kernel.DefaultTenant, id, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		var p map[string]any
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case kernel.EvDispatchClaimed:
			claimed = append(claimed, p)
		case kernel.EvDispatchSuperseded:
			superseded = append(superseded, p)
		}
	}
	return claimed, superseded
}

func waitExec(t *testing.T, k *kernel.Kernel, id string, ok func(*kernel.Execution) bool) *kernel.Execution {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		e, err := k.GetExecution(context.Background(), kernel.DefaultTenant, id)
		if err != nil {
			t.Fatal(err)
		}
		if ok(e) {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s never reached the expected state; it is %s, dispatch %+v", id, e.Status, e.Dispatch)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func recvDelivery(t *testing.T, got <-chan kernel.Delivery) kernel.Delivery {
	t.Helper()
	select {
	case d := <-got:
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery")
		return kernel.Delivery{}
	}
}

// TestRecoveryLeavesNewDeliveriesAlone: an execution created while the
// kernel is starting is delivered once. Recovery runs before the kernel
// claims anything, so it cannot take the new process's own delivery, still
// in flight, for one a stopped process left behind and deliver it again.
func TestRecoveryLeavesNewDeliveriesAlone(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)}
	g := &recoveryGate{Store: openStore(t, filepath.Join(t.TempDir(), "wicket.db")), clock: clk,
		entered: make(chan struct{}), release: make(chan struct{}), claiming: make(chan struct{})}
	t.Cleanup(func() { _ = g.Store.Close() })
	dv := &heldDeliverer{got: make(chan kernel.Delivery, 16), open: make(chan struct{})}
	k, err := kernel.New(g, dv, &script{}, nil, kernel.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := k.PutAgent(ctx, kernel.Agent{ID: agentID, WebhookURL: "http://127.0.0.1:1/webhook", Secret: agentSecret}); err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- k.Start(ctx) }()
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := k.Close(cctx); err != nil {
			t.Errorf("close kernel: %v", err)
		}
	})
	<-g.entered // recovery is about to scan
	e, _, err := k.CreateExecution(ctx, kernel.CreateExecution{AgentID: agentID, Input: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	close(g.release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	<-g.claiming // recovery is over: the dispatcher runs after it
	d := recvDelivery(t, dv.got)
	if d.ExecutionID != e.ID || d.Attempt != 1 {
		t.Fatalf("delivery %+v, want attempt 1 of %s", d, e.ID)
	}
	close(dv.open)
	got := waitExec(t, k, e.ID, func(e *kernel.Execution) bool { return e.Dispatch.State == kernel.DispatchAcked })
	claimed, superseded := dispatchEvents(t, k, e.ID)
	if got.Dispatch.Attempt != 1 || len(claimed) != 1 || len(superseded) != 0 {
		t.Errorf("dispatch %+v after %d claims, superseded %v: want attempt 1 delivered once", got.Dispatch, len(claimed), superseded)
	}
}

// TestRecoveryRedeliversAfterRestart: a delivery in flight when the kernel
// stopped is delivered again, as the next attempt, as soon as a kernel
// starts on the store, without waiting for its lease.
func TestRecoveryRedeliversAfterRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wicket.db")
	clk := &clock{t: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)}
	ctx := context.Background()
	st := openStore(t, path)
	dv := &heldDeliverer{got: make(chan kernel.Delivery, 16), open: make(chan struct{})} // never opened: killed mid-delivery
	k, err := kernel.New(st, dv, &script{}, nil, kernel.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := k.PutAgent(ctx, kernel.Agent{ID: agentID, WebhookURL: "http://127.0.0.1:1/webhook", Secret: agentSecret}); err != nil {
		t.Fatal(err)
	}
	e, _, err := k.CreateExecution(ctx, kernel.CreateExecution{AgentID: agentID, Input: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if d := recvDelivery(t, dv.got); d.ExecutionID != e.ID || d.Attempt != 1 {
		t.Fatalf("delivery %+v, want attempt 1 of %s", d, e.ID)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := k.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = openStore(t, path)
	t.Cleanup(func() { _ = st.Close() })
	dv2 := &heldDeliverer{got: make(chan kernel.Delivery, 16), open: make(chan struct{})}
	close(dv2.open)
	k2, err := kernel.New(st, dv2, &script{}, nil, kernel.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := k2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := k2.Close(cctx); err != nil {
			t.Errorf("close kernel: %v", err)
		}
	})
	if d := recvDelivery(t, dv2.got); d.ExecutionID != e.ID || d.Attempt != 2 {
		t.Fatalf("delivery after restart %+v, want attempt 2 of %s", d, e.ID)
	}
	got := waitExec(t, k2, e.ID, func(e *kernel.Execution) bool { return e.Dispatch.State == kernel.DispatchAcked })
	_, superseded := dispatchEvents(t, k2, e.ID)
	if got.Dispatch.Attempt != 2 || len(superseded) != 1 || superseded[0]["reason"] != "kernel_restart" || superseded[0]["dispatch_attempt"] != float64(1) {
		t.Errorf("dispatch %+v, superseded %v: want attempt 1 superseded by kernel_restart, attempt 2 acked", got.Dispatch, superseded)
	}
}
