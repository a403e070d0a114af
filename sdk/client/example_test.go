package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// A client of a local kernel, authenticated with an API key from the
// environment.
func ExampleNew() {
	c := client.New("http://127.0.0.1:8080",
		client.WithAPIKey(os.Getenv("WICKET_API_KEY")),
		client.WithUserAgent("nightly-report/1.0"),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Health(ctx); err != nil {
		log.Fatal(err)
	}
}

// Start an execution safely under retries, and wait for its output.
func ExampleClient_CreateExecution() {
	c := client.New("http://127.0.0.1:8080", client.WithAPIKey(os.Getenv("WICKET_API_KEY")))
	ctx := context.Background()
	x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{
		AgentID: "researcher",
		Input:   json.RawMessage(`{"topic":"durable execution"}`),
		Limits:  &client.Limits{MaxSteps: 50, MaxDuration: "10m"},
	}, "report-2025-06-01") // a retry with this key returns the same execution
	if err != nil {
		log.Fatal(err)
	}
	done, err := c.Wait(ctx, x.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(done.Status, string(done.Output))
}

// Follow an execution live: every event of its log once, in order, and the
// agent's streamed output as it is produced.
func ExampleClient_Watch() {
	c := client.New("http://127.0.0.1:8080", client.WithAPIKey(os.Getenv("WICKET_API_KEY")))
	id := os.Args[1]
	err := c.Watch(context.Background(), id, 0, func(it client.StreamItem) error {
		switch {
		case it.Delta != nil:
			fmt.Printf("  %s> %s\n", it.Delta.StepID[:8], it.Delta.Data)
		case it.Event != nil:
			fmt.Println(it.Event.Seq, it.Event.Type)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Errors of the kernel are *APIError values, wrapped with the request.
func ExampleIsCode() {
	// What GetExecution returns for an unknown id.
	err := fmt.Errorf("GET /v0/executions/x: %w",
		&client.APIError{Status: 404, Code: wire.CodeNotFound, Message: "execution x not found"})

	fmt.Println(client.IsCode(err, wire.CodeNotFound))
	var ae *client.APIError
	if errors.As(err, &ae) {
		fmt.Println(ae.Status, ae.Message)
	}
	fmt.Println(err)
	// Output:
	// true
	// 404 execution x not found
	// GET /v0/executions/x: 404 not_found: execution x not found
}
