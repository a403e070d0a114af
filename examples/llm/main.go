// Command llm is an agent that calls an LLM, written with sdk/agent: every
// model call is a durable llm_call step, recorded once and replayed byte for
// byte when the execution runs again.
//
// It needs no network and no API key: on start it serves a fake
// OpenAI-compatible provider (internal/fakellm) on a loopback port. Its
// input is {"prompt": "..."}. The handler makes two chat completion
// calls with an *http.Client from agent.NewHTTPClient, with the handler's
// context: a plain one, and the same prompt again streamed ("stream": true),
// whose chunks the kernel fans out live, as step.delta items, to whoever
// watches the execution. The two calls are two steps (their arguments
// differ in "stream"). It returns {"reply": ..., "streamed": ...}, the two
// answers.
//
// The chat client below is a few lines of net/http; any Go client that
// takes an *http.Client (a provider's SDK, say) works the same way: give it
// agent.NewHTTPClient(nil), pass it the handler's ctx, and hand its errors
// to agent.RaiseForRefusal, so that a call refused by policy comes back as
// *agent.PolicyError, *agent.Blocked, ... instead of an opaque 403.
//
//	go build -o wicket ./cmd/wicket    # once, from the repository root
//	./wicket serve
//	go run ./examples/llm
//	./wicket exec create llm --input '{"prompt":"Tell me about durable execution"}' --wait
//	./wicket exec watch <execution id>    # live, while a call streams
//	./wicket exec events <execution id>
//
// Flags: --kernel (WICKET_URL), --listen, --admin-key (WICKET_ADMIN_KEY;
// only for a kernel started with one), --id, --secret (WICKET_AGENT_SECRET),
// --model.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/wicket-run/wicket/internal/fakellm"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
)

// chat is a minimal client of an OpenAI-style POST /v1/chat/completions.
type chat struct {
	baseURL string
	model   string
	hc      *http.Client
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// post sends one chat completion request and returns the 2xx answer.
func (c *chat) post(ctx context.Context, prompt string, stream bool) (*http.Response, error) {
	in := map[string]any{
		"model":    c.model,
		"messages": []message{{Role: "user", Content: prompt}},
		"stream":   stream,
	}
	if stream {
		// OpenAI sends a stream's token usage only when asked.
		in["stream_options"] = map[string]bool{"include_usage": true}
	}
	body, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		// A call the kernel refused comes back as a 403 or 429 whose body
		// carries agent.RefusalMarker; RaiseForRefusal turns it into the
		// SDK's typed error. A provider's own error stays as it is.
		return nil, agent.RaiseForRefusal(ctx, fmt.Errorf("chat completion: %s: %s", resp.Status, bytes.TrimSpace(data)))
	}
	return resp, nil
}

// complete returns the assistant's answer to prompt.
func (c *chat) complete(ctx context.Context, prompt string) (string, error) {
	resp, err := c.post(ctx, prompt, false)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Message message `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("chat completion: %w", err)
	}
	if len(out.Choices) == 0 {
		return "", errors.New("chat completion: no choices")
	}
	return out.Choices[0].Message.Content, nil
}

// stream asks for a streamed answer (server-sent events, one chunk per
// "data:" line, ending with "data: [DONE]") and returns it assembled.
func (c *chat) stream(ctx context.Context, prompt string) (string, error) {
	resp, err := c.post(ctx, prompt, true)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			break
		}
		var chunk struct {
			Choices []struct {
				Delta message `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return "", fmt.Errorf("chat completion chunk: %w", err)
		}
		if len(chunk.Choices) > 0 {
			text.WriteString(chunk.Choices[0].Delta.Content)
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("chat completion stream: %w", err)
	}
	return text.String(), nil
}

type input struct {
	Prompt string `json:"prompt"`
}

type output struct {
	Reply    string `json:"reply"`
	Streamed string `json:"streamed"`
}

func main() {
	kernelURL := flag.String("kernel", env("WICKET_URL", "http://127.0.0.1:8080"), "kernel base URL (WICKET_URL)")
	listen := flag.String("listen", "127.0.0.1:5003", "address to serve the webhook on")
	adminKey := flag.String("admin-key", os.Getenv("WICKET_ADMIN_KEY"), "admin API key, if the kernel has one (WICKET_ADMIN_KEY)")
	id := flag.String("id", "llm", "agent id")
	secret := flag.String("secret", env("WICKET_AGENT_SECRET", "llm-dev-secret-0123456789"), "the agent's HMAC secret (WICKET_AGENT_SECRET)")
	model := flag.String("model", "fake-1", "model id (the llm_call step's target, which policy sees)")
	flag.Parse()

	// The fake provider, on a loopback port of its own. It pauses between
	// streamed chunks so that a watcher sees them arrive.
	providerURL, stopProvider, err := fakellm.Listen("127.0.0.1:0", &fakellm.Provider{Delay: 100 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer stopProvider()
	llm := &chat{baseURL: providerURL, model: *model, hc: agent.NewHTTPClient(nil)}

	handle := func(ctx context.Context, in input) (output, error) {
		if in.Prompt == "" {
			return output{}, errors.New(`input needs a "prompt"`)
		}
		reply, err := llm.complete(ctx, in.Prompt)
		if err != nil {
			return output{}, err
		}
		log.Printf("llm: %s", reply)
		streamed, err := llm.stream(ctx, in.Prompt)
		if err != nil {
			return output{}, err
		}
		log.Printf("llm (streamed): %s", streamed)
		return output{Reply: reply, Streamed: streamed}, nil
	}

	a, err := agent.New(agent.Config{
		ID:        *id,
		Secret:    []byte(*secret),
		KernelURL: *kernelURL,
		Handler:   agent.Typed(handle),
	})
	if err != nil {
		log.Fatal(err)
	}
	// Listen first, so the URL to register is known; webhooks that arrive
	// before Serve starts wait in the listener's backlog.
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}

	// Register (upsert) the agent: the kernel sends its webhooks, signed
	// with the secret, to this URL.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var opts []client.Option
	if *adminKey != "" {
		opts = append(opts, client.WithAPIKey(*adminKey))
	}
	admin := client.New(*kernelURL, opts...)
	// The kernel may still be starting (go run compiles it first): wait.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	if err := admin.WaitReady(wctx); err != nil {
		log.Fatalf("is the kernel running (./wicket serve)? %v", err)
	}
	cancel()
	webhook := "http://" + ln.Addr().String() + "/webhook"
	if _, err := admin.PutAgent(ctx, client.AgentRequest{ID: *id, WebhookURL: webhook, Secret: *secret}); err != nil {
		log.Fatalf("register agent %s with %s: %v", *id, *kernelURL, err)
	}
	log.Printf("agent %s is registered and serving %s (fake LLM at %s); now run:\n\t./wicket exec create %s --input '{\"prompt\":\"Tell me about durable execution\"}' --wait",
		*id, webhook, llm.baseURL, *id)

	// Serve until SIGINT/SIGTERM, then shut down gracefully: running
	// handlers get a few seconds to finish, and whatever does not finish
	// is re-delivered by the kernel once its lease expires.
	if err := a.Serve(ctx, ln); err != nil {
		log.Fatal(err)
	}
	log.Print("stopped")
}

// env returns the environment variable key, or def when it is empty.
func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
