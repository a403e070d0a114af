package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// Client speaks the agent side of the /v0 protocol: every request is signed
// with the agent's secret; mutations carry the lease headers.
type Client struct {
	BaseURL string
	AgentID string
	Secret  []byte
	// Signing is the scheme: kernel.SigningV1 (empty) or kernel.SigningBody.
	Signing string
	HTTP    *http.Client
}

// APIError is a non-2xx answer of the kernel.
type APIError struct {
	Status  int
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *APIError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// Do sends a signed request. body may be nil, []byte (sent raw) or a value
// encoded as JSON; out, when non-nil, receives the decoded 2xx answer.
func (c *Client) Do(ctx context.Context, method, path string, lease *kernel.Lease, body, out any) error {
	var raw []byte
	switch b := body.(type) {
	case nil:
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			return err
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.HeaderAgentID, c.AgentID)
	if lease != nil {
		req.Header.Set(wire.HeaderDispatchID, lease.DispatchID)
		req.Header.Set(wire.HeaderDispatchAttempt, strconv.Itoa(lease.Attempt))
	}
	if c.Signing == kernel.SigningBody {
		req.Header.Set(wire.HeaderSignature, wire.Sign(c.Secret, raw))
	} else {
		wire.SignRequest(req, c.Secret, raw, time.Now())
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		ae := &APIError{Status: resp.StatusCode}
		_ = json.Unmarshal(data, ae)
		return ae
	}
	if out != nil && len(data) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

// DecisionError is returned by Run.Step for every decision other than
// proceed and replay.
type DecisionError struct {
	Decision kernel.StepDecision
}

func (e *DecisionError) Error() string {
	return fmt.Sprintf("step %s: %s (%s)", e.Decision.StepID, e.Decision.Decision, e.Decision.Reason)
}

// StepError is a recorded step failure, returned on proceed-then-fail and on replay of a failed step.
type StepError struct {
	StepID string
	Err    json.RawMessage
}

func (e *StepError) Error() string { return fmt.Sprintf("step %s failed: %s", e.StepID, e.Err) }

// Run is one dispatch attempt as the agent sees it.
type Run struct {
	c           *Client
	ExecutionID string
	Lease       kernel.Lease
	Input       json.RawMessage
	// LLMGatewayToken is the webhook's llm_gateway_token.
	LLMGatewayToken string
	// Attempt counts the agent's runs of this execution, from 1.
	Attempt int
	// Decisions records every decision this run received, in order.
	mu        sync.Mutex
	Decisions []kernel.StepDecision
}

// StepOpts are the optional fields of a submission.
type StepOpts struct {
	Idempotency string
	Effect      string
}

// Step submits a step; on proceed it runs fn and records its outcome, on
// replay it returns the recorded outcome without running fn.
func (r *Run) Step(ctx context.Context, kind, target string, args any, opts StepOpts, fn func() (any, error)) (json.RawMessage, error) {
	body := map[string]any{"kind": kind, "target": target, "args": args}
	if opts.Idempotency != "" {
		body["idempotency"] = opts.Idempotency
	}
	if opts.Effect != "" {
		body["effect"] = opts.Effect
	}
	var d kernel.StepDecision
	if err := r.c.Do(ctx, "POST", "/v0/executions/"+r.ExecutionID+"/steps", &r.Lease, body, &d); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.Decisions = append(r.Decisions, d)
	r.mu.Unlock()
	switch d.Decision {
	case kernel.DecisionReplay:
		if d.Error != nil {
			return nil, &StepError{StepID: d.StepID, Err: d.Error}
		}
		return d.Result, nil
	case kernel.DecisionProceed:
	default:
		return nil, &DecisionError{Decision: d}
	}
	v, ferr := fn()
	if ferr != nil {
		e := map[string]any{"message": ferr.Error()}
		if err := r.c.Do(ctx, "POST", "/v0/executions/"+r.ExecutionID+"/steps/"+d.StepID+"/fail", &r.Lease, map[string]any{"error": e}, nil); err != nil {
			return nil, err
		}
		raw, _ := json.Marshal(e)
		return nil, &StepError{StepID: d.StepID, Err: raw}
	}
	res, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if err := r.c.Do(ctx, "POST", "/v0/executions/"+r.ExecutionID+"/steps/"+d.StepID+"/complete", &r.Lease, map[string]any{"result": json.RawMessage(res)}, nil); err != nil {
		return nil, err
	}
	return res, nil
}

// Handler is an agent's work for one dispatch. Its output completes the
// execution; an error fails it, except a DecisionError for blocked or
// terminal decisions and a superseded lease, which just end the attempt.
type Handler func(ctx context.Context, r *Run) (any, error)

// ErrAbandon, returned by a Handler, ends the attempt without failing or
// completing the execution, as an agent does when it lost touch with the
// kernel: its heartbeats stop, the lease runs out and the dispatch is
// delivered again, where the recorded steps replay.
var ErrAbandon = errors.New("testkit: attempt abandoned")

// Agent is a real HTTP agent on loopback.
type Agent struct {
	ID     string
	Secret []byte
	// Signing is the agent's scheme: kernel.SigningV1 (empty) or
	// kernel.SigningBody. Set it with SetSigning before registering.
	Signing string
	Server  *httptest.Server
	Client  *Client
	Handler Handler
	// HeartbeatEvery, when > 0, renews the lease while the handler runs.
	HeartbeatEvery time.Duration
	// Fail, when set, is consulted for every webhook; a non-zero status is answered without running the handler.
	Fail func(p wire.WebhookPayload) int
	// SlowAck, when > 0, delays the webhook's answer while the handler
	// already runs (an agent whose acknowledgement is lost or late).
	SlowAck time.Duration

	Webhooks atomic.Int64 // webhooks received with a valid signature
	Acks     atomic.Int64 // webhooks answered 202 (after SlowAck)
	running  atomic.Int64 // dispatches whose run (handler and final call) is not over
	BadSigs  atomic.Int64 // webhooks refused for their signature
	wg       sync.WaitGroup
	ctx      context.Context
	cancel   context.CancelFunc

	mu   sync.Mutex
	Runs []*Run
	Errs []error
}

// NewAgent starts an agent server; register it with the kernel afterwards
// (its URL is a.Server.URL + "/webhook").
func NewAgent(id, secret, kernelURL string, h Handler) *Agent {
	ctx, cancel := context.WithCancel(context.Background())
	a := &Agent{ID: id, Secret: []byte(secret), Handler: h, ctx: ctx, cancel: cancel}
	a.Client = &Client{BaseURL: kernelURL, AgentID: id, Secret: a.Secret}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serveWebhook))
	return a
}

// SetSigning makes the agent sign its requests and verify its webhooks
// under scheme (register it with the same "signing").
func (a *Agent) SetSigning(scheme string) {
	a.Signing = scheme
	a.Client.Signing = scheme
}

// WebhookURL is where the kernel should post dispatches.
func (a *Agent) WebhookURL() string { return a.Server.URL + "/webhook" }

// Close stops the agent and waits for its handlers.
func (a *Agent) Close() {
	a.cancel()
	a.Server.Close()
	a.wg.Wait()
}

func (a *Agent) serveWebhook(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	ok := false
	if a.Signing == kernel.SigningBody {
		ok = r.Header.Get(wire.HeaderWicketSignature) == "" && wire.Verify(a.Secret, body, r.Header.Get(wire.HeaderSignature))
	} else {
		ok = r.Header.Get(wire.HeaderSignature) == "" &&
			wire.VerifyV1(a.Secret, r.Header.Get(wire.HeaderWicketSignature), wire.SignedRequestOf(r, body), time.Now(), 0) == nil
	}
	if !ok {
		a.BadSigs.Add(1)
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var p wire.WebhookPayload
	if err := json.Unmarshal(body, &p); err != nil {
		http.Error(w, "bad payload", http.StatusBadRequest)
		return
	}
	a.Webhooks.Add(1)
	if a.Fail != nil {
		if st := a.Fail(p); st != 0 {
			w.WriteHeader(st)
			return
		}
	}
	a.wg.Add(1)
	a.running.Add(1)
	go a.run(p)
	if a.SlowAck > 0 {
		select {
		case <-time.After(a.SlowAck):
		case <-a.ctx.Done():
		}
	}
	w.WriteHeader(http.StatusAccepted)
	a.Acks.Add(1)
}

func (a *Agent) run(p wire.WebhookPayload) {
	defer a.wg.Done()
	defer a.running.Add(-1)
	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	run := &Run{c: a.Client, ExecutionID: p.ExecutionID, Lease: kernel.Lease{DispatchID: p.DispatchID, Attempt: p.DispatchAttempt},
		LLMGatewayToken: p.LLMGatewayToken}
	a.mu.Lock()
	for _, r := range a.Runs {
		if r.ExecutionID == p.ExecutionID {
			run.Attempt++
		}
	}
	run.Attempt++
	a.Runs = append(a.Runs, run)
	a.mu.Unlock()
	record := func(err error) {
		a.mu.Lock()
		a.Errs = append(a.Errs, err)
		a.mu.Unlock()
	}
	var e kernel.Execution
	if err := a.Client.Do(ctx, "GET", "/v0/executions/"+p.ExecutionID, nil, nil, &e); err != nil {
		record(fmt.Errorf("get execution: %w", err))
		return
	}
	run.Input = e.Input
	if a.HeartbeatEvery > 0 {
		go func() {
			t := time.NewTicker(a.HeartbeatEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if err := a.Client.Do(ctx, "POST", "/v0/executions/"+p.ExecutionID+"/heartbeat", &run.Lease, []byte("{}"), nil); err != nil {
						var ae *APIError
						if errors.As(err, &ae) && ae.Code == kernel.CodeLeaseSuperseded {
							cancel()
						}
					}
				}
			}
		}()
	}
	out, err := a.Handler(ctx, run)
	if err != nil {
		var de *DecisionError
		var ae *APIError
		switch {
		case errors.As(err, &de) && (de.Decision.Decision == kernel.DecisionBlocked || de.Decision.Decision == kernel.DecisionExecutionBlocked || de.Decision.Decision == kernel.DecisionExecutionTerminal):
			return
		case errors.As(err, &ae) && ae.Code == kernel.CodeLeaseSuperseded:
			record(err)
			return
		case ctx.Err() != nil, errors.Is(err, ErrAbandon):
			return
		}
		if ferr := a.Client.Do(context.Background(), "POST", "/v0/executions/"+p.ExecutionID+"/fail", &run.Lease, map[string]any{"error": map[string]any{"message": err.Error()}}, nil); ferr != nil {
			record(fmt.Errorf("fail execution: %w", ferr))
		}
		return
	}
	if err := a.Client.Do(context.Background(), "POST", "/v0/executions/"+p.ExecutionID+"/complete", &run.Lease, map[string]any{"output": out}, nil); err != nil {
		record(fmt.Errorf("complete execution: %w", err))
	}
}

// Running returns how many dispatches the agent is still working on, the
// call that completes or fails the execution included.
func (a *Agent) Running() int { return int(a.running.Load()) }

// Errors returns the errors the agent recorded.
func (a *Agent) Errors() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]error(nil), a.Errs...)
}

// Client returns the signed client of the run's agent.
func (r *Run) Client() *Client { return r.c }
