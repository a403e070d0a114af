package kernel_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// cpuStore is a bbolt store whose Update functions are timed in CPU time
// of the thread that runs them (the store's writer), so that a benchmark
// can report the writer's work per function without the time the writer
// waited for a CPU on a busy machine.
type cpuStore struct {
	*bbolt.Store
	ns, runs atomic.Int64 // CPU nanoseconds of the functions measured, and how many
}

func (s *cpuStore) Update(ctx context.Context, fn func(kernel.Tx) error) error {
	return s.Store.Update(ctx, func(tx kernel.Tx) error {
		// Locked to its thread, the function's goroutine runs on no other
		// thread, nor does another goroutine run on this one.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		c0, ok0 := threadCPU()
		err := fn(tx)
		if c1, ok1 := threadCPU(); ok0 && ok1 {
			s.ns.Add(c1 - c0)
			s.runs.Add(1)
		}
		return err
	})
}

// report reports the functions' CPU µs per function since the mark
// (fn-cpu-µs/update), when any were measured.
func (s *cpuStore) report(b *testing.B, ns0, runs0 int64) {
	if runs := s.runs.Load() - runs0; runs > 0 {
		b.ReportMetric(float64(s.ns.Load()-ns0)/1e3/float64(runs), "fn-cpu-µs/update")
	}
}
