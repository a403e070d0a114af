// Command sdkagent is the agent process of the SDK end-to-end tests: an
// agent written with sdk/agent that the tests start, SIGKILL mid-run and
// start again. Every tool body appends a line to --journal (synced), so a
// test can count what ran across processes. --life tells the process which
// start it is: in life 1 the scenarios hang at their critical point, so
// that the kill lands there.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/wicket-run/wicket/sdk/agent"
)

var (
	journalPath = flag.String("journal", "", "file the tool bodies append to")
	life        = flag.Int("life", 1, "which start of the agent process this is")
	provider    = flag.String("provider", "", "base URL of the fake LLM provider")
	mu          sync.Mutex
)

// note appends one line to the journal and syncs it.
func note(format string, args ...any) {
	mu.Lock()
	defer mu.Unlock()
	f, err := os.OpenFile(*journalPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(f, format+"\n", args...)
	if err := f.Sync(); err != nil {
		log.Fatal(err)
	}
	f.Close()
}

// hang waits for the kill in life 1.
func hang(ctx context.Context) error {
	if *life == 1 {
		<-ctx.Done()
		return context.Cause(ctx)
	}
	return nil
}

type input struct {
	Scenario string `json:"scenario"`
	Mode     string `json:"mode"`
}

func main() {
	kernelURL := flag.String("kernel", "", "kernel base URL")
	listen := flag.String("listen", "", "webhook listen address")
	id := flag.String("id", "", "agent id")
	secret := flag.String("secret", "", "agent secret")
	heartbeat := flag.Duration("heartbeat", 200*time.Millisecond, "heartbeat interval")
	flag.Parse()

	fetch := agent.NewTool("fetch", func(ctx context.Context, url string) (string, error) {
		note("fetch %s", url)
		return "contents of " + url, nil
	}, agent.WithIdempotency(agent.SafeToRetry), agent.WithEffect(agent.ReadOnly))
	charge := func(mode string) *agent.Tool[int, string] {
		idem := agent.AtMostOnce
		if mode == "safe" {
			idem = agent.SafeToRetry
		}
		return agent.NewTool("charge", func(ctx context.Context, cents int) (string, error) {
			sid, _ := agent.StepID(ctx)
			note("charge-start %d %s", cents, sid)
			if err := hang(ctx); err != nil {
				return "", err
			}
			note("charge-done %d", cents)
			return fmt.Sprintf("charged %d", cents), nil
		}, agent.WithIdempotency(idem), agent.WithEffect(agent.RemoteMutation))
	}
	// reconciled is the charge with a Reconcile function: in a later life
	// it is asked what became of the charge that was in flight, and
	// answers the mode (completed with a result from "the ledger",
	// continue, or conflict).
	reconciled := func(mode string) *agent.Tool[int, string] {
		return agent.NewTool("charge", func(ctx context.Context, cents int) (string, error) {
			note("charge-start %d", cents)
			if err := hang(ctx); err != nil {
				return "", err
			}
			note("charge-done %d", cents)
			return fmt.Sprintf("charged %d", cents), nil
		}, agent.WithEffect(agent.RemoteMutation)).WithReconcile(func(ctx context.Context, cents int) (agent.Reconciled[string], error) {
			sid, _ := agent.StepID(ctx)
			note("reconcile %d %s %s", cents, mode, sid)
			return agent.Reconciled[string]{Outcome: mode, Result: fmt.Sprintf("ledger says charged %d", cents), Detail: "the ledger and the provider disagree"}, nil
		})
	}
	plan := agent.NewTool("plan", func(ctx context.Context, env string) (string, error) {
		note("plan %s", env)
		return "plan for " + env, nil
	})
	deploy := agent.NewTool("deploy", func(ctx context.Context, env string) (string, error) {
		note("deploy %s", env)
		return "deployed " + env, nil
	})
	hc := agent.NewHTTPClient(nil)

	handler := agent.Typed(func(ctx context.Context, in input) (map[string]any, error) {
		switch in.Scenario {
		case "crash":
			page, err := fetch.Call(ctx, "https://example.test/a")
			if err != nil {
				return nil, err
			}
			res, err := charge(in.Mode).Call(ctx, 1250)
			var te *agent.ToolError
			if errors.As(err, &te) && te.Indeterminate() {
				return map[string]any{"page": page, "charge": "indeterminate"}, nil
			}
			if errors.As(err, &te) && te.Code() == "interrupted" {
				return map[string]any{"page": page, "charge": "interrupted: " + te.Message()}, nil
			}
			if err != nil {
				return nil, err
			}
			return map[string]any{"page": page, "charge": res}, nil
		case "reconcile":
			res, err := reconciled(in.Mode).Call(ctx, 990)
			if err != nil {
				return nil, err
			}
			return map[string]any{"charge": res}, nil
		case "approval":
			p, err := plan.Call(ctx, "prod")
			if err != nil {
				return nil, err
			}
			d, err := deploy.Call(ctx, "prod") // blocks on the approval in life 1
			if err != nil {
				return nil, err
			}
			return map[string]any{"plan": p, "deploy": d, "life": *life}, nil
		case "llm":
			body, _ := json.Marshal(map[string]any{"model": "fake-1", "stream": in.Mode == "stream",
				"messages": []map[string]string{{"role": "user", "content": "what now?"}}})
			req, err := http.NewRequestWithContext(ctx, "POST", *provider+"/v1/chat/completions", bytes.NewReader(body))
			if err != nil {
				return nil, err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return nil, err
			}
			data, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return nil, err
			}
			if resp.StatusCode != 200 {
				return nil, agent.RaiseForRefusal(ctx, fmt.Errorf("provider: %d %s", resp.StatusCode, data))
			}
			sum := sha256.Sum256(data)
			note("llm %s %s", hex.EncodeToString(sum[:]), resp.Header.Get("Wicket-Replay"))
			if err := hang(ctx); err != nil {
				return nil, err
			}
			return map[string]any{"answer": string(data)}, nil
		}
		return nil, fmt.Errorf("unknown scenario %q", in.Scenario)
	})

	a, err := agent.New(agent.Config{ID: *id, Secret: []byte(*secret), KernelURL: *kernelURL, Handler: handler, HeartbeatInterval: *heartbeat})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/webhook", a)
	log.Printf("sdkagent life %d listening on %s", *life, *listen)
	log.Fatal(http.ListenAndServe(*listen, mux))
}
