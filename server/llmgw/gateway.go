// Package llmgw is the kernel's LLM gateway: OpenAI- and Anthropic-
// compatible endpoints under /llm/ that make every model call of an agent,
// written in any language with a stock provider client, an llm_call step.
//
// For each request the gateway authenticates the dispatch attempt's
// gateway token (kernel.AuthenticateLLMToken), finds the tenant's provider
// of the model, and submits the step (target: the model, args: the request
// body). A replay answers the recorded bytes without calling the provider;
// a proceed forwards the request with the provider's key and records the
// answer exactly as the Go SDK's Transport does (internal/llmrec), passing
// a stream through as it arrives with each event posted as a step delta;
// any other decision is refused with 403 (429 for rate_limited) and the
// rebuno_refusal marker. docs/llm-gateway.md is the user's guide.
package llmgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/wicket-run/wicket/internal/llmrec"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/server/wire"
)

// Headers of the gateway.
const (
	// HeaderExecutionID may name the execution the call belongs to; when
	// sent, it must be the token's.
	HeaderExecutionID = "Rebuno-Execution-Id"
	// HeaderToken may carry the gateway token instead of the API key
	// headers (Authorization: Bearer, x-api-key).
	HeaderToken = "Wicket-Gateway-Token"
	// headerShouldRetry tells the providers' SDKs (Stainless-generated)
	// whether to retry an answer; refusals say "false".
	headerShouldRetry = "X-Should-Retry"
)

// Defaults of Config.
const (
	DefaultMaxBodyBytes    int64 = 8 << 20
	DefaultUpstreamTimeout       = 10 * time.Minute
	// defaultAnthropicVersion is sent when the client sends none.
	defaultAnthropicVersion = "2023-06-01"
)

// Config configures a Gateway.
type Config struct {
	// Providers are the upstreams, per tenant.
	Providers []Provider
	// MaxBodyBytes bounds a request body (default 8 MiB); more is 413.
	MaxBodyBytes int64
	// UpstreamTimeout bounds one provider call, stream included (default
	// 10 min).
	UpstreamTimeout time.Duration
	// Transport sends provider requests (default: a pooled transport that
	// honours HTTP(S)_PROXY and follows no redirects).
	Transport http.RoundTripper
	// Deltas passes a stream's events to the execution's watchers (the
	// server's SSE hub); nil drops them.
	Deltas func(executionID string, d wire.StepDeltaEvent) int
	// Observe, when set, is told the outcome of every request (for metrics).
	Observe func(Observation)
	// Logger receives errors (default slog.Default()).
	Logger *slog.Logger
}

// Observation is one gateway request as metrics see it.
type Observation struct {
	Tenant   string
	Dialect  string
	Model    string
	Decision string // the kernel's decision; "" when the request did not reach it
	Status   int
	// Upstream is how long the provider call took (zero without one).
	Upstream time.Duration
	Usage    *wire.Usage
}

// Gateway serves /llm/. Create it with New.
type Gateway struct {
	k      *kernel.Kernel
	cfg    Config
	routes routes
	tr     http.RoundTripper
	log    *slog.Logger
}

// New validates cfg's providers and builds a gateway over k. k must be
// configured with kernel.Config.LLMGatewayTokens, or no token will ever
// authenticate.
func New(k *kernel.Kernel, cfg Config) (*Gateway, error) {
	if len(cfg.Providers) == 0 {
		return nil, errNoProviders
	}
	rt, err := buildRoutes(cfg.Providers)
	if err != nil {
		return nil, err
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	tr := cfg.Transport
	if tr == nil {
		tr = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          256,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: cfg.UpstreamTimeout,
		}
	}
	return &Gateway{k: k, cfg: cfg, routes: rt, tr: tr, log: cfg.Logger}, nil
}

// Tenants returns how many providers each tenant has (for the boot log).
func (g *Gateway) Tenants() map[string]int {
	out := map[string]int{}
	for i := range g.cfg.Providers {
		out[g.cfg.Providers[i].Tenant]++
	}
	return out
}

// endpoint is one gateway route.
type endpoint struct {
	dialect string
	// upstream is the path appended to the provider's base URL.
	upstream string
	// kind says which output cap and usage option apply.
	kind string
}

// Endpoint kinds.
const (
	kindChat       = "chat"
	kindResponses  = "responses"
	kindEmbeddings = "embeddings"
	kindMessages   = "messages"
)

// Prefix is where the gateway is mounted.
const Prefix = "/llm/"

var endpoints = map[string]endpoint{
	"/llm/openai/v1/chat/completions": {DialectOpenAI, "/chat/completions", kindChat},
	"/llm/openai/v1/responses":        {DialectOpenAI, "/responses", kindResponses},
	"/llm/openai/v1/embeddings":       {DialectOpenAI, "/embeddings", kindEmbeddings},
	"/llm/anthropic/v1/messages":      {DialectAnthropic, "/v1/messages", kindMessages},
}

// ServeHTTP serves one gateway request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ep, ok := endpoints[r.URL.Path]
	if !ok {
		dialect := DialectOpenAI
		if strings.HasPrefix(r.URL.Path, "/llm/anthropic/") {
			dialect = DialectAnthropic
		}
		closeUnread(w, r)
		writeError(w, dialect, http.StatusNotFound, "not_found_error", "no gateway route for "+r.URL.Path+
			" (the gateway serves POST /llm/openai/v1/chat/completions, /llm/openai/v1/responses, /llm/openai/v1/embeddings and /llm/anthropic/v1/messages)")
		return
	}
	if r.Method != http.MethodPost {
		closeUnread(w, r)
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, ep.dialect, http.StatusMethodNotAllowed, "invalid_request_error", "method "+r.Method+" is not allowed on "+r.URL.Path+"; use POST")
		return
	}
	obs := Observation{Dialect: ep.dialect}
	defer func() {
		if g.cfg.Observe != nil {
			g.cfg.Observe(obs)
		}
	}()
	sw := &statusWriter{ResponseWriter: w}
	g.serve(sw, r, ep, &obs)
	obs.Status = sw.status
}

// serve runs one request: authenticate, read, route, submit, then answer
// the decision.
func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, ep endpoint, obs *Observation) {
	// Credentials are checked before a byte of the body is read.
	call, err := g.authenticate(r)
	if err != nil {
		closeUnread(w, r)
		g.writeKernelError(w, ep.dialect, err)
		return
	}
	obs.Tenant = call.Tenant
	body, err := readBody(w, r, g.cfg.MaxBodyBytes)
	if err != nil {
		g.writeKernelError(w, ep.dialect, err)
		return
	}
	model, err := modelOf(body)
	if err != nil {
		writeError(w, ep.dialect, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	obs.Model = model
	rt, ok := g.routes[call.Tenant][ep.dialect][model]
	if !ok {
		msg := fmt.Sprintf("model %q is not configured for %s calls of tenant %s", model, ep.dialect, call.Tenant)
		if ms := g.routes.models(call.Tenant, ep.dialect); len(ms) > 0 {
			msg += " (configured: " + strings.Join(ms, ", ") + ")"
		} else {
			msg += " (it has no " + ep.dialect + " provider)"
		}
		writeError(w, ep.dialect, http.StatusNotFound, "model_not_configured", msg)
		return
	}
	// The record outlives the caller: a client that goes away mid-call
	// does not stop the provider call from being recorded whole.
	ctx := context.WithoutCancel(r.Context())
	d, err := g.k.SubmitStep(ctx, kernel.StepRequest{AgentCall: call.AgentCall, Kind: policy.KindLLMCall, Target: model, Args: body})
	if err != nil {
		g.writeKernelError(w, ep.dialect, err)
		return
	}
	obs.Decision = string(d.Decision)
	w.Header().Set(llmrec.HeaderStepID, d.StepID)
	switch d.Decision {
	case kernel.DecisionReplay:
		g.replay(w, ep, d)
	case kernel.DecisionProceed:
		g.proceed(ctx, w, r, ep, call, rt, body, d.StepID, obs)
	default:
		status, b := llmrec.Refusal(string(d.Decision), d.Reason)
		if d.StepID == "" {
			w.Header().Del(llmrec.HeaderStepID)
		}
		w.Header().Set(headerShouldRetry, "false")
		writeBody(w, status, "application/json", b)
	}
}

// authenticate reads the gateway token and checks the lease headers, when
// sent, against it.
func (g *Gateway) authenticate(r *http.Request) (*kernel.GatewayCall, error) {
	var toks []string
	if v := r.Header.Get(HeaderToken); v != "" {
		toks = append(toks, v)
	}
	if v := r.Header.Get("Authorization"); v != "" {
		scheme, tok, ok := strings.Cut(v, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return nil, kernel.Errorf(kernel.CodeUnauthenticated, `the Authorization header must be "Bearer <gateway token>"`)
		}
		toks = append(toks, strings.TrimSpace(tok))
	}
	if v := r.Header.Get("X-Api-Key"); v != "" {
		toks = append(toks, v)
	}
	if len(toks) == 0 {
		return nil, kernel.Errorf(kernel.CodeUnauthenticated,
			"missing gateway token: give the webhook's llm_gateway_token as the client's API key (Authorization: Bearer or x-api-key) or in %s", HeaderToken)
	}
	for _, t := range toks[1:] {
		if t != toks[0] {
			return nil, kernel.Errorf(kernel.CodeUnauthenticated, "the request carries two different tokens")
		}
	}
	call, err := g.k.AuthenticateLLMToken(r.Context(), toks[0])
	if err != nil {
		return nil, err
	}
	if id := r.Header.Get(HeaderExecutionID); id != "" && id != call.ExecutionID {
		return nil, kernel.Errorf(kernel.CodeUnauthenticated, "%s names another execution than the gateway token's", HeaderExecutionID)
	}
	did, at := r.Header.Get(wire.HeaderDispatchID), r.Header.Get(wire.HeaderDispatchAttempt)
	if did != "" || at != "" {
		if did != call.Lease.DispatchID || at != strconv.Itoa(call.Lease.Attempt) {
			return nil, (&kernel.Error{Code: kernel.CodeLeaseSuperseded,
				Message: fmt.Sprintf("dispatch %s attempt %s is not the lease the gateway token was issued for", did, at)}).
				WithDetails(map[string]any{"dispatch_id": did, "dispatch_attempt": at})
		}
	}
	return call, nil
}

// replay answers the recorded response.
func (g *Gateway) replay(w http.ResponseWriter, ep endpoint, d *kernel.StepDecision) {
	w.Header().Set(llmrec.HeaderReplay, "true")
	rec, body, raw, ok := llmrec.Replayed(d.Result, d.Error)
	if !ok {
		// No whole answer was recorded (the provider was unreachable, its
		// stream broke off, or the kernel failed an orphan): the recorded
		// error is given back, as the first caller got it.
		msg := rec.Message
		if msg == "" {
			msg = "the step's recorded error: " + string(raw)
		}
		noAnswer(w, ep.dialect, msg)
		return
	}
	writeBody(w, rec.Status, rec.ContentType, body)
}

// recorder records a proceeded call in the kernel, in process.
type recorder struct {
	g    *Gateway
	call kernel.AgentCall
	m    Model
	// usage is the last usage recorded (for Observation).
	usage *wire.Usage
}

func (rc *recorder) Complete(ctx context.Context, stepID string, result json.RawMessage, u *wire.Usage) error {
	o := kernel.StepOutcome{AgentCall: rc.call, StepID: stepID, Result: result}
	if u != nil {
		o.Usage = &kernel.Usage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, TotalTokens: u.TotalTokens, CostUSD: u.CostUSD}
		rc.usage = u
	}
	_, err := rc.g.k.CompleteStep(ctx, o)
	return err
}

func (rc *recorder) Fail(ctx context.Context, stepID string, stepErr json.RawMessage) error {
	_, err := rc.g.k.FailStep(ctx, kernel.StepOutcome{AgentCall: rc.call, StepID: stepID, Error: stepErr})
	return err
}

func (rc *recorder) Delta(_ context.Context, stepID string, seq int64, data json.RawMessage) error {
	if rc.g.cfg.Deltas != nil {
		rc.g.cfg.Deltas(rc.call.ExecutionID, wire.StepDeltaEvent{ExecutionID: rc.call.ExecutionID, StepID: stepID, Seq: seq, Data: data})
	}
	return nil
}

// usage reads an answer's usage and prices it with the model's cost.
func (rc *recorder) usageOf(body []byte) *wire.Usage {
	u := llmrec.Usage(body)
	if u != nil {
		u.CostUSD = cost(rc.m, u)
	}
	return u
}

func cost(m Model, u *wire.Usage) float64 {
	c := (float64(u.InputTokens)*m.Input + float64(u.OutputTokens)*m.Output) / 1e6
	if math.IsNaN(c) || math.IsInf(c, 0) || c < 0 {
		return 0
	}
	return c
}

// proceed sends the call to the provider and records its answer.
func (g *Gateway) proceed(ctx context.Context, w http.ResponseWriter, r *http.Request, ep endpoint, call *kernel.GatewayCall, rt route, body []byte, stepID string, obs *Observation) {
	rc := &recorder{g: g, call: call.AgentCall, m: rt.m}
	defer func() { obs.Usage = rc.usage }()
	out, err := upstreamBody(ep, body, call.Limits.MaxOutputTokensPerCall)
	if err != nil {
		g.unreachable(ctx, w, ep, rc, stepID, "prepare the provider request: "+err.Error())
		return
	}
	uctx, cancel := context.WithTimeout(ctx, g.cfg.UpstreamTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(uctx, http.MethodPost, rt.p.BaseURL+ep.upstream, bytes.NewReader(out))
	if err != nil {
		g.unreachable(ctx, w, ep, rc, stepID, "provider request: "+err.Error())
		return
	}
	setUpstreamHeaders(req.Header, r.Header, rt.p, stepID)
	start := time.Now()
	resp, err := g.tr.RoundTrip(req)
	if err != nil {
		obs.Upstream = time.Since(start)
		g.unreachable(ctx, w, ep, rc, stepID, fmt.Sprintf("provider %s: %v", rt.p.Name, err))
		return
	}
	ct := resp.Header.Get("Content-Type")
	if llmrec.IsStream(resp.StatusCode, ct) {
		g.stream(ctx, w, rc, stepID, resp, ct)
		obs.Upstream = time.Since(start)
		return
	}
	data, err := llmrec.ReadAndRecord(ctx, rc, stepID, resp.StatusCode, ct, resp.Body, rc.usageOf)
	resp.Body.Close()
	obs.Upstream = time.Since(start)
	if err != nil {
		g.log.Warn("llm gateway: read or record a provider answer", "step_id", stepID, "provider", rt.p.String(), "err", err)
		g.writeKernelError(w, ep.dialect, err)
		return
	}
	writeBody(w, resp.StatusCode, ct, data)
}

// unreachable records that no answer came and answers as a replay of the
// record will.
func (g *Gateway) unreachable(ctx context.Context, w http.ResponseWriter, ep endpoint, rc *recorder, stepID, msg string) {
	if err := llmrec.Unreachable(ctx, rc, stepID, errors.New(msg)); err != nil {
		g.log.Error("llm gateway: record a call without an answer", "step_id", stepID, "err", err)
	}
	noAnswer(w, ep.dialect, msg)
}

// noAnswer is the answer to a call that got no whole answer: 502.
func noAnswer(w http.ResponseWriter, dialect, msg string) {
	writeError(w, dialect, http.StatusBadGateway, "provider_error", "the provider gave no whole answer: "+msg)
}

// stream passes a streamed answer through as it arrives. The stream is
// read to its end whatever the caller does, and recorded; its terminal
// event reaches the caller only once the record is made (llmrec.Stream).
func (g *Gateway) stream(ctx context.Context, w http.ResponseWriter, rc *recorder, stepID string, resp *http.Response, ct string) {
	s := llmrec.NewStream(ctx, rc, stepID, resp.StatusCode, ct, resp.Body, rc.usageOf)
	h := w.Header()
	h.Set("Content-Type", ct)
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(resp.StatusCode)
	ctl := http.NewResponseController(w)
	_ = ctl.Flush()
	buf := make([]byte, 32<<10)
	gone := false
	for {
		n, err := s.Read(buf)
		if n > 0 && !gone {
			if _, werr := w.Write(buf[:n]); werr != nil {
				gone = true // the caller left: keep recording
			} else {
				_ = ctl.Flush()
			}
		}
		if err != nil {
			if err != io.EOF {
				if s.Broken() {
					g.log.Warn("llm gateway: a provider stream broke off", "step_id", stepID, "err", err)
				} else {
					// The answer came whole but is not on the record (the
					// execution ended meanwhile, the store failed): the
					// terminal event was held back, and is not sent.
					g.log.Warn("llm gateway: record a stream", "step_id", stepID, "err", err)
				}
				_ = s.Close()
				// The caller gets a cut stream: the connection ends
				// without a clean end of the body.
				panic(http.ErrAbortHandler)
			}
			break
		}
	}
	_ = s.Close()
}

// hop-by-hop and credential headers are never forwarded; these are.
var forwarded = []string{"Accept", "User-Agent", "OpenAI-Beta", "OpenAI-Organization", "OpenAI-Project", "Anthropic-Version", "Anthropic-Beta"}

// setUpstreamHeaders sets the provider request's headers: the provider's
// key (never the caller's token), the step id as the idempotency key, and
// a few of the caller's headers that select API behaviour.
func setUpstreamHeaders(out, in http.Header, p *Provider, stepID string) {
	out.Set("Content-Type", "application/json")
	for _, k := range forwarded {
		if v := in.Values(k); len(v) > 0 {
			out[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
		}
	}
	switch p.Dialect {
	case DialectOpenAI:
		if p.APIKey != "" {
			out.Set("Authorization", "Bearer "+p.APIKey)
		}
	case DialectAnthropic:
		if p.APIKey != "" {
			out.Set("X-Api-Key", p.APIKey)
		}
		if out.Get("Anthropic-Version") == "" {
			out.Set("Anthropic-Version", defaultAnthropicVersion)
		}
	}
	if p.IdempotencyHeader != "" {
		out.Set(p.IdempotencyHeader, stepID)
	}
}

// upstreamBody is the body sent to the provider: the caller's, byte for
// byte, except that an OpenAI chat stream asks for its usage
// (stream_options.include_usage: without it a streamed call would use
// tokens the limits never see) and, under max_output_tokens_per_call, a
// request without an output cap (or with a null one) gets the limit as its
// cap, shared among its choices when it asks for n. The step's
// args stay the caller's body.
func upstreamBody(ep endpoint, body []byte, maxOut int64) ([]byte, error) {
	capField := ""
	switch ep.kind {
	case kindChat:
		capField = "max_completion_tokens"
	case kindResponses:
		capField = "max_output_tokens"
	case kindMessages:
		capField = "max_tokens"
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	changed := false
	if maxOut > 0 {
		// A cap given as null is no cap: it gets the limit, as an absent one.
		for _, f := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
			if raw, ok := m[f]; ok && bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
				delete(m, f)
				changed = true
			}
		}
	}
	if maxOut > 0 && capField != "" && m["max_tokens"] == nil && m["max_completion_tokens"] == nil && m["max_output_tokens"] == nil {
		// Each of n choices may use the cap: they share the limit.
		choices, why := kernel.ChoicesOf(m["n"], maxOut)
		if why != "" {
			return nil, errors.New(why) // the kernel refused such a call before
		}
		m[capField] = json.RawMessage(strconv.FormatInt(maxOut/choices, 10))
		changed = true
	}
	if ep.kind == kindChat && bytes.Equal(bytes.TrimSpace(m["stream"]), []byte("true")) {
		var so map[string]json.RawMessage
		if raw := m["stream_options"]; len(raw) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			if err := json.Unmarshal(raw, &so); err != nil {
				return nil, fmt.Errorf("stream_options: %w", err)
			}
		}
		if !bytes.Equal(bytes.TrimSpace(so["include_usage"]), []byte("true")) {
			if so == nil {
				so = map[string]json.RawMessage{}
			}
			so["include_usage"] = json.RawMessage("true")
			b, _ := json.Marshal(so)
			m["stream_options"] = b
			changed = true
		}
	}
	if !changed {
		return body, nil
	}
	return json.Marshal(m)
}

// modelOf reads the request's model: a JSON object with a "model" string.
func modelOf(body []byte) (string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return "", errors.New("the request body must be a JSON object")
	}
	var model string
	if raw := bytes.TrimSpace(m["model"]); len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &model); err != nil {
			return "", fmt.Errorf(`the request's "model" must be a string, not %.40s`, raw)
		}
	}
	if model == "" {
		return "", errors.New(`the request body must name its "model"`)
	}
	if len(model) > kernel.MaxTargetLen {
		return "", fmt.Errorf("the model name is longer than %d bytes", kernel.MaxTargetLen)
	}
	return model, nil
}

// readBody reads a request body within limit; the read deadline the
// server set for the request is lifted once it is read, so a long stream
// is not cut.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			closeUnread(w, r)
			return nil, kernel.Errorf(kernel.CodeTooLarge, "request body over %d bytes", limit)
		}
		return nil, kernel.Errorf(kernel.CodeValidation, "read body: %v", err)
	}
	if !json.Valid(b) {
		return nil, kernel.Errorf(kernel.CodeValidation, "the request body must be JSON")
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	return b, nil
}

// closeUnread closes the connection after the answer rather than drain a
// body nobody read.
func closeUnread(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
}

func writeBody(w http.ResponseWriter, status int, contentType string, body []byte) {
	if contentType != "" {
		w.Header().Set("Content-Type", contentType)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeKernelError answers a kernel error with its status in the dialect's
// error shape.
func (g *Gateway) writeKernelError(w http.ResponseWriter, dialect string, err error) {
	code := kernel.CodeOf(err)
	status, typ := http.StatusInternalServerError, "api_error"
	switch code {
	case kernel.CodeValidation:
		status, typ = http.StatusBadRequest, "invalid_request_error"
	case kernel.CodeUnauthenticated:
		status, typ = http.StatusUnauthorized, "authentication_error"
	case kernel.CodeForbidden:
		status, typ = http.StatusForbidden, "permission_error"
	case kernel.CodeNotFound:
		status, typ = http.StatusNotFound, "not_found_error"
	case kernel.CodeConflict, kernel.CodeLeaseSuperseded, kernel.CodeStepIDDivergence:
		status, typ = http.StatusConflict, string(code)
	case kernel.CodeTooLarge:
		status, typ = http.StatusRequestEntityTooLarge, "request_too_large"
	case kernel.CodeUnavailable:
		status, typ = http.StatusServiceUnavailable, "overloaded_error"
	}
	msg := err.Error()
	var ke *kernel.Error
	if errors.As(err, &ke) {
		msg = ke.Message
	}
	if status == http.StatusInternalServerError {
		g.log.Error("llm gateway", "err", err)
		msg = "internal error (see the kernel log)"
	}
	if status == http.StatusConflict {
		w.Header().Set(headerShouldRetry, "false")
	}
	writeError(w, dialect, status, typ, msg)
}

// writeError answers an error of the gateway itself in the dialect's
// shape, which the provider's SDKs read into their error types: OpenAI's
// {"error": {"message", "type", "code"}}, Anthropic's {"type": "error",
// "error": {"type", "message"}}.
func writeError(w http.ResponseWriter, dialect string, status int, typ, msg string) {
	var v any
	if dialect == DialectAnthropic {
		v = map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}}
	} else {
		v = map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": typ}}
	}
	b, _ := json.Marshal(v)
	writeBody(w, status, "application/json", b)
}

// statusWriter remembers the status written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
