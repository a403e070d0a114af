// Package cpubench adds a CPU-time metric to benchmarks: the process CPU
// time per iteration, which unlike ns/op does not grow when other processes
// compete for the machine (a shared 2-core machine is never idle).
package cpubench

import "testing"

// Report adds a cpu-ns/op metric to b, measured from now until b ends:
// call it after the setup, right before the loop.
func Report(b *testing.B) {
	start := cpuTime()
	b.Cleanup(func() {
		if b.N > 0 {
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
		}
	})
}
