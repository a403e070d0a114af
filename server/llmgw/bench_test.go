package llmgw_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/fakellm"
	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/llmgw"
)

// BenchmarkGatewayOverhead times one non-streamed chat completion sent to
// the fake provider directly and through the gateway (a new llm_call step
// each: submit, provider call, record; the store fsyncs), on one
// keep-alive connection, and reports p50 and p99 in microseconds.
//
//	flock /tmp/wicket-suite.lock go test -run '^$' -bench GatewayOverhead -benchtime 2000x ./server/llmgw/
func BenchmarkGatewayOverhead(b *testing.B) {
	prov := &fakellm.Provider{APIKey: providerKey}
	base, stop, err := fakellm.Listen("127.0.0.1:0", prov)
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	env := testkit.Start(b, testkit.Options{LLM: &llmgw.Config{Providers: []llmgw.Provider{
		{Name: "openai", Dialect: llmgw.DialectOpenAI, BaseURL: base + "/v1", APIKey: providerKey,
			Models: []llmgw.Model{{Name: "gpt-fake", Input: 1, Output: 2}}},
	}}})
	tokens := make(chan string, 1)
	a := testkit.NewAgent("bench", "bench-agent-secret-0123456789", env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		tokens <- r.LLMGatewayToken
		<-ctx.Done() // hold the lease while the benchmark runs
		return nil, ctx.Err()
	})
	defer a.Close()
	env.RegisterAgent(a, "")
	env.CreateExecution(a.ID, map[string]any{})
	var token string
	select {
	case token = <-tokens:
	case <-time.After(30 * time.Second):
		b.Fatal("no dispatch")
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	post := func(url, key string, i int) {
		body := fmt.Sprintf(`{"model":"gpt-fake","messages":[{"role":"user","content":"benchmark call %d"}]}`, i)
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("%s: %d", url, resp.StatusCode)
		}
	}
	n := 0
	for _, mode := range []struct{ name, url, key string }{
		{"direct", base + "/v1/chat/completions", providerKey},
		{"gateway", env.URL + "/llm/openai/v1/chat/completions", token},
	} {
		b.Run(mode.name, func(b *testing.B) {
			ds := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				n++
				start := time.Now()
				post(mode.url, mode.key, n)
				ds = append(ds, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), "p99-µs")
		})
	}
	if x := env.Execution(func() string {
		var list struct{ Executions []kernel.Execution }
		_, _ = env.Admin("GET", "/v0/executions", nil, &list)
		return list.Executions[0].ID
	}()); x.Totals.LLMCalls == 0 {
		b.Fatalf("no llm_call recorded: %+v", x.Totals)
	}
}
