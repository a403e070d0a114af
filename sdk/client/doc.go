// Package client is the Go client of a Wicket kernel's /v0 HTTP API: the
// client routes (run, read, watch and cancel executions), the admin routes
// (agents, policies, bundles, approvals), the tenant routes, and the plain
// request primitive (Client.Do) that agent SDKs build on. It imports only
// the standard library and server/wire.
//
// # Basics
//
// A Client is built once with New and options, and is safe for concurrent
// use:
//
//	c := client.New("http://127.0.0.1:8080", client.WithAPIKey(os.Getenv("WICKET_API_KEY")))
//	x, err := c.CreateExecution(ctx, client.CreateExecutionRequest{
//		AgentID: "researcher",
//		Input:   json.RawMessage(`{"topic":"durable execution"}`),
//	}, "request-42") // Idempotency-Key: a retry returns the same execution
//	if err != nil {
//		return err
//	}
//	err = c.Watch(ctx, x.ID, 0, func(it client.StreamItem) error {
//		if it.Event != nil {
//			fmt.Println(it.Event.Seq, it.Event.Type)
//		}
//		return nil
//	})
//
// Methods take a context first and return the decoded answer. The answer
// types are aliases of the server/wire types (Execution = wire.Execution,
// ...).
//
// # Credentials
//
// WithAPIKey sends a bearer key: a client key runs and reads executions of
// its tenant, a tenant-admin key also manages agents, bundles and
// approvals, and an admin key manages tenants and may act in any tenant
// with WithTenant. WithAgent signs every request with an agent's secret
// instead (the agent routes; an agent may read its own executions).
//
// # Errors
//
// A non-2xx answer is an *APIError carrying the HTTP status and the error
// envelope's code and message. Errors are wrapped with the request's method
// and path; test them with errors.As or IsCode:
//
//	if client.IsCode(err, wire.CodeNotFound) { ... }
//
// # Watching
//
// Watch follows an execution's event log over Server-Sent Events until its
// terminal event, delivering each event exactly once in order, and the live
// step deltas as they come. It reconnects with Last-Event-ID when the
// connection drops and falls back to polling when the server (or a proxy)
// does not speak SSE. Wait returns the execution once it is finished.
package client
