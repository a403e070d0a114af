// Package agent is the Go SDK for writing Wicket agents: stateless HTTP
// services whose every effect (a tool call, an LLM call, a local value) is
// a durable step of the kernel.
//
//	search := agent.NewTool("web.search", func(ctx context.Context, q Query) (Results, error) {
//		return doSearch(ctx, q) // runs only when the kernel says proceed
//	}, agent.WithEffect(agent.ReadOnly))
//
//	a, err := agent.New(agent.Config{
//		ID: "researcher", Secret: []byte(secret), KernelURL: "http://127.0.0.1:8080",
//		Handler: agent.Typed(func(ctx context.Context, in Input) (Output, error) {
//			started, err := agent.Now(ctx) // recorded: the same on every replay
//			if err != nil {
//				return Output{}, err
//			}
//			res, err := search.Call(ctx, Query{Text: in.Question})
//			...
//		}),
//	})
//	http.Handle("/webhook", a) // the agent's registered webhook_url
//
// # How a dispatch runs
//
// The kernel POSTs a signed webhook for each dispatch. The Agent verifies
// the signature in constant time (401 otherwise), answers 202 at once, reads
// the execution, and runs the Handler under a context.Context that carries
// the Execution (FromContext returns it), renewing the lease every
// Config.HeartbeatInterval (default 30 s). The handler's output completes
// the execution and its error fails it.
//
// Every recording primitive (Tool.Call, Step, Now, NewID, Invoke, the LLM
// Transport) submits its effect and acts on the decision:
//
//	proceed             run the body, record its result (or its error: *ToolError)
//	replay              return the recorded result or error; the body does not run
//	denied              *PolicyError
//	rate_limited        *RateLimited
//	blocked             *Blocked: return; the dispatch ends, the approval resumes it
//	execution_blocked   *Blocked
//	execution_terminal  *Terminated
//
// Blocked, Terminated and LeaseSuperseded are remembered on the Execution:
// a handler that swallows one still ends the dispatch without a verdict,
// and every later step returns it again. A superseded lease or an ended
// execution also cancels the handler's context (context.Cause tells which).
//
// # Determinism
//
// The kernel derives a step's id from its execution, kind, target,
// canonical arguments and occurrence. A re-delivered dispatch runs the
// handler again from the top and every recorded step replays, as long as
// it submits the same steps: read the clock, randomness and fresh ids
// through Step (or Now and NewID), never directly into another step's
// arguments.
//
// # LLM calls
//
// Transport (or NewHTTPClient) turns requests to an LLM provider into
// llm_call steps, so any Go client that accepts an *http.Client records and
// replays model calls; requests must carry the handler's context. Refused
// calls come back as 403/429 answers carrying RefusalMarker, which
// RaiseForRefusal turns back into the typed errors above.
package agent
