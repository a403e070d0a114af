// Package llmrec is how an LLM call is recorded as an llm_call step and
// given back: the recorded answer's format (Response), the refusal answer
// and its marker, token usage read from OpenAI's and Anthropic's answers,
// and the stream recorder that passes a server-sent event stream through
// while posting each event as a step delta and recording the whole stream
// when it ends.
//
// The Go agent SDK's Transport (sdk/agent) and the kernel's LLM gateway
// (server/llmgw) both use it, so that an answer recorded by one replays byte
// for byte through the other. It imports only the standard library and
// server/wire.
package llmrec

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/wicket-run/wicket/server/wire"
)

// RefusalMarker starts the message of every refused LLM request. Provider
// SDKs surface an error body only as text, so the flat marker is what a
// caller's raise_for_refusal reads back (Rebuno's "rebuno_refusal").
const RefusalMarker = "rebuno_refusal"

// Headers set on the answers handed back to the caller.
const (
	// HeaderStepID carries the llm_call step's id.
	HeaderStepID = "Wicket-Step-Id"
	// HeaderReplay is "true" on an answer rebuilt from the record.
	HeaderReplay = "Wicket-Replay"
)

// MaxBody bounds a request or response body that is recorded (32 MiB).
const MaxBody = 32 << 20

// Response is the recorded result (or, for a non-2xx answer, the recorded
// error) of an llm_call step: the provider's answer, whole. Body holds the
// body when it is valid UTF-8, BodyBase64 otherwise.
type Response struct {
	Status      int    `json:"status"`
	ContentType string `json:"content_type,omitempty"`
	Stream      bool   `json:"stream,omitempty"`
	Body        string `json:"body,omitempty"`
	BodyBase64  string `json:"body_base64,omitempty"`
	// Message is set when no whole answer came (the provider could not be
	// reached, or its stream broke off); such a record replays as an
	// error, never as an answer.
	Message string `json:"message,omitempty"`
}

// NewResponse returns the record of a whole answer.
func NewResponse(status int, contentType string, stream bool, body []byte) Response {
	r := Response{Status: status, ContentType: contentType, Stream: stream}
	if utf8.Valid(body) {
		r.Body = string(body)
	} else {
		r.BodyBase64 = base64.StdEncoding.EncodeToString(body)
	}
	return r
}

// Bytes returns the recorded body.
func (r *Response) Bytes() ([]byte, error) {
	if r.BodyBase64 != "" {
		return base64.StdEncoding.DecodeString(r.BodyBase64)
	}
	return []byte(r.Body), nil
}

// Success reports whether a status is a 2xx: such an answer is the step's
// result, any other its error.
func Success(status int) bool { return status/100 == 2 }

// IsStream reports whether an answer is a stream to pass through as it
// arrives: a 2xx text/event-stream.
func IsStream(status int, contentType string) bool {
	return Success(status) && strings.HasPrefix(contentType, "text/event-stream")
}

// Replayed reads back the record a replay decision carries (its result, or
// its error when it has one). ok is false when no whole answer was
// recorded: the provider could not be reached or broke off its stream
// (Message says which), the kernel failed an orphan as indeterminate, or
// the record has another shape; raw is then all there is to give back.
func Replayed(result, stepErr json.RawMessage) (r Response, body []byte, raw json.RawMessage, ok bool) {
	raw = result
	if isSet(stepErr) {
		raw = stepErr
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.Status == 0 || r.Message != "" {
		return r, nil, raw, false
	}
	b, err := r.Bytes()
	if err != nil {
		return r, nil, raw, false
	}
	return r, b, raw, true
}

func isSet(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

// Refusal is the answer to a refused request, as Rebuno answers: 403, or
// 429 for rate_limited, with the body {"error": {"type": "rebuno_refusal",
// "message": "rebuno_refusal: <decision>[ reason=<why>]"}}.
func Refusal(decision, reason string) (status int, body []byte) {
	msg := RefusalMarker + ": " + decision
	if reason != "" {
		msg += " reason=" + reason
	}
	body, _ = json.Marshal(map[string]any{"error": map[string]string{"type": RefusalMarker, "message": msg}})
	status = 403
	if decision == wire.DecisionRateLimited {
		status = 429
	}
	return status, body
}

// Recorder is where the outcome of a proceeded call goes: the kernel, over
// HTTP for the SDK (*agent.Execution) or in process for the gateway.
type Recorder interface {
	// Complete records the step's result and usage.
	Complete(ctx context.Context, stepID string, result json.RawMessage, usage *wire.Usage) error
	// Fail records the step's error.
	Fail(ctx context.Context, stepID string, stepErr json.RawMessage) error
	// Delta posts an ephemeral event of a stream in progress.
	Delta(ctx context.Context, stepID string, seq int64, data json.RawMessage) error
}

// UsageFunc reads the usage of an answer body (nil: none).
type UsageFunc func(body []byte) *wire.Usage

// Unreachable records that the provider gave no answer (err), as the
// step's error.
func Unreachable(ctx context.Context, rec Recorder, stepID string, err error) error {
	b, _ := json.Marshal(Response{Message: err.Error()})
	return rec.Fail(ctx, stepID, b)
}

// ReadAndRecord reads a whole (not streamed) answer, at most MaxBody
// bytes, and records it: as the step's result with its usage for a 2xx,
// as its error otherwise. It returns the body to hand back.
func ReadAndRecord(ctx context.Context, rec Recorder, stepID string, status int, contentType string, body io.Reader, usage UsageFunc) ([]byte, error) {
	data, rerr := io.ReadAll(io.LimitReader(body, MaxBody+1))
	if rerr == nil && len(data) > MaxBody {
		rerr = fmt.Errorf("response body over %d bytes", MaxBody)
	}
	if rerr != nil {
		b, _ := json.Marshal(Response{Status: status, Message: "read response: " + rerr.Error()})
		if ferr := rec.Fail(ctx, stepID, b); ferr != nil {
			return nil, errors.Join(rerr, ferr)
		}
		return nil, fmt.Errorf("read LLM response: %w", rerr)
	}
	b, err := json.Marshal(NewResponse(status, contentType, false, data))
	if err != nil {
		return nil, err
	}
	if Success(status) {
		var u *wire.Usage
		if usage != nil {
			u = usage(data)
		}
		err = rec.Complete(ctx, stepID, b, u)
	} else {
		err = rec.Fail(ctx, stepID, b)
	}
	if err != nil {
		return nil, err
	}
	return data, nil
}

// Stream hands a streamed answer to its reader as it arrives, posts each
// complete server-sent event to the Recorder as a delta, and records the
// whole body when the stream ends: as the step's result (with its usage)
// at EOF, as its error when the stream breaks off or passes MaxBody.
// Closing it early drains the rest first: the provider call happened, and
// a replay must return all of it.
//
// The stream's terminal event (OpenAI's "data: [DONE]", Anthropic's
// message_stop, the Responses API's response.completed and its failures,
// an error event)
// is held back until the step is recorded: a caller that stops reading at
// that event, as the providers' own clients do, and goes on to its next
// step or ends its execution, must find this step already on the record.
// If the record fails, the reader gets the error instead of the terminal
// event, so it never takes an unrecorded answer for a whole one.
type Stream struct {
	ctx         context.Context
	rec         Recorder
	usage       UsageFunc
	stepID      string
	src         io.ReadCloser
	status      int
	contentType string

	mu      sync.Mutex // guards the fields below (Read and Close may race)
	all     bytes.Buffer
	pending bytes.Buffer // bytes after the last complete event
	handed  int          // bytes of all handed to the reader
	hold    int          // where the terminal event starts in all, or -1
	seq     int64
	done    bool
	broken  bool // the source failed or overran MaxBody (not the record)
	err     error
	deltas  chan wire.StreamDelta // to the sender, which posts them in order
	sent    chan struct{}         // closed when the sender has finished
}

// NewStream wraps a streamed answer's body.
func NewStream(ctx context.Context, rec Recorder, stepID string, status int, contentType string, src io.ReadCloser, usage UsageFunc) *Stream {
	return &Stream{ctx: ctx, rec: rec, usage: usage, stepID: stepID, src: src, status: status, contentType: contentType, hold: -1}
}

// deltaQueue is how many deltas may wait for the sender; beyond it they are
// dropped (deltas are ephemeral; the step's result is the record).
const deltaQueue = 256

// send queues one delta, starting the sender on first use.
func (s *Stream) send(d wire.StreamDelta) {
	if s.deltas == nil {
		s.deltas = make(chan wire.StreamDelta, deltaQueue)
		s.sent = make(chan struct{})
		go func() {
			defer close(s.sent)
			for d := range s.deltas {
				_ = s.rec.Delta(s.ctx, s.stepID, d.Seq, d.Data)
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
func (s *Stream) flush() {
	if s.deltas != nil {
		close(s.deltas)
		<-s.sent
	}
}

// Read implements io.Reader. It hands out the answer's bytes as they
// arrive, except the terminal event, which comes only once the step is
// recorded (see Stream).
func (s *Stream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if n := s.give(p); n > 0 {
			return n, nil
		}
		if s.done {
			if s.err != nil {
				return 0, s.err // the stream broke, or its record failed
			}
			return 0, io.EOF
		}
		n, err := s.src.Read(p) // p is scratch here: give copies from all
		if n > 0 {
			s.take(p[:n])
		}
		if err != nil {
			s.finish(err)
		}
	}
}

// give copies into p what the reader may have next: every complete event
// before the terminal one while the stream runs (a client acts on whole
// events only, and an incomplete one may turn out to be terminal), all of
// it once recorded, and what came before the terminal event if the stream
// broke or its record failed.
func (s *Stream) give(p []byte) int {
	end := s.all.Len()
	switch {
	case !s.done:
		end -= s.pending.Len()
		if s.hold >= 0 {
			end = s.hold
		}
	case s.err != nil && s.hold >= 0:
		end = s.hold
	}
	if s.handed >= end {
		return 0
	}
	n := copy(p, s.all.Bytes()[s.handed:end])
	s.handed += n
	return n
}

// Close drains and records what is left, then closes the source.
func (s *Stream) Close() error {
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
func (s *Stream) take(p []byte) {
	s.all.Write(p)
	s.pending.Write(p)
	if s.all.Len() > MaxBody {
		return // finish refuses it
	}
	for {
		b := s.pending.Bytes()
		i, sep := eventEnd(b)
		if i < 0 {
			return
		}
		start := s.all.Len() - len(b) // pending is a suffix of all
		ev := string(b[:i])
		s.pending.Next(i + sep)
		data := EventData(ev)
		if s.hold < 0 && terminal(ev, data) {
			s.hold = start
		}
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
func (s *Stream) finish(err error) {
	s.done = true
	s.flush()
	if err == io.EOF && s.all.Len() > MaxBody {
		err = fmt.Errorf("streamed response over %d bytes", MaxBody)
	}
	if err != io.EOF {
		s.broken = true
		s.err = fmt.Errorf("LLM stream: %w", err)
		rec, _ := json.Marshal(Response{Status: s.status, Message: "stream broken: " + err.Error()})
		_ = s.rec.Fail(s.ctx, s.stepID, rec)
		return
	}
	data := s.all.Bytes()
	rec, merr := json.Marshal(NewResponse(s.status, s.contentType, true, data))
	if merr == nil {
		var u *wire.Usage
		if s.usage != nil {
			u = s.usage(data)
		}
		merr = s.rec.Complete(s.ctx, s.stepID, rec, u)
	}
	if merr != nil {
		s.err = merr
	}
}

// Broken reports whether the stream ended without a whole answer (its
// source failed or passed MaxBody), rather than whole but unrecorded.
func (s *Stream) Broken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.broken
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

// terminalEvents are the event names that end a provider's stream.
var terminalEvents = map[string]bool{
	"message_stop":        true, // Anthropic
	"response.completed":  true, // OpenAI Responses
	"response.incomplete": true,
	"response.failed":     true,
	"error":               true, // both: the providers' clients raise on it and stop reading
}

// terminal reports whether an event (ev, its data joined) ends a stream.
func terminal(ev, data string) bool {
	if data == "[DONE]" {
		return true // OpenAI chat and completions, and most compatible servers
	}
	for _, line := range strings.Split(ev, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSuffix(line, "\r"), "event:"); ok {
			return terminalEvents[strings.TrimSpace(v)]
		}
	}
	return false
}

// EventData joins the data lines of one server-sent event.
func EventData(ev string) string {
	var parts []string
	sc := bufio.NewScanner(strings.NewReader(ev))
	sc.Buffer(make([]byte, 0, 4096), MaxBody)
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if v, ok := strings.CutPrefix(line, "data:"); ok {
			parts = append(parts, strings.TrimPrefix(v, " "))
		}
	}
	return strings.Join(parts, "\n")
}
