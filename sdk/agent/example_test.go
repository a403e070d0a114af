package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"time"

	"github.com/wicket-run/wicket/sdk/agent"
)

// An agent is an http.Handler: mount it where its registered webhook_url
// points. The handler runs once per dispatch, under a context that carries
// the execution.
func ExampleNew() {
	type Input struct {
		Name string `json:"name"`
	}
	a, err := agent.New(agent.Config{
		ID:        "hello",
		Secret:    []byte("hello-secret-0123456789"),
		KernelURL: "http://127.0.0.1:8080",
		Handler: agent.Typed(func(ctx context.Context, in Input) (map[string]string, error) {
			return map[string]string{"greeting": "hello " + in.Name}, nil
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/webhook", a)
	log.Fatal(http.ListenAndServe("127.0.0.1:5001", nil))
}

// A tool's body runs only when the kernel says proceed; a replay returns
// the recorded result. Policy sees the tool's name, arguments and effect
// class.
func ExampleNewTool() {
	type Refund struct {
		OrderID string `json:"order_id"`
		Cents   int    `json:"cents"`
	}
	refund := agent.NewTool("payments.refund", func(ctx context.Context, r Refund) (string, error) {
		return "refunded " + r.OrderID, nil // call the payment provider here
	}, agent.WithEffect(agent.RemoteMutation), agent.WithIdempotency(agent.AtMostOnce))

	handler := agent.Typed(func(ctx context.Context, r Refund) (string, error) {
		res, err := refund.Call(ctx, r)
		var blocked *agent.Blocked
		if errors.As(err, &blocked) {
			// Policy wants a human: return, and the approval resumes the
			// execution with a new dispatch that replays up to here.
			return "", err
		}
		return res, err
	})
	_ = handler
}

// Step records a value that differs between runs, so that a replay sees the
// first run's value and later steps keep their ids.
func ExampleStep() {
	handler := agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		deadline, err := agent.Step(ctx, "deadline", func(context.Context) (time.Time, error) {
			return time.Now().Add(24 * time.Hour), nil
		})
		if err != nil {
			return nil, err
		}
		id, err := agent.NewID(ctx) // a recorded random id
		if err != nil {
			return nil, err
		}
		return map[string]any{"ticket": id, "due": deadline}, nil
	})
	_ = handler
}

// Any Go client that accepts an *http.Client records its LLM calls: make
// the requests with the handler's context.
func ExampleNewHTTPClient() {
	llm := agent.NewHTTPClient(nil) // or &http.Client{Transport: &agent.Transport{Base: yourTransport}}
	handler := agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		body := []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`)
		req, err := http.NewRequestWithContext(ctx, "POST", "https://api.openai.com/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		resp, err := llm.Do(req) // an llm_call step: recorded once, replayed on resume
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			// A refusal (403/429 with the marker) becomes a typed error:
			// *agent.Blocked parks the execution instead of failing it.
			return nil, agent.RaiseForRefusal(ctx, fmt.Errorf("provider: %s", data))
		}
		return json.RawMessage(data), nil
	})
	_ = handler
}

// A provider SDK surfaces a refused call as text; ParseRefusal reads the
// kernel's decision back from it.
func ExampleParseRefusal() {
	msg := `Error code: 403 - {"error": {"type": "rebuno_refusal", "message": "rebuno_refusal: denied reason=model not allowed"}}`
	r, ok := agent.ParseRefusal(msg)
	fmt.Println(ok, r.Decision, "/", r.Reason)

	err := agent.RaiseForRefusal(context.Background(), errors.New(msg))
	var pe *agent.PolicyError
	fmt.Println(errors.As(err, &pe), pe.Reason)
	// Output:
	// true denied / model not allowed
	// true model not allowed
}
