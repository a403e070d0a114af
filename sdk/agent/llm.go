package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/wicket-run/wicket/internal/llmrec"
	"github.com/wicket-run/wicket/server/wire"
)

// RefusalMarker starts the message of every refused LLM request. Provider
// SDKs surface an error body only as text, so the flat marker is what
// ParseRefusal and RaiseForRefusal read back (Rebuno's "rebuno_refusal").
const RefusalMarker = llmrec.RefusalMarker

// Headers the Transport adds to the responses it hands back.
const (
	// HeaderStepID carries the llm_call step's id.
	HeaderStepID = llmrec.HeaderStepID
	// HeaderReplay is "true" on a response rebuilt from the record.
	HeaderReplay = llmrec.HeaderReplay
)

// maxLLMBody bounds a request or response body the Transport records.
const maxLLMBody = llmrec.MaxBody

// Transport is an http.RoundTripper that makes every request to an LLM
// provider an llm_call step of the execution in the request's context:
// target = the model id, args = the request body (JSON; the kernel
// canonicalises it for the step id).
//
//   - proceed: the request goes to the provider through Base and the whole
//     response (status, content type, body) is recorded as the step's
//     result; a non-2xx answer is recorded as the step's error and returned
//     as is. A text/event-stream response is handed to the caller as it
//     arrives, each event also posted to the kernel's step stream (ephemeral
//     deltas), and recorded whole when it ends.
//   - replay: the recorded response is returned, byte for byte, without
//     calling the provider.
//   - any other decision: a refusal response, 403 (429 for rate_limited)
//     with the body {"error": {"type": "rebuno_refusal", "message":
//     "rebuno_refusal: <decision>[ reason=<why>]"}}, which provider SDKs
//     surface as an error carrying the marker (see RaiseForRefusal). A
//     blocked or terminal decision is also remembered on the execution, so
//     the handler unwinds even if the client library's error is swallowed.
//
// Any Go client that takes an *http.Client works: pass NewHTTPClient(nil),
// and make requests with the handler's context (http.NewRequestWithContext).
// A request without an execution in its context fails with ErrNoExecution.
type Transport struct {
	// Base sends proceeded requests to the provider (nil:
	// http.DefaultTransport).
	Base http.RoundTripper
	// Model returns a request's model id (nil: the body's top-level "model"
	// string, else the URL path).
	Model func(req *http.Request, body []byte) (string, error)
	// Usage reads token usage from a response body to record with the step
	// (nil: OpenAI's and Anthropic's "usage" objects, also in stream events).
	Usage func(body []byte) *wire.Usage
	// Idempotency of the llm_call steps (empty: the kernel's default,
	// safe_to_retry).
	Idempotency string
	// IdempotencyHeader, when set (e.g. "Idempotency-Key"), names a request
	// header the Transport sets to the step id on the provider request, so
	// that a provider honouring it applies a re-run orphan once.
	IdempotencyHeader string
}

// NewHTTPClient returns an *http.Client whose requests become llm_call
// steps, sent on through base (nil: http.DefaultTransport).
func NewHTTPClient(base http.RoundTripper) *http.Client {
	return &http.Client{Transport: &Transport{Base: base}}
}

// LLMResponse is the recorded result (or, for a non-2xx answer, the
// recorded error) of an llm_call step: the provider's answer, whole (status,
// content type, and the body as a string when it is valid UTF-8, else in
// BodyBase64). Message is set when no whole answer came (the provider could
// not be reached, or its stream broke off); such a record replays as a
// *ToolError, never as an answer. The kernel's LLM gateway records the same
// format, so a call recorded by either replays through both.
type LLMResponse = llmrec.Response

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	ex, err := FromContext(ctx)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	body, err := readBody(req)
	if err != nil {
		return nil, fmt.Errorf("agent: LLM request body: %w", err)
	}
	if !json.Valid(body) {
		return nil, &ArgsError{Target: req.URL.String(), Err: errors.New("an LLM request body must be JSON")}
	}
	model, err := t.model(req, body)
	if err != nil {
		return nil, err
	}
	d, err := ex.Submit(ctx, wire.StepSubmitRequest{Kind: KindLLMCall, Target: model, Args: body, Idempotency: t.Idempotency})
	if err != nil {
		return nil, err
	}
	switch d.Decision {
	case wire.DecisionProceed:
		return t.proceed(ctx, ex, req, body, d.StepID)
	case wire.DecisionReplay:
		return replayed(req, d)
	}
	_ = ex.refused(d, model) // remembers blocked and terminal decisions
	return refusalResponse(req, d.Decision, d.Reason), nil
}

func (t *Transport) model(req *http.Request, body []byte) (string, error) {
	if t.Model != nil {
		m, err := t.Model(req, body)
		if err != nil {
			return "", fmt.Errorf("agent: LLM model id: %w", err)
		}
		return m, nil
	}
	var b struct {
		Model any `json:"model"`
	}
	if json.Unmarshal(body, &b) == nil {
		if s, ok := b.Model.(string); ok && s != "" {
			return s, nil
		}
	}
	return req.URL.Path, nil
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

func (t *Transport) usage(body []byte) *wire.Usage {
	if t.Usage != nil {
		return t.Usage(body)
	}
	return DefaultUsage(body)
}

// proceed sends the request to the provider and records the answer.
func (t *Transport) proceed(ctx context.Context, ex *Execution, req *http.Request, body []byte, stepID string) (*http.Response, error) {
	out := req.Clone(ctx)
	if t.IdempotencyHeader != "" {
		out.Header.Set(t.IdempotencyHeader, stepID)
	}
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	resp, err := t.base().RoundTrip(out)
	if err != nil {
		if ferr := llmrec.Unreachable(ctx, ex, stepID, err); ferr != nil {
			return nil, errors.Join(err, ferr)
		}
		return nil, err
	}
	resp.Header.Set(HeaderStepID, stepID)
	ct := resp.Header.Get("Content-Type")
	if llmrec.IsStream(resp.StatusCode, ct) {
		resp.Body = llmrec.NewStream(ctx, ex, stepID, resp.StatusCode, ct, resp.Body, t.usage)
		resp.ContentLength = -1
		return resp, nil
	}
	data, err := llmrec.ReadAndRecord(ctx, ex, stepID, resp.StatusCode, ct, resp.Body, t.usage)
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(data))
	resp.ContentLength = int64(len(data))
	return resp, nil
}

// replayed rebuilds the recorded answer.
func replayed(req *http.Request, d *wire.StepDecision) (*http.Response, error) {
	r, body, raw, ok := llmrec.Replayed(d.Result, d.Error)
	if !ok {
		// No whole answer was recorded: the provider could not be reached
		// or broke off its stream (Message says which), the kernel failed
		// an orphan as indeterminate, or the record has another shape. The
		// recorded error is all there is to give back.
		return nil, &ToolError{StepID: d.StepID, Target: req.URL.String(), Recorded: raw, Replayed: true}
	}
	return response(req, r.Status, r.ContentType, body, map[string]string{HeaderStepID: d.StepID, HeaderReplay: "true"}), nil
}

// refusalResponse is the answer to a refused request (as Rebuno answers: 403, or 429
// for rate_limited, with the flat marker in the message).
func refusalResponse(req *http.Request, decision, reason string) *http.Response {
	status, b := llmrec.Refusal(decision, reason)
	return response(req, status, "application/json", b, nil)
}

func response(req *http.Request, status int, contentType string, body []byte, hdr map[string]string) *http.Response {
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	for k, v := range hdr {
		h.Set(k, v)
	}
	return &http.Response{
		Status:        strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}

func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, errors.New("an LLM request needs a JSON body")
	}
	defer req.Body.Close()
	b, err := io.ReadAll(io.LimitReader(req.Body, maxLLMBody+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxLLMBody {
		return nil, fmt.Errorf("over %d bytes", maxLLMBody)
	}
	return b, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// DefaultUsage reads token usage from an LLM answer, a JSON body or the
// events of a stream: OpenAI's "usage" ({prompt_tokens,
// completion_tokens, total_tokens}, or {input_tokens, output_tokens} of
// the responses API, also inside a response.completed event) and
// Anthropic's ({input_tokens, output_tokens}, cache tokens counted as
// input, also in message_start and message_delta events). In a stream each
// count is the last non-zero one seen. It returns nil when there is none.
func DefaultUsage(body []byte) *wire.Usage { return llmrec.Usage(body) }

// Refusal is a refused LLM request read back from its marker.
type Refusal struct {
	// Decision is the kernel's decision: denied, rate_limited, blocked,
	// execution_blocked or execution_terminal.
	Decision string
	// Reason is the decision's reason, if any.
	Reason string
}

// Error implements error.
func (r *Refusal) Error() string {
	if r.Reason != "" {
		return RefusalMarker + ": " + r.Decision + " reason=" + r.Reason
	}
	return RefusalMarker + ": " + r.Decision
}

// ParseRefusal finds the refusal marker in text (an error message or a
// response body, however a provider SDK wrapped it) and reads it back.
func ParseRefusal(text string) (*Refusal, bool) {
	i := strings.Index(text, RefusalMarker+": ")
	if i < 0 {
		return nil, false
	}
	rest := text[i+len(RefusalMarker)+2:]
	end := 0
	for end < len(rest) && (rest[end] == '_' || rest[end] >= 'a' && rest[end] <= 'z') {
		end++
	}
	r := &Refusal{Decision: rest[:end]}
	switch r.Decision {
	case wire.DecisionDenied, wire.DecisionRateLimited, wire.DecisionBlocked, wire.DecisionExecutionBlocked, wire.DecisionExecutionTerminal:
	default:
		return nil, false
	}
	if why, ok := strings.CutPrefix(rest[end:], " reason="); ok {
		// The reason runs to the end of the marker's JSON string or line.
		if j := strings.IndexAny(why, "\"\n"); j >= 0 {
			why = why[:j]
		}
		r.Reason = strings.TrimSpace(why)
	}
	return r, true
}

// RaiseForRefusal turns an error that carries the refusal marker into the
// SDK's typed error for its decision (*PolicyError, *RateLimited, *Blocked,
// *Terminated), so a blocked LLM call parks the execution instead of
// failing it. When ctx carries the execution, the refusal the Transport
// remembered there (Blocked, Terminated) is returned as is. Any other
// error is returned unchanged, and nil stays nil.
func RaiseForRefusal(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	r, ok := ParseRefusal(err.Error())
	if !ok {
		return err
	}
	if ex, xerr := FromContext(ctx); xerr == nil {
		if u := ex.Unwinding(); u != nil {
			return u
		}
	}
	switch r.Decision {
	case wire.DecisionDenied:
		return &PolicyError{Reason: r.Reason}
	case wire.DecisionRateLimited:
		return &RateLimited{Reason: r.Reason}
	case wire.DecisionBlocked, wire.DecisionExecutionBlocked:
		return &Blocked{Reason: r.Reason, Execution: r.Decision == wire.DecisionExecutionBlocked}
	default:
		return &Terminated{Reason: r.Reason}
	}
}
