package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wicket-run/wicket/internal/metrics"
	"github.com/wicket-run/wicket/internal/webhook"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server"
	"github.com/wicket-run/wicket/server/wire"
	"github.com/wicket-run/wicket/store/bbolt"
	"github.com/wicket-run/wicket/store/postgres"
)

// benchOptions are the flags of `wicket bench`.
type benchOptions struct {
	execs, steps   int
	dir            string
	noSync         bool
	store          string
	url            string
	inProcess      bool
	cpuProfile     string
	loadProfile    string
	reportJSON     bool
	maxBatch       int
	commitInterval time.Duration
	gatherWindow   time.Duration
	noFreelistSync bool
	noWAL          bool
	ckptInterval   time.Duration
	idle           int
	replicas       int
}

// benchSetup defines the flags of `wicket bench`, which measures steps over
// HTTP. By default it runs a kernel on a fresh store in this process and
// the load (an agent built with sdk/agent whose --executions handlers
// submit and complete steps through the SDK as fast as they can, two
// signed requests per step; the agent registered and the executions
// created through sdk/client) in a child process, so that the CPU time
// this process reports is the kernel's alone. With --url it is only the
// load, against a kernel already serving there. With --store postgres://…
// the kernel runs on PostgreSQL, and with --replicas N so do N kernels
// sharing the database, each with its own HTTP server; the load's requests
// go to them in turn.
func benchSetup(fs *flag.FlagSet, _ *clientOpts) runFunc {
	var o benchOptions
	fs.IntVar(&o.execs, "executions", 10, "concurrent executions")
	fs.IntVar(&o.steps, "steps", 20000, "steps in total")
	fs.StringVar(&o.dir, "data", "", "data directory (default: a temporary one, removed after)")
	fs.BoolVar(&o.noSync, "unsafe-no-fsync", false, "skip fsync (to see the cost of durability)")
	fs.StringVar(&o.store, "store", "disk", "disk (bbolt under --data), memory (bbolt without fsync on a tmpfs file: the cost of durability as a ratio), or a postgres:// URL (PostgreSQL, in a schema of the bench's own, dropped after)")
	fs.IntVar(&o.replicas, "replicas", 1, "kernels sharing the store, each with its own HTTP server; the load's requests go round-robin (PostgreSQL only)")
	fs.StringVar(&o.url, "url", "", "only generate the load, against the kernel serving at this URL (authentication disabled); several URLs, comma-separated, are taken in turn")
	fs.BoolVar(&o.inProcess, "load-in-process", false, "run the load in this process too (the CPU figure then covers both)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the kernel process over the measured run to this file (with --url: of the load)")
	fs.StringVar(&o.loadProfile, "load-cpuprofile", "", "write a CPU profile of the load process (the agent and its HTTP clients) over the measured run to this file")
	fs.BoolVar(&o.reportJSON, "report-json", false, "with --url: print machine-readable progress lines (used by bench itself)")
	fs.IntVar(&o.maxBatch, "max-batch", 0, "store: Update functions per commit at most (0: the default)")
	fs.DurationVar(&o.gatherWindow, "gather-window", 0, "store: group-commit gather window (0: the default; negative: off)")
	fs.DurationVar(&o.commitInterval, "commit-interval", 0, "store: how long the writer keeps one transaction open across batches before committing it to the file (0: the default; negative: one per batch)")
	fs.BoolVar(&o.noFreelistSync, "no-freelist-sync", false, "store: leave the free-page list out of commits")
	fs.DurationVar(&o.ckptInterval, "checkpoint-interval", 0, "store: how often the write-ahead log's checkpoints sync the file (0: the default)")
	fs.BoolVar(&o.noWAL, "no-wal", false, "store: commit with bbolt's own fsyncs instead of its write-ahead log (as serve --no-wal)")
	fs.IntVar(&o.idle, "idle", 0, "instead of steps: create this many executions whose agent holds them and does nothing, and report the kernel's memory")
	return func(ctx context.Context, _ []string, stdout, _ io.Writer) error {
		return bench(ctx, o, stdout)
	}
}

// bench runs `wicket bench` with its flags.
func bench(ctx context.Context, o benchOptions, stdout io.Writer) error {
	if o.execs < 1 || o.steps < o.execs {
		return usageError{"bench: want --executions >= 1 and --steps >= --executions"}
	}
	if o.store != "disk" && o.store != "memory" && !isPostgres(o.store) {
		return usageError{fmt.Sprintf("bench: --store %q: want disk, memory or a postgres:// URL", redactSpec(o.store))}
	}
	if o.replicas < 1 || (o.replicas > 1 && !isPostgres(o.store)) {
		return usageError{"bench: --replicas needs a shared store (--store postgres://…) and must be at least 1"}
	}
	if o.idle < 0 {
		return usageError{"bench: --idle must not be negative"}
	}
	if o.loadProfile != "" && o.inProcess {
		return usageError{"bench: with --load-in-process there is one process: --cpuprofile profiles it"}
	}
	if o.url != "" {
		return benchLoadOnly(ctx, o, stdout)
	}
	// The kernel runs in this process: with the GC headroom serve uses
	// (GOGC in the environment turns it off, as for serve).
	defer startGCHeadroom(gcHeadroom)()
	if isPostgres(o.store) {
		if o.idle > 0 {
			return usageError{"bench: --idle runs on the embedded store only"}
		}
		return benchPostgres(ctx, o, stdout)
	}
	return benchKernel(ctx, o, stdout)
}

// benchPostgres runs --replicas kernels on one PostgreSQL database (a
// schema of the bench's own) and the load beside them, taking the
// replicas in turn as a load balancer would.
func benchPostgres(ctx context.Context, o benchOptions, stdout io.Writer) error {
	if o.cpuProfile != "" {
		return usageError{"bench: --cpuprofile runs on the embedded store only"}
	}
	if o.dir == "" {
		d, err := os.MkdirTemp("", "wicket-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		o.dir = d
	}
	// A schema of the bench's own, dropped afterwards: the database's
	// other contents are left alone.
	schema := fmt.Sprintf("wicket_bench_%d", os.Getpid())
	if err := postgres.CreateSchema(ctx, o.store, schema); err != nil {
		return err
	}
	defer func() { _ = postgres.DropSchema(context.WithoutCancel(ctx), o.store, schema) }()
	dsn := postgres.WithSearchPath(o.store, schema)
	var bases []string
	var stores []*openedStore
	for range o.replicas {
		reg := metrics.New()
		st, err := openStore(ctx, dsn, o.dir, o.noSync, true, 0, reg.Commit)
		if err != nil {
			return err
		}
		defer st.Close()
		stores = append(stores, st)
		base, stop, err := startBenchKernel(ctx, st.Store, reg)
		if err != nil {
			return err
		}
		defer stop()
		bases = append(bases, base)
	}
	counts := func() (commits, updates, conflicts uint64) {
		for _, st := range stores {
			c, u, x := st.counts()
			commits, updates, conflicts = commits+c, updates+u, conflicts+x
		}
		return commits, updates, conflicts
	}
	var c0, u0, x0, c1, u1, x1 uint64
	var cpu0, cpu1 procCPU
	onStart := func() error { c0, u0, x0 = counts(); cpu0 = readCPU(); return nil }
	onEnd := func() { c1, u1, x1 = counts(); cpu1 = readCPU() }
	var res loadResult
	var err error
	if o.inProcess {
		res, err = runLoad(ctx, strings.Join(bases, ","), o.execs, o.steps, onStart, onEnd)
	} else {
		o.url = strings.Join(bases, ",")
		res, err = runLoadChild(ctx, o.url, o, onStart, onEnd)
	}
	if err != nil {
		return err
	}
	commits := max(c1-c0, 1)
	fmt.Fprintf(stdout, "steps:           %d over HTTP through sdk/agent, %d concurrent executions, synchronous_commit %v, store postgres, %d replica(s)\n",
		o.steps, o.execs, !o.noSync, o.replicas)
	res.print(stdout)
	fmt.Fprintf(stdout, "group commit:    %.2f updates/commit, %s per commit\n", float64(u1-u0)/float64(commits), (res.Elapsed / time.Duration(commits)).Round(time.Microsecond))
	fmt.Fprintf(stdout, "conflicts:       %d transactions retried after a serialization failure\n", x1-x0)
	if cpu0.ok && cpu1.ok {
		cpu := cpu1.total() - cpu0.total()
		who := "the kernels, one process"
		if o.inProcess {
			who = "kernels and load, one process"
		}
		fmt.Fprintf(stdout, "server CPU:      %.3f s per 1,000 steps (%s; PostgreSQL's own not counted)\n", cpu.Seconds()*1000/float64(o.steps), who)
	}
	return nil
}

// roundRobin sends each request to the next of the kernels' hosts, as a
// load balancer in front of replicas would (the signature does not cover
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

// startBenchKernel runs a kernel on st and its HTTP server on a loopback
// port, wired as serve wires them (so that the bench measures what serve
// pays): reg observes the kernel and counts the server's requests (the
// caller passed reg.Commit to the store), and the server's own http.Server
// and listener serve it. Authentication is off, as on a loopback serve
// without keys; agents still sign.
func startBenchKernel(ctx context.Context, st kernel.Store, reg *metrics.Metrics) (base string, stop func(), err error) {
	sender := webhook.New()
	k, err := kernel.New(st, sender, nil, nil, kernel.Config{Logger: discardLogger(), Observer: reg})
	if err != nil {
		sender.Close()
		return "", nil, err
	}
	srv := server.New(k, server.Config{AuthDisabled: true, Logger: discardLogger(), Metrics: reg})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		sender.Close()
		return "", nil, err
	}
	hs := srv.HTTPServer()
	go func() { _ = hs.Serve(srv.Listener(ln)) }()
	if err := k.Start(ctx); err != nil {
		hs.Close()
		sender.Close()
		return "", nil, err
	}
	return "http://" + ln.Addr().String(), func() {
		_ = k.Close(context.WithoutCancel(ctx))
		hs.Close()
		sender.Close()
	}, nil
}

// benchKernel runs the kernel here and the load beside it.
func benchKernel(ctx context.Context, o benchOptions, stdout io.Writer) error {
	noSync := o.noSync
	if o.dir == "" {
		base := ""
		if o.store == "memory" {
			base = memoryDir()
		}
		d, err := os.MkdirTemp(base, "wicket-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		o.dir = d
	}
	if o.store == "memory" {
		noSync = true
	}
	dbPath := filepath.Join(o.dir, "wicket.db")
	reg := metrics.New()
	st, err := bbolt.Open(dbPath, bbolt.Options{NoSync: noSync, MaxBatch: o.maxBatch, GatherWindow: o.gatherWindow, CommitInterval: o.commitInterval,
		NoFreelistSync: o.noFreelistSync, WAL: !o.noWAL, CheckpointInterval: o.ckptInterval, OnCommit: reg.Commit})
	if err != nil {
		return err
	}
	defer st.Close()
	base, stop, err := startBenchKernel(ctx, st, reg)
	if err != nil {
		return err
	}
	defer stop()

	if o.idle > 0 {
		return benchIdle(ctx, base, st, o.idle, stdout)
	}
	var (
		s0, s1      bbolt.Stats
		c0, c1      procCPU
		stopProfile = func() {}
	)
	onStart := func() error {
		var err error
		if stopProfile, err = startCPUProfile(o.cpuProfile); err != nil {
			return err
		}
		s0, c0 = st.Stats(), readCPU()
		return nil
	}
	onEnd := func() {
		s1, c1 = st.Stats(), readCPU()
		stopProfile()
	}
	var res loadResult
	if o.inProcess {
		res, err = runLoad(ctx, base, o.execs, o.steps, onStart, onEnd)
	} else {
		res, err = runLoadChild(ctx, base, o, onStart, onEnd)
	}
	if err != nil {
		return err
	}
	commits := max(s1.Commits-s0.Commits, 1)
	durable := !noSync
	fmt.Fprintf(stdout, "steps:           %d over HTTP through sdk/agent, %d concurrent executions, fsync %v, store %s, wal %v\n", o.steps, o.execs, durable, o.store, durable && !o.noWAL && !isPostgres(o.store))
	res.print(stdout)
	fmt.Fprintf(stdout, "group commit:    %.2f updates/commit, %.1f page writes/commit, %s per commit\n",
		float64(s1.Updates-s0.Updates)/float64(commits),
		float64(s1.DB.TxStats.GetWrite()-s0.DB.TxStats.GetWrite())/float64(commits),
		(res.Elapsed / time.Duration(commits)).Round(time.Microsecond))
	if fc := s1.FileCommits - s0.FileCommits; fc > 0 {
		fmt.Fprintf(stdout, "file commits:    %d of the writer's open transaction, one per %s, %.1f page writes each\n",
			fc, (res.Elapsed / time.Duration(fc)).Round(time.Microsecond),
			float64(s1.DB.TxStats.GetWrite()-s0.DB.TxStats.GetWrite())/float64(fc))
	}
	fn, lg, fl := s1.Functions-s0.Functions, s1.Log-s0.Log, s1.File-s0.File
	per := func(d time.Duration) time.Duration { return (d / time.Duration(commits)).Round(time.Microsecond) }
	fmt.Fprintf(stdout, "store writer:    %.0f%% busy; per commit %s in Update functions, %s appending and syncing the log, %s in bbolt's commit\n",
		100*(fn+lg+fl).Seconds()/res.Elapsed.Seconds(), per(fn), per(lg), per(fl))
	if c0.ok && c1.ok {
		cpu := c1.total() - c0.total()
		who := "kernel process"
		if o.inProcess {
			who = "kernel and load, one process"
		}
		fmt.Fprintf(stdout, "server CPU:      %.3f s per 1,000 steps (%s: user %.2fs sys %.2fs, %.0f%% of one core)\n",
			cpu.Seconds()*1000/float64(o.steps), who, (c1.user - c0.user).Seconds(), (c1.sys - c0.sys).Seconds(),
			100*cpu.Seconds()/res.Elapsed.Seconds())
	}
	fmt.Fprintf(stdout, "store:           %.0f bytes per step (pages used, free ones included), %d-byte file\n",
		float64(s1.Size-s0.Size)/float64(o.steps), fileSize(dbPath))
	return nil
}

// startCPUProfile starts a CPU profile of this process into path (none
// when path is empty); stop ends it and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// memoryDir is a tmpfs directory when the machine has one (the store's
// file then lives in memory), else the default temporary directory.
func memoryDir() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return ""
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// procCPU is the CPU time this process has used, from the operating
// system's accounting of it (getrusage).
type procCPU struct {
	user, sys time.Duration
	ok        bool
}

func (c procCPU) total() time.Duration { return c.user + c.sys }

// runLoadChild runs the load in a child process (this binary, `bench
// --url`) and calls onStart and onEnd when the child's clock starts and
// stops.
func runLoadChild(ctx context.Context, base string, o benchOptions, onStart func() error, onEnd func()) (loadResult, error) {
	self, err := os.Executable()
	if err != nil {
		return loadResult{}, fmt.Errorf("bench: find this binary: %w", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	args := []string{"bench", "--url", base, "--report-json", "--executions", strconv.Itoa(o.execs), "--steps", strconv.Itoa(o.steps)}
	if o.loadProfile != "" {
		args = append(args, "--cpuprofile", o.loadProfile)
	}
	cmd := exec.CommandContext(cctx, self, args...)
	var errBuf strings.Builder
	cmd.Stderr = &errBuf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return loadResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return loadResult{}, fmt.Errorf("bench: start the load: %w", err)
	}
	var res loadResult
	var got bool
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "start":
			if err := onStart(); err != nil {
				return loadResult{}, err
			}
		case line == "end":
			onEnd()
		case strings.HasPrefix(line, "{"):
			if err := json.Unmarshal([]byte(line), &res); err != nil {
				return loadResult{}, fmt.Errorf("bench: the load's report: %w", err)
			}
			got = true
		}
	}
	if err := cmd.Wait(); err != nil {
		return loadResult{}, fmt.Errorf("bench: the load: %w: %s", err, strings.TrimSpace(errBuf.String()))
	}
	if !got {
		return loadResult{}, errors.New("bench: the load printed no report")
	}
	return res, nil
}

// benchLoadOnly generates the load against --url.
func benchLoadOnly(ctx context.Context, o benchOptions, stdout io.Writer) error {
	if o.loadProfile != "" {
		if o.cpuProfile != "" {
			return usageError{"bench: with --url, --cpuprofile is the load's profile: give one of --cpuprofile and --load-cpuprofile"}
		}
		o.cpuProfile = o.loadProfile
	}
	// The load runs with the kernel's GC headroom: it allocates per
	// request on a small live heap as the kernel does, and on a machine
	// it shares with the kernel, the collections it would run with Go's
	// default are CPU taken from the kernel under test.
	defer startGCHeadroom(gcHeadroom)()
	var c0, c1 procCPU
	var m0, m1 runtime.MemStats
	stopProfile := func() {}
	onStart := func() error {
		var err error
		if stopProfile, err = startCPUProfile(o.cpuProfile); err != nil {
			return err
		}
		runtime.ReadMemStats(&m0)
		c0 = readCPU()
		if o.reportJSON {
			fmt.Fprintln(stdout, "start")
		}
		return nil
	}
	onEnd := func() {
		c1 = readCPU()
		runtime.ReadMemStats(&m1)
		stopProfile()
		if o.reportJSON {
			fmt.Fprintln(stdout, "end")
		}
	}
	res, err := runLoad(ctx, strings.TrimRight(o.url, "/"), o.execs, o.steps, onStart, onEnd)
	if err != nil {
		return err
	}
	res.LoadCPU = c1.total() - c0.total()
	res.LoadAllocs = float64(m1.Mallocs-m0.Mallocs) / float64(o.steps)
	res.LoadGCs = m1.NumGC - m0.NumGC
	if o.reportJSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(stdout, string(b))
		return nil
	}
	fmt.Fprintf(stdout, "steps:           %d over HTTP through sdk/agent, %d concurrent executions, against %s\n", o.steps, o.execs, o.url)
	res.print(stdout)
	return nil
}

// loadResult is what the load measured.
type loadResult struct {
	Steps   int           `json:"steps"`
	Elapsed time.Duration `json:"elapsed"`
	P50     time.Duration `json:"p50"`
	P99     time.Duration `json:"p99"`
	Max     time.Duration `json:"max"`
	LoadCPU time.Duration `json:"load_cpu"`
	// LoadAllocs is the load process's heap allocations per step, and
	// LoadGCs its garbage collections over the run.
	LoadAllocs float64 `json:"load_allocs,omitempty"`
	LoadGCs    uint32  `json:"load_gcs,omitempty"`
}

func (r loadResult) print(w io.Writer) {
	fmt.Fprintf(w, "throughput:      %.0f steps/s (%s)\n", float64(r.Steps)/r.Elapsed.Seconds(), r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "submit latency:  p50 %s  p99 %s  max %s\n", r.P50, r.P99, r.Max)
	if r.LoadCPU > 0 {
		fmt.Fprintf(w, "load CPU:        %.3f s per 1,000 steps (the agent and its HTTP clients, another process)\n", r.LoadCPU.Seconds()*1000/float64(r.Steps))
	}
	if r.LoadAllocs > 0 {
		fmt.Fprintf(w, "load allocs:     %.0f heap allocations per step, %d GCs over the run\n", r.LoadAllocs, r.LoadGCs)
	}
}

// runLoad registers the bench agent at base, creates the executions, waits
// until every handler holds its lease, then runs the steps; onStart and
// onEnd bracket the measured part.
func runLoad(ctx context.Context, base string, execs, steps int, onStart func() error, onEnd func()) (loadResult, error) {
	r := &benchRun{total: int64(steps), lat: make([][]time.Duration, execs), gate: make(chan struct{}),
		errc: make(chan error, execs)}
	r.ready.Add(execs)
	r.done.Add(execs)
	id := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const secret = "bench-secret-0123456789"
	// base may name several kernels (replicas of one store), taken in turn.
	rr := &roundRobin{base: &http.Transport{MaxIdleConnsPerHost: execs * 2}}
	urls := strings.Split(base, ",")
	for _, u := range urls {
		pu, err := url.Parse(strings.TrimRight(u, "/"))
		if err != nil || pu.Host == "" {
			return loadResult{}, usageError{fmt.Sprintf("bench: --url %q: want http://host:port[,http://host:port…]", u)}
		}
		rr.hosts = append(rr.hosts, pu.Host)
	}
	base = strings.TrimRight(urls[0], "/")
	a, err := agent.New(agent.Config{ID: id, Secret: []byte(secret), KernelURL: base, Handler: agent.HandlerFunc(r.handle),
		HTTPClient: &http.Client{Transport: rr}, Logger: discardLogger()})
	if err != nil {
		return loadResult{}, err
	}
	agentLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return loadResult{}, err
	}
	actx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	go func() { _ = a.Serve(actx, agentLn) }()

	admin := client.New(base)
	if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: id, WebhookURL: "http://" + agentLn.Addr().String() + "/", Secret: secret}); err != nil {
		return loadResult{}, fmt.Errorf("bench: register the agent: %w", err)
	}
	for i := range execs {
		if _, err := admin.CreateExecution(ctx, wire.CreateExecutionRequest{AgentID: id, Input: json.RawMessage(strconv.Itoa(i))}, ""); err != nil {
			return loadResult{}, fmt.Errorf("bench: create execution: %w", err)
		}
	}
	// Every handler holds its lease before the clock starts.
	if err := r.waitReady(ctx, 30*time.Second); err != nil {
		return loadResult{}, err
	}
	if err := onStart(); err != nil {
		return loadResult{}, err
	}
	start := time.Now()
	close(r.gate)
	r.done.Wait()
	el := time.Since(start)
	onEnd()
	close(r.errc)
	if err := <-r.errc; err != nil {
		return loadResult{}, fmt.Errorf("bench: %w", err)
	}
	var all []time.Duration
	for _, l := range r.lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	q := func(f float64) time.Duration { return all[int(float64(len(all)-1)*f)].Round(time.Microsecond) }
	return loadResult{Steps: steps, Elapsed: el, P50: q(0.5), P99: q(0.99), Max: q(1)}, nil
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
	// The args and results are built in buffers of the handler's own
	// (the SDK keeps neither after the call returns).
	var args, res []byte
	for n := r.next.Add(1); n <= r.total; n = r.next.Add(1) {
		args = append(strconv.AppendInt(append(args[:0], `{"n":`...), n, 10), `,"q":"bench"}`...)
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
		res = append(strconv.AppendInt(append(res[:0], `{"n":`...), n, 10), '}')
		if err := ex.Complete(ctx, d.StepID, res, nil); err != nil {
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

// benchIdle creates n executions of an agent that acknowledges every
// webhook and does nothing more, waits until each is held, and reports the
// kernel process's resident memory before and after, and the store's
// growth.
func benchIdle(ctx context.Context, base string, st *bbolt.Store, n int, stdout io.Writer) error {
	var got atomic.Int64
	hook := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
		w.WriteHeader(http.StatusAccepted)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = hook.Serve(ln) }()
	defer hook.Close()
	c := client.New(base)
	if _, err := c.PutAgent(ctx, wire.AgentRequest{ID: "idle", WebhookURL: "http://" + ln.Addr().String() + "/", Secret: "idle-secret-0123456789"}); err != nil {
		return fmt.Errorf("bench: register the agent: %w", err)
	}
	rss0, heap0 := residentBytes(), heapBytes()
	size0 := st.Stats().Size
	start := time.Now()
	var next atomic.Int64
	errc := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if _, err := c.CreateExecution(ctx, wire.CreateExecutionRequest{AgentID: "idle", Input: json.RawMessage(`{"task":"wait"}`)}, ""); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return fmt.Errorf("bench: create execution: %w", err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for got.Load() < int64(n) {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %d of %d webhooks delivered", got.Load(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	el := time.Since(start)
	rss1, heap1 := residentBytes(), heapBytes()
	fmt.Fprintf(stdout, "idle:            %d executions created and held by their agent in %s\n", n, el.Round(time.Millisecond))
	if rss0 > 0 && rss1 > 0 {
		fmt.Fprintf(stdout, "memory:          %.1f MiB resident after (%.1f MiB before): %.0f bytes per idle execution\n",
			float64(rss1)/(1<<20), float64(rss0)/(1<<20), float64(rss1-rss0)/float64(n))
	}
	fmt.Fprintf(stdout, "Go heap:         %.1f MiB in use after (%.1f MiB before): %.0f bytes per idle execution (the rest of the growth is the store's file, mapped)\n",
		float64(heap1)/(1<<20), float64(heap0)/(1<<20), float64(heap1-heap0)/float64(n))
	fmt.Fprintf(stdout, "store:           %.0f bytes per execution (pages used)\n", float64(st.Stats().Size-size0)/float64(n))
	return nil
}

// heapBytes is the Go heap in use after a garbage collection.
func heapBytes() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// residentBytes is the process's resident memory after a garbage
// collection that returns what it can to the system (Linux; 0 elsewhere).
func residentBytes() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
