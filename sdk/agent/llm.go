package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/wicket-run/wicket/server/wire"
)

// RefusalMarker starts the message of every refused LLM request. Provider
// SDKs surface an error body only as text, so the flat marker is what
// ParseRefusal and RaiseForRefusal read back (Rebuno's "rebuno_refusal").
const RefusalMarker = "rebuno_refusal"

// Headers the Transport adds to the responses it hands back.
const (
	// HeaderStepID carries the llm_call step's id.
	HeaderStepID = "Wicket-Step-Id"
	// HeaderReplay is "true" on a response rebuilt from the record.
	HeaderReplay = "Wicket-Replay"
)

// maxLLMBody bounds a request or response body the Transport records.
const maxLLMBody = 32 << 20

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
// recorded error) of an llm_call step: the provider's answer, whole. Body
// holds the body when it is valid UTF-8, BodyBase64 otherwise.
type LLMResponse struct {
	Status      int    `json:"status"`
	ContentType string `json:"content_type,omitempty"`
	Stream      bool   `json:"stream,omitempty"`
	Body        string `json:"body,omitempty"`
	BodyBase64  string `json:"body_base64,omitempty"`
	// Message is set when no whole answer came (the provider could not be
	// reached, or its stream broke off); such a record replays as a
	// *ToolError, never as an answer.
	Message string `json:"message,omitempty"`
}

// bytes returns the recorded body.
func (r *LLMResponse) bytes() ([]byte, error) {
	if r.BodyBase64 != "" {
		return base64.StdEncoding.DecodeString(r.BodyBase64)
	}
	return []byte(r.Body), nil
}

func newLLMResponse(status int, contentType string, stream bool, body []byte) LLMResponse {
	r := LLMResponse{Status: status, ContentType: contentType, Stream: stream}
	if utf8.Valid(body) {
		r.Body = string(body)
	} else {
		r.BodyBase64 = base64.StdEncoding.EncodeToString(body)
	}
	return r
}

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
		rec, _ := json.Marshal(LLMResponse{Message: err.Error()})
		if ferr := ex.Fail(ctx, stepID, rec); ferr != nil {
			return nil, errors.Join(err, ferr)
		}
		return nil, err
	}
	resp.Header.Set(HeaderStepID, stepID)
	ct := resp.Header.Get("Content-Type")
	if resp.StatusCode/100 == 2 && strings.HasPrefix(ct, "text/event-stream") {
		resp.Body = &teeStream{ctx: ctx, ex: ex, t: t, stepID: stepID, src: resp.Body, status: resp.StatusCode, contentType: ct}
		resp.ContentLength = -1
		return resp, nil
	}
	data, rerr := io.ReadAll(io.LimitReader(resp.Body, maxLLMBody+1))
	resp.Body.Close()
	if rerr == nil && len(data) > maxLLMBody {
		rerr = fmt.Errorf("response body over %d bytes", maxLLMBody)
	}
	if rerr != nil {
		rec, _ := json.Marshal(LLMResponse{Status: resp.StatusCode, Message: "read response: " + rerr.Error()})
		if ferr := ex.Fail(ctx, stepID, rec); ferr != nil {
			return nil, errors.Join(rerr, ferr)
		}
		return nil, fmt.Errorf("agent: read LLM response: %w", rerr)
	}
	rec, err := json.Marshal(newLLMResponse(resp.StatusCode, ct, false, data))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		err = ex.Complete(ctx, stepID, rec, t.usage(data))
	} else {
		err = ex.Fail(ctx, stepID, rec)
	}
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(data))
	resp.ContentLength = int64(len(data))
	return resp, nil
}

// replayed rebuilds the recorded answer.
func replayed(req *http.Request, d *wire.StepDecision) (*http.Response, error) {
	raw := d.Result
	if isSet(d.Error) {
		raw = d.Error
	}
	var r LLMResponse
	if err := json.Unmarshal(raw, &r); err != nil || r.Status == 0 || r.Message != "" {
		// No whole answer was recorded: the provider could not be reached
		// or broke off its stream (Message says which), the kernel failed
		// an orphan as indeterminate, or the record has another shape. The
		// recorded error is all there is to give back.
		return nil, &ToolError{StepID: d.StepID, Target: req.URL.String(), Recorded: raw, Replayed: true}
	}
	body, err := r.bytes()
	if err != nil {
		return nil, fmt.Errorf("agent: recorded LLM body of step %s: %w", short(d.StepID), err)
	}
	return response(req, r.Status, r.ContentType, body, map[string]string{HeaderStepID: d.StepID, HeaderReplay: "true"}), nil
}

// refusalResponse is the answer to a refused request (as Rebuno answers: 403, or 429
// for rate_limited, with the flat marker in the message).
func refusalResponse(req *http.Request, decision, reason string) *http.Response {
	msg := RefusalMarker + ": " + decision
	if reason != "" {
		msg += " reason=" + reason
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"type": RefusalMarker, "message": msg}})
	status := http.StatusForbidden
	if decision == wire.DecisionRateLimited {
		status = http.StatusTooManyRequests
	}
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

// teeStream hands a streamed provider answer to the caller as it arrives,
// posts each complete server-sent event to the kernel's step stream, and
// records the whole body when the stream ends. Closing it early drains the
// rest first: the provider call happened, and a replay must return all of
// it.
type teeStream struct {
	ctx         context.Context
	ex          *Execution
	t           *Transport
	stepID      string
	src         io.ReadCloser
	status      int
	contentType string

	mu      sync.Mutex // guards the fields below (Read and Close may race)
	all     bytes.Buffer
	pending bytes.Buffer // bytes after the last complete event
	seq     int64
	done    bool
	err     error
	deltas  chan wire.StreamDelta // to the sender, which posts them in order
	sent    chan struct{}         // closed when the sender has finished
}

// deltaQueue is how many deltas may wait for the sender; beyond it they are
// dropped (deltas are ephemeral; the step's result is the record).
const deltaQueue = 256

// send queues one delta, starting the sender on first use.
func (s *teeStream) send(d wire.StreamDelta) {
	if s.deltas == nil {
		s.deltas = make(chan wire.StreamDelta, deltaQueue)
		s.sent = make(chan struct{})
		go func() {
			defer close(s.sent)
			for d := range s.deltas {
				_ = s.ex.Delta(s.ctx, s.stepID, d.Seq, d.Data)
			}
		}()
	}
	select {
	case s.deltas <- d:
	default:
	}
}

// flush waits until the queued deltas are posted, so that observers see
// them before the step's terminal event.
func (s *teeStream) flush() {
	if s.deltas != nil {
		close(s.deltas)
		<-s.sent
	}
}

func (s *teeStream) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		if s.err != nil {
			return 0, s.err
		}
		return 0, io.EOF
	}
	n, err := s.src.Read(p)
	if n > 0 {
		s.take(p[:n])
	}
	if err != nil {
		s.finish(err)
		if s.err != nil {
			return n, s.err // the stream broke, or its record failed
		}
		return n, io.EOF
	}
	return n, nil
}

func (s *teeStream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		buf := make([]byte, 32<<10)
		for {
			n, err := s.src.Read(buf)
			if n > 0 {
				s.take(buf[:n])
			}
			if err != nil {
				s.finish(err)
				break
			}
		}
	}
	cerr := s.src.Close()
	if s.err != nil {
		return s.err
	}
	return cerr
}

// take keeps p and posts each event it completes as a delta.
func (s *teeStream) take(p []byte) {
	s.all.Write(p)
	s.pending.Write(p)
	if s.all.Len() > maxLLMBody {
		return // finish refuses it
	}
	for {
		b := s.pending.Bytes()
		i, sep := eventEnd(b)
		if i < 0 {
			return
		}
		ev := string(b[:i])
		s.pending.Next(i + sep)
		data := eventData(ev)
		if data == "" {
			continue
		}
		var raw json.RawMessage
		if json.Valid([]byte(data)) {
			raw = json.RawMessage(data)
		} else {
			raw, _ = json.Marshal(data)
		}
		s.seq++
		s.send(wire.StreamDelta{Seq: s.seq, Data: raw})
	}
}

// finish records the stream's outcome once.
func (s *teeStream) finish(err error) {
	s.done = true
	s.flush()
	if err == io.EOF && s.all.Len() > maxLLMBody {
		err = fmt.Errorf("streamed response over %d bytes", maxLLMBody)
	}
	if err != io.EOF {
		s.err = fmt.Errorf("agent: LLM stream: %w", err)
		rec, _ := json.Marshal(LLMResponse{Status: s.status, Message: "stream broken: " + err.Error()})
		_ = s.ex.Fail(s.ctx, s.stepID, rec)
		return
	}
	data := s.all.Bytes()
	rec, merr := json.Marshal(newLLMResponse(s.status, s.contentType, true, data))
	if merr == nil {
		merr = s.ex.Complete(s.ctx, s.stepID, rec, s.t.usage(data))
	}
	if merr != nil {
		s.err = merr
	}
}

// eventEnd returns where the first complete event in b ends and the length
// of its separator (a blank line: \n\n, \r\n\r\n or \r\r), or -1.
func eventEnd(b []byte) (int, int) {
	best, sepLen := -1, 0
	for _, sep := range []string{"\n\n", "\r\n\r\n", "\r\r"} {
		if i := bytes.Index(b, []byte(sep)); i >= 0 && (best < 0 || i < best) {
			best, sepLen = i, len(sep)
		}
	}
	return best, sepLen
}

// eventData joins the data lines of one event.
func eventData(ev string) string {
	var parts []string
	sc := bufio.NewScanner(strings.NewReader(ev))
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if v, ok := strings.CutPrefix(line, "data:"); ok {
			parts = append(parts, strings.TrimPrefix(v, " "))
		}
	}
	return strings.Join(parts, "\n")
}

// DefaultUsage reads token usage from an LLM answer: the "usage" object of
// OpenAI ({prompt_tokens, completion_tokens, total_tokens}) or Anthropic
// ({input_tokens, output_tokens}), from a JSON body or from the events of a
// stream (the last usage seen wins). It returns nil when there is none.
func DefaultUsage(body []byte) *wire.Usage {
	if u := usageOf(body); u != nil {
		return u
	}
	var last *wire.Usage
	for _, line := range bytes.Split(body, []byte("\n")) {
		v, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		if !ok {
			continue
		}
		if u := usageOf(bytes.TrimSpace(v)); u != nil {
			last = u
		}
	}
	return last
}

func usageOf(b []byte) *wire.Usage {
	var v struct {
		Usage *struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
			TotalTokens      int64 `json:"total_tokens"`
			InputTokens      int64 `json:"input_tokens"`
			OutputTokens     int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &v) != nil || v.Usage == nil {
		return nil
	}
	u := &wire.Usage{
		InputTokens:  v.Usage.PromptTokens + v.Usage.InputTokens,
		OutputTokens: v.Usage.CompletionTokens + v.Usage.OutputTokens,
		TotalTokens:  v.Usage.TotalTokens,
	}
	if u.TotalTokens == 0 {
		u.TotalTokens = u.InputTokens + u.OutputTokens
	}
	if u.InputTokens < 0 || u.OutputTokens < 0 || u.TotalTokens < 0 || u.TotalTokens == 0 {
		return nil
	}
	return u
}

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
