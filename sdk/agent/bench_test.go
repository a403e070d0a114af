package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// BenchmarkStep measures one step through the SDK against a real kernel
// (bbolt with fsync, HTTP on loopback): submit, run the body, complete.
// conc executions run their handlers at once; each does its share of the
// b.N steps. "raw" drives the same protocol with the test harness's bare
// client, so the ratio is the SDK's overhead.
//
//	go test -run '^$' -bench BenchmarkStep -benchtime 2000x ./sdk/agent/
func BenchmarkStep(b *testing.B) {
	for _, conc := range []int{1, 10} {
		b.Run(fmt.Sprintf("sdk/conc=%d", conc), func(b *testing.B) { benchSDK(b, conc) })
		b.Run(fmt.Sprintf("raw/conc=%d", conc), func(b *testing.B) { benchRaw(b, conc) })
	}
}

func share(n, conc, i int) int {
	s := n / conc
	if i < n%conc {
		s++
	}
	return s
}

func benchSDK(b *testing.B, conc int) {
	env := testkit.Start(b, testkit.Options{})
	admin := client.New(env.URL, client.WithAPIKey(testkit.AdminKey))
	tool := agent.NewTool("work", func(ctx context.Context, i int) (int, error) { return i * 2, nil })
	var wg sync.WaitGroup
	wg.Add(conc)
	startGate := make(chan struct{})
	a, err := agent.New(agent.Config{ID: "bench", Secret: []byte(secret), KernelURL: env.URL,
		HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		Handler: agent.Typed(func(ctx context.Context, n int) (int, error) {
			defer wg.Done()
			<-startGate
			for i := 0; i < n; i++ {
				if _, err := tool.Call(ctx, i); err != nil {
					return 0, err
				}
			}
			return n, nil
		})})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(a)
	defer srv.Close()
	if _, err := admin.PutAgent(context.Background(), wire.AgentRequest{ID: "bench", WebhookURL: srv.URL, Secret: secret}); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < conc; i++ {
		raw, _ := json.Marshal(share(b.N, conc, i))
		if _, err := admin.CreateExecution(context.Background(), wire.CreateExecutionRequest{AgentID: "bench", Input: raw}, ""); err != nil {
			b.Fatal(err)
		}
	}
	for a.Running() < conc {
		time.Sleep(time.Millisecond)
	}
	b.ResetTimer()
	start := time.Now()
	close(startGate)
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "steps/s")
	waitSettled(b, env, admin)
}

// waitSettled waits until no execution is running, so that the kernel is
// not closed under an agent still completing one.
func waitSettled(b *testing.B, env *testkit.Env, admin *client.Client) {
	for {
		l, err := admin.ListExecutions(context.Background(), client.ListOptions{Status: "running"})
		if err != nil {
			b.Fatal(err)
		}
		if len(l.Executions) == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func benchRaw(b *testing.B, conc int) {
	env := testkit.Start(b, testkit.Options{})
	var wg sync.WaitGroup
	wg.Add(conc)
	startGate := make(chan struct{})
	ta := testkit.NewAgent("bench", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		defer wg.Done()
		var n int
		_ = json.Unmarshal(r.Input, &n)
		<-startGate
		for i := 0; i < n; i++ {
			if _, err := r.Step(ctx, "tool_call", "work", i, testkit.StepOpts{}, func() (any, error) { return i * 2, nil }); err != nil {
				return nil, err
			}
		}
		return n, nil
	})
	ta.Client.HTTP = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer ta.Close()
	env.RegisterAgent(ta, "")
	ids := make([]string, conc)
	for i := 0; i < conc; i++ {
		ids[i] = env.CreateExecution("bench", share(b.N, conc, i))
	}
	for _, id := range ids {
		env.WaitStatus(id, time.Minute, func(s kernel.ExecStatus) bool { return s == kernel.ExecRunning })
	}
	b.ResetTimer()
	start := time.Now()
	close(startGate)
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "steps/s")
}
