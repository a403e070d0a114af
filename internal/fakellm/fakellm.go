// Package fakellm is a local stand-in for an LLM provider: an
// OpenAI-compatible POST /v1/chat/completions that answers
// deterministically from the last user message, streams when asked
// ("stream": true, as server-sent events ending in "data: [DONE]"), and
// counts the calls it serves. Tests and the LLM example use it so that
// nothing leaves the machine.
package fakellm

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// Provider is the fake provider's handler.
type Provider struct {
	calls atomic.Int64
	// Delay, when set, is slept before each streamed chunk.
	Delay time.Duration
}

// Calls returns how many completions were served.
func (p *Provider) Calls() int64 { return p.calls.Load() }

// request is the part of a chat completion request the fake reads.
type request struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	Stream bool `json:"stream"`
}

// Reply is the fake's answer to a prompt: deterministic, so a test can
// predict it, with the call number in it, so a test can tell a replay (the
// recorded number) from a new call.
func Reply(prompt string, call int64) string {
	return fmt.Sprintf("You said %q. (completion #%d)", prompt, call)
}

// ServeHTTP answers POST /v1/chat/completions.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		writeErr(w, http.StatusNotFound, "not_found", "no route "+r.Method+" "+r.URL.Path)
		return
	}
	var req request
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		writeErr(w, http.StatusBadRequest, "invalid_request_error", "body: "+err.Error())
		return
	}
	if req.Model == "" || len(req.Messages) == 0 {
		writeErr(w, http.StatusBadRequest, "invalid_request_error", "model and messages are required")
		return
	}
	n := p.calls.Add(1)
	prompt := req.Messages[len(req.Messages)-1].Content
	text := Reply(prompt, n)
	id := fmt.Sprintf("chatcmpl-%d", n)
	usage := map[string]int{"prompt_tokens": len(strings.Fields(prompt)), "completion_tokens": len(strings.Fields(text))}
	usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		// Indented on purpose: a recorder must give these bytes back
		// exactly, not a re-encoding.
		b, _ := json.MarshalIndent(map[string]any{
			"id": id, "object": "chat.completion", "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]string{"role": "assistant", "content": text}}},
			"usage": usage,
		}, "", "  ")
		w.Write(append(b, '\n'))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	words := strings.SplitAfter(text, " ")
	for i, word := range words {
		if p.Delay > 0 {
			time.Sleep(p.Delay)
		}
		chunk := map[string]any{"id": id, "object": "chat.completion.chunk", "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "delta": map[string]string{"content": word}}}}
		if i == len(words)-1 {
			chunk["usage"] = usage
		}
		b, _ := json.Marshal(chunk)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func writeErr(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"type": typ, "message": msg}})
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
