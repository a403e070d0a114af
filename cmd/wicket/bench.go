package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wicket-run/wicket/internal/webhook"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server"
	"github.com/wicket-run/wicket/server/wire"
	"github.com/wicket-run/wicket/store/postgres"
)

// benchSetup defines the flags of `wicket bench`, which measures steps over
// HTTP against an in-process kernel on a fresh store: each of --executions
// workers submits and completes steps (two signed requests, two commits per
// step) as fast as it can, through an agent built with sdk/agent; the
// agent is registered and the executions created through sdk/client.
// With --store postgres://… the kernel runs on PostgreSQL, and with
// --replicas N so do N kernels sharing the database, each with its own
// HTTP server; the agent's requests go to them in turn.
func benchSetup(fs *flag.FlagSet, _ *clientOpts) runFunc {
	execs := fs.Int("executions", 10, "concurrent executions")
	steps := fs.Int("steps", 20000, "steps in total")
	dir := fs.String("data", "", "data directory (default: a temporary one, removed after)")
	noSync := fs.Bool("unsafe-no-fsync", false, "skip fsync (to see the cost of durability)")
	storeSpec := fs.String("store", envString("WICKET_STORE", ""), "postgres://… URL to run on PostgreSQL (in a schema of the bench's own, dropped after); empty: bbolt under --data (WICKET_STORE)")
	replicas := fs.Int("replicas", 1, "kernels sharing the store, each with its own HTTP server; requests go round-robin (PostgreSQL only)")
	return func(ctx context.Context, _ []string, stdout, _ io.Writer) error {
		return bench(ctx, benchOptions{execs: *execs, steps: *steps, dir: *dir, noSync: *noSync, store: *storeSpec, replicas: *replicas}, stdout)
	}
}

// benchOptions are the flags of `wicket bench`.
type benchOptions struct {
	execs, steps int
	dir          string
	noSync       bool
	store        string
	replicas     int
}

func bench(ctx context.Context, o benchOptions, stdout io.Writer) error {
	execs, steps, dir, noSync := &o.execs, &o.steps, o.dir, o.noSync
	if *execs < 1 || *steps < *execs || o.replicas < 1 {
		return usageError{"bench: want --executions >= 1, --steps >= --executions and --replicas >= 1"}
	}
	if o.replicas > 1 && !isPostgres(o.store) {
		return usageError{"bench: --replicas needs a shared store (--store postgres://…)"}
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "wicket-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	if isPostgres(o.store) {
		// A schema of the bench's own, dropped afterwards: the database's
		// other contents are left alone.
		schema := fmt.Sprintf("wicket_bench_%d", os.Getpid())
		if err := postgres.CreateSchema(ctx, o.store, schema); err != nil {
			return err
		}
		defer func() { _ = postgres.DropSchema(context.WithoutCancel(ctx), o.store, schema) }()
		o.store = postgres.WithSearchPath(o.store, schema)
	}
	var hosts []string // the replicas' listeners
	var stores []*openedStore
	for range o.replicas {
		st, err := openStore(ctx, o.store, dir, noSync, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		stores = append(stores, st)
		sender := webhook.New()
		defer sender.Close()
		k, err := kernel.New(st.Store, sender, nil, nil, kernel.Config{Logger: discardLogger()})
		if err != nil {
			return err
		}
		srv := server.New(k, server.Config{AuthDisabled: true, Logger: discardLogger()})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: srv.Handler()}
		go func() { _ = hs.Serve(ln) }()
		defer hs.Close()
		if err := k.Start(ctx); err != nil {
			return err
		}
		defer k.Close(context.WithoutCancel(ctx))
		hosts = append(hosts, ln.Addr().String())
	}
	counts := func() (commits, updates, conflicts uint64) {
		for _, st := range stores {
			c, u, x := st.counts()
			commits, updates, conflicts = commits+c, updates+u, conflicts+x
		}
		return commits, updates, conflicts
	}
	base := "http://" + hosts[0]

	r := &benchRun{total: int64(*steps), lat: make([][]time.Duration, *execs), gate: make(chan struct{}),
		errc: make(chan error, *execs)}
	r.ready.Add(*execs)
	r.done.Add(*execs)
	const secret = "bench-secret-0123456789"
	a, err := agent.New(agent.Config{ID: "bench", Secret: []byte(secret), KernelURL: base, Handler: agent.HandlerFunc(r.handle),
		HTTPClient: &http.Client{Transport: &roundRobin{hosts: hosts, base: &http.Transport{MaxIdleConnsPerHost: *execs * 2}}}, Logger: discardLogger()})
	if err != nil {
		return err
	}
	agentLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	actx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	go func() { _ = a.Serve(actx, agentLn) }()

	admin := client.New(base)
	if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "bench", WebhookURL: "http://" + agentLn.Addr().String() + "/", Secret: secret}); err != nil {
		return fmt.Errorf("bench: register the agent: %w", err)
	}
	for i := range *execs {
		if _, err := admin.CreateExecution(ctx, wire.CreateExecutionRequest{AgentID: "bench", Input: json.RawMessage(strconv.Itoa(i))}, ""); err != nil {
			return fmt.Errorf("bench: create execution: %w", err)
		}
	}
	// Every handler holds its lease before the clock starts.
	if err := r.waitReady(ctx, 30*time.Second); err != nil {
		return err
	}
	c0, u0, x0 := counts()
	start := time.Now()
	close(r.gate)
	r.done.Wait()
	el := time.Since(start)
	c1, u1, x1 := counts()
	close(r.errc)
	if err := <-r.errc; err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	var all []time.Duration
	for _, l := range r.lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	q := func(f float64) time.Duration { return all[int(float64(len(all)-1)*f)].Round(time.Microsecond) }
	commits := max(c1-c0, 1)
	fmt.Fprintf(stdout, "store:           %s, %d replica(s)\n", stores[0].kind, o.replicas)
	fmt.Fprintf(stdout, "steps:           %d over HTTP through sdk/agent, %d concurrent executions, fsync %v\n", *steps, *execs, !noSync)
	fmt.Fprintf(stdout, "throughput:      %.0f steps/s (%s)\n", float64(*steps)/el.Seconds(), el.Round(time.Millisecond))
	fmt.Fprintf(stdout, "submit latency:  p50 %s  p99 %s  max %s\n", q(0.5), q(0.99), q(1))
	fmt.Fprintf(stdout, "group commit:    %.2f updates/commit, %s per commit\n", float64(u1-u0)/float64(commits), (el / time.Duration(commits)).Round(time.Microsecond))
	if stores[0].kind == "postgres" {
		fmt.Fprintf(stdout, "conflicts:       %d transactions retried after a serialization failure\n", x1-x0)
	}
	return nil
}

// roundRobin sends each request to the next of the replicas' listeners, as
// a load balancer in front of them would (the signature does not cover
// the host).
type roundRobin struct {
	hosts []string
	next  atomic.Uint64
	base  http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (rr *roundRobin) RoundTrip(req *http.Request) (*http.Response, error) {
	if len(rr.hosts) > 1 {
		req = req.Clone(req.Context())
		req.URL.Host = rr.hosts[rr.next.Add(1)%uint64(len(rr.hosts))]
		req.Host = req.URL.Host
	}
	return rr.base.RoundTrip(req)
}

// benchRun is the shared state of the bench's handlers.
type benchRun struct {
	total int64
	next  atomic.Int64
	lat   [][]time.Duration // submit latencies, per execution (its input)
	ready sync.WaitGroup    // handlers holding their lease
	gate  chan struct{}     // closed when the clock starts
	done  sync.WaitGroup    // handlers finished
	errc  chan error
}

// handle is the agent's handler: it takes steps from the shared counter
// until all are done, each a submit and a complete through the SDK.
func (r *benchRun) handle(ctx context.Context, input json.RawMessage) (any, error) {
	w, err := strconv.Atoi(string(input))
	if err != nil || w < 0 || w >= len(r.lat) {
		return nil, fmt.Errorf("bench: unexpected input %s", input)
	}
	ex, err := agent.FromContext(ctx)
	if err != nil {
		return nil, err
	}
	r.ready.Done()
	defer r.done.Done()
	select {
	case <-r.gate:
	case <-ctx.Done():
		r.errc <- context.Cause(ctx)
		return nil, ctx.Err()
	}
	for n := r.next.Add(1); n <= r.total; n = r.next.Add(1) {
		args, _ := json.Marshal(map[string]any{"q": "bench", "n": n})
		t0 := time.Now()
		d, err := ex.Submit(ctx, wire.StepSubmitRequest{Kind: "tool_call", Target: "search", Args: args})
		if err == nil && d.Decision != wire.DecisionProceed {
			err = fmt.Errorf("step %d: decision %s (%s)", n, d.Decision, d.Reason)
		}
		if err != nil {
			r.errc <- err
			return nil, err
		}
		r.lat[w] = append(r.lat[w], time.Since(t0))
		if err := ex.Complete(ctx, d.StepID, json.RawMessage(`{"n":`+strconv.FormatInt(n, 10)+`}`), nil); err != nil {
			r.errc <- err
			return nil, err
		}
	}
	return map[string]int{"steps": len(r.lat[w])}, nil
}

// waitReady waits until every handler holds its lease.
func (r *benchRun) waitReady(ctx context.Context, timeout time.Duration) error {
	ready := make(chan struct{})
	go func() { r.ready.Wait(); close(ready) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case err := <-r.errc:
		return fmt.Errorf("bench: %w", err)
	case <-t.C:
		return errors.New("bench: the agent did not receive every execution within " + timeout.String())
	case <-ctx.Done():
		return ctx.Err()
	}
}
