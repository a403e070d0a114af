package wasm

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/plugins/bundle"
)

// TestConcurrentEvaluations hammers one evaluator of each SDK from many
// goroutines (run it with -race) and checks every answer and the pool bound.
func TestConcurrentEvaluations(t *testing.T) {
	const (
		workers = 16
		iters   = 40
		pool    = 4
	)
	e := newEngine(t, Config{Limits: bundle.Limits{PoolSize: pool}})
	for _, m := range []struct {
		name string
		wasm func(testing.TB) []byte
	}{{"go", goPolicy}, {"c", cPolicy}} {
		t.Run(m.name, func(t *testing.T) {
			ev := compile(t, e, newBundle(m.name, m.wasm(t), relaxed))
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range iters {
						c := sdkCases[(w+i)%len(sdkCases)]
						d, err := ev.Evaluate(context.Background(), c.in)
						if err != nil {
							errs <- fmt.Errorf("worker %d: %s: %w", w, c.name, err)
							return
						}
						if (d == nil) != (c.action == "") || (d != nil && (d.Action != c.action || d.RuleID != c.rule)) {
							errs <- fmt.Errorf("worker %d: %s: got %+v, want %s/%s", w, c.name, d, c.action, c.rule)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if n := ev.instances.Load(); n < 1 || n > pool {
				t.Errorf("instances = %d, want 1..%d", n, pool)
			}
		})
	}
}

// TestTrappedInstanceNotReused counts instantiations around a trap.
func TestTrappedInstanceNotReused(t *testing.T) {
	e := newEngine(t, Config{Limits: bundle.Limits{PoolSize: 1}})
	ev := compile(t, e, newBundle("trap", conditional(trap), bundle.Sandbox{}))
	count := func(want int64) {
		t.Helper()
		if got := ev.instances.Load(); got != want {
			t.Fatalf("instances = %d, want %d", got, want)
		}
	}
	count(1) // Compile instantiates one to prove the module starts
	for range 3 {
		wantDecision(t, ev, smallInput(), "allow", "ok")
	}
	count(1) // reused
	wantError(t, ev, bigInput(), "wasm: trap: unreachable")
	count(1) // discarded, nothing new yet
	wantDecision(t, ev, smallInput(), "allow", "ok")
	count(2) // a fresh one
	wantDecision(t, ev, smallInput(), "allow", "ok")
	count(2)
}

// TestPoolBound: with one instance busy in an infinite loop, another
// evaluation waits and gives up when its context ends.
func TestPoolBound(t *testing.T) {
	e := newEngine(t, Config{Limits: bundle.Limits{PoolSize: 1}})
	// The loop holds the instance until its deadline: long enough, even on
	// a loaded machine, for the second evaluation to wait and give up.
	ev := compile(t, e, newBundle("loop", conditional(infiniteLoop), bundle.Sandbox{Timeout: "2s"}))
	done := make(chan error, 1)
	go func() {
		_, err := ev.Evaluate(context.Background(), bigInput())
		done <- err
	}()
	// Gate: the loop has taken the only slot.
	deadline := time.Now().Add(10 * time.Second)
	for len(ev.slots) < cap(ev.slots) {
		if time.Now().After(deadline) {
			t.Fatal("the looping evaluation never took the instance")
		}
		runtime.Gosched()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := ev.Evaluate(ctx, smallInput())
	if err == nil || !strings.Contains(err.Error(), "wasm: waiting for a free instance: context deadline exceeded") {
		t.Fatalf("second evaluation: %v", err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("looping evaluation: %v", err)
	}
	wantDecision(t, ev, smallInput(), "allow", "ok")
}

// TestCloseWhileEvaluating closes an evaluator with evaluations in flight.
func TestCloseWhileEvaluating(t *testing.T) {
	e := newEngine(t, Config{Limits: bundle.Limits{PoolSize: 4}})
	ev, err := e.Compile(context.Background(), newBundle("c", cPolicy(t), bundle.Sandbox{}))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var evaluated atomic.Int64
	running := make(chan struct{}) // closed once every worker has evaluated once
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if _, err := ev.Evaluate(context.Background(), sdkCases[0].in); err != nil {
					if !strings.Contains(err.Error(), "closed") {
						t.Errorf("unexpected error: %v", err)
					}
					return
				}
				if i == 0 && evaluated.Add(1) == 8 {
					close(running)
				}
			}
		}()
	}
	<-running // every worker is mid-loop: Close lands among evaluations in flight
	if err := ev.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}
