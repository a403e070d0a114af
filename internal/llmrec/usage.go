package llmrec

import (
	"bytes"
	"encoding/json"

	"github.com/wicket-run/wicket/server/wire"
)

// Usage reads token usage from an LLM answer, a JSON body or a stream of
// server-sent events, and returns nil when there is none. It reads:
//
//   - OpenAI's chat completions and embeddings: "usage" {prompt_tokens,
//     completion_tokens, total_tokens}, in the body or in the last chunk of
//     a stream (sent when stream_options.include_usage is set);
//   - OpenAI's responses: "usage" {input_tokens, output_tokens,
//     total_tokens}, in the body or in the "response" of a stream's
//     response.completed event;
//   - Anthropic's messages: "usage" {input_tokens, output_tokens,
//     cache_creation_input_tokens, cache_read_input_tokens}, in the body
//     or, in a stream, in message_start's "message" (input) and
//     message_delta (the output so far). Cache tokens count as input.
//
// In a stream each count is the last non-zero one seen, so that a later
// event's cumulative count replaces an earlier one and an event that
// reports only output keeps the input seen before it.
func Usage(body []byte) *wire.Usage {
	if u, ok := usageOf(body); ok {
		return u.result()
	}
	var acc counts
	seen := false
	for _, line := range bytes.Split(body, []byte("\n")) {
		v, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		if !ok {
			continue
		}
		if u, ok := usageOf(bytes.TrimSpace(v)); ok {
			seen = true
			acc.merge(u)
		}
	}
	if !seen {
		return nil
	}
	return acc.result()
}

// counts are the token counts of one usage object.
type counts struct {
	input, output, total int64
}

func (c *counts) merge(u counts) {
	if u.input != 0 {
		c.input = u.input
	}
	if u.output != 0 {
		c.output = u.output
	}
	if u.total != 0 {
		c.total = u.total
	}
}

func (c counts) result() *wire.Usage {
	u := &wire.Usage{InputTokens: c.input, OutputTokens: c.output, TotalTokens: c.total}
	if u.TotalTokens == 0 {
		u.TotalTokens = u.InputTokens + u.OutputTokens
	}
	if u.InputTokens < 0 || u.OutputTokens < 0 || u.TotalTokens <= 0 {
		return nil
	}
	return u
}

// usageJSON is a usage object of any of the dialects.
type usageJSON struct {
	PromptTokens             int64 `json:"prompt_tokens"`
	CompletionTokens         int64 `json:"completion_tokens"`
	TotalTokens              int64 `json:"total_tokens"`
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// usageOf reads the usage object of one JSON document: its own "usage", or
// that of its "response" (OpenAI's response events) or "message"
// (Anthropic's message_start).
func usageOf(b []byte) (counts, bool) {
	var v struct {
		Usage    *usageJSON `json:"usage"`
		Response *struct {
			Usage *usageJSON `json:"usage"`
		} `json:"response"`
		Message *struct {
			Usage *usageJSON `json:"usage"`
		} `json:"message"`
	}
	if json.Unmarshal(b, &v) != nil {
		return counts{}, false
	}
	u := v.Usage
	if u == nil && v.Response != nil {
		u = v.Response.Usage
	}
	if u == nil && v.Message != nil {
		u = v.Message.Usage
	}
	if u == nil {
		return counts{}, false
	}
	return counts{
		input:  u.PromptTokens + u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens,
		output: u.CompletionTokens + u.OutputTokens,
		total:  u.TotalTokens,
	}, true
}
