package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// BenchmarkSessionSubmitComplete is BenchmarkStepSubmitComplete for session
// holders: one op = one step proposed and completed over HTTP by the
// bearer key that holds the session's lease (the key is looked up and the
// holder checked before each body is read), fsync on. Compare with
// BenchmarkStepSubmitComplete in the same run.
func BenchmarkSessionSubmitComplete(b *testing.B) {
	for _, conc := range []int{1, 10} {
		b.Run(fmt.Sprintf("sessions=%d", conc), func(b *testing.B) {
			env := testkit.Start(b, testkit.Options{})
			admin := client.New(env.URL, client.WithAPIKey(testkit.AdminKey))
			ctx := context.Background()
			if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "loop", Secret: secret}); err != nil {
				b.Fatal(err)
			}
			k, err := admin.CreateKey(ctx, "default", wire.KeyRequest{Role: "client", Principal: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			c := client.New(env.URL, client.WithAPIKey(k.Key),
				client.WithHTTPClient(&http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}))
			type sess struct {
				id  string
				hdr http.Header
			}
			ss := make([]sess, conc)
			for i := range ss {
				s, err := c.BeginSession(ctx, client.SessionRequest{AgentID: "loop"})
				if err != nil {
					b.Fatal(err)
				}
				ss[i] = sess{s.Execution.ID, http.Header{wire.HeaderDispatchID: {s.DispatchID}, wire.HeaderDispatchAttempt: {strconv.Itoa(s.DispatchAttempt)}}}
			}
			var next, idx atomic.Int64
			lat := make([][]time.Duration, conc)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := range conc {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := ss[idx.Add(1)-1]
					for {
						n := next.Add(1)
						if n > int64(b.N) {
							return
						}
						var d wire.StepDecision
						t0 := time.Now()
						if err := c.Do(ctx, "POST", "/v0/executions/"+s.id+"/steps", s.hdr,
							map[string]any{"kind": "tool_call", "target": "read", "args": map[string]any{"q": "benchmark", "n": n}}, &d); err != nil {
							b.Error(err)
							return
						}
						lat[w] = append(lat[w], time.Since(t0))
						if d.Decision != wire.DecisionProceed {
							b.Errorf("decision %+v", d)
							return
						}
						if err := c.Do(ctx, "POST", "/v0/executions/"+s.id+"/steps/"+d.StepID+"/complete", s.hdr,
							map[string]any{"result": map[string]any{"hits": n}}, nil); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			var all []time.Duration
			for _, l := range lat {
				all = append(all, l...)
			}
			b.ReportMetric(float64(b.N)/el.Seconds(), "steps/s")
			if p := percentile(all, 0.99); p > 0 {
				b.ReportMetric(float64(p.Microseconds()), "submit-p99-µs")
				b.ReportMetric(float64(percentile(all, 0.5).Microseconds()), "submit-p50-µs")
			}
		})
	}
}
