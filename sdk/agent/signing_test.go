package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/server/wire"
)

// stepRecorder is an http.RoundTripper that records, for every step
// submission, the Rebuno-Step-Id the SDK sent and the step_id the kernel
// answered.
type stepRecorder struct {
	mu    sync.Mutex
	pairs [][2]string // sent, answered
	codes []string    // error codes of refused submissions
}

func (s *stepRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || req.Method != http.MethodPost || !bytes.HasSuffix([]byte(req.URL.Path), []byte("/steps")) {
		return resp, err
	}
	data, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(data))
	if rerr != nil {
		return resp, nil
	}
	var d struct {
		StepID string `json:"step_id"`
		Code   string `json:"code"`
	}
	_ = json.Unmarshal(data, &d)
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.Code != "" {
		s.codes = append(s.codes, d.Code)
	}
	s.pairs = append(s.pairs, [2]string{req.Header.Get(wire.HeaderStepID), d.StepID})
	return resp, nil
}

// TestSDKSendsItsStepIDs: every submission carries the step id the SDK
// computed, and it is the kernel's, including identical calls made
// concurrently (occurrences 0..n, which the SDK sends one at a time) and
// args that canonicalise differently from how they were written.
func TestSDKSendsItsStepIDs(t *testing.T) {
	h := start(t, kernel.Config{})
	rec := &stepRecorder{}
	echo := agent.NewTool("echo", func(_ context.Context, in map[string]any) (map[string]any, error) { return in, nil })
	a, err := agent.New(agent.Config{ID: "ids", Secret: []byte(secret), KernelURL: h.env.URL, HTTPClient: &http.Client{Transport: rec},
		Handler: agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := echo.Call(ctx, map[string]any{"same": true})
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					return nil, err
				}
			}
			// Keys out of order, escapes and a big number: the kernel's
			// canonical form is not the bytes sent.
			raw := json.RawMessage(`{"z":1,"a":"\u00e9<>","n":12345678901234567890}`)
			if _, err := agent.Invoke(ctx, agent.KindLocal, "raw", raw, agent.StepOptions{}, nil); err != nil {
				return nil, err
			}
			return "ok", nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	defer srv.Close()
	defer a.Shutdown(context.Background())
	h.register("ids", srv.URL+"/webhook", false)
	x := h.status(h.create("ids", nil), kernel.ExecCompleted)
	if x.Status != kernel.ExecCompleted {
		t.Fatalf("execution %s: %s", x.Status, x.Error)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.codes) != 0 {
		t.Fatalf("submissions refused: %v", rec.codes)
	}
	if len(rec.pairs) != 7 {
		t.Fatalf("%d submissions, want 7", len(rec.pairs))
	}
	seen := map[string]bool{}
	for _, p := range rec.pairs {
		if p[0] == "" || p[0] != p[1] {
			t.Errorf("sent step id %q, kernel's %q", p[0], p[1])
		}
		seen[p[1]] = true
	}
	if len(seen) != 7 {
		t.Errorf("%d distinct step ids, want 7", len(seen))
	}
}

// TestBodySigningAgent: an SDK agent configured for the body scheme works
// end to end once registered with "signing": "body", and refuses v1
// webhooks; a v1 agent refuses body-signed webhooks (TestWebhookRequests).
func TestBodySigningAgent(t *testing.T) {
	h := start(t, kernel.Config{})
	a, err := agent.New(agent.Config{ID: "seeds", Secret: []byte(secret), KernelURL: h.env.URL, Signing: wire.SigningBody,
		Handler: agent.HandlerFunc(func(ctx context.Context, in json.RawMessage) (any, error) {
			return agent.Step(ctx, "value", func(context.Context) (string, error) { return "from a body-signed agent", nil })
		})})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	defer srv.Close()
	defer a.Shutdown(context.Background())
	if _, err := h.admin.PutAgent(context.Background(), wire.AgentRequest{ID: "seeds", WebhookURL: srv.URL + "/webhook", Secret: secret,
		Signing: wire.SigningBody}); err != nil {
		t.Fatal(err)
	}
	x := h.status(h.create("seeds", nil), kernel.ExecCompleted)
	if x.Status != kernel.ExecCompleted || string(x.Output) != `"from a body-signed agent"` {
		t.Fatalf("execution %s %s %s", x.Status, x.Output, x.Error)
	}
	body := []byte(fmt.Sprintf(`{"execution_id":%q,"dispatch_id":"d","dispatch_attempt":1}`, x.ID))
	req, _ := http.NewRequest("POST", srv.URL+"/webhook", bytes.NewReader(body))
	signWebhook(req, []byte(secret), body, time.Now())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a v1 webhook to a body agent: %d, want 401", resp.StatusCode)
	}

	// The SDK agent and the registration disagree: the kernel refuses.
	mismatched, err := agent.New(agent.Config{ID: "seeds", Secret: []byte(secret), KernelURL: h.env.URL,
		Handler: agent.HandlerFunc(func(context.Context, json.RawMessage) (any, error) { return nil, nil })})
	if err != nil {
		t.Fatal(err)
	}
	_, err = mismatched.Kernel().GetExecution(context.Background(), x.ID)
	if err == nil {
		t.Fatal("a v1-signed read by a body-registered agent succeeded")
	}
}
