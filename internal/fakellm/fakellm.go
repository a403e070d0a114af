// Package fakellm is a local stand-in for an LLM provider that speaks
// OpenAI's and Anthropic's APIs:
//
//   - POST /v1/chat/completions (OpenAI chat completions)
//   - POST /v1/responses (OpenAI responses)
//   - POST /v1/embeddings (OpenAI embeddings, float or base64)
//   - POST /v1/messages (Anthropic messages)
//
// It answers deterministically from the last user message, streams when
// asked ("stream": true) as the real APIs do (OpenAI's data-only chunks
// ending in "data: [DONE]", with a usage chunk only when
// stream_options.include_usage is set; typed events for responses and
// Anthropic messages), cuts an answer to the request's output cap (one
// word per token), and counts the calls it serves. A model whose name ends
// in "-error" gets a 500 in the dialect's error shape. Tests and the LLM
// examples use it so that nothing leaves the machine.
package fakellm

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Provider is the fake provider's handler.
type Provider struct {
	calls atomic.Int64
	// Delay, when set, is slept before each streamed chunk.
	Delay time.Duration
	// APIKey, when set, must come with every request: as Authorization:
	// Bearer on OpenAI's routes, as x-api-key on Anthropic's.
	APIKey string

	mu   sync.Mutex // guards reqs
	reqs []Request
}

// Request is a request the provider served, as it arrived.
type Request struct {
	Path   string
	Header http.Header
	Body   []byte
}

// maxKept bounds the requests a Provider keeps.
const maxKept = 1024

// Calls returns how many requests were answered (errors of the "-error"
// models included; refused requests not).
func (p *Provider) Calls() int64 { return p.calls.Load() }

// Requests returns the requests answered so far (at most the last 1024).
func (p *Provider) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Request(nil), p.reqs...)
}

// Reply is the fake's answer to a prompt: deterministic, so a test can
// predict it, with the call number in it, so a test can tell a replay (the
// recorded number) from a new call.
func Reply(prompt string, call int64) string {
	return fmt.Sprintf("You said %q. (completion #%d)", prompt, call)
}

// message is a chat message of either dialect: content is a string or a
// list of parts with text.
type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func (m message) text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// request is what the fake reads of any request.
type request struct {
	Model               string          `json:"model"`
	Messages            []message       `json:"messages"`
	Input               json.RawMessage `json:"input"`
	EncodingFormat      string          `json:"encoding_format"`
	Stream              bool            `json:"stream"`
	MaxTokens           int             `json:"max_tokens"`
	MaxCompletionTokens int             `json:"max_completion_tokens"`
	MaxOutputTokens     int             `json:"max_output_tokens"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// cap is the request's output cap in tokens (0: none).
func (r *request) cap() int {
	for _, v := range []int{r.MaxCompletionTokens, r.MaxTokens, r.MaxOutputTokens} {
		if v > 0 {
			return v
		}
	}
	return 0
}

// answer is one call's text, cut to the cap, and its token counts.
type answer struct {
	id            string
	n             int64
	words         []string
	text          string
	in, out       int
	truncated     bool
	model, prompt string
}

func (p *Provider) answer(req *request, prompt, prefix string) answer {
	n := p.calls.Add(1)
	words := strings.SplitAfter(Reply(prompt, n), " ")
	a := answer{id: fmt.Sprintf("%s%d", prefix, n), n: n, model: req.Model, prompt: prompt}
	if c := req.cap(); c > 0 && c < len(words) {
		words, a.truncated = words[:c], true
	}
	a.words = words
	a.text = strings.Join(words, "")
	a.in = len(strings.Fields(prompt))
	a.out = len(words)
	return a
}

// ServeHTTP answers the four routes.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	anthropic := r.URL.Path == "/v1/messages"
	if r.Method != http.MethodPost {
		writeErr(w, anthropic, http.StatusMethodNotAllowed, "invalid_request_error", "use POST")
		return
	}
	if p.APIKey != "" {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if anthropic {
			got = r.Header.Get("X-Api-Key")
		}
		if got != p.APIKey {
			writeErr(w, anthropic, http.StatusUnauthorized, "authentication_error", "invalid API key")
			return
		}
	}
	var raw json.RawMessage
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8<<20)).Decode(&raw); err != nil {
		writeErr(w, anthropic, http.StatusBadRequest, "invalid_request_error", "body: "+err.Error())
		return
	}
	var req request
	if err := json.Unmarshal(raw, &req); err != nil || req.Model == "" {
		writeErr(w, anthropic, http.StatusBadRequest, "invalid_request_error", "a JSON body with a model is required")
		return
	}
	switch r.URL.Path {
	case "/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/embeddings":
	default:
		writeErr(w, anthropic, http.StatusNotFound, "not_found_error", "no route "+r.Method+" "+r.URL.Path)
		return
	}
	p.mu.Lock()
	if len(p.reqs) == maxKept {
		p.reqs = p.reqs[1:]
	}
	p.reqs = append(p.reqs, Request{Path: r.URL.Path, Header: r.Header.Clone(), Body: raw})
	p.mu.Unlock()
	if strings.HasSuffix(req.Model, "-error") {
		p.calls.Add(1)
		writeErr(w, anthropic, http.StatusInternalServerError, "api_error", "the fake model "+req.Model+" always fails")
		return
	}
	switch r.URL.Path {
	case "/v1/chat/completions":
		p.chat(w, &req)
	case "/v1/messages":
		p.messages(w, &req)
	case "/v1/responses":
		p.responses(w, &req)
	case "/v1/embeddings":
		p.embeddings(w, &req)
	}
}

func lastUser(ms []message) (string, bool) {
	if len(ms) == 0 {
		return "", false
	}
	return ms[len(ms)-1].text(), true
}

// chat answers POST /v1/chat/completions.
func (p *Provider) chat(w http.ResponseWriter, req *request) {
	prompt, ok := lastUser(req.Messages)
	if !ok {
		writeErr(w, false, http.StatusBadRequest, "invalid_request_error", "messages are required")
		return
	}
	a := p.answer(req, prompt, "chatcmpl-")
	usage := map[string]int{"prompt_tokens": a.in, "completion_tokens": a.out, "total_tokens": a.in + a.out}
	finish := "stop"
	if a.truncated {
		finish = "length"
	}
	if !req.Stream {
		// Indented on purpose: a recorder must give these bytes back
		// exactly, not a re-encoding.
		writeJSONIndent(w, map[string]any{
			"id": a.id, "object": "chat.completion", "created": 1700000000, "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": finish, "logprobs": nil,
				"message": map[string]any{"role": "assistant", "content": a.text, "refusal": nil}}},
			"usage": usage,
		})
		return
	}
	sse := p.sse(w)
	for i, word := range a.words {
		delta := map[string]string{"content": word}
		if i == 0 {
			delta["role"] = "assistant"
		}
		choice := map[string]any{"index": 0, "delta": delta, "finish_reason": nil}
		if i == len(a.words)-1 {
			choice["finish_reason"] = finish
		}
		sse("", map[string]any{"id": a.id, "object": "chat.completion.chunk", "created": 1700000000, "model": req.Model, "choices": []any{choice}})
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		sse("", map[string]any{"id": a.id, "object": "chat.completion.chunk", "created": 1700000000, "model": req.Model, "choices": []any{}, "usage": usage})
	}
	sse("", "[DONE]")
}

// messages answers Anthropic's POST /v1/messages.
func (p *Provider) messages(w http.ResponseWriter, req *request) {
	prompt, ok := lastUser(req.Messages)
	if !ok || req.MaxTokens <= 0 {
		writeErr(w, true, http.StatusBadRequest, "invalid_request_error", "messages and max_tokens are required")
		return
	}
	a := p.answer(req, prompt, "msg_")
	stop := "end_turn"
	if a.truncated {
		stop = "max_tokens"
	}
	msg := map[string]any{"id": a.id, "type": "message", "role": "assistant", "model": req.Model,
		"content": []any{map[string]any{"type": "text", "text": a.text}}, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": a.in, "output_tokens": a.out}}
	if !req.Stream {
		writeJSONIndent(w, msg)
		return
	}
	sse := p.sse(w)
	start := map[string]any{"id": a.id, "type": "message", "role": "assistant", "model": req.Model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": a.in, "output_tokens": 1}}
	sse("message_start", map[string]any{"type": "message_start", "message": start})
	sse("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]string{"type": "text", "text": ""}})
	sse("ping", map[string]any{"type": "ping"})
	for _, word := range a.words {
		sse("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]string{"type": "text_delta", "text": word}})
	}
	sse("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	sse("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]int{"output_tokens": a.out}})
	sse("message_stop", map[string]any{"type": "message_stop"})
}

// responses answers OpenAI's POST /v1/responses.
func (p *Provider) responses(w http.ResponseWriter, req *request) {
	var prompt string
	if json.Unmarshal(req.Input, &prompt) != nil {
		var items []message
		_ = json.Unmarshal(req.Input, &items)
		var ok bool
		if prompt, ok = lastUser(items); !ok {
			writeErr(w, false, http.StatusBadRequest, "invalid_request_error", "input is required")
			return
		}
	}
	a := p.answer(req, prompt, "resp_")
	msgID := fmt.Sprintf("msg_%d", a.n)
	text := map[string]any{"type": "output_text", "text": a.text, "annotations": []any{}}
	item := map[string]any{"type": "message", "id": msgID, "status": "completed", "role": "assistant", "content": []any{text}}
	resp := func(status string, output []any, usage any) map[string]any {
		return map[string]any{"id": a.id, "object": "response", "created_at": 1700000000, "status": status, "model": req.Model,
			"output": output, "usage": usage, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{}}
	}
	usage := map[string]int{"input_tokens": a.in, "output_tokens": a.out, "total_tokens": a.in + a.out}
	if !req.Stream {
		writeJSONIndent(w, resp("completed", []any{item}, usage))
		return
	}
	sse := p.sse(w)
	seq := 0
	ev := func(typ string, v map[string]any) {
		v["type"], v["sequence_number"] = typ, seq
		seq++
		sse(typ, v)
	}
	ev("response.created", map[string]any{"response": resp("in_progress", []any{}, nil)})
	ev("response.output_item.added", map[string]any{"output_index": 0,
		"item": map[string]any{"type": "message", "id": msgID, "status": "in_progress", "role": "assistant", "content": []any{}}})
	for _, word := range a.words {
		ev("response.output_text.delta", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "delta": word})
	}
	ev("response.output_text.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "text": a.text})
	ev("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	ev("response.completed", map[string]any{"response": resp("completed", []any{item}, usage)})
}

// embeddings answers OpenAI's POST /v1/embeddings: 8 dimensions derived
// from each input's bytes.
func (p *Provider) embeddings(w http.ResponseWriter, req *request) {
	var inputs []string
	var one string
	if json.Unmarshal(req.Input, &one) == nil {
		inputs = []string{one}
	} else if json.Unmarshal(req.Input, &inputs) != nil || len(inputs) == 0 {
		writeErr(w, false, http.StatusBadRequest, "invalid_request_error", "input must be a string or a list of strings")
		return
	}
	p.calls.Add(1)
	tokens := 0
	data := make([]any, len(inputs))
	for i, in := range inputs {
		tokens += len(strings.Fields(in))
		vec := make([]float32, 8)
		for j := range vec {
			var h uint32 = 2166136261
			for _, c := range []byte(in) {
				h = (h ^ uint32(c)) * 16777619
			}
			vec[j] = float32(math.Sin(float64(h%1000+uint32(j)*131))) / 2
		}
		var emb any = vec
		if req.EncodingFormat == "base64" {
			b := make([]byte, 4*len(vec))
			for j, f := range vec {
				binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(f))
			}
			emb = base64.StdEncoding.EncodeToString(b)
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": emb}
	}
	writeJSONIndent(w, map[string]any{"object": "list", "data": data, "model": req.Model,
		"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens}})
}

// sse starts a text/event-stream answer and returns a function that sends
// one event (event name optional; a string is sent as is, anything else
// as JSON).
func (p *Provider) sse(w http.ResponseWriter) func(event string, v any) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	return func(event string, v any) {
		if p.Delay > 0 {
			time.Sleep(p.Delay)
		}
		data, ok := v.(string)
		if !ok {
			b, _ := json.Marshal(v)
			data = string(b)
		}
		if event != "" {
			fmt.Fprintf(w, "event: %s\n", event)
		}
		fmt.Fprintf(w, "data: %s\n\n", data)
		if fl != nil {
			fl.Flush()
		}
	}
}

func writeJSONIndent(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	b, _ := json.MarshalIndent(v, "", "  ")
	w.Write(append(b, '\n'))
}

// writeErr answers an error in the dialect's shape.
func writeErr(w http.ResponseWriter, anthropic bool, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if anthropic {
		json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
		return
	}
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": typ, "message": msg, "code": nil}})
}

// Listen serves p on addr ("127.0.0.1:0" for any free port) and returns
// its base URL and a function that stops it. Set p's fields before.
func Listen(addr string, p *Provider) (string, func() error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("fakellm: listen: %w", err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String(), srv.Close, nil
}
