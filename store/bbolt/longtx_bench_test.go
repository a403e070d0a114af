package bbolt

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// BenchmarkViewLatencyUnderWrites measures how long a point View takes
// while 8 writers keep the writer busy, with the writer's transaction
// kept open across batches (Views read it under s.mu, waiting for a batch
// and its log sync) and with one commit per batch (Views read the file).
func BenchmarkViewLatencyUnderWrites(b *testing.B) {
	for _, c := range []struct {
		name     string
		interval time.Duration
	}{{"open-tx", 0}, {"per-batch", -1}} {
		b.Run(c.name, func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "wicket.db"), Options{WAL: true, CommitInterval: c.interval})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						_ = s.Update(ctx, func(tx kernel.Tx) error {
							return tx.PutCounter("t", fmt.Sprint("w", w, "-", i%100), make([]byte, 200))
						})
					}
				}()
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				_ = s.View(ctx, func(tx kernel.ReadTx) error { _, err := tx.Counter("t", "w0-1"); return err })
				lat = append(lat, time.Since(t0))
				time.Sleep(200 * time.Microsecond)
			}
			b.StopTimer()
			close(stop)
			wg.Wait()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			st := s.Stats()
			b.ReportMetric(float64(st.Updates)/float64(max(st.Commits, 1)), "upd/commit")
		})
	}
}
