package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/plugins/worker"
	"github.com/wicket-run/wicket/server/wire"
	"github.com/wicket-run/wicket/store/bbolt"
)

// leaseAgent is an agent that acknowledges webhooks and hands the leases to
// the benchmark, which then drives the protocol itself.
func leaseAgent(b *testing.B, env *testkit.Env, id string, bundleName ...string) (*testkit.Agent, chan wire.WebhookPayload) {
	leases := make(chan wire.WebhookPayload, 1024)
	a := testkit.NewAgent(id, secret, env.URL, nil)
	a.Fail = func(p wire.WebhookPayload) int { leases <- p; return http.StatusAccepted }
	a.Client.HTTP = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	env.RegisterAgent(a, strings.Join(bundleName, ""))
	b.Cleanup(a.Close)
	return a, leases
}

// benchSubmitComplete measures submit + complete over HTTP with `conc`
// executions driven concurrently, fsync on.
func benchSubmitComplete(b *testing.B, conc int, setup func(env *testkit.Env) string, engines ...plugins.Engine) {
	env := testkit.Start(b, testkit.Options{Engines: engines})
	bundleName := ""
	if setup != nil {
		bundleName = setup(env)
	}
	agent, leases := leaseAgent(b, env, "bench", bundleName)
	type ex struct {
		id    string
		lease kernel.Lease
	}
	exs := make([]ex, conc)
	for i := range conc {
		env.CreateExecution("bench", i)
	}
	for i := range conc {
		p := <-leases
		exs[i] = ex{p.ExecutionID, kernel.Lease{DispatchID: p.DispatchID, Attempt: p.DispatchAttempt}}
	}
	var next atomic.Int64
	var idx atomic.Int64
	lat := make([][]time.Duration, conc)
	b.ResetTimer()
	st0 := env.Bolt.Stats()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := exs[idx.Add(1)-1]
			ctx := context.Background()
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				var d kernel.StepDecision
				t0 := time.Now()
				if err := agent.Client.Do(ctx, "POST", "/v0/executions/"+e.id+"/steps", &e.lease,
					map[string]any{"kind": "tool_call", "target": "read", "args": map[string]any{"q": "benchmark", "n": n}}, &d); err != nil {
					b.Error(err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				if d.Decision != kernel.DecisionProceed {
					b.Errorf("decision %+v", d)
					return
				}
				if err := agent.Client.Do(ctx, "POST", "/v0/executions/"+e.id+"/steps/"+d.StepID+"/complete", &e.lease,
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
	st1 := env.Bolt.Stats()
	if c := st1.Commits - st0.Commits; c > 0 {
		b.ReportMetric(float64(st1.Updates-st0.Updates)/float64(c), "updates/commit")
		b.ReportMetric(float64(st1.DB.TxStats.GetWrite()-st0.DB.TxStats.GetWrite())/float64(c), "page-writes/commit")
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "steps/s")
	if p := percentile(all, 0.99); p > 0 {
		b.ReportMetric(float64(p.Microseconds()), "submit-p99-µs")
		b.ReportMetric(float64(percentile(all, 0.5).Microseconds()), "submit-p50-µs")
	}
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*q)]
}

// BenchmarkStepSubmitComplete: one op = one step submitted and completed
// over HTTP (two signed requests, two fsynced commits shared by group commit).
func BenchmarkStepSubmitComplete(b *testing.B) {
	for _, conc := range []int{1, 10, 32} {
		b.Run(fmt.Sprintf("executions=%d", conc), func(b *testing.B) { benchSubmitComplete(b, conc, nil) })
	}
}

// BenchmarkStepSubmitEngine is BenchmarkStepSubmitComplete with each
// engine's form of the e2e decision policy in the path (10 executions);
// "rego-worker" is the Rego engine as serve runs it, in the tenant's worker
// process.
func BenchmarkStepSubmitEngine(b *testing.B) {
	type benchCase struct {
		name string
		engineCase
	}
	var cases []benchCase
	for _, ec := range policyEngines() {
		cases = append(cases, benchCase{ec.engine, ec})
		if ec.engine == "rego" {
			w := ec
			w.eng = func() plugins.Engine {
				return worker.New(worker.Config{Name: "rego", Command: []string{wicketBinary(b), "policy-worker"}})
			}
			cases = append(cases, benchCase{"rego-worker", w})
		}
	}
	for _, bc := range cases {
		ec := bc.engineCase
		b.Run(bc.name, func(b *testing.B) {
			var archive []byte
			if ec.archive != nil {
				archive = ec.archive(b)
			}
			setup := func(env *testkit.Env) string {
				var err error
				if archive != nil {
					_, err = testkit.BearerWithHeaders(env.URL, testkit.AdminKey, "PUT", "/v0/bundles/decisions", map[string]string{"Content-Type": "application/gzip"}, archive, nil)
				} else {
					_, err = env.Admin("PUT", "/v0/bundles/decisions", map[string]any{"engine": ec.engine, "files": ec.files}, nil)
				}
				if err != nil {
					b.Fatal(err)
				}
				return "decisions"
			}
			benchSubmitComplete(b, 10, setup, ec.eng())
		})
	}
}

// BenchmarkReplay measures replaying one recorded step (the lookup plus the
// occurrence counter's commit) in executions whose history holds 100, 1000
// and 10000 steps: the cost must not grow with history length.
func BenchmarkReplay(b *testing.B) {
	for _, hist := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("history=%d", hist), func(b *testing.B) {
			env := testkit.Start(b, testkit.Options{Config: kernel.Config{LeaseTimeout: 200 * time.Millisecond, DispatchTimeout: 100 * time.Millisecond, ReapInterval: 10 * time.Millisecond, DispatchMaxAttempts: 1 << 30}})
			_, leases := leaseAgent(b, env, "replayer")
			id := env.CreateExecution("replayer", nil)
			p := <-leases
			k := env.Kernel
			ctx := context.Background()
			call := kernel.AgentCall{Tenant: "default", ExecutionID: id, AgentID: "replayer", Lease: kernel.Lease{DispatchID: p.DispatchID, Attempt: p.DispatchAttempt}}
			// Record the history (every mutation renews the lease).
			for i := range hist {
				d, err := k.SubmitStep(ctx, kernel.StepRequest{AgentCall: call, Kind: "tool_call", Target: "t", Args: []byte(fmt.Sprintf(`{"i":%d}`, i))})
				if err != nil || d.Decision != kernel.DecisionProceed {
					b.Fatalf("record %d: %+v %v", i, d, err)
				}
				if _, err := k.CompleteStep(ctx, kernel.StepOutcome{AgentCall: call, StepID: d.StepID, Result: []byte(`{"ok":true}`)}); err != nil {
					b.Fatal(err)
				}
			}
			// Let the lease lapse: the next attempt replays.
			p = <-leases
			call.Lease = kernel.Lease{DispatchID: p.DispatchID, Attempt: p.DispatchAttempt}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				d, err := k.SubmitStep(ctx, kernel.StepRequest{AgentCall: call, Kind: "tool_call", Target: "t", Args: []byte(fmt.Sprintf(`{"i":%d}`, i%hist))})
				if err != nil {
					b.Fatal(err)
				}
				if d.Decision != kernel.DecisionReplay {
					b.Fatalf("op %d: %+v", i, d)
				}
				if i%hist == hist-1 {
					b.StopTimer() // a full pass replayed; the next needs a new attempt
					p = <-leases
					call.Lease = kernel.Lease{DispatchID: p.DispatchID, Attempt: p.DispatchAttempt}
					b.StartTimer()
				}
			}
		})
	}
}

// BenchmarkKernelSubmitComplete is BenchmarkStepSubmitComplete without HTTP:
// the kernel API called directly by 10 concurrent executions (fsync on).
func BenchmarkKernelSubmitComplete(b *testing.B) {
	for _, g := range []struct {
		name   string
		window time.Duration
	}{{"gather=off", -1}, {"gather=on", 0}} {
		b.Run(g.name, func(b *testing.B) { benchKernel(b, bbolt.Options{GatherWindow: g.window}) })
	}
}

func benchKernel(b *testing.B, so bbolt.Options) {
	env := testkit.Start(b, testkit.Options{Store: so})
	_, leases := leaseAgent(b, env, "kbench")
	const conc = 10
	calls := make([]kernel.AgentCall, conc)
	for i := range conc {
		env.CreateExecution("kbench", i)
	}
	for i := range conc {
		p := <-leases
		calls[i] = kernel.AgentCall{Tenant: "default", ExecutionID: p.ExecutionID, AgentID: "kbench", Lease: kernel.Lease{DispatchID: p.DispatchID, Attempt: p.DispatchAttempt}}
	}
	k := env.Kernel
	var next, idx atomic.Int64
	s0 := env.Bolt.Stats()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := calls[idx.Add(1)-1]
			ctx := context.Background()
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				d, err := k.SubmitStep(ctx, kernel.StepRequest{AgentCall: c, Kind: "tool_call", Target: "read", Args: []byte(fmt.Sprintf(`{"q":"benchmark","n":%d}`, n))})
				if err != nil || d.Decision != kernel.DecisionProceed {
					b.Errorf("%+v %v", d, err)
					return
				}
				if _, err := k.CompleteStep(ctx, kernel.StepOutcome{AgentCall: c, StepID: d.StepID, Result: []byte(`{"hits":1}`)}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	s1 := env.Bolt.Stats()
	b.ReportMetric(float64(b.N)/el.Seconds(), "steps/s")
	commits := float64(s1.Commits - s0.Commits)
	b.ReportMetric(float64(s1.Updates-s0.Updates)/commits, "updates/commit")
	b.ReportMetric(float64(el.Microseconds())/commits, "µs/commit")
	b.ReportMetric(float64(s1.DB.TxStats.GetWrite()-s0.DB.TxStats.GetWrite())/commits, "writes/commit")
}

// BenchmarkDispatchLatency measures how soon a webhook follows the event
// that queues its dispatch, over real HTTP with fsync on: one op is one
// execution created (POST /v0/executions, start measured before the
// request is sent) until its webhook reaches the agent; "resume" is an
// approval granted until the new dispatch's webhook arrives.
//
//	go test -run '^$' -bench BenchmarkDispatchLatency -benchtime 300x ./e2e/
func BenchmarkDispatchLatency(b *testing.B) {
	b.Run("create", func(b *testing.B) {
		env := testkit.Start(b, testkit.Options{})
		_, leases := leaseAgent(b, env, "bench")
		lat := make([]time.Duration, 0, b.N)
		answered := make([]time.Duration, 0, b.N) // the create request alone
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			var x kernel.Execution
			if _, err := env.Admin("POST", "/v0/executions", map[string]any{"agent_id": "bench", "input": i}, &x); err != nil {
				b.Fatal(err)
			}
			answered = append(answered, time.Since(t0))
			p := <-leases
			lat = append(lat, time.Since(t0))
			if p.ExecutionID != x.ID {
				b.Fatalf("webhook for %s, created %s", p.ExecutionID, x.ID)
			}
		}
		b.StopTimer()
		reportLatency(b, lat)
		b.ReportMetric(float64(percentile(answered, 0.5).Microseconds()), "create-answer-p50-µs")
	})
	b.Run("resume", func(b *testing.B) {
		env := testkit.Start(b, testkit.Options{Engines: []plugins.Engine{rules.New()}})
		agent, leases := leaseAgent(b, env, "bench")
		if _, err := env.Admin("POST", "/v0/policies/bench", map[string]any{"bundle": "default_action: allow\nrules:\n  - id: gate\n    priority: 1\n    when: {target: gate}\n    then: {decision: require_approval}\n"}, nil); err != nil {
			b.Fatal(err)
		}
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			id := env.CreateExecution("bench", i)
			p := <-leases
			var d kernel.StepDecision
			lease := kernel.Lease{DispatchID: p.DispatchID, Attempt: p.DispatchAttempt}
			if err := agent.Client.Do(context.Background(), "POST", "/v0/executions/"+id+"/steps", &lease,
				map[string]any{"kind": "tool_call", "target": "gate", "args": i}, &d); err != nil || d.Decision != kernel.DecisionBlocked {
				b.Fatalf("submit: %+v %v", d, err)
			}
			b.StartTimer()
			t0 := time.Now()
			if _, err := env.Admin("POST", "/v0/approvals/"+d.ApprovalID+"/grant", map[string]any{"decided_by": "bench"}, nil); err != nil {
				b.Fatal(err)
			}
			p = <-leases
			lat = append(lat, time.Since(t0))
			if p.ExecutionID != id {
				b.Fatalf("webhook for %s, resumed %s", p.ExecutionID, id)
			}
		}
		b.StopTimer()
		reportLatency(b, lat)
	})
}

func reportLatency(b *testing.B, lat []time.Duration) {
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds()), "p99-µs")
}
