package kernel_test

import (
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// BenchmarkWriterFunctions runs a step's two calls (SubmitStep of a new
// allowed step, CompleteStep) from 10 executions at once on a bbolt store
// with fsync and its write-ahead log, as wicket bench does without HTTP,
// so that commits carry several Update functions as they do in service.
// Besides ns/op (wall time of a step, all executions together) it reports
// the store writer's time in the Update functions per function
// (fn-µs/update): the serial part of the kernel's work, which caps
// throughput when the writer is busy, and their CPU time
// (fn-cpu-µs/update, on Linux), which a busy machine disturbs less.
func BenchmarkWriterFunctions(b *testing.B) {
	const executions = 10
	bst, err := bbolt.Open(filepath.Join(b.TempDir(), "wicket.db"), bbolt.Options{})
	if err != nil {
		b.Fatal(err)
	}
	st := &cpuStore{Store: bst}
	k, calls := runningKernel(b, bst, st, executions, discard())
	ctx := context.Background()
	b.ReportAllocs()
	s0, ns0, runs0 := st.Stats(), st.ns.Load(), st.runs.Load()
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, executions)
	for _, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var args, res []byte
			for n := next.Add(1); n <= int64(b.N); n = next.Add(1) {
				args = append(strconv.AppendInt(append(args[:0], `{"n":`...), n, 10), `,"q":"bench"}`...)
				d, err := k.SubmitStep(ctx, kernel.StepRequest{AgentCall: call, Kind: "tool_call", Target: "search", Args: args})
				if err == nil && d.Decision != kernel.DecisionProceed {
					err = &kernel.Error{Code: kernel.CodeInternal, Message: "decision " + string(d.Decision)}
				}
				if err != nil {
					errc <- err
					return
				}
				res = append(strconv.AppendInt(append(res[:0], `{"n":`...), n, 10), '}')
				if _, err := k.CompleteStep(ctx, kernel.StepOutcome{AgentCall: call, StepID: d.StepID, Result: res}); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errc)
	for err := range errc {
		b.Fatal(err)
	}
	s1 := st.Stats()
	if updates := s1.Updates - s0.Updates; updates > 0 {
		b.ReportMetric((s1.Functions-s0.Functions).Seconds()*1e6/float64(updates), "fn-µs/update")
		b.ReportMetric(float64(updates)/float64(s1.Commits-s0.Commits), "updates/commit")
	}
	st.report(b, ns0, runs0)
}
