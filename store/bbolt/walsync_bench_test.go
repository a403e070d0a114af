package bbolt

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// spin keeps the busy goroutines' sums live.
var spin atomic.Int64

// BenchmarkLogAppend times the write-ahead log's append of one record the
// size of a batch of ten steps (about 14 KiB: write and fdatasync), alone
// and while other goroutines keep every core busy in short bursts, as the
// HTTP handlers and the load do during `wicket bench`. It reports the
// mean, median and 99th percentile of an append. The gap between the two
// is what the machine's scheduling adds to a durable commit, whatever the
// disk does (docs/benchmarks.md, "What a log sync costs under load").
func BenchmarkLogAppend(b *testing.B) {
	for _, busy := range []int{0, runtime.GOMAXPROCS(0)} {
		b.Run(fmt.Sprintf("busy=%d", busy), func(b *testing.B) {
			w := &wal{dir: b.TempDir(), segSize: 64 << 20, spare: make(chan spareSegment, 1)}
			b.Cleanup(func() { _ = w.close() })
			var rec walBatch
			rec.reset()
			v := make([]byte, 1400)
			for i := range 10 {
				rec.put([]byte("events"), fmt.Appendf(nil, "key-%d", i), v)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range busy {
				wg.Add(1)
				go func() {
					defer wg.Done()
					x := 0
					for {
						select {
						case <-stop:
							return
						default:
						}
						for j := range 200_000 {
							x += j
						}
						spin.Store(int64(x))
						time.Sleep(20 * time.Microsecond)
					}
				}()
			}
			took := make([]time.Duration, 0, b.N)
			b.SetBytes(int64(len(rec.buf)))
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if err := w.append(&rec); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(t0))
			}
			b.StopTimer()
			close(stop)
			wg.Wait()
			slices.Sort(took)
			var sum time.Duration
			for _, d := range took {
				sum += d
			}
			b.ReportMetric(float64(sum.Microseconds())/float64(len(took)), "mean-µs")
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
		})
	}
}
