package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
	"github.com/wicket-run/wicket/store/bbolt"
)

// scrape reads /metrics and returns each sample ("name{labels}") and its
// value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, body)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// waitMetric polls /metrics until cond holds for the sample.
func waitMetric(t *testing.T, url, sample string, cond func(float64) bool) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := scrape(t, url)
		if cond(m[sample]) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed at %v", sample, m[sample])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitAll polls /metrics until every sample has its value, and fails
// naming those that do not when the deadline passes.
func waitAll(t *testing.T, url string, want map[string]float64) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := scrape(t, url)
		var off []string
		for sample, v := range want {
			if m[sample] != v {
				off = append(off, fmt.Sprintf("%s = %v, want %v", sample, m[sample], v))
			}
		}
		if len(off) == 0 {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics did not move:\n%s", strings.Join(off, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetricsFamilies runs a real kernel and checks that each family moves
// when the matching thing happens: executions by status, step decisions
// and evaluation time by engine, deliveries acked and failed, approvals
// pending, their age and their wait, store commits, HTTP requests; and that
// the executions gauge is rebuilt from the store at the next boot.
func TestMetricsFamilies(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, "--lease-timeout", "2s", "--dispatch-timeout", "500ms", "--dispatch-max-attempts", "1")
	ctx := t.Context()
	c := client.New(s.url)
	m0 := scrape(t, s.url)
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", `wicket_executions{status="running"}`, "wicket_approvals_pending", "wicket_ready"} {
		if _, ok := m0[name]; !ok {
			t.Errorf("no %s at boot", name)
		}
	}

	b := filepath.Join(dir, "gate")
	_ = os.MkdirAll(b, 0o700)
	_ = os.WriteFile(filepath.Join(b, "bundle.yaml"), []byte("name: gate\nrevision: \"1\"\nengine: rules\n"), 0o600)
	_ = os.WriteFile(filepath.Join(b, "rules.yaml"), []byte("default_action: allow\nrules:\n  - id: ask\n    priority: 1\n    when: {target: deploy}\n    then: {decision: require_approval}\n  - id: no\n    priority: 2\n    when: {target: rm}\n    then: {decision: deny}\n"), 0o600)
	if _, errOut, code := runExit(t, "bundle", "put", b, "--url", s.url); code != 0 {
		t.Fatal(errOut)
	}
	const secret = "metrics-secret-0123456789"
	agent := testkit.NewAgent("m", secret, s.url, func(ctx context.Context, r *testkit.Run) (any, error) {
		if _, err := r.Step(ctx, "tool_call", "read", nil, testkit.StepOpts{}, func() (any, error) { return 1, nil }); err != nil {
			return nil, err
		}
		_, err := r.Step(ctx, "tool_call", "rm", nil, testkit.StepOpts{}, func() (any, error) { return nil, nil })
		var de *testkit.DecisionError
		if !errors.As(err, &de) {
			return nil, err
		}
		if _, err := r.Step(ctx, "tool_call", "deploy", nil, testkit.StepOpts{}, func() (any, error) { return "shipped", nil }); err != nil {
			return nil, err
		}
		return "done", nil
	})
	defer agent.Close()
	if _, err := c.PutAgent(ctx, wire.AgentRequest{ID: "m", WebhookURL: agent.WebhookURL(), Secret: secret, Policy: ptr("gate")}); err != nil {
		t.Fatal(err)
	}
	x, err := c.CreateExecution(ctx, wire.CreateExecutionRequest{AgentID: "m"}, "")
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, s.url, map[string]float64{
		"wicket_approvals_pending":                                                1,
		"wicket_executions_created_total":                                         1,
		`wicket_executions{status="blocked"}`:                                     1,
		`wicket_step_decisions_total{decision="allow",engine="rules"}`:            1,
		`wicket_step_decisions_total{decision="deny",engine="rules"}`:             1,
		`wicket_step_decisions_total{decision="require_approval",engine="rules"}`: 1,
		`wicket_policy_eval_seconds_count{engine="rules"}`:                        3,
		`wicket_deliveries_total{result="acked"}`:                                 1,
		`wicket_step_submissions_total{decision="denied"}`:                        1,
	})
	// The oldest pending approval ages.
	waitMetric(t, s.url, "wicket_approvals_pending_oldest_age_seconds", func(v float64) bool { return v > 0.01 })
	as, err := c.Approvals(ctx, "pending")
	if err != nil || len(as) != 1 {
		t.Fatalf("approvals: %v %v", as, err)
	}
	if _, err := c.Grant(ctx, as[0].ID, wire.ResolveApprovalRequest{DecidedBy: "ops"}); err != nil {
		t.Fatal(err)
	}
	m2 := waitAll(t, s.url, map[string]float64{
		`wicket_executions_finished_total{status="completed"}`:  1,
		"wicket_approvals_pending":                              0,
		`wicket_approval_wait_seconds_count{outcome="granted"}`: 1,
		`wicket_executions{status="completed"}`:                 1,
		`wicket_executions{status="blocked"}`:                   0,
		`wicket_executions{status="running"}`:                   0,
		`wicket_deliveries_total{result="acked"}`:               2,
	})
	if m2["wicket_store_commit_seconds_count"] <= m0["wicket_store_commit_seconds_count"] || m2["wicket_store_updates_per_commit_count"] == 0 {
		t.Errorf("store commits did not move: %v → %v", m0["wicket_store_commit_seconds_count"], m2["wicket_store_commit_seconds_count"])
	}
	if m2[`wicket_http_requests_total{method="POST",route="/v0/executions",status="201"}`] != 1 {
		t.Errorf("http requests: %v", m2[`wicket_http_requests_total{method="POST",route="/v0/executions",status="201"}`])
	}

	// A webhook nobody answers: a failed delivery, then a failed execution.
	if _, err := c.PutAgent(ctx, wire.AgentRequest{ID: "gone", WebhookURL: closedURL(t) + "/hook", Secret: secret}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateExecution(ctx, wire.CreateExecutionRequest{AgentID: "gone"}, ""); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, s.url, `wicket_deliveries_total{result="failed"}`, func(v float64) bool { return v >= 1 })
	waitMetric(t, s.url, `wicket_executions_finished_total{status="failed"}`, func(v float64) bool { return v == 1 })
	if !strings.Contains(s.stderr.String(), "delivery failed") {
		t.Errorf("no warning for the failed delivery in the log")
	}

	// The next boot counts the stored executions.
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	s2 := startServe(t, "--data", s.data)
	m3 := scrape(t, s2.url)
	if m3[`wicket_executions{status="completed"}`] != 1 || m3[`wicket_executions{status="failed"}`] != 1 {
		t.Errorf("after a restart: completed %v failed %v", m3[`wicket_executions{status="completed"}`], m3[`wicket_executions{status="failed"}`])
	}
	if _, err := client.New(s2.url).GetExecution(ctx, x.ID); err != nil {
		t.Fatal(err)
	}
}

// TestMetricsListenerAndKey: --metrics-addr moves /metrics to a listener
// of its own; --metrics-key guards it.
func TestMetricsListenerAndKey(t *testing.T) {
	const key = "metrics-key-0123456789"
	s := startServe(t, "--metrics-addr", "127.0.0.1:0", "--metrics-key", key)
	if resp, err := http.Get(s.url + "/metrics"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/metrics on the API listener: %v %v", resp, err)
	}
	var murl string
	deadline := time.Now().Add(10 * time.Second)
	for murl == "" {
		for _, line := range strings.Split(s.stderr.String(), "\n") {
			if strings.Contains(line, "metrics listening on") {
				_, u, _ := strings.Cut(line, "url=")
				murl = strings.TrimSuffix(strings.Fields(u)[0], "/metrics")
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no metrics listener in the log:\n%s", s.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Get(murl + "/metrics")
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/metrics without the key: %v %v", resp, err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest("GET", murl+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics with the key: %v %v", resp, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "wicket_ready 1") {
		t.Fatalf("metrics: %s", body)
	}
}

func ptr[T any](v T) *T { return &v }

// TestServeRetention: serve --retention deletes the terminal executions
// that ended before it (seeded old into the store), keeps the others, and
// counts what it removed in wicket_retention_deleted_total.
func TestServeRetention(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	st, err := bbolt.Open(storePath(data), bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour).UTC()
	ids := []string{"01960000-0000-7000-8000-000000000001", "01960000-0000-7000-8000-000000000002", "01960000-0000-7000-8000-000000000003"}
	err = st.Update(t.Context(), func(tx kernel.Tx) error {
		for i, id := range ids {
			status := kernel.ExecCompleted
			if i == 2 {
				status = kernel.ExecBlocked // old but not over: kept
			}
			if err := tx.PutExecution(&kernel.Execution{ID: id, Tenant: kernel.DefaultTenant, AgentID: "a", Status: status, LastSeq: 1, CreatedAt: old, UpdatedAt: old}); err != nil {
				return err
			}
			if err := tx.AppendEvent(kernel.DefaultTenant, kernel.Event{ExecutionID: id, Seq: 1, Type: kernel.EvExecutionCreated, Time: old, Payload: []byte("{}")}); err != nil {
				return err
			}
		}
		return nil
	})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "--data", data, "--retention", "24h", "--retention-interval", "50ms")
	m := waitMetric(t, s.url, `wicket_retention_deleted_total{kind="executions"}`, func(v float64) bool { return v == 2 })
	if m[`wicket_retention_deleted_total{kind="events"}`] != 2 || m[`wicket_executions{status="completed"}`] != 0 || m[`wicket_executions{status="blocked"}`] != 1 {
		t.Errorf("after retention: events %v, completed %v, blocked %v", m[`wicket_retention_deleted_total{kind="events"}`],
			m[`wicket_executions{status="completed"}`], m[`wicket_executions{status="blocked"}`])
	}
	c := client.New(s.url)
	if _, err := c.GetExecution(t.Context(), ids[0]); !client.IsCode(err, wire.CodeNotFound) {
		t.Errorf("a deleted execution: %v", err)
	}
	if _, err := c.GetExecution(t.Context(), ids[2]); err != nil {
		t.Errorf("the blocked one: %v", err)
	}
	// The line is logged after the purge that counted the metric returns.
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(s.stderr.String(), "retention deleted executions"); {
		if time.Now().After(deadline) {
			t.Fatalf("no retention log line")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, _, code := runExit(t, "serve", "--data", t.TempDir(), "--retention", "10s"); code != 2 {
		t.Errorf("--retention 10s: exit %d, want 2", code)
	}
}
