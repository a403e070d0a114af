package kernel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// leaseDeliverer hands every delivery to a channel: the benchmark is the
// agent.
type leaseDeliverer struct{ ch chan kernel.Delivery }

func (d leaseDeliverer) Deliver(_ context.Context, dl kernel.Delivery) error {
	d.ch <- dl
	return nil
}

// runSteps drives one execution of the kernel through n tool steps (submit
// and complete, with small args and results) and, when finish is set,
// completes it; it returns the submit latencies.
func runSteps(ctx context.Context, k *kernel.Kernel, dl kernel.Delivery, n int, finish bool) ([]time.Duration, error) {
	call := kernel.AgentCall{Tenant: dl.Tenant, ExecutionID: dl.ExecutionID, AgentID: dl.AgentID,
		Lease: kernel.Lease{DispatchID: dl.DispatchID, Attempt: dl.Attempt}}
	lat := make([]time.Duration, 0, n)
	for i := range n {
		t0 := time.Now()
		d, err := k.SubmitStep(ctx, kernel.StepRequest{AgentCall: call, Kind: "tool_call", Target: "search",
			Args: json.RawMessage(`{"q":"retention","page":` + strconv.Itoa(i) + `}`)})
		if err != nil {
			return lat, err
		}
		lat = append(lat, time.Since(t0))
		if _, err := k.CompleteStep(ctx, kernel.StepOutcome{AgentCall: call, StepID: d.StepID,
			Result: json.RawMessage(`{"hits":["a","b","c"],"n":` + strconv.Itoa(i) + `}`)}); err != nil {
			return lat, err
		}
	}
	if !finish {
		return lat, nil
	}
	_, err := k.CompleteExecution(ctx, call, json.RawMessage(`"done"`))
	return lat, err
}

// BenchmarkRetention measures what retention and compaction do with a
// store of WICKET_BENCH_STEPS steps (default 20000) in executions of
// WICKET_BENCH_STEPS_PER_EXEC steps (default 100), written by the real
// kernel: the file's size, the time a retention pass takes with the
// default batch (WICKET_BENCH_RETENTION_BATCH sets another) and pause, submit latency of steps run beside it, and the
// size after `wicket store compact`. docs/operations.md quotes it for a
// million steps.
func BenchmarkRetention(b *testing.B) {
	total := envInt("WICKET_BENCH_STEPS", 20000)
	per := envInt("WICKET_BENCH_STEPS_PER_EXEC", 100)
	for range b.N {
		path := filepath.Join(b.TempDir(), "wicket.db")
		st, err := bbolt.Open(path, bbolt.Options{})
		if err != nil {
			b.Fatal(err)
		}
		ch := make(chan kernel.Delivery, 1024)
		k, err := kernel.New(st, leaseDeliverer{ch}, nil, nil, kernel.Config{Retention: time.Hour, RetentionInterval: time.Hour, Logger: discard(),
			RetentionBatch: envInt("WICKET_BENCH_RETENTION_BATCH", 0)})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		if err := k.Start(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := k.PutAgent(ctx, kernel.Agent{ID: "a", WebhookURL: "http://127.0.0.1:9/", Secret: "bench-secret-0123456789"}); err != nil {
			b.Fatal(err)
		}
		execs := total / per
		// Ten workers fill the store.
		var wg sync.WaitGroup
		errc := make(chan error, 16)
		go func() {
			for range execs {
				if _, _, err := k.CreateExecution(ctx, kernel.CreateExecution{AgentID: "a", Input: json.RawMessage(`{}`)}); err != nil {
					errc <- err
					return
				}
			}
		}()
		var taken atomic.Int64
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for taken.Add(1) <= int64(execs) {
					if _, err := runSteps(ctx, k, <-ch, per, true); err != nil {
						errc <- err
						return
					}
				}
			}()
		}
		deadline := time.Now().Add(2 * time.Hour)
		for {
			done := 0
			_ = st.View(ctx, func(tx kernel.ReadTx) error {
				l, err := tx.ListExecutions(kernel.DefaultTenant, kernel.ExecutionFilter{Status: kernel.ExecCompleted})
				done = len(l)
				return err
			})
			if done == execs {
				wg.Wait()
				break
			}
			select {
			case err := <-errc:
				b.Fatal(err)
			default:
			}
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d executions completed", done, execs)
			}
			time.Sleep(100 * time.Millisecond)
		}
		fi, _ := os.Stat(path)
		filled := fi.Size()
		t0 := time.Now()
		if err := st.Check(); err != nil {
			b.Fatal(err)
		}
		checked := time.Since(t0)

		// Steps of one more execution, alone, then beside the purge.
		probe := func(stop func() bool) []time.Duration {
			if _, _, err := k.CreateExecution(ctx, kernel.CreateExecution{AgentID: "a", Input: json.RawMessage(`{}`)}); err != nil {
				b.Fatal(err)
			}
			dl := <-ch
			var lat []time.Duration
			for len(lat) < 100 || !stop() {
				l, err := runSteps(ctx, k, dl, 50, false)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, l...)
			}
			if _, err := runSteps(ctx, k, dl, 0, true); err != nil {
				b.Fatal(err)
			}
			slices.Sort(lat)
			return lat
		}
		alone := probe(func() bool { return true })
		var purged kernel.PurgeStats
		var purgeErr error
		var took time.Duration
		var over atomic.Bool
		go func() {
			start := time.Now()
			// An hour from now, everything that ended before the probe is past a one-hour retention.
			purged, purgeErr = kernel.PurgeAt(k, ctx, time.Now().Add(time.Hour+time.Minute))
			took = time.Since(start)
			over.Store(true)
		}()
		beside := probe(over.Load)
		if purgeErr != nil {
			b.Fatal(purgeErr)
		}
		fi, _ = os.Stat(path)
		after := fi.Size()
		_ = k.Close(ctx)
		if err := st.Check(); err != nil {
			b.Fatal(err)
		}
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
		cs, err := bbolt.Compact(path, "", time.Second)
		if err != nil {
			b.Fatal(err)
		}
		q := func(l []time.Duration, f float64) time.Duration {
			return l[int(float64(len(l)-1)*f)].Round(10 * time.Microsecond)
		}
		b.ReportMetric(float64(filled)/float64(total), "bytes/step")
		b.ReportMetric(float64(purged.Executions), "executions_purged")
		b.ReportMetric(took.Seconds(), "purge_s")
		b.ReportMetric(float64(cs.After), "compacted_bytes")
		b.Logf("%d steps in %d executions: file %s (checked in %s); purge of %d executions, %d events, %d steps in %s (file %s after); compact → %s; submit p50/p99 alone %s/%s, beside the purge %s/%s",
			total, execs, mib(filled), checked.Round(time.Millisecond), purged.Executions, purged.Events, purged.Steps, took.Round(time.Millisecond), mib(after), mib(cs.After),
			q(alone, 0.5), q(alone, 0.99), q(beside, 0.5), q(beside, 0.99))
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
