// Command sessionloop is the session holder of the gate's end-to-end
// tests: a Go program whose own loop drives a Wicket session with
// sdk/agent's Session, no webhook. Life 1 begins a session, writes its id
// to --id-file, runs the first steps and hangs (the test SIGKILLs it);
// life 2 attaches with --execution (waiting while the dead holder's lease
// is live), runs the same loop, whose recorded steps replay, and completes
// the execution. Every tool body appends a line to --journal.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

var journal = flag.String("journal", "", "file the tool bodies append to")

func note(format string, args ...any) {
	f, err := os.OpenFile(*journal, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(f, format+"\n", args...)
	if err := f.Sync(); err != nil {
		log.Fatal(err)
	}
	f.Close()
}

func main() {
	kernelURL := flag.String("kernel", "", "kernel base URL")
	key := flag.String("key", "", "API key holding the session")
	agentID := flag.String("agent", "", "agent of a new session")
	execID := flag.String("execution", "", "session to attach to")
	idFile := flag.String("id-file", "", "where life 1 writes the session's id")
	life := flag.Int("life", 1, "which start this is")
	flag.Parse()
	ctx := context.Background()
	cfg := agent.SessionConfig{KernelURL: *kernelURL, APIKey: *key, HeartbeatInterval: 200 * time.Millisecond}

	var s *agent.Session
	var err error
	if *execID == "" {
		s, err = agent.Begin(ctx, cfg, client.SessionRequest{AgentID: *agentID, Input: []byte(`{"task":"triage"}`)})
	} else {
		for {
			s, err = agent.Attach(ctx, cfg, *execID)
			if !client.IsCode(err, wire.CodeExecutionLeased) {
				break
			}
			note("attach refused: leased")
			time.Sleep(200 * time.Millisecond)
		}
	}
	if err != nil {
		log.Fatal(err)
	}
	if *idFile != "" {
		if err := os.WriteFile(*idFile, []byte(s.ID()), 0o600); err != nil {
			log.Fatal(err)
		}
	}
	sctx := s.Context(ctx)
	search := agent.NewTool("search", func(_ context.Context, q string) ([]string, error) {
		note("search %s", q)
		return []string{q + " #1", q + " #2"}, nil
	}, agent.WithEffect(agent.ReadOnly))
	label := agent.NewTool("label", func(_ context.Context, l string) (string, error) {
		note("label %s", l)
		return "labelled " + l, nil
	}, agent.WithEffect(agent.RemoteMutation))
	purge := agent.NewTool("purge", func(context.Context, struct{}) (string, error) {
		note("purge")
		return "purged", nil
	})

	hits, err := search.Call(sctx, "open bugs")
	if err != nil {
		log.Fatal(err)
	}
	at, err := agent.Now(sctx)
	if err != nil {
		log.Fatal(err)
	}
	note("life %d now %s", *life, at.Format(time.RFC3339Nano))
	var pe *agent.PolicyError
	if _, err := purge.Call(sctx, struct{}{}); !errors.As(err, &pe) {
		log.Fatalf("purge: %v", err)
	}
	lbl, err := label.Call(sctx, hits[0])
	if err != nil {
		log.Fatal(err)
	}
	if *life == 1 {
		note("hang")
		select {} // SIGKILLed here
	}
	second, err := label.Call(sctx, hits[1])
	if err != nil {
		log.Fatal(err)
	}
	x, err := s.Complete(ctx, map[string]any{"labels": []string{lbl, second}, "at": at})
	if err != nil {
		log.Fatal(err)
	}
	note("completed %s", x.Status)
}
