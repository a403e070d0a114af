// Command hello is the smallest agent written with the Go agent SDK
// (sdk/agent). It greets whoever its input names: it reads the clock
// through agent.Now, so the time is recorded and a replay sees the same one,
// and builds the greeting in a typed tool ("greet") that runs as a durable
// tool_call step. Its output is {"greeting": ..., "at": ...}.
//
// On start it registers itself with the kernel (its webhook URL and secret)
// and serves the kernel's signed webhooks on /webhook. Run a kernel, then
// the agent, then an execution:
//
//	go build -o wicket ./cmd/wicket    # once, from the repository root
//	./wicket serve
//	go run ./examples/hello
//	./wicket exec create hello --input '{"name":"Ada"}' --wait
//	./wicket exec events <execution id>
//
// Flags: --kernel (WICKET_URL), --listen, --admin-key (WICKET_ADMIN_KEY;
// only for a kernel started with one), --id, --secret (WICKET_AGENT_SECRET).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
)

type input struct {
	Name string `json:"name"`
}

type output struct {
	Greeting string    `json:"greeting"`
	At       time.Time `json:"at"`
}

type greetArgs struct {
	Name string    `json:"name"`
	At   time.Time `json:"at"`
}

// greet builds the greeting. It is a tool: its arguments and result are
// recorded, and it runs only when the kernel says proceed, never on replay.
var greet = agent.NewTool("greet", func(ctx context.Context, in greetArgs) (string, error) {
	log.Printf("tool greet: greeting %s", in.Name)
	return fmt.Sprintf("Hello, %s! It is %s UTC.", in.Name, in.At.Format("15:04")), nil
}, agent.WithEffect(agent.ReadOnly), agent.WithIdempotency(agent.SafeToRetry))

// hello is the agent's handler: one run per dispatch.
func hello(ctx context.Context, in input) (output, error) {
	if in.Name == "" {
		in.Name = "world"
	}
	// The clock is read through a recorded step: the greet step's
	// arguments, and hence its id, are the same on every replay.
	at, err := agent.Now(ctx)
	if err != nil {
		return output{}, err
	}
	g, err := greet.Call(ctx, greetArgs{Name: in.Name, At: at})
	if err != nil {
		return output{}, err
	}
	return output{Greeting: g, At: at}, nil
}

func main() {
	kernelURL := flag.String("kernel", env("WICKET_URL", "http://127.0.0.1:8080"), "kernel base URL (WICKET_URL)")
	listen := flag.String("listen", "127.0.0.1:5001", "address to serve the webhook on")
	adminKey := flag.String("admin-key", os.Getenv("WICKET_ADMIN_KEY"), "admin API key, if the kernel has one (WICKET_ADMIN_KEY)")
	id := flag.String("id", "hello", "agent id")
	secret := flag.String("secret", env("WICKET_AGENT_SECRET", "hello-dev-secret-0123456789"), "the agent's HMAC secret (WICKET_AGENT_SECRET)")
	flag.Parse()

	a, err := agent.New(agent.Config{
		ID:        *id,
		Secret:    []byte(*secret),
		KernelURL: *kernelURL,
		Handler:   agent.Typed(hello),
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
	log.Printf("agent %s is registered and serving %s; now run:\n\t./wicket exec create %s --input '{\"name\":\"Ada\"}' --wait", *id, webhook, *id)

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
