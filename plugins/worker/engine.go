package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// Defaults of Config.
const (
	// DefaultMemory caps each worker's data segment: 256 MiB.
	DefaultMemory = 256 << 20
	// DefaultGrace is how long past an evaluation's deadline the kernel
	// waits for the worker before killing it.
	DefaultGrace = time.Second
	// DefaultCompileTimeout bounds the compilation of one bundle.
	DefaultCompileTimeout = 30 * time.Second
)

// Config configures an [Engine].
type Config struct {
	// Name is the manifest engine the workers serve ("rego").
	Name string
	// Command is the worker's argv: a program whose main calls [Serve]
	// (wicket: its own executable with the hidden "policy-worker" command).
	Command []string
	// Env is the worker's whole environment. Nil means an empty one: the
	// kernel's environment, and the secrets in it, stay in the kernel.
	Env []string
	// Limits are handed to the workers' engine; each evaluation's deadline
	// is the bundle's sandbox.timeout under them.
	Limits bundle.Limits
	// Memory caps each worker's data segment in bytes (default
	// DefaultMemory); a worker that needs more dies and is replaced.
	Memory int64
	// Grace is how long past an evaluation's deadline the worker is given
	// before it is killed (default DefaultGrace).
	Grace time.Duration
	// CompileTimeout bounds one compilation (default DefaultCompileTimeout).
	CompileTimeout time.Duration
	// Concurrency bounds the evaluations in flight per worker (default
	// twice GOMAXPROCS); more wait.
	Concurrency int
	// Logger receives a warning when a worker dies (default slog.Default()).
	Logger *slog.Logger
}

// Engine is a plugins.Engine that compiles and evaluates bundles in worker
// processes, one per tenant (the tenant comes from [plugins.TenantFrom]),
// each with its memory capped by the operating system. A policy that
// exhausts its worker's memory, or that does not stop at its deadline,
// costs only that worker: it is killed, every evaluation it was running is
// denied with the reason, and the next evaluation starts a new worker that
// compiles the tenant's bundles again. The kernel's own memory holds only
// the bundles' files and the answers.
type Engine struct {
	cfg Config

	mu      sync.Mutex
	tenants map[string]*slot
	closed  atomic.Bool

	// starts counts worker processes started, for tests and diagnostics.
	starts atomic.Int64
}

var _ plugins.Engine = (*Engine)(nil)

// New returns an engine configured by cfg, with defaults filled in. No
// process starts before the first Compile.
func New(cfg Config) *Engine {
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.Memory <= 0 {
		cfg.Memory = DefaultMemory
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.CompileTimeout <= 0 {
		cfg.CompileTimeout = DefaultCompileTimeout
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 2 * runtime.GOMAXPROCS(0)
	}
	if cfg.Env == nil {
		cfg.Env = []string{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Engine{cfg: cfg, tenants: map[string]*slot{}}
}

// Name returns the engine name of Config.Name.
func (e *Engine) Name() string { return e.cfg.Name }

// Compile compiles b in the worker of the tenant of ctx, starting it if
// needed. The errors are the worker engine's (a Rego compile error reads
// as with the in-process engine), or the worker's death.
func (e *Engine) Compile(ctx context.Context, b *bundle.Bundle) (policy.Evaluator, error) {
	if b == nil {
		return nil, fmt.Errorf("%s: nil bundle", e.cfg.Name)
	}
	eff, err := e.cfg.Limits.Apply(&b.Manifest)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.cfg.Name, err)
	}
	s, err := e.slot(plugins.TenantFrom(ctx))
	if err != nil {
		return nil, err
	}
	ev := &evaluator{slot: s, name: b.Manifest.Name, files: b.Files, timeout: eff.Timeout}
	if _, _, err := ev.ensure(ctx); err != nil {
		s.unref()
		return nil, err
	}
	return ev, nil
}

// Close kills every worker. Evaluators fail afterwards.
func (e *Engine) Close() error {
	e.mu.Lock()
	e.closed.Store(true)
	slots := e.tenants
	e.tenants = map[string]*slot{}
	e.mu.Unlock()
	for _, s := range slots {
		s.stop()
	}
	return nil
}

// Workers returns the number of worker processes running.
func (e *Engine) Workers() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, s := range e.tenants {
		s.mu.Lock()
		if s.cur != nil && !s.cur.exited() {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// slot returns the tenant's slot with one more reference.
func (e *Engine) slot(tenant string) (*slot, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return nil, fmt.Errorf("%s: engine closed", e.cfg.Name)
	}
	s := e.tenants[tenant]
	if s == nil {
		s = &slot{e: e, tenant: tenant}
		e.tenants[tenant] = s
	}
	s.refs++
	return s, nil
}

// slot is one tenant's worker: the process running now, if any, and the
// number of evaluators that use it.
type slot struct {
	e      *Engine
	tenant string

	mu   sync.Mutex
	cur  *proc
	refs int // guarded by e.mu
}

// running returns the tenant's live worker, starting one if there is none.
func (s *slot) running(ctx context.Context) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil && !s.cur.exited() {
		return s.cur, nil
	}
	if s.e.closed.Load() {
		return nil, fmt.Errorf("%s: engine closed", s.e.cfg.Name)
	}
	p, err := s.e.start(ctx, s.tenant)
	if err != nil {
		return nil, err
	}
	s.cur = p
	return p, nil
}

// unref drops a reference; the last one stops the worker.
func (s *slot) unref() {
	s.e.mu.Lock()
	s.refs--
	last := s.refs == 0
	if last && s.e.tenants[s.tenant] == s {
		delete(s.e.tenants, s.tenant)
	}
	s.e.mu.Unlock()
	if last {
		s.stop()
	}
}

func (s *slot) stop() {
	s.mu.Lock()
	p := s.cur
	s.cur = nil
	s.mu.Unlock()
	if p != nil {
		p.stop()
	}
}

// proc is one worker process.
type proc struct {
	e      *Engine
	tenant string
	cmd    *exec.Cmd
	stderr *Stderr
	sem    chan struct{}

	wmu   sync.Mutex // guards stdin
	stdin io.WriteCloser
	bw    *bufio.Writer

	nextID  atomic.Uint64
	pmu     sync.Mutex
	pending map[uint64]chan response
	killed  string // why the kernel killed it, if it did (guarded by pmu)
	stopped bool   // the kernel asked it to exit (guarded by pmu)

	dead  chan struct{} // closed once the process is gone
	cause error         // why, set before dead is closed
}

// start starts a worker for tenant and sends it the limits.
func (e *Engine) start(ctx context.Context, tenant string) (*proc, error) {
	if len(e.cfg.Command) == 0 {
		return nil, fmt.Errorf("%s: no worker command configured", e.cfg.Name)
	}
	cmd := exec.Command(e.cfg.Command[0], e.cfg.Command[1:]...)
	cmd.Env = e.cfg.Env
	p := &proc{e: e, tenant: tenant, cmd: cmd, stderr: &Stderr{}, sem: make(chan struct{}, e.cfg.Concurrency),
		pending: map[uint64]chan response{}, dead: make(chan struct{})}
	cmd.Stderr = p.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("%s: worker: %w", e.cfg.Name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("%s: worker: %w", e.cfg.Name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: start worker %s: %w", e.cfg.Name, e.cfg.Command[0], err)
	}
	e.starts.Add(1)
	p.stdin, p.bw = stdin, bufio.NewWriterSize(stdin, 64<<10)
	go p.read(stdout)
	limits := e.cfg.Limits
	if _, err := p.call(ctx, request{Op: opInit, Limits: &limits, Memory: e.cfg.Memory}, e.cfg.CompileTimeout, "start"); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// read dispatches responses until the worker's stdout ends, then records
// why the worker is gone and fails every pending call with it.
func (p *proc) read(stdout io.Reader) {
	r := bufio.NewReaderSize(stdout, 64<<10)
	var rerr error
	for {
		var res response
		if rerr = readFrame(r, maxResponse, &res); rerr != nil {
			break
		}
		p.pmu.Lock()
		ch := p.pending[res.ID]
		delete(p.pending, res.ID)
		p.pmu.Unlock()
		if ch != nil {
			ch <- res
		}
	}
	if !errors.Is(rerr, io.EOF) {
		p.kill("it sent a malformed answer (" + rerr.Error() + ")")
	}
	werr := p.cmd.Wait()
	p.pmu.Lock()
	killed, stopped := p.killed, p.stopped
	p.pmu.Unlock()
	name := p.e.cfg.Name
	switch {
	case stopped:
		p.cause = fmt.Errorf("%s: the tenant's policy worker was stopped", name)
	case killed != "":
		p.cause = fmt.Errorf("%s: the tenant's policy worker was killed: %s", name, killed)
	case p.outOfMemory():
		p.cause = fmt.Errorf("%s: evaluation exceeded the memory limit of %s of the tenant's policy worker, which was stopped", name, bundle.BytesString(p.e.cfg.Memory))
	default:
		msg := fmt.Sprintf("%s: the tenant's policy worker exited (%v)", name, werr)
		if l := p.stderr.Summary(); l != "" {
			msg += ": " + l
		}
		p.cause = errors.New(msg)
	}
	close(p.dead)
	if !stopped {
		p.e.cfg.Logger.Warn("policy worker gone; the next evaluation starts another", "engine", name, "tenant", p.tenant, "reason", p.cause)
	}
}

// outOfMemory reports whether the worker, now waited for, died of its
// memory cap (memoryDeath). A Go panic (a bug, in OPA or here) is not
// counted.
func (p *proc) outOfMemory() bool {
	if st := p.cmd.ProcessState; st == nil || st.Success() {
		return p.stderr.Contains("out of memory") || p.stderr.Contains("cannot allocate memory")
	}
	return p.stderr.DiedOfMemory()
}

// memoryDeath reports whether a worker that crashed without a Go panic,
// its standard error starting with first, died of its memory cap
// (RLIMIT_DATA): the runtime itself faulted (a failed mapping can surface
// as a SIGSEGV inside the garbage collector), or it could not start a
// thread, whose stack is a private mapping the cap counts (with cgo,
// pthread_create fails with EAGAIN and the process aborts; without it,
// the runtime says it failed to create an OS thread).
func memoryDeath(first string) bool {
	for _, shape := range []string{
		"SIGSEGV",
		"SIGBUS",
		"unexpected fault address",
		"runtime/cgo: pthread_create failed",
		"runtime: failed to create new OS thread",
	} {
		if strings.HasPrefix(first, shape) {
			return true
		}
	}
	return false
}

func (p *proc) exited() bool {
	select {
	case <-p.dead:
		return true
	default:
		return false
	}
}

// kill kills the process, recording why (the first reason wins).
func (p *proc) kill(why string) {
	p.pmu.Lock()
	if p.killed == "" {
		p.killed = why
	}
	p.pmu.Unlock()
	_ = p.cmd.Process.Kill()
}

// stop ends the worker: its stdin is closed, so it exits once its
// evaluations finish; it is killed if it has not after a grace period.
func (p *proc) stop() {
	p.pmu.Lock()
	p.stopped = true
	p.pmu.Unlock()
	p.wmu.Lock()
	_ = p.stdin.Close()
	p.wmu.Unlock()
	select {
	case <-p.dead:
	case <-time.After(p.e.cfg.Grace + p.e.cfg.Limits.MaxTimeout):
		p.kill("stopped")
		<-p.dead
	}
}

// call sends req and waits for its response. After deadline (if > 0) the
// worker is killed and the call fails; what names the operation in that
// reason.
func (p *proc) call(ctx context.Context, req request, deadline time.Duration, what string) (response, error) {
	select {
	case p.sem <- struct{}{}:
	case <-p.dead:
		return response{}, p.cause
	case <-ctx.Done():
		return response{}, fmt.Errorf("%s: waiting for the tenant's policy worker: %w", p.e.cfg.Name, ctx.Err())
	}
	defer func() { <-p.sem }()
	req.ID = p.nextID.Add(1)
	ch := make(chan response, 1)
	p.pmu.Lock()
	p.pending[req.ID] = ch
	p.pmu.Unlock()
	defer func() {
		p.pmu.Lock()
		delete(p.pending, req.ID)
		p.pmu.Unlock()
	}()
	p.wmu.Lock()
	err := writeFrame(p.bw, req)
	if err == nil {
		err = p.bw.Flush()
	}
	p.wmu.Unlock()
	if err != nil {
		p.kill("its input broke")
		<-p.dead
		return response{}, p.cause
	}
	if deadline > 0 {
		t := time.AfterFunc(deadline, func() {
			p.kill(fmt.Sprintf("%s did not end within %s", what, deadline))
		})
		defer t.Stop()
	}
	select {
	case res := <-ch:
		return res, nil
	case <-p.dead:
		return response{}, p.cause
	case <-ctx.Done():
		return response{}, fmt.Errorf("%s: %s cancelled: %w", p.e.cfg.Name, what, ctx.Err())
	}
}

// evaluator is one bundle revision compiled in its tenant's worker, and
// compiled again in the next worker when that one is replaced.
type evaluator struct {
	slot    *slot
	name    string
	files   map[string][]byte
	timeout time.Duration

	mu     sync.Mutex // guards proc and id
	proc   *proc
	id     uint64
	closed atomic.Bool
}

var _ policy.Evaluator = (*evaluator)(nil)

// ensure returns the worker and the bundle's id in it, compiling the
// bundle there first if the worker is new.
func (ev *evaluator) ensure(ctx context.Context) (*proc, uint64, error) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	p, err := ev.slot.running(ctx)
	if err != nil {
		return nil, 0, err
	}
	if p == ev.proc {
		return p, ev.id, nil
	}
	res, err := p.call(ctx, request{Op: opCompile, Files: ev.files, Name: ev.name}, ev.slot.e.cfg.CompileTimeout, "compilation")
	if err != nil {
		return nil, 0, err
	}
	if res.Error != "" {
		return nil, 0, errors.New(res.Error)
	}
	ev.proc, ev.id = p, res.ID
	return p, res.ID, nil
}

// Evaluate evaluates in in the tenant's worker. The worker's engine stops
// the evaluation at the bundle's deadline; a worker that has not answered
// Config.Grace later is killed.
func (ev *evaluator) Evaluate(ctx context.Context, in *policy.Input) (*policy.Answer, error) {
	name := ev.slot.e.cfg.Name
	if ev.closed.Load() {
		return nil, fmt.Errorf("%s: evaluator closed", name)
	}
	if in == nil {
		return nil, fmt.Errorf("%s: nil input", name)
	}
	input, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("%s: encode input: %w", name, err)
	}
	p, id, err := ev.ensure(ctx)
	if err != nil {
		return nil, err
	}
	res, err := p.call(ctx, request{Op: opEval, Bundle: id, Input: input}, ev.timeout+ev.slot.e.cfg.Grace,
		fmt.Sprintf("an evaluation with a deadline of %s", ev.timeout))
	if err != nil {
		return nil, err
	}
	if res.Error != "" {
		return nil, errors.New(res.Error)
	}
	if err := res.Decision.Validate(); err != nil {
		return nil, fmt.Errorf("%s: invalid decision: %w", name, err)
	}
	return res.Decision, nil
}

// Close releases the bundle in the worker; the tenant's last evaluator
// stops the worker.
func (ev *evaluator) Close() error {
	if ev.closed.Swap(true) {
		return nil
	}
	ev.mu.Lock()
	p, id := ev.proc, ev.id
	ev.mu.Unlock()
	if p != nil && !p.exited() {
		ctx, cancel := context.WithTimeout(context.Background(), ev.slot.e.cfg.Grace)
		_, _ = p.call(ctx, request{Op: opClose, Bundle: id}, 0, "close")
		cancel()
	}
	ev.slot.unref()
	return nil
}
