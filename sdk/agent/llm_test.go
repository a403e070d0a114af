package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/fakellm"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// chat posts one chat completion request through hc under ctx.
func chat(ctx context.Context, hc *http.Client, base, model, prompt string, stream bool) (*http.Response, []byte, error) {
	m := map[string]any{"model": model, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": prompt}}}
	if stream {
		m["stream_options"] = map[string]bool{"include_usage": true} // OpenAI streams usage only when asked
	}
	body, _ := json.Marshal(m)
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp, data, err
}

// An LLM call is recorded once and replayed byte for byte when the
// execution resumes; a streamed one is also teed to the step stream.
func TestLLMCallRecordedOnceReplayedExactly(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			h := start(t, kernel.Config{})
			prov := &fakellm.Provider{}
			if stream {
				prov.Delay = 5 * time.Millisecond
			}
			ps := httptest.NewServer(prov)
			defer ps.Close()
			var keys []string // Idempotency-Key headers the provider got
			var keysMu sync.Mutex
			hc := &http.Client{Transport: &agent.Transport{IdempotencyHeader: "Idempotency-Key",
				Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
					keysMu.Lock()
					keys = append(keys, r.Header.Get("Idempotency-Key"))
					keysMu.Unlock()
					return http.DefaultTransport.RoundTrip(r)
				})}}
			deploy := agent.NewTool("deploy", func(ctx context.Context, in string) (string, error) { return "deployed " + in, nil })

			type got struct {
				body   []byte
				replay string
				status int
				stepID string
			}
			runs := make(chan got, 4)
			ready := make(chan struct{})
			_, url := h.serve("llm", 0, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
				<-ready
				resp, data, err := chat(ctx, hc, ps.URL, "fake-1", "ship it?", stream)
				if err != nil {
					return nil, err
				}
				runs <- got{body: data, replay: resp.Header.Get(agent.HeaderReplay), status: resp.StatusCode, stepID: resp.Header.Get(agent.HeaderStepID)}
				if _, err := deploy.Call(ctx, "prod"); err != nil {
					return nil, err // Blocked on the first run
				}
				return map[string]string{"llm": string(data)}, nil
			}))
			h.register("llm", url, true)
			id := h.create("llm", nil)

			// Watch the execution's stream from the start to see the deltas.
			var deltas []wire.StepDeltaEvent
			wctx, stopWatch := context.WithCancel(context.Background())
			defer stopWatch()
			watched := make(chan error, 1)
			first := make(chan struct{})
			go func() {
				n := 0
				watched <- h.admin.Watch(wctx, id, 0, func(it client.StreamItem) error {
					if n++; n == 1 {
						close(first)
					}
					if it.Delta != nil {
						deltas = append(deltas, *it.Delta)
					}
					if it.Event != nil && it.Event.Type == string(kernel.EvExecutionBlocked) {
						return errStop
					}
					return nil
				})
			}()
			<-first
			close(ready)

			r1 := <-runs
			if r1.status != 200 || r1.replay != "" {
				t.Fatalf("first call: %d replay=%q", r1.status, r1.replay)
			}
			if err := <-watched; !errors.Is(err, errStop) {
				t.Fatalf("watch: %v", err)
			}
			want := fakellm.Reply("ship it?", 1)
			if !bytes.Contains(r1.body, []byte(strings.ReplaceAll(want, `"`, `\"`))) && !stream {
				t.Fatalf("body %s does not carry %q", r1.body, want)
			}
			if stream {
				var text strings.Builder
				for i, d := range deltas {
					if d.Seq != int64(i+1) {
						t.Fatalf("delta %d has seq %d", i, d.Seq)
					}
					var chunk struct {
						Choices []struct {
							Delta struct{ Content string } `json:"delta"`
						} `json:"choices"`
					}
					if json.Unmarshal(d.Data, &chunk) == nil && len(chunk.Choices) > 0 {
						text.WriteString(chunk.Choices[0].Delta.Content)
					}
				}
				if text.String() != want {
					t.Fatalf("deltas spell %q, want %q (%d deltas)", text.String(), want, len(deltas))
				}
				if last := deltas[len(deltas)-1]; string(last.Data) != `"[DONE]"` {
					t.Fatalf("last delta %s", last.Data)
				}
			}

			x := h.status(id, kernel.ExecBlocked)
			approval := x.BlockedOn
			if x.Status != kernel.ExecBlocked || approval == "" {
				t.Fatalf("execution %s blocked_on %q", x.Status, approval)
			}
			if _, err := h.admin.Grant(context.Background(), approval, wire.ResolveApprovalRequest{DecidedBy: "alice"}); err != nil {
				t.Fatal(err)
			}
			r2 := <-runs
			if !bytes.Equal(r1.body, r2.body) {
				t.Fatalf("replayed body differs:\n%q\n%q", r1.body, r2.body)
			}
			if r2.replay != "true" || r2.status != 200 {
				t.Fatalf("second call: %d replay=%q", r2.status, r2.replay)
			}
			if prov.Calls() != 1 {
				t.Fatalf("provider called %d times, want 1", prov.Calls())
			}
			x = h.status(id, kernel.ExecCompleted)
			if x.Status != kernel.ExecCompleted {
				t.Fatalf("status %s", x.Status)
			}
			steps, err := h.admin.Steps(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			var llm *wire.Step
			for i := range steps {
				if steps[i].Kind == agent.KindLLMCall {
					llm = &steps[i]
				}
			}
			if llm == nil || llm.Target != "fake-1" || llm.Status != "succeeded" || llm.Usage == nil || llm.Usage.TotalTokens == 0 {
				t.Fatalf("llm step %+v", llm)
			}
			if r1.stepID != llm.ID || r2.stepID != llm.ID || len(keys) != 1 || keys[0] != llm.ID {
				t.Fatalf("step id %s: responses carried %q and %q, provider got idempotency keys %q", llm.ID, r1.stepID, r2.stepID, keys)
			}
			var rec agent.LLMResponse
			if err := json.Unmarshal(llm.Result, &rec); err != nil || rec.Stream != stream || rec.Body != string(r1.body) {
				t.Fatalf("recorded %+v (%v)", rec, err)
			}
			if x.Totals.Tokens != llm.Usage.TotalTokens {
				t.Fatalf("execution tokens %d, step %d", x.Totals.Tokens, llm.Usage.TotalTokens)
			}
			h.checkLog(id)
		})
	}
}

var errStop = errors.New("stop watching")

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Refused LLM calls come back as 403/429 answers carrying the marker, which
// RaiseForRefusal turns into typed errors; the provider is not called.
func TestLLMRefusals(t *testing.T) {
	h := start(t, kernel.Config{})
	prov := &fakellm.Provider{}
	ps := httptest.NewServer(prov)
	defer ps.Close()
	hc := agent.NewHTTPClient(nil)
	type result struct {
		status int
		err    error
	}
	results := make(chan map[string]result, 2)
	_, url := h.serve("refuse", 0, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		out := map[string]result{}
		call := func(name, model string) {
			resp, data, err := chat(ctx, hc, ps.URL, model, name, false)
			if err != nil {
				out[name] = result{err: err}
				return
			}
			var perr error
			if resp.StatusCode/100 != 2 {
				// What a provider SDK does with an error body: a text error.
				perr = agent.RaiseForRefusal(ctx, fmt.Errorf("provider: %d %s", resp.StatusCode, data))
			}
			out[name] = result{status: resp.StatusCode, err: perr}
		}
		call("denied", "forbidden-9")
		call("limited-1", "limited-a")
		call("limited-2", "limited-a")
		call("bad-request", "") // the provider refuses it: recorded as a failed step
		call("approval", "approve-x")
		results <- out
		return "carried on", nil // swallowed the refusal: the SDK still unwinds
	}))
	h.register("refuse", url, true)
	id := h.create("refuse", nil)
	out := <-results
	var pe *agent.PolicyError
	if r := out["denied"]; r.status != 403 || !errors.As(r.err, &pe) || pe.Reason != "model not allowed" {
		t.Fatalf("denied: %+v", r)
	}
	if r := out["limited-1"]; r.status != 200 || r.err != nil {
		t.Fatalf("limited-1: %+v", r)
	}
	if r := out["limited-2"]; r.status != 429 || !errors.As(r.err, new(*agent.RateLimited)) {
		t.Fatalf("limited-2: %+v", r)
	}
	if r := out["bad-request"]; r.status != 400 || r.err == nil || errors.As(r.err, new(*agent.PolicyError)) {
		t.Fatalf("bad-request: %+v", r)
	}
	var b *agent.Blocked
	if r := out["approval"]; r.status != 403 || !errors.As(r.err, &b) || b.ApprovalID == "" {
		t.Fatalf("approval: %+v (the remembered Blocked carries the approval id)", r)
	}
	if prov.Calls() != 1 {
		t.Fatalf("provider served %d completions, want 1 (limited-1; it refuses bad-request itself)", prov.Calls())
	}
	x := h.status(id, kernel.ExecBlocked)
	if x.Status != kernel.ExecBlocked {
		t.Fatalf("status %s: the blocked LLM call must park the execution", x.Status)
	}
	steps, _ := h.admin.Steps(context.Background(), id)
	var failed int
	for _, s := range steps {
		if s.Kind == agent.KindLLMCall && s.Target == "/v1/chat/completions" && s.Status == "failed" {
			failed++
		}
	}
	if failed != 1 {
		t.Fatalf("the provider's 400 should be one failed step (model id from the path): %+v", steps)
	}
	h.checkLog(id)
}

func TestParseRefusal(t *testing.T) {
	for _, tc := range []struct {
		text, decision, reason string
		ok                     bool
	}{
		{`rebuno_refusal: denied reason=model not allowed`, "denied", "model not allowed", true},
		{`Error code: 403 - {"error": {"type": "rebuno_refusal", "message": "rebuno_refusal: blocked reason=needs a human"}}`, "blocked", "needs a human", true},
		{`rebuno_refusal: rate_limited`, "rate_limited", "", true},
		{`x rebuno_refusal: execution_terminal reason=cancelled` + "\nmore", "execution_terminal", "cancelled", true},
		{`rebuno_refusal: exploded`, "", "", false},
		{`rebuno_refusal denied`, "", "", false},
		{`nothing to see`, "", "", false},
	} {
		r, ok := agent.ParseRefusal(tc.text)
		if ok != tc.ok || (ok && (r.Decision != tc.decision || r.Reason != tc.reason)) {
			t.Errorf("ParseRefusal(%q) = %+v, %v", tc.text, r, ok)
		}
	}
	if err := agent.RaiseForRefusal(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	plain := errors.New("connection reset")
	if err := agent.RaiseForRefusal(context.Background(), plain); err != plain {
		t.Fatalf("a plain error changed: %v", err)
	}
}

func TestDefaultUsage(t *testing.T) {
	for name, tc := range map[string]struct {
		body  string
		total int64
	}{
		"openai":    {`{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`, 7},
		"anthropic": {`{"usage":{"input_tokens":5,"output_tokens":6}}`, 11},
		"stream":    {"data: {\"x\":1}\n\ndata: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\ndata: [DONE]\n\n", 2},
		"none":      {`{"choices":[]}`, 0},
		"negative":  {`{"usage":{"input_tokens":-5,"output_tokens":1}}`, 0},
	} {
		u := agent.DefaultUsage([]byte(tc.body))
		var got int64
		if u != nil {
			got = u.TotalTokens
		}
		if got != tc.total {
			t.Errorf("%s: total %d, want %d", name, got, tc.total)
		}
	}
}

// The Transport's bad paths: a body that is not JSON or is missing is
// refused before anything is submitted; a provider that cannot be reached
// or breaks off a stream records the step as failed, and the caller gets
// an error, not a partial answer.
func TestLLMBadPaths(t *testing.T) {
	h := start(t, kernel.Config{})
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close() // nothing listens there now
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"par\"}}]}\n\n")
		w.(http.Flusher).Flush()
		hj, ok := w.(http.Hijacker)
		if !ok {
			t.Error("no hijacker")
			return
		}
		conn, _, _ := hj.Hijack()
		conn.Close() // the connection drops mid-stream
	}))
	defer broken.Close()
	hc := agent.NewHTTPClient(nil)

	got := make(chan map[string]error, 2)
	deploy := agent.NewTool("deploy", func(ctx context.Context, in string) (string, error) { return in, nil })
	_, url := h.serve("badllm", 0, agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		out := map[string]error{}
		post := func(name, target string, body io.Reader) {
			req, _ := http.NewRequestWithContext(ctx, "POST", target, body)
			resp, err := hc.Do(req)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			out[name] = err
		}
		post("not json", downURL+"/v1/chat/completions", strings.NewReader("hello"))
		post("no body", downURL+"/v1/chat/completions", nil)
		post("provider down", downURL+"/v1/chat/completions", strings.NewReader(`{"model":"m-down"}`))
		post("stream broken", broken.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m-broken","stream":true}`))
		got <- out
		// Park on an approval: the next dispatch replays the failures.
		if _, err := deploy.Call(ctx, "x"); err != nil {
			return nil, err
		}
		return "ok", nil
	}))
	h.register("badllm", url, true)
	id := h.create("badllm", nil)
	out := <-got
	if !errors.As(out["not json"], new(*agent.ArgsError)) {
		t.Errorf("not JSON: %v", out["not json"])
	}
	if out["no body"] == nil || !strings.Contains(out["no body"].Error(), "needs a JSON body") {
		t.Errorf("no body: %v", out["no body"])
	}
	if out["provider down"] == nil || !strings.Contains(out["provider down"].Error(), "connect") {
		t.Errorf("provider down: %v", out["provider down"])
	}
	if out["stream broken"] == nil || !strings.Contains(out["stream broken"].Error(), "LLM stream") {
		t.Errorf("stream broken: %v", out["stream broken"])
	}
	x := h.status(id, kernel.ExecBlocked)
	if _, err := h.admin.Grant(context.Background(), x.BlockedOn, wire.ResolveApprovalRequest{DecidedBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	// The recorded failures replay as ToolErrors: no provider is asked.
	again := <-got
	for _, name := range []string{"provider down", "stream broken"} {
		var te *agent.ToolError
		if !errors.As(again[name], &te) || !te.Replayed {
			t.Errorf("%s on replay: %v, want a replayed ToolError", name, again[name])
		}
	}
	if !errors.As(again["not json"], new(*agent.ArgsError)) {
		t.Errorf("not JSON on replay: %v", again["not json"])
	}
	h.status(id, kernel.ExecCompleted)
	steps, err := h.admin.Steps(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	byTarget := map[string]wire.Step{}
	for _, s := range steps {
		byTarget[s.Target] = s
	}
	if len(steps) != 3 {
		t.Fatalf("want the two requests that reached submission and the deploy recorded, got %+v", steps)
	}
	for target, want := range map[string]string{"m-down": "connect", "m-broken": "stream broken"} {
		s := byTarget[target]
		if s.Status != "failed" || !strings.Contains(string(s.Error), want) {
			t.Errorf("step %s: %s %s, want failed mentioning %q", target, s.Status, s.Error, want)
		}
	}
	h.checkLog(id)
}
