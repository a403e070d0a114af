package llmrec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/wicket-run/wicket/server/wire"
)

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		name, body   string
		in, out, tot int64
		none         bool
	}{
		{name: "openai chat", body: `{"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`, in: 3, out: 5, tot: 8},
		{name: "openai embeddings", body: `{"data":[],"usage":{"prompt_tokens":4,"total_tokens":4}}`, in: 4, tot: 4},
		{name: "openai responses", body: `{"object":"response","usage":{"input_tokens":7,"output_tokens":2,"total_tokens":9}}`, in: 7, out: 2, tot: 9},
		{name: "anthropic", body: `{"type":"message","usage":{"input_tokens":10,"output_tokens":4,"cache_read_input_tokens":6}}`, in: 16, out: 4, tot: 20},
		{name: "chat stream", body: "data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3,\"total_tokens\":5}}\n\ndata: [DONE]\n\n", in: 2, out: 3, tot: 5},
		{name: "responses stream", body: "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":6,\"total_tokens\":10}}}\n\n", in: 4, out: 6, tot: 10},
		{name: "anthropic stream", body: "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n", in: 25, out: 15, tot: 40},
		{name: "no usage", body: `{"choices":[]}`, none: true},
		{name: "zero usage", body: `{"usage":{"prompt_tokens":0}}`, none: true},
		{name: "negative", body: `{"usage":{"prompt_tokens":-5,"completion_tokens":1}}`, none: true},
		{name: "not json", body: `hello`, none: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := Usage([]byte(tc.body))
			if tc.none {
				if u != nil {
					t.Fatalf("usage %+v, want none", u)
				}
				return
			}
			if u == nil || u.InputTokens != tc.in || u.OutputTokens != tc.out || u.TotalTokens != tc.tot {
				t.Fatalf("usage %+v, want in=%d out=%d total=%d", u, tc.in, tc.out, tc.tot)
			}
		})
	}
}

func FuzzUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":3}}`))
	f.Add([]byte("data: {\"usage\":{\"output_tokens\":2}}\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if u := Usage(b); u != nil && (u.InputTokens < 0 || u.OutputTokens < 0 || u.TotalTokens <= 0) {
			t.Fatalf("usage %+v from %q", u, b)
		}
	})
}

func TestRefusal(t *testing.T) {
	status, body := Refusal(wire.DecisionRateLimited, "too many")
	if status != 429 || string(body) != `{"error":{"message":"rebuno_refusal: rate_limited reason=too many","type":"rebuno_refusal"}}` {
		t.Fatalf("%d %s", status, body)
	}
	status, body = Refusal(wire.DecisionDenied, "")
	if status != 403 || string(body) != `{"error":{"message":"rebuno_refusal: denied","type":"rebuno_refusal"}}` {
		t.Fatalf("%d %s", status, body)
	}
}

func TestReplayed(t *testing.T) {
	rec, _ := json.Marshal(NewResponse(200, "application/json", false, []byte("{\n \"a\": 1}\n")))
	r, body, _, ok := Replayed(rec, nil)
	if !ok || r.Status != 200 || string(body) != "{\n \"a\": 1}\n" {
		t.Fatalf("%+v %q %v", r, body, ok)
	}
	bin, _ := json.Marshal(NewResponse(500, "application/octet-stream", false, []byte{0xff, 0x00}))
	r, body, _, ok = Replayed(nil, bin)
	if !ok || r.Status != 500 || r.BodyBase64 == "" || string(body) != "\xff\x00" {
		t.Fatalf("%+v %q %v", r, body, ok)
	}
	broken, _ := json.Marshal(Response{Status: 200, Message: "stream broken: EOF"})
	if _, _, raw, ok := Replayed(nil, broken); ok || string(raw) != string(broken) {
		t.Fatalf("a broken stream replayed as an answer")
	}
	if _, _, _, ok := Replayed(nil, json.RawMessage(`{"code":"indeterminate"}`)); ok {
		t.Fatal("an indeterminate orphan replayed as an answer")
	}
}

// memRecorder keeps what a Stream records.
type memRecorder struct {
	mu     sync.Mutex
	result json.RawMessage
	err    json.RawMessage
	usage  *wire.Usage
	deltas []string
}

func (m *memRecorder) Complete(_ context.Context, _ string, r json.RawMessage, u *wire.Usage) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.result, m.usage = r, u
	return nil
}

func (m *memRecorder) Fail(_ context.Context, _ string, e json.RawMessage) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.err = e
	return nil
}

func (m *memRecorder) Delta(_ context.Context, _ string, _ int64, d json.RawMessage) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deltas = append(m.deltas, string(d))
	return nil
}

func TestStream(t *testing.T) {
	src := "data: {\"n\":1}\n\ndata: {\"n\":2,\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\r\n\r\ndata: [DONE]\n\n"
	m := &memRecorder{}
	s := NewStream(context.Background(), m, "s1", 200, "text/event-stream", io.NopCloser(strings.NewReader(src)), Usage)
	buf := make([]byte, 5)
	got, err := s.Read(buf) // read a little, then close: the rest is drained and recorded
	if err != nil || got == 0 {
		t.Fatalf("read: %d %v", got, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var r Response
	if err := json.Unmarshal(m.result, &r); err != nil || r.Body != src || !r.Stream {
		t.Fatalf("recorded %s (%v)", m.result, err)
	}
	if m.usage == nil || m.usage.TotalTokens != 3 {
		t.Fatalf("usage %+v", m.usage)
	}
	if strings.Join(m.deltas, "|") != `{"n":1}|{"n":2,"usage":{"prompt_tokens":1,"completion_tokens":2}}|"[DONE]"` {
		t.Fatalf("deltas %q", m.deltas)
	}
}

type brokenReader struct{ n int }

func (b *brokenReader) Read(p []byte) (int, error) {
	if b.n == 0 {
		b.n++
		return copy(p, "data: {}\n\n"), nil
	}
	return 0, errors.New("connection reset")
}

func TestStreamBroken(t *testing.T) {
	m := &memRecorder{}
	s := NewStream(context.Background(), m, "s1", 200, "text/event-stream", io.NopCloser(&brokenReader{}), Usage)
	_, err := io.ReadAll(s)
	if err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("err %v", err)
	}
	if m.result != nil || !strings.Contains(string(m.err), "stream broken: connection reset") {
		t.Fatalf("result %s err %s", m.result, m.err)
	}
}

// chunks is a source that gives one chunk per Read, then EOF.
type chunks []string

func (c *chunks) Read(p []byte) (int, error) {
	if len(*c) == 0 {
		return 0, io.EOF
	}
	n := copy(p, (*c)[0])
	(*c)[0] = (*c)[0][n:]
	if (*c)[0] == "" {
		*c = (*c)[1:]
	}
	return n, nil
}

// seenRecorder is a Recorder that notes, when the step is recorded, what
// the stream's reader had been handed by then; fail makes the record fail.
type seenRecorder struct {
	memRecorder
	got     *bytes.Buffer
	atEnd   string
	records int
	fail    error
}

func (s *seenRecorder) Complete(ctx context.Context, id string, r json.RawMessage, u *wire.Usage) error {
	s.atEnd = s.got.String()
	s.records++
	if s.fail != nil {
		return s.fail
	}
	return s.memRecorder.Complete(ctx, id, r, u)
}

// readAll reads s to its end into got, a few bytes at a time.
func readAll(s *Stream, got *bytes.Buffer) error {
	buf := make([]byte, 7) // small: every event takes several reads
	for {
		n, err := s.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			return err
		}
	}
}

// A reader that stops at the terminal event, as the providers' clients do,
// finds the step recorded: the event is handed out only after the record,
// and not at all when the record fails.
func TestStreamHoldsTheTerminalEventUntilRecorded(t *testing.T) {
	cases := []struct {
		name   string
		chunks []string // as the source gives them
		held   string   // the terminal event and what follows it
	}{
		{"openai chat", []string{"data: {\"n\":1}\n\n", "data: {\"n\":2,\"usage\":{}}\n\n", "data: [DONE]\n\n"}, "data: [DONE]\n\n"},
		{"one chunk", []string{"data: {\"n\":1}\n\ndata: [DONE]\n\n"}, "data: [DONE]\n\n"},
		{"crlf, trailing bytes", []string{"data: {\"n\":1}\r\n\r\n", "data: [DONE]\r\n\r\n", ": bye\n"}, "data: [DONE]\r\n\r\n: bye\n"},
		{"anthropic", []string{"event: message_start\ndata: {\"type\":\"message_start\"}\n\n", "event: message_delta\ndata: {}\n\n",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"}, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
		{"responses", []string{"event: response.created\ndata: {}\n\n", "event: response.completed\ndata: {}\n\n"}, "event: response.completed\ndata: {}\n\n"},
		{"anthropic error", []string{"event: message_start\ndata: {}\n\n", "event: error\ndata: {\"type\":\"error\"}\n\n"}, "event: error\ndata: {\"type\":\"error\"}\n\n"},
		{"responses failed", []string{"event: response.created\ndata: {}\n\n", "event: response.failed\ndata: {}\n\n"}, "event: response.failed\ndata: {}\n\n"},
	}
	for _, tc := range cases {
		for _, fail := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fail=%v", tc.name, fail), func(t *testing.T) {
				src := strings.Join(tc.chunks, "")
				before := strings.TrimSuffix(src, tc.held)
				var got bytes.Buffer
				rec := &seenRecorder{got: &got}
				if fail {
					rec.fail = errors.New("execution ended")
				}
				c := chunks(append([]string(nil), tc.chunks...))
				err := readAll(NewStream(context.Background(), rec, "s1", 200, "text/event-stream", io.NopCloser(&c), Usage), &got)
				if rec.records != 1 || rec.atEnd != before {
					t.Fatalf("recorded %d times; the reader had %q when the step was recorded, want %q", rec.records, rec.atEnd, before)
				}
				if fail {
					if err == io.EOF || !strings.Contains(err.Error(), "execution ended") || got.String() != before {
						t.Fatalf("record failed: the reader got %q, %v", got.String(), err)
					}
					return
				}
				if err != io.EOF || got.String() != src {
					t.Fatalf("the reader got %q, %v; want all of %q", got.String(), err, src)
				}
			})
		}
	}
}

// An event named like a terminal one only in its data is not terminal,
// and a stream without one is handed out whole before it is recorded.
func TestStreamWithoutTerminalEvent(t *testing.T) {
	for _, ev := range []string{"data: {\"type\":\"message_stop\"}", "event: ping\ndata: [DONE] later", "event: message_stopped\ndata: {}"} {
		if terminal(ev, EventData(ev)) {
			t.Errorf("%q taken as terminal", ev)
		}
	}
	var got bytes.Buffer
	rec := &seenRecorder{got: &got}
	c := chunks{"data: {\"n\":1}\n\n", "data: {\"n\":2}\n\n"}
	if err := readAll(NewStream(context.Background(), rec, "s1", 200, "text/event-stream", io.NopCloser(&c), Usage), &got); err != io.EOF {
		t.Fatal(err)
	}
	if rec.atEnd != "data: {\"n\":1}\n\ndata: {\"n\":2}\n\n" || got.String() != rec.atEnd {
		t.Fatalf("at the record the reader had %q; in all %q", rec.atEnd, got.String())
	}
}
