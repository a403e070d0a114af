package llmgw_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/wicket-run/wicket/internal/fakellm"
	"github.com/wicket-run/wicket/internal/llmrec"
	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/server/llmgw"
)

// providerKey is the fake provider's key: the gateway must send it, and it
// must appear in no event.
const providerKey = "sk-fake-provider-key-never-recorded-0123456789"

// Prices of the test models, USD per million tokens.
const (
	gptIn, gptOut       = 2.0, 8.0
	claudeIn, claudeOut = 3.0, 15.0
)

// gw is a kernel serving the gateway in front of a fake provider, with one
// agent whose handler the test sets.
type gw struct {
	t     *testing.T
	env   *testkit.Env
	prov  *fakellm.Provider
	agent *testkit.Agent

	mu      sync.Mutex
	handler testkit.Handler
}

func startGW(t *testing.T, cfg kernel.Config, extra ...llmgw.Provider) *gw {
	t.Helper()
	return startGWWith(t, cfg, &fakellm.Provider{APIKey: providerKey}, extra...)
}

// startGWWith is startGW in front of prov (set its fields before).
func startGWWith(t *testing.T, cfg kernel.Config, prov *fakellm.Provider, extra ...llmgw.Provider) *gw {
	t.Helper()
	base, stop, err := fakellm.Listen("127.0.0.1:0", prov)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop() })
	providers := append([]llmgw.Provider{
		{Name: "openai", Dialect: llmgw.DialectOpenAI, BaseURL: base + "/v1", APIKey: providerKey, Models: []llmgw.Model{
			{Name: "gpt-fake", Input: gptIn, Output: gptOut}, {Name: "gpt-denied"}, {Name: "gpt-limited"}, {Name: "gpt-gated"},
			{Name: "gpt-error"}, {Name: "embed-fake", Input: 0.1},
		}},
		{Name: "anthropic", Dialect: llmgw.DialectAnthropic, BaseURL: base, APIKey: providerKey, Models: []llmgw.Model{
			{Name: "claude-fake", Input: claudeIn, Output: claudeOut}, {Name: "claude-denied"},
		}},
	}, extra...)
	env := testkit.Start(t, testkit.Options{Config: cfg, Engines: []plugins.Engine{rules.New()},
		LLM: &llmgw.Config{Providers: providers}})
	g := &gw{t: t, env: env, prov: prov}
	g.agent = testkit.NewAgent("model-user", "model-user-secret-0123456789", env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		g.mu.Lock()
		h := g.handler
		g.mu.Unlock()
		return h(ctx, r)
	})
	t.Cleanup(g.agent.Close)
	env.RegisterAgent(g.agent, "")
	return g
}

func (g *gw) setHandler(h testkit.Handler) {
	g.mu.Lock()
	g.handler = h
	g.mu.Unlock()
}

// fastLeases lets a test wait for a lease to expire.
func fastLeases() kernel.Config {
	return kernel.Config{LeaseTimeout: time.Second, DispatchTimeout: 400 * time.Millisecond, ReapInterval: 20 * time.Millisecond,
		DispatchBackoff: 20 * time.Millisecond, DispatchBackoffMax: 100 * time.Millisecond}
}

// captured is one answer as the client's HTTP layer got it.
type captured struct {
	status int
	header http.Header
	body   []byte
}

// capture returns middleware (the same signature for both SDKs) that
// keeps each raw answer under name.
func capture(mu *sync.Mutex, into map[string]captured, name string) func(*http.Request, func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	return func(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
		resp, err := next(req)
		if err != nil {
			return resp, err
		}
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr != nil {
			return nil, rerr
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		mu.Lock()
		into[name] = captured{status: resp.StatusCode, header: resp.Header.Clone(), body: b}
		mu.Unlock()
		return resp, nil
	}
}

// clients are the official clients, pointed at the gateway with the run's
// token and lease, as docs/llm-gateway.md tells users to.
func (g *gw) clients(r *testkit.Run, retries int) (openai.Client, anthropic.Client) {
	oc := openai.NewClient(option.WithBaseURL(g.env.URL+"/llm/openai/v1"), option.WithAPIKey(r.LLMGatewayToken),
		option.WithHeader("Rebuno-Execution-Id", r.ExecutionID), option.WithHeader("Rebuno-Dispatch-Id", r.Lease.DispatchID),
		option.WithHeader("Rebuno-Dispatch-Attempt", fmt.Sprint(r.Lease.Attempt)), option.WithMaxRetries(retries))
	ac := anthropic.NewClient(aoption.WithBaseURL(g.env.URL+"/llm/anthropic"), aoption.WithAPIKey(r.LLMGatewayToken),
		aoption.WithHeader("Rebuno-Execution-Id", r.ExecutionID), aoption.WithHeader("Rebuno-Dispatch-Id", r.Lease.DispatchID),
		aoption.WithHeader("Rebuno-Dispatch-Attempt", fmt.Sprint(r.Lease.Attempt)), aoption.WithMaxRetries(retries))
	return oc, ac
}

func chatParams(model, prompt string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
}

// everyCall makes one call of each kind, plain and streamed, and keeps
// the raw answers.
func (g *gw) everyCall(ctx context.Context, r *testkit.Run, into map[string]captured) error {
	var mu sync.Mutex
	oc, ac := g.clients(r, 0)
	mw := func(name string) option.RequestOption { return option.WithMiddleware(capture(&mu, into, name)) }
	amw := func(name string) aoption.RequestOption { return aoption.WithMiddleware(capture(&mu, into, name)) }

	c, err := oc.Chat.Completions.New(ctx, chatParams("gpt-fake", "plain chat"), mw("chat"))
	if err != nil {
		return fmt.Errorf("chat: %w", err)
	}
	if !strings.Contains(c.Choices[0].Message.Content, `"plain chat"`) {
		return fmt.Errorf("chat answered %q", c.Choices[0].Message.Content)
	}
	st := oc.Chat.Completions.NewStreaming(ctx, chatParams("gpt-fake", "streamed chat"), mw("chat-stream"))
	var text strings.Builder
	sawUsage := false
	for st.Next() {
		ch := st.Current()
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
		sawUsage = sawUsage || ch.Usage.TotalTokens > 0
	}
	if err := st.Err(); err != nil {
		return fmt.Errorf("chat stream: %w", err)
	}
	if !strings.Contains(text.String(), `"streamed chat"`) || !sawUsage {
		return fmt.Errorf("chat stream gave %q (usage chunk %v)", text.String(), sawUsage)
	}
	resp, err := oc.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-fake",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("plain response")}}, mw("responses"))
	if err != nil {
		return fmt.Errorf("responses: %w", err)
	}
	if !strings.Contains(resp.OutputText(), `"plain response"`) {
		return fmt.Errorf("responses answered %q", resp.OutputText())
	}
	rs := oc.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "gpt-fake",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("streamed response")}}, mw("responses-stream"))
	text.Reset()
	for rs.Next() {
		if ev := rs.Current(); ev.Type == "response.output_text.delta" {
			text.WriteString(ev.Delta)
		}
	}
	if err := rs.Err(); err != nil || !strings.Contains(text.String(), `"streamed response"`) {
		return fmt.Errorf("responses stream gave %q: %v", text.String(), err)
	}
	emb, err := oc.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "embed-fake",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"first text", "second text here"}}}, mw("embeddings"))
	if err != nil || len(emb.Data) != 2 || len(emb.Data[0].Embedding) != 8 {
		return fmt.Errorf("embeddings: %v (%+v)", err, emb)
	}
	mp := anthropic.MessageNewParams{Model: "claude-fake", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("plain message"))}}
	m, err := ac.Messages.New(ctx, mp, amw("messages"))
	if err != nil {
		return fmt.Errorf("messages: %w", err)
	}
	if len(m.Content) != 1 || !strings.Contains(m.Content[0].Text, `"plain message"`) {
		return fmt.Errorf("messages answered %+v", m.Content)
	}
	mp.Messages = []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("streamed message"))}
	ms := ac.Messages.NewStreaming(ctx, mp, amw("messages-stream"))
	var acc anthropic.Message
	for ms.Next() {
		if err := acc.Accumulate(ms.Current()); err != nil {
			return fmt.Errorf("accumulate: %w", err)
		}
	}
	if err := ms.Err(); err != nil || len(acc.Content) != 1 || !strings.Contains(acc.Content[0].Text, `"streamed message"`) {
		return fmt.Errorf("messages stream gave %+v: %v", acc.Content, err)
	}
	if acc.Usage.InputTokens == 0 || acc.Usage.OutputTokens == 0 {
		return fmt.Errorf("messages stream usage %+v", acc.Usage)
	}
	return nil
}

// Every kind of call, plain and streamed, through the official clients:
// recorded once; after the agent's lease expires the re-delivered attempt
// gets byte-identical answers with the replay header and the provider is
// not called again; usage and cost reach the execution's totals.
func TestOfficialClientsRecordedOnceReplayedExactly(t *testing.T) {
	g := startGW(t, fastLeases())
	var mu sync.Mutex
	answers := map[int]map[string]captured{}
	tokens := map[int]string{}
	callsAfterFirst := make(chan int64, 1)
	g.setHandler(func(ctx context.Context, r *testkit.Run) (any, error) {
		got := map[string]captured{}
		err := g.everyCall(ctx, r, got)
		mu.Lock()
		answers[r.Attempt], tokens[r.Attempt] = got, r.LLMGatewayToken
		mu.Unlock()
		if err != nil {
			return nil, err
		}
		if r.Attempt == 1 {
			callsAfterFirst <- g.prov.Calls()
			<-ctx.Done() // the agent hangs: its lease expires and the kernel delivers the execution again
			return nil, ctx.Err()
		}
		return map[string]int{"calls": len(got)}, nil
	})
	id := g.env.CreateExecution(g.agent.ID, map[string]any{})
	x := g.env.WaitTerminal(id, 30*time.Second)
	if x.Status != kernel.ExecCompleted {
		t.Fatalf("execution %s: %s (agent errors %v)", x.Status, x.Error, g.agent.Errors())
	}
	first := <-callsAfterFirst
	if first != 7 || g.prov.Calls() != first {
		t.Fatalf("provider calls: %d after the first attempt, %d in all; want 7 and 7", first, g.prov.Calls())
	}
	mu.Lock()
	a1, a2 := answers[1], answers[2]
	tok1, tok2 := tokens[1], tokens[2]
	mu.Unlock()
	if len(a1) != 7 || len(a2) != 7 || tok1 == "" || tok1 == tok2 {
		t.Fatalf("answers %d and %d; tokens %q, %q", len(a1), len(a2), tok1, tok2)
	}
	steps := map[string]bool{}
	for name, c1 := range a1 {
		c2 := a2[name]
		if c1.status != 200 || c2.status != 200 || !bytes.Equal(c1.body, c2.body) {
			t.Errorf("%s: first %d %q, replay %d %q", name, c1.status, c1.body, c2.status, c2.body)
		}
		if c1.header.Get(llmrec.HeaderReplay) != "" || c2.header.Get(llmrec.HeaderReplay) != "true" {
			t.Errorf("%s: replay headers %q, %q", name, c1.header.Get(llmrec.HeaderReplay), c2.header.Get(llmrec.HeaderReplay))
		}
		sid := c1.header.Get(llmrec.HeaderStepID)
		if sid == "" || c2.header.Get(llmrec.HeaderStepID) != sid || steps[sid] {
			t.Errorf("%s: step ids %q, %q", name, sid, c2.header.Get(llmrec.HeaderStepID))
		}
		steps[sid] = true
		if c1.header.Get("Content-Type") != c2.header.Get("Content-Type") {
			t.Errorf("%s: content types %q, %q", name, c1.header.Get("Content-Type"), c2.header.Get("Content-Type"))
		}
	}
	if !bytes.HasPrefix(a1["chat-stream"].body, []byte("data: ")) || !bytes.Contains(a1["messages-stream"].body, []byte("event: message_start")) {
		t.Fatalf("streams: %q / %q", a1["chat-stream"].body, a1["messages-stream"].body)
	}

	// Recorded once: one llm_call step per call, each succeeded once.
	evs := g.env.Events(id)
	if err := testkit.CheckLog(evs); err != nil {
		t.Fatal(err)
	}
	succeeded := 0
	for _, e := range evs {
		if e.Type == kernel.EvStepSucceeded && strings.Contains(string(e.Payload), `"llm_call"`) {
			succeeded++
		}
		if strings.Contains(string(e.Payload), providerKey) || strings.Contains(string(e.Payload), tok1) {
			t.Fatalf("event %d (%s) holds a secret", e.Seq, e.Type)
		}
	}
	var list struct{ Steps []kernel.Step }
	if _, err := g.env.Admin("GET", "/v0/executions/"+id+"/steps", nil, &list); err != nil {
		t.Fatal(err)
	}
	var tokensSum int64
	var cost float64
	for _, s := range list.Steps {
		if s.Kind != "llm_call" {
			continue
		}
		if !steps[s.ID] || s.Status != kernel.StepSucceeded || s.Usage == nil || s.Usage.TotalTokens == 0 {
			t.Fatalf("step %+v", s)
		}
		var rec llmrec.Response
		if err := json.Unmarshal(s.Result, &rec); err != nil || rec.Status != 200 {
			t.Fatalf("step %s result %s", s.ID, s.Result)
		}
		in, out := gptIn, gptOut
		switch s.Target {
		case "claude-fake":
			in, out = claudeIn, claudeOut
		case "embed-fake":
			in, out = 0.1, 0
		}
		want := (float64(s.Usage.InputTokens)*in + float64(s.Usage.OutputTokens)*out) / 1e6
		if math.Abs(s.Usage.CostUSD-want) > 1e-12 {
			t.Fatalf("step %s (%s): cost %v, want %v for %+v", s.ID, s.Target, s.Usage.CostUSD, want, s.Usage)
		}
		tokensSum += s.Usage.TotalTokens
		cost += s.Usage.CostUSD
	}
	if succeeded != 7 || len(steps) != 7 {
		t.Fatalf("%d llm_call steps succeeded, %d step ids; want 7", succeeded, len(steps))
	}
	if x.Totals.Tokens != tokensSum || math.Abs(x.Totals.CostUSD-cost) > 1e-12 || x.Totals.LLMCalls != 7 {
		t.Fatalf("totals %+v; steps: %d tokens, %v USD", x.Totals, tokensSum, cost)
	}

	// What the provider got: its own key, never the token; the step id as
	// OpenAI's idempotency key; a chat stream asking for its usage.
	reqs := g.prov.Requests()
	if len(reqs) != 7 {
		t.Fatalf("provider got %d requests", len(reqs))
	}
	for _, rq := range reqs {
		for k, vs := range rq.Header {
			for _, v := range vs {
				if strings.Contains(v, tok1) {
					t.Fatalf("the provider got the gateway token in %s", k)
				}
			}
		}
		key := rq.Header.Get("Idempotency-Key")
		if rq.Path == "/v1/messages" {
			if key != "" || rq.Header.Get("Anthropic-Version") == "" {
				t.Fatalf("anthropic request headers %v", rq.Header)
			}
		} else if !steps[key] {
			t.Fatalf("%s: Idempotency-Key %q is not a step id", rq.Path, key)
		}
	}
	if !bytes.Contains(reqs[1].Body, []byte(`"include_usage":true`)) {
		t.Fatalf("streamed chat request %s", reqs[1].Body)
	}

	// The first attempt's token ended with its lease.
	st, body := rawCall(t, g.env.URL+"/llm/openai/v1/chat/completions", tok1, `{"model":"gpt-fake","messages":[{"role":"user","content":"late"}]}`)
	if st != http.StatusUnauthorized || !strings.Contains(body, "authentication_error") {
		t.Fatalf("old token: %d %s", st, body)
	}
	if g.prov.Calls() != 7 {
		t.Fatalf("provider calls %d", g.prov.Calls())
	}
}

// rawCall posts body with a bearer token and returns the status and body.
func rawCall(t *testing.T, url, token, body string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const gatePolicy = `default_action: allow
rules:
  - id: no-denied
    priority: 1
    when: {target: gpt-denied}
    then: {decision: deny, reason: "model not for this agent"}
  - id: no-claude
    priority: 1
    when: {target: claude-denied}
    then: {decision: deny, reason: "model not for this agent"}
  - id: one-call
    priority: 2
    when: {target: gpt-limited}
    then: {decision: allow, rate_limit: {max_calls: 1, window: 1h, per: execution}}
  - id: gate
    priority: 3
    when: {target: gpt-gated}
    then: {decision: require_approval}
`

// statusOf reads the HTTP status and text of an official client's error:
// openai-go keeps the error's message in Message (its Error() says only
// the status); anthropic-sdk-go's Error() carries the whole body.
func statusOf(err error) (int, string) {
	var oe *openai.Error
	if errors.As(err, &oe) {
		return oe.StatusCode, oe.Message
	}
	var ae *anthropic.Error
	if errors.As(err, &ae) {
		return ae.StatusCode, ae.Error()
	}
	if err == nil {
		return 200, ""
	}
	return 0, err.Error()
}

// Refusals reach the official clients as 403/429 with the marker; the
// clients' own retries stop at them; a blocked call parks the execution
// and, after the grant, the re-issued call proceeds.
func TestRefusalsAndApproval(t *testing.T) {
	g := startGW(t, kernel.Config{})
	if _, err := g.env.Admin("POST", "/v0/policies/"+g.agent.ID, map[string]any{"bundle": gatePolicy}, nil); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		status int
		text   string
	}
	var mu sync.Mutex
	seen := map[int][]outcome{}
	note := func(attempt int, err error) {
		st, txt := statusOf(err)
		mu.Lock()
		seen[attempt] = append(seen[attempt], outcome{st, txt})
		mu.Unlock()
	}
	g.setHandler(func(ctx context.Context, r *testkit.Run) (any, error) {
		oc, ac := g.clients(r, 2) // the clients' default retries: refusals must not be retried
		_, err := oc.Chat.Completions.New(ctx, chatParams("gpt-denied", "hello"))
		note(r.Attempt, err)
		_, err = ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-denied", MaxTokens: 10,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))}})
		note(r.Attempt, err)
		for range 2 {
			_, err = oc.Chat.Completions.New(ctx, chatParams("gpt-limited", "hello"))
			note(r.Attempt, err)
		}
		_, err = ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-fake", MaxTokens: 10000,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))}})
		note(r.Attempt, err) // allowed: no limit here
		c, err := oc.Chat.Completions.New(ctx, chatParams("gpt-gated", "deploy?"))
		note(r.Attempt, err)
		if err != nil {
			_, txt := statusOf(err)
			if strings.Contains(txt, "rebuno_refusal: blocked") {
				// What raise_for_refusal does: the dispatch ends, parked.
				return nil, &testkit.DecisionError{Decision: kernel.StepDecision{Decision: kernel.DecisionBlocked}}
			}
			return nil, err
		}
		return map[string]string{"answer": c.Choices[0].Message.Content}, nil
	})
	id := g.env.CreateExecution(g.agent.ID, map[string]any{})
	g.env.WaitStatus(id, 30*time.Second, func(s kernel.ExecStatus) bool { return s == kernel.ExecBlocked || s.Terminal() })
	var approvals struct{ Approvals []kernel.Approval }
	if _, err := g.env.Admin("GET", "/v0/approvals?status=pending", nil, &approvals); err != nil || len(approvals.Approvals) != 1 {
		t.Fatalf("approvals %+v: %v", approvals, err)
	}
	if g.prov.Calls() != 2 { // gpt-limited once, claude-fake once; gpt-gated waits
		t.Fatalf("provider calls before the grant: %d", g.prov.Calls())
	}
	if _, err := g.env.Admin("POST", "/v0/approvals/"+approvals.Approvals[0].ID+"/grant", map[string]any{"decided_by": "ops"}, nil); err != nil {
		t.Fatal(err)
	}
	x := g.env.WaitTerminal(id, 30*time.Second)
	if x.Status != kernel.ExecCompleted || !strings.Contains(string(x.Output), `deploy?`) {
		t.Fatalf("execution %s %s %s (agent errors %v)", x.Status, x.Output, x.Error, g.agent.Errors())
	}
	mu.Lock()
	defer mu.Unlock()
	for attempt, want := range map[int][]string{
		1: {"403 rebuno_refusal: denied reason=model not for this agent", `403 {"error":{"message":"rebuno_refusal: denied reason=model not for this agent","type":"rebuno_refusal"}}`, "200", "429 rebuno_refusal: rate_limited", "200", "403 rebuno_refusal: blocked"},
		2: {"403 rebuno_refusal: denied reason=model not for this agent", `403 {"error":{"message":"rebuno_refusal: denied reason=model not for this agent","type":"rebuno_refusal"}}`, "200", "429 rebuno_refusal: rate_limited", "200", "200"},
	} {
		got := seen[attempt]
		if len(got) != len(want) {
			t.Fatalf("attempt %d: %+v", attempt, got)
		}
		for i, w := range want {
			st, marker, _ := strings.Cut(w, " ")
			if fmt.Sprint(got[i].status) != st || !strings.Contains(got[i].text, marker) {
				t.Errorf("attempt %d call %d: %d %q, want %s", attempt, i, got[i].status, got[i].text, w)
			}
		}
	}
	// gpt-gated reached the provider once, after the grant; the replayed
	// calls did not; the refused ones never.
	if g.prov.Calls() != 3 {
		t.Fatalf("provider calls %d, want 3", g.prov.Calls())
	}
	// The clients did not retry the refusals: one decision per call.
	limited := 0
	for _, e := range g.env.Events(id) {
		if e.Type == kernel.EvStepRateLimited {
			limited++
		}
	}
	if limited != 2 {
		t.Fatalf("%d rate-limited steps, want 2 (one per attempt)", limited)
	}
}

// Limits: max_output_tokens_per_call is checked before the call and caps a
// request that has no cap of its own; usage moves the totals, and
// max_total_tokens and max_cost_usd refuse the next call.
func TestLimits(t *testing.T) {
	g := startGW(t, kernel.Config{})
	var mu sync.Mutex
	results := map[string][]string{}
	g.setHandler(func(ctx context.Context, r *testkit.Run) (any, error) {
		oc, _ := g.clients(r, 0)
		var in struct{ Case string }
		_ = json.Unmarshal(r.Input, &in)
		var out []string
		p := chatParams("gpt-fake", "one two three")
		if in.Case == "output" {
			p.MaxCompletionTokens = openai.Int(50)
		}
		for range 2 {
			c, err := oc.Chat.Completions.New(ctx, p)
			if err != nil {
				st, txt := statusOf(err)
				out = append(out, fmt.Sprintf("%d %s", st, txt))
			} else {
				out = append(out, fmt.Sprintf("200 %s %d", c.Choices[0].FinishReason, c.Usage.CompletionTokens))
			}
			p.MaxCompletionTokens = openai.ChatCompletionNewParams{}.MaxCompletionTokens // no cap of its own
		}
		mu.Lock()
		results[in.Case] = out
		mu.Unlock()
		return map[string]any{}, nil
	})
	run := func(c string, limits map[string]any) kernel.Execution {
		var x kernel.Execution
		if _, err := g.env.Admin("POST", "/v0/executions", map[string]any{"agent_id": g.agent.ID, "input": map[string]string{"case": c}, "limits": limits}, &x); err != nil {
			t.Fatal(err)
		}
		return g.env.WaitTerminal(x.ID, 30*time.Second)
	}
	x := run("output", map[string]any{"max_output_tokens_per_call": 3})
	calls := g.prov.Calls()
	mu.Lock()
	got := results["output"]
	mu.Unlock()
	if len(got) != 2 || !strings.HasPrefix(got[0], "403 ") || !strings.Contains(got[0], "rebuno_refusal: denied reason=limit_output_tokens") ||
		got[1] != "200 length 3" || calls != 1 {
		t.Fatalf("output cap: %q, provider calls %d", got, calls)
	}
	if reqs := g.prov.Requests(); !bytes.Contains(reqs[len(reqs)-1].Body, []byte(`"max_completion_tokens":3`)) {
		t.Fatalf("the uncapped request went out as %s", reqs[len(reqs)-1].Body)
	}
	if x.Totals.Tokens != 6 || x.Totals.LLMCalls != 1 { // 3 prompt words, 3 answer words
		t.Fatalf("totals %+v", x.Totals)
	}

	x = run("tokens", map[string]any{"max_total_tokens": 5})
	mu.Lock()
	got = results["tokens"]
	mu.Unlock()
	if len(got) != 2 || !strings.HasPrefix(got[0], "200 stop") || !strings.HasPrefix(got[1], "403 ") || !strings.Contains(got[1], "rebuno_refusal: denied reason=limit_tokens") {
		t.Fatalf("token limit: %q", got)
	}
	if x.Totals.Tokens <= 5 || x.Totals.LLMCalls != 1 {
		t.Fatalf("totals %+v", x.Totals)
	}

	x = run("cost", map[string]any{"max_cost_usd": 0.00001})
	mu.Lock()
	got = results["cost"]
	mu.Unlock()
	if len(got) != 2 || !strings.HasPrefix(got[0], "200 stop") || !strings.Contains(got[1], "rebuno_refusal: denied reason=limit_cost") {
		t.Fatalf("cost limit: %q", got)
	}
	if x.Totals.CostUSD < 0.00001 || x.Totals.LLMCalls != 1 {
		t.Fatalf("totals %+v", x.Totals)
	}
}

// hangUp returns the address of a listener that closes every connection
// it accepts without a byte: a provider that is down. It stays bound
// until the test ends, so no other server can take its port meanwhile
// (a fixed "unreachable" port such as 1 can be bound by anyone root).
func hangUp(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return ln.Addr().String()
}

// Errors: no or bad tokens, another lease, an unconfigured model, a body
// too large, a provider's error (recorded as the step's error and replayed
// as it came) and an unreachable provider.
func TestErrors(t *testing.T) {
	g := startGW(t, kernel.Config{}, llmgw.Provider{Name: "down", Dialect: llmgw.DialectAnthropic, BaseURL: "http://" + hangUp(t),
		Models: []llmgw.Model{{Name: "claude-down"}}})
	url := g.env.URL + "/llm/openai/v1/chat/completions"
	chat := `{"model":"gpt-fake","messages":[{"role":"user","content":"hi"}]}`

	st, body := rawCall(t, url, "", chat)
	if st != 401 || !strings.Contains(body, `"type":"authentication_error"`) || !strings.Contains(body, "llm_gateway_token") {
		t.Fatalf("no token: %d %s", st, body)
	}
	st, body = rawCall(t, g.env.URL+"/llm/anthropic/v1/messages", "wkg1.nope", chat)
	if st != 401 || !strings.HasPrefix(body, `{"error":{"message":`) && !strings.Contains(body, `"type":"error"`) {
		t.Fatalf("bad token: %d %s", st, body)
	}
	st, body = rawCall(t, g.env.URL+"/llm/openai/v1/models", "", "")
	if st != 404 {
		t.Fatalf("unknown route: %d %s", st, body)
	}

	type res struct {
		name, out string
	}
	var mu sync.Mutex
	var got []res
	g.setHandler(func(ctx context.Context, r *testkit.Run) (any, error) {
		add := func(name string, st int, body string) {
			mu.Lock()
			got = append(got, res{name, fmt.Sprintf("%d %s", st, body)})
			mu.Unlock()
		}
		fake := "wkg1." + r.ExecutionID + "." + strings.Repeat("A", 43)
		st, b := rawCall(t, url, fake, chat)
		add("forged", st, b)
		st, b = rawCall(t, url, r.LLMGatewayToken, chat, "Rebuno-Dispatch-Attempt", fmt.Sprint(r.Lease.Attempt+1), "Rebuno-Dispatch-Id", r.Lease.DispatchID)
		add("lease", st, b)
		st, b = rawCall(t, url, r.LLMGatewayToken, `{"model":"gpt-5-unknown","messages":[]}`)
		add("model", st, b)
		st, b = rawCall(t, url, r.LLMGatewayToken, `{"model":"gpt-fake","pad":"`+strings.Repeat("x", 9<<20)+`"}`)
		add("large", st, b)
		st, b = rawCall(t, url, r.LLMGatewayToken, `{"model":`)
		add("json", st, b)
		st, b = rawCall(t, url, r.LLMGatewayToken, `[{"model":"gpt-fake"}]`)
		add("array", st, b)
		st, b = rawCall(t, url, r.LLMGatewayToken, `{"model":["gpt-fake"]}`)
		add("model type", st, b)
		st, b = rawCall(t, url, r.LLMGatewayToken, `{"model":"gpt-error","messages":[{"role":"user","content":"x"}]}`)
		add("provider", st, b)
		st, b = rawCall(t, g.env.URL+"/llm/anthropic/v1/messages", "", `{"model":"claude-down","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`,
			"X-Api-Key", r.LLMGatewayToken)
		add("down", st, b)
		if r.Attempt == 1 {
			return nil, errors.New("try again") // fails: no re-delivery; the test re-runs by hand below
		}
		return map[string]any{}, nil
	})
	id := g.env.CreateExecution(g.agent.ID, map[string]any{})
	g.env.WaitTerminal(id, 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	want := map[string]string{
		"forged": `401 {"error":{"code":"authentication_error","message":"invalid gateway token: unknown or expired"`,
		"lease":  `409 {"error":{"code":"lease_superseded"`,
		"model":  `404 {"error":{"code":"model_not_configured","message":"model \"gpt-5-unknown\" is not configured for openai calls of tenant default (configured: embed-fake, gpt-denied, gpt-error, gpt-fake, gpt-gated, gpt-limited)"`,
		"large":  `413 {"error":{"code":"request_too_large"`,
		"json":   `400 {"error":{"code":"invalid_request_error"`,
		// Precise, in the request's own terms, not Go's decoder's.
		"array":      `400 {"error":{"code":"invalid_request_error","message":"the request body must be a JSON object"`,
		"model type": `400 {"error":{"code":"invalid_request_error","message":"the request's \"model\" must be a string, not [\"gpt-fake\"]"`,
		"provider":   `500 {"error":{"code":null,"message":"the fake model gpt-error always fails","type":"api_error"}}`,
		"down":       `502 {"error":{"message":"the provider gave no whole answer: provider down: `,
	}
	if len(got) != len(want) {
		t.Fatalf("results %+v", got)
	}
	for _, r := range got {
		if !strings.HasPrefix(r.out, want[r.name]) {
			t.Errorf("%s: %s\nwant prefix %s", r.name, r.out, want[r.name])
		}
	}
	// The provider's error and the unreachable provider are the steps'
	// recorded errors; nothing else made a step.
	var list struct{ Steps []kernel.Step }
	if _, err := g.env.Admin("GET", "/v0/executions/"+id+"/steps", nil, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Steps) != 2 {
		t.Fatalf("steps %+v", list.Steps)
	}
	for _, s := range list.Steps {
		var rec llmrec.Response
		if err := json.Unmarshal(s.Error, &rec); err != nil || s.Status != kernel.StepFailed {
			t.Fatalf("step %+v", s)
		}
		switch s.Target {
		case "gpt-error":
			if rec.Status != 500 || !strings.Contains(rec.Body, "always fails") {
				t.Fatalf("recorded %+v", rec)
			}
		case "claude-down":
			if rec.Status != 0 || !strings.Contains(rec.Message, "provider down") {
				t.Fatalf("recorded %+v", rec)
			}
		default:
			t.Fatalf("step %+v", s)
		}
	}
}

// A streamed call's events reach the execution's watchers as step.delta
// frames while the call runs.
func TestStreamDeltas(t *testing.T) {
	g := startGW(t, kernel.Config{})
	watching := make(chan struct{})
	g.setHandler(func(ctx context.Context, r *testkit.Run) (any, error) {
		select {
		case <-watching:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		_, ac := g.clients(r, 0)
		st := ac.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "claude-fake", MaxTokens: 64,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("tell me more"))}})
		n := 0
		for st.Next() {
			n++
		}
		return map[string]int{"events": n}, st.Err()
	})
	id := g.env.CreateExecution(g.agent.ID, map[string]any{})
	req, _ := http.NewRequest("GET", g.env.URL+"/v0/executions/"+id+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+testkit.AdminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	close(watching)
	deltas, events := 0, 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "event: step.delta" {
			deltas++
		}
		if line == "event: execution.completed" || line == "event: execution.failed" {
			break
		}
	}
	x := g.env.WaitTerminal(id, 30*time.Second)
	if err := json.Unmarshal(x.Output, &struct{ Events *int }{&events}); err != nil || x.Status != kernel.ExecCompleted {
		t.Fatalf("execution %s %s", x.Status, x.Output)
	}
	// Every server-sent event of the answer is one delta (the client
	// skips none of Anthropic's events but ping).
	if deltas == 0 || deltas < events {
		t.Fatalf("%d deltas for a stream of %d events", deltas, events)
	}
}

// A caller that goes away in the middle of a stream does not stop the
// call from being recorded whole.
func TestStreamRecordedWhenTheCallerLeaves(t *testing.T) {
	g := startGWWith(t, kernel.Config{}, &fakellm.Provider{APIKey: providerKey, Delay: 10 * time.Millisecond})
	left := make(chan string, 1)
	g.setHandler(func(ctx context.Context, r *testkit.Run) (any, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", g.env.URL+"/llm/openai/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-fake","stream":true,"messages":[{"role":"user","content":"a long story please"}]}`))
		req.Header.Set("Authorization", "Bearer "+r.LLMGatewayToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, 16)
		_, err = io.ReadFull(resp.Body, buf) // the first bytes, then leave
		resp.Body.Close()
		left <- resp.Header.Get(llmrec.HeaderStepID)
		if err != nil {
			return nil, err
		}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	id := g.env.CreateExecution(g.agent.ID, map[string]any{})
	stepID := <-left
	deadline := time.Now().Add(30 * time.Second)
	for {
		var s kernel.Step
		if _, err := g.env.Admin("GET", "/v0/executions/"+id+"/steps/"+stepID, nil, &s); err != nil {
			t.Fatal(err)
		}
		if s.Status == kernel.StepSucceeded {
			var rec llmrec.Response
			if err := json.Unmarshal(s.Result, &rec); err != nil || !rec.Stream || !strings.HasSuffix(rec.Body, "data: [DONE]\n\n") ||
				!strings.Contains(rec.Body, `"usage"`) || s.Usage == nil {
				t.Fatalf("recorded %+v (%v), usage %+v", rec, err, s.Usage)
			}
			break
		}
		if s.Status != kernel.StepExecuting || time.Now().After(deadline) {
			t.Fatalf("step %s: %s", stepID, s.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if g.prov.Calls() != 1 {
		t.Fatalf("provider calls %d", g.prov.Calls())
	}
}

// A caller that stops reading at the stream's last event, as the OpenAI
// client does at "data: [DONE]", and goes on finds the call on the
// record: the gateway sends that event only once the step is recorded.
func TestStreamRecordedBeforeItsLastEvent(t *testing.T) {
	g := startGW(t, kernel.Config{})
	g.setHandler(func(ctx context.Context, r *testkit.Run) (any, error) {
		var statuses []string
		for i := 0; i < 5; i++ {
			req, _ := http.NewRequestWithContext(ctx, "POST", g.env.URL+"/llm/openai/v1/chat/completions",
				strings.NewReader(fmt.Sprintf(`{"model":"gpt-fake","stream":true,"messages":[{"role":"user","content":"story %d"}]}`, i)))
			req.Header.Set("Authorization", "Bearer "+r.LLMGatewayToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return nil, err
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() && sc.Text() != "data: [DONE]" {
			}
			var s kernel.Step
			_, err = g.env.Admin("GET", "/v0/executions/"+r.ExecutionID+"/steps/"+resp.Header.Get(llmrec.HeaderStepID), nil, &s)
			resp.Body.Close()
			if err != nil {
				return nil, err
			}
			statuses = append(statuses, string(s.Status))
		}
		return statuses, nil
	})
	id := g.env.CreateExecution(g.agent.ID, map[string]any{})
	x := g.env.WaitTerminal(id, 30*time.Second)
	if x.Status != kernel.ExecCompleted || string(x.Output) != `["succeeded","succeeded","succeeded","succeeded","succeeded"]` {
		t.Fatalf("execution %s: %s %s", x.Status, x.Output, x.Error)
	}
}

// Providers are per tenant: tenant acme's agent reaches only acme's
// provider (with acme's key, even for a model name the default tenant also
// configures) and none of the default tenant's models; the default
// tenant's agent cannot reach acme's models, and the 404 lists only its own.
func TestProvidersPerTenant(t *testing.T) {
	const acmeKey = "sk-acme-provider-key-0123456789abcdef"
	acmeProv := &fakellm.Provider{APIKey: acmeKey}
	acmeBase, stop, err := fakellm.Listen("127.0.0.1:0", acmeProv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop() })
	g := startGW(t, kernel.Config{}, llmgw.Provider{Name: "acme-openai", Tenant: "acme", Dialect: llmgw.DialectOpenAI,
		BaseURL: acmeBase + "/v1", APIKey: acmeKey, Models: []llmgw.Model{{Name: "gpt-acme"}, {Name: "gpt-fake"}}})
	if _, err := g.env.Admin("POST", "/v0/tenants", map[string]any{"id": "acme"}, nil); err != nil {
		t.Fatal(err)
	}
	var k struct{ Key string }
	if _, err := g.env.Admin("POST", "/v0/tenants/acme/keys", map[string]any{"role": "tenant-admin", "principal": "acme-ops"}, &k); err != nil {
		t.Fatal(err)
	}

	type res struct{ name, out string }
	var mu sync.Mutex
	var got []res
	calls := func(prefix string, list [][3]string) testkit.Handler {
		return func(ctx context.Context, r *testkit.Run) (any, error) {
			for _, c := range list { // name, path, model
				body := `{"model":"` + c[2] + `","messages":[{"role":"user","content":"hi"}]}`
				if strings.Contains(c[1], "anthropic") {
					body = `{"model":"` + c[2] + `","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
				}
				st, b := rawCall(t, g.env.URL+c[1], r.LLMGatewayToken, body)
				mu.Lock()
				got = append(got, res{prefix + c[0], fmt.Sprintf("%d %s", st, b)})
				mu.Unlock()
			}
			return map[string]any{}, nil
		}
	}
	const chat, messages = "/llm/openai/v1/chat/completions", "/llm/anthropic/v1/messages"
	acme := testkit.NewAgent("bot", "acme-bot-secret-0123456789", g.env.URL, calls("acme/", [][3]string{
		{"own", chat, "gpt-acme"}, {"same-name", chat, "gpt-fake"}, {"default-model", chat, "embed-fake"}, {"no-dialect", messages, "claude-fake"},
	}))
	t.Cleanup(acme.Close)
	if _, err := g.env.As(k.Key, "POST", "/v0/agents", map[string]any{"id": "bot", "webhook_url": acme.WebhookURL(), "secret": string(acme.Secret)}, nil); err != nil {
		t.Fatal(err)
	}
	var x kernel.Execution
	if _, err := g.env.As(k.Key, "POST", "/v0/executions", map[string]any{"agent_id": "bot"}, &x); err != nil {
		t.Fatal(err)
	}
	if x.Tenant != "acme" {
		t.Fatalf("execution tenant %q", x.Tenant)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var cur kernel.Execution
		if _, err := g.env.As(k.Key, "GET", "/v0/executions/"+x.ID, nil, &cur); err != nil {
			t.Fatal(err)
		}
		if cur.Status.Terminal() {
			if cur.Status != kernel.ExecCompleted {
				t.Fatalf("acme's execution %s %s (agent errors %v)", cur.Status, cur.Error, acme.Errors())
			}
			if cur.Totals.LLMCalls != 2 {
				t.Fatalf("acme's totals %+v", cur.Totals)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acme's execution is %s", cur.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	g.setHandler(calls("default/", [][3]string{{"acme-model", chat, "gpt-acme"}, {"own", chat, "gpt-fake"}}))
	if x := g.env.WaitTerminal(g.env.CreateExecution(g.agent.ID, map[string]any{}), 30*time.Second); x.Status != kernel.ExecCompleted {
		t.Fatalf("default's execution %s %s", x.Status, x.Error)
	}

	want := map[string]string{
		"acme/own":           `200 {`,
		"acme/same-name":     `200 {`,
		"acme/default-model": `404 {"error":{"code":"model_not_configured","message":"model \"embed-fake\" is not configured for openai calls of tenant acme (configured: gpt-acme, gpt-fake)"`,
		"acme/no-dialect":    `404 {"error":{"message":"model \"claude-fake\" is not configured for anthropic calls of tenant acme (it has no anthropic provider)","type":"model_not_configured"}`,
		"default/acme-model": `404 {"error":{"code":"model_not_configured","message":"model \"gpt-acme\" is not configured for openai calls of tenant default (configured: embed-fake, gpt-denied, gpt-error, gpt-fake, gpt-gated, gpt-limited)"`,
		"default/own":        `200 {`,
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("results %+v", got)
	}
	for _, r := range got {
		if !strings.HasPrefix(r.out, want[r.name]) {
			t.Errorf("%s: %s\nwant prefix %s", r.name, r.out, want[r.name])
		}
	}
	// acme's calls went to acme's provider (which checks acme's key), the
	// default tenant's to its own.
	if acmeProv.Calls() != 2 || g.prov.Calls() != 1 {
		t.Fatalf("provider calls: acme %d, default %d; want 2 and 1", acmeProv.Calls(), g.prov.Calls())
	}
	for _, rq := range acmeProv.Requests() {
		if rq.Header.Get("Authorization") != "Bearer "+acmeKey {
			t.Fatalf("acme's provider got %q", rq.Header.Get("Authorization"))
		}
	}
}

// TestOutputCapSharedByChoices: a call asking for n choices may use its
// output cap once per choice, so under max_output_tokens_per_call an
// uncapped call gets the limit divided among its choices, and a capped one
// whose choices together ask for more is refused before the call.
func TestOutputCapSharedByChoices(t *testing.T) {
	g := startGW(t, kernel.Config{})
	url := g.env.URL + "/llm/openai/v1/chat/completions"
	var mu sync.Mutex
	got := map[string]string{}
	bodies := []string{`"n":3`, `"n":2,"max_tokens":5`, `"n":10`}
	g.setHandler(func(ctx context.Context, r *testkit.Run) (any, error) {
		for i, b := range bodies {
			st, out := rawCall(t, url, r.LLMGatewayToken, fmt.Sprintf(`{"model":"gpt-fake","messages":[{"role":"user","content":"choices %d"}],%s}`, i, b))
			mu.Lock()
			got[b] = fmt.Sprintf("%d %s", st, out)
			mu.Unlock()
		}
		return map[string]any{}, nil
	})
	var x kernel.Execution
	if _, err := g.env.Admin("POST", "/v0/executions", map[string]any{"agent_id": g.agent.ID, "input": map[string]any{},
		"limits": map[string]any{"max_output_tokens_per_call": 9}}, &x); err != nil {
		t.Fatal(err)
	}
	g.env.WaitTerminal(x.ID, 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if !strings.HasPrefix(got[`"n":3`], "200 ") {
		t.Errorf("3 choices, no cap, under a limit of 9: %s", got[`"n":3`])
	}
	for _, b := range []string{`"n":2,"max_tokens":5`, `"n":10`} {
		if !strings.HasPrefix(got[b], "403 ") || !strings.Contains(got[b], "rebuno_refusal: denied reason=limit_output_tokens") {
			t.Errorf("%s under a limit of 9: %s", b, got[b])
		}
	}
	reqs := g.prov.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests reached the provider, want 1", len(reqs))
	}
	if !bytes.Contains(reqs[0].Body, []byte(`"max_completion_tokens":3`)) {
		t.Errorf("3 choices under a limit of 9 went out as %s", reqs[0].Body)
	}
}

// TestOutputCapsThatAreNotIntegers: under max_output_tokens_per_call, a
// request's own cap is held to the limit whatever its JSON form (an
// exponent, a fraction, a string a lenient provider reads as a number)
// and refused before the call; a null cap is no cap and gets the limit.
func TestOutputCapsThatAreNotIntegers(t *testing.T) {
	g := startGW(t, kernel.Config{})
	url := g.env.URL + "/llm/openai/v1/chat/completions"
	var mu sync.Mutex
	got := map[string]string{}
	caps := []string{`1e3`, `3.5`, `"500"`, `true`, `null`, `2`}
	g.setHandler(func(ctx context.Context, r *testkit.Run) (any, error) {
		for i, c := range caps {
			st, b := rawCall(t, url, r.LLMGatewayToken, fmt.Sprintf(`{"model":"gpt-fake","messages":[{"role":"user","content":"cap %d"}],"max_tokens":%s}`, i, c))
			mu.Lock()
			got[c] = fmt.Sprintf("%d %s", st, b)
			mu.Unlock()
		}
		return map[string]any{}, nil
	})
	var x kernel.Execution
	if _, err := g.env.Admin("POST", "/v0/executions", map[string]any{"agent_id": g.agent.ID, "input": map[string]any{},
		"limits": map[string]any{"max_output_tokens_per_call": 3}}, &x); err != nil {
		t.Fatal(err)
	}
	g.env.WaitTerminal(x.ID, 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	for _, c := range []string{`1e3`, `3.5`, `"500"`, `true`} {
		if !strings.HasPrefix(got[c], "403 ") || !strings.Contains(got[c], "rebuno_refusal: denied reason=limit_output_tokens") {
			t.Errorf("max_tokens %s under a limit of 3: %s", c, got[c])
		}
	}
	for _, c := range []string{`null`, `2`} {
		if !strings.HasPrefix(got[c], "200 ") {
			t.Errorf("max_tokens %s under a limit of 3: %s", c, got[c])
		}
	}
	reqs := g.prov.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests reached the provider, want 2", len(reqs))
	}
	for _, rq := range reqs {
		switch {
		case bytes.Contains(rq.Body, []byte("cap 4")): // null
			if !bytes.Contains(rq.Body, []byte(`"max_completion_tokens":3`)) || bytes.Contains(rq.Body, []byte(`"max_tokens"`)) {
				t.Errorf("a null cap went out as %s", rq.Body)
			}
		case !bytes.Contains(rq.Body, []byte(`"max_tokens":2}`)):
			t.Errorf("unexpected request %s", rq.Body)
		}
	}
}
