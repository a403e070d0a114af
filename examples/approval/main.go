// Command approval is a support agent that refunds orders, and shows how
// policy, approvals and replay meet in an agent written with sdk/agent.
//
// Its input is {"order_id": "...", "reason": "..."}. It looks the order up
// with the tool orders.lookup (read_only, safe_to_retry), then refunds it
// with payments.refund (remote_mutation, at_most_once). On start it
// uploads its policy (native rules) as a bundle and registers itself bound
// to it: lookups are
// allowed, refunds require a human's approval, anything else is denied.
//
// The first dispatch looks the order up, then submits the refund; the
// kernel answers "blocked", the SDK returns an *agent.Blocked, the handler
// returns it, and the dispatch ends with the execution blocked. Granting the
// approval queues a new dispatch: the handler runs again from the top, the
// lookup replays from the record (its body does not run again: each tool
// body logs a line, so watch the agent's log), the refund runs once, and
// the execution completes.
//
//	go build -o wicket ./cmd/wicket    # once, from the repository root
//	./wicket serve
//	go run ./examples/approval
//	./wicket exec create approval --input '{"order_id":"A-1001","reason":"arrived broken"}'
//	./wicket approval ls --status pending
//	./wicket approval grant <approval id> --by alice --rationale "photo checks out"
//	./wicket exec events <execution id>
//
// (approval deny instead of grant makes the refund step denied: the handler
// gets an *agent.PolicyError and the execution fails.)
//
// Flags: --kernel (WICKET_URL), --listen, --admin-key (WICKET_ADMIN_KEY;
// only for a kernel started with one), --id, --secret (WICKET_AGENT_SECRET).
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
)

// policy is the agent's native rules (docs/policy.md): the lowest priority
// that matches decides, and what no rule matches is denied.
const policy = `default_action: deny
rules:
  - id: lookups
    priority: 1
    when: {target: orders.lookup}
    then: {decision: allow}
  - id: refunds-need-a-human
    priority: 2
    when: {target: payments.refund}
    then:
      decision: require_approval
      reason: refunds move money
      approval_config:
        message: "Refund this order? Check the amount and the customer's reason."
        timeout: 24h
`

type input struct {
	OrderID string `json:"order_id"`
	Reason  string `json:"reason"`
}

type order struct {
	ID          string `json:"id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

type refundArgs struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Reason      string `json:"reason"`
}

type refund struct {
	RefundID    string `json:"refund_id"`
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// lookup reads an order. A real one would query the order service; a read
// is safe to run again if a crash leaves its outcome unknown.
var lookup = agent.NewTool("orders.lookup", func(ctx context.Context, orderID string) (order, error) {
	log.Printf("tool orders.lookup: looking up order %s", orderID)
	return order{ID: orderID, Customer: "ada@example.com", AmountCents: 4200, Currency: "EUR"}, nil
}, agent.WithEffect(agent.ReadOnly), agent.WithIdempotency(agent.SafeToRetry))

// pay refunds an order. Money moves at most once: if a crash leaves its
// outcome unknown, the kernel records it as indeterminate rather than
// running it again.
var pay = agent.NewTool("payments.refund", func(ctx context.Context, in refundArgs) (refund, error) {
	log.Printf("tool payments.refund: refunding %d.%02d %s for order %s (%s)",
		in.AmountCents/100, in.AmountCents%100, in.Currency, in.OrderID, in.Reason)
	return refund{RefundID: "re_" + in.OrderID, OrderID: in.OrderID, AmountCents: in.AmountCents, Currency: in.Currency}, nil
}, agent.WithEffect(agent.RemoteMutation), agent.WithIdempotency(agent.AtMostOnce))

// handle runs once per dispatch: before the approval, and again after it.
func handle(ctx context.Context, in input) (refund, error) {
	if in.OrderID == "" {
		return refund{}, errors.New(`input needs an "order_id"`)
	}
	if x, err := agent.FromContext(ctx); err == nil {
		log.Printf("handler: execution %s, order %s", x.ID, in.OrderID)
	}
	o, err := lookup.Call(ctx, in.OrderID) // replayed after the approval
	if err != nil {
		return refund{}, err
	}
	r, err := pay.Call(ctx, refundArgs{OrderID: o.ID, AmountCents: o.AmountCents, Currency: o.Currency, Reason: in.Reason})
	var blocked *agent.Blocked
	if errors.As(err, &blocked) {
		log.Printf("the refund waits for approval %s; run:\n\t./wicket approval grant %s --by alice", blocked.ApprovalID, blocked.ApprovalID)
	}
	// Returning the *agent.Blocked ends the dispatch without a verdict (the
	// execution stays blocked); a denied refund (*agent.PolicyError) fails
	// the execution.
	return r, err
}

func main() {
	kernelURL := flag.String("kernel", env("WICKET_URL", "http://127.0.0.1:8080"), "kernel base URL (WICKET_URL)")
	listen := flag.String("listen", "127.0.0.1:5002", "address to serve the webhook on")
	adminKey := flag.String("admin-key", os.Getenv("WICKET_ADMIN_KEY"), "admin API key, if the kernel has one (WICKET_ADMIN_KEY)")
	id := flag.String("id", "approval", "agent id")
	secret := flag.String("secret", env("WICKET_AGENT_SECRET", "approval-dev-secret-0123456789"), "the agent's HMAC secret (WICKET_AGENT_SECRET)")
	flag.Parse()

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

	// Upload the policy as a bundle first, then register (upsert) the agent
	// bound to it: the agent never exists without its policy, so no
	// execution can slip through under the kernel's default.
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
	bundle := *id + "-policy"
	b, err := admin.PutBundleFiles(ctx, bundle, client.BundleFilesRequest{Engine: "rules", Files: map[string]string{"rules.yaml": policy}})
	if err != nil {
		log.Fatalf("upload policy bundle %s to %s: %v", bundle, *kernelURL, err)
	}
	webhook := "http://" + ln.Addr().String() + "/webhook"
	if _, err := admin.PutAgent(ctx, client.AgentRequest{ID: *id, WebhookURL: webhook, Secret: *secret, Policy: &bundle}); err != nil {
		log.Fatalf("register agent %s with %s: %v", *id, *kernelURL, err)
	}
	log.Printf("agent %s is registered (policy bundle %s revision %s) and serving %s; now run:\n\t./wicket exec create %s --input '{\"order_id\":\"A-1001\",\"reason\":\"arrived broken\"}'",
		*id, b.Name, b.Revision, webhook, *id)

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
