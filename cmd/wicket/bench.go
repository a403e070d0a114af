package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/internal/webhook"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server"
	"github.com/wicket-run/wicket/server/wire"
	"github.com/wicket-run/wicket/store/postgres"
)

// benchCommand measures steps over HTTP against an in-process kernel on a
// fresh store: each of --executions workers submits and completes steps
// (two signed requests, two commits per step) as fast as it can.
func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	execs := fs.Int("executions", 10, "concurrent executions")
	steps := fs.Int("steps", 20000, "steps in total")
	dir := fs.String("data", "", "data directory (default: a temporary one, removed after)")
	noSync := fs.Bool("unsafe-no-fsync", false, "skip fsync (to see the cost of durability)")
	storeSpec := fs.String("store", envString("WICKET_STORE", ""), "postgres://… URL to run on PostgreSQL (its tables are emptied first); empty: bbolt under --data (WICKET_STORE)")
	replicas := fs.Int("replicas", 1, "kernels sharing the store, each with its own HTTP server; requests go round-robin (PostgreSQL only)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *execs < 1 || *steps < *execs || *replicas < 1 {
		return usageError{"bench: want --executions >= 1, --steps >= --executions and --replicas >= 1"}
	}
	if *replicas > 1 && !isPostgres(*storeSpec) {
		return usageError{"bench: --replicas needs a shared store (--store postgres://…)"}
	}
	if *dir == "" {
		d, err := os.MkdirTemp("", "wicket-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		*dir = d
	}
	if isPostgres(*storeSpec) {
		// A schema of the bench's own, dropped afterwards: the database's
		// other contents are left alone.
		schema := fmt.Sprintf("wicket_bench_%d", os.Getpid())
		if err := postgres.CreateSchema(ctx, *storeSpec, schema); err != nil {
			return err
		}
		defer func() { _ = postgres.DropSchema(context.WithoutCancel(ctx), *storeSpec, schema) }()
		*storeSpec = postgres.WithSearchPath(*storeSpec, schema)
	}
	var bases []string
	var stores []*openedStore
	var k *kernel.Kernel // the first replica: setup goes through it
	for range *replicas {
		st, err := openStore(ctx, *storeSpec, *dir, *noSync)
		if err != nil {
			return err
		}
		defer st.Close()
		stores = append(stores, st)
		sender := webhook.New()
		defer sender.Close()
		kr, err := kernel.New(st.Store, sender, nil, kernel.Config{Logger: discardLogger()})
		if err != nil {
			return err
		}
		srv := server.New(kr, server.Config{AuthDisabled: true, Logger: discardLogger()})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: srv.Handler()}
		go func() { _ = hs.Serve(ln) }()
		defer hs.Close()
		if err := kr.Start(ctx); err != nil {
			return err
		}
		defer kr.Close(context.WithoutCancel(ctx))
		bases = append(bases, "http://"+ln.Addr().String())
		if k == nil {
			k = kr
		}
	}
	counts := func() (commits, updates, conflicts uint64) {
		for _, st := range stores {
			c, u, x := st.counts()
			commits, updates, conflicts = commits+c, updates+u, conflicts+x
		}
		return commits, updates, conflicts
	}

	// The agent acknowledges webhooks and hands the leases to the workers.
	const secret = "bench-secret-0123456789"
	leases := make(chan wire.WebhookPayload, *execs)
	agentLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	agentSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p wire.WebhookPayload
		if wire.VerifyV1([]byte(secret), r.Header.Get(wire.HeaderWicketSignature), wire.SignedRequestOf(r, body), time.Now(), 0) != nil ||
			json.Unmarshal(body, &p) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		leases <- p
	})}
	go func() { _ = agentSrv.Serve(agentLn) }()
	defer agentSrv.Close()
	if _, err := k.PutAgent(ctx, kernel.Agent{ID: "bench", WebhookURL: "http://" + agentLn.Addr().String() + "/", Secret: secret}); err != nil {
		return err
	}
	for i := range *execs {
		if _, _, err := k.CreateExecution(ctx, kernel.CreateExecution{AgentID: "bench", Input: []byte(fmt.Sprint(i))}); err != nil {
			return err
		}
	}
	var clients []*testkit.Client
	for _, base := range bases {
		clients = append(clients, &testkit.Client{BaseURL: base, AgentID: "bench", Secret: []byte(secret),
			HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *execs * 2}}})
	}
	var next atomic.Int64
	lat := make([][]time.Duration, *execs)
	errc := make(chan error, *execs)
	c0, u0, x0 := counts()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range *execs {
		p := <-leases
		lease := kernel.Lease{DispatchID: p.DispatchID, Attempt: p.DispatchAttempt}
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := "/v0/executions/" + p.ExecutionID
			for n := next.Add(1); n <= int64(*steps); n = next.Add(1) {
				client := clients[int(n)%len(clients)]
				var d kernel.StepDecision
				t0 := time.Now()
				if err := client.Do(ctx, "POST", path+"/steps", &lease, map[string]any{"kind": "tool_call", "target": "search", "args": map[string]any{"q": "bench", "n": n}}, &d); err != nil {
					errc <- err
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				if err := client.Do(ctx, "POST", path+"/steps/"+d.StepID+"/complete", &lease, map[string]any{"result": map[string]any{"n": n}}, nil); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	c1, u1, x1 := counts()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	q := func(f float64) time.Duration { return all[int(float64(len(all)-1)*f)].Round(time.Microsecond) }
	commits := max(c1-c0, 1)
	fmt.Fprintf(stdout, "store:           %s, %d replica(s)\n", stores[0].kind, *replicas)
	fmt.Fprintf(stdout, "steps:           %d over HTTP, %d concurrent executions, fsync %v\n", *steps, *execs, !*noSync)
	fmt.Fprintf(stdout, "throughput:      %.0f steps/s (%s)\n", float64(*steps)/el.Seconds(), el.Round(time.Millisecond))
	fmt.Fprintf(stdout, "submit latency:  p50 %s  p99 %s  max %s\n", q(0.5), q(0.99), q(1))
	fmt.Fprintf(stdout, "group commit:    %.2f updates/commit, %s per commit\n", float64(u1-u0)/float64(commits), (el / time.Duration(commits)).Round(time.Microsecond))
	if stores[0].kind == "postgres" {
		fmt.Fprintf(stdout, "conflicts:       %d transactions retried after a serialization failure\n", x1-x0)
	}
	return nil
}
