package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// Handler is an agent's work: it runs once per dispatch with the
// execution's input, under a context that carries the Execution. Its output
// (any JSON-serialisable value) completes the execution; an error fails it,
// except the errors that only end the dispatch (Blocked, Terminated,
// LeaseSuperseded, KernelError).
//
// A handler must be deterministic in what it submits: on re-delivery it runs
// again from the top, and every recorded step replays.
type Handler interface {
	Run(ctx context.Context, input json.RawMessage) (any, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, input json.RawMessage) (any, error)

// Run calls f.
func (f HandlerFunc) Run(ctx context.Context, input json.RawMessage) (any, error) {
	return f(ctx, input)
}

// Typed adapts a function of a typed input and output to Handler: the input
// is decoded from JSON (a decoding error fails the execution), the output
// encoded.
func Typed[In, Out any](fn func(ctx context.Context, in In) (Out, error)) Handler {
	return HandlerFunc(func(ctx context.Context, raw json.RawMessage) (any, error) {
		var in In
		if len(raw) > 0 && string(raw) != "null" {
			if err := json.Unmarshal(raw, &in); err != nil {
				return nil, fmt.Errorf("agent: decode input: %w", err)
			}
		}
		return fn(ctx, in)
	})
}

// DefaultHeartbeat is how often a running handler renews its lease: a third
// of the kernel's default 90 s lease timeout.
const DefaultHeartbeat = 30 * time.Second

// Config configures an Agent. ID, Secret, KernelURL and Handler are required.
type Config struct {
	// ID is the agent id, as registered with the kernel.
	ID string
	// Secret is the agent's HMAC secret: it verifies webhooks and signs
	// every request to the kernel.
	Secret []byte
	// Signing is the agent's signature scheme, as registered with the
	// kernel: wire.SigningV1 (empty means v1: timestamped signatures that
	// bind the method, path, lease and body, both ways) or
	// wire.SigningBody (the Rebuno scheme over the body alone). Webhooks
	// signed the other way are refused.
	Signing string
	// SignatureTolerance is how far a v1 webhook's timestamp may be from
	// this machine's clock (zero: wire.DefaultSignatureTolerance, 300 s).
	SignatureTolerance time.Duration
	// KernelURL is the kernel's base URL, e.g. http://127.0.0.1:8080.
	KernelURL string
	// Handler is the agent's work.
	Handler Handler
	// HeartbeatInterval is how often a running handler renews its lease
	// (zero: DefaultHeartbeat). Keep it well under the kernel's
	// --lease-timeout.
	HeartbeatInterval time.Duration
	// HTTPClient sends the requests to the kernel (nil: a default client).
	HTTPClient *http.Client
	// Logger receives the agent's diagnostics (nil: slog.Default()).
	Logger *slog.Logger
}

// maxWebhookBody bounds a webhook body; the real one is under 200 bytes.
const maxWebhookBody = 64 << 10

// Agent serves the kernel's webhooks for one registered agent: it verifies
// each signature in constant time, acknowledges at once (202), and runs the
// Handler for the execution under the dispatch's lease, with heartbeats.
// It is an http.Handler; mount it wherever the agent's webhook_url points.
type Agent struct {
	cfg    Config
	kernel *client.Client
	log    *slog.Logger
	base   context.Context
	stop   context.CancelCauseFunc

	mu     sync.Mutex      // guards runs, closed
	runs   map[string]*run // running dispatches by execution id
	closed bool
	wg     sync.WaitGroup
}

// run is one running dispatch.
type run struct {
	lease  Lease
	token  string // the webhook's llm_gateway_token
	cancel context.CancelCauseFunc
	// prev is the run this one replaced for its execution, under another
	// dispatch; it is cancelled once this run has checked with the kernel
	// that its own lease is the current one.
	prev *run
}

// ErrShutdown is the cause of the context of handlers still running when
// Shutdown gives up waiting; their dispatches end without a verdict and the
// kernel re-delivers them after the lease expires.
var ErrShutdown = errors.New("agent: shutting down")

// New returns an Agent for cfg.
func New(cfg Config) (*Agent, error) {
	switch {
	case cfg.ID == "":
		return nil, errors.New("agent: Config.ID is required")
	case len(cfg.Secret) == 0:
		return nil, errors.New("agent: Config.Secret is required")
	case cfg.Handler == nil:
		return nil, errors.New("agent: Config.Handler is required")
	case cfg.HeartbeatInterval < 0:
		return nil, errors.New("agent: Config.HeartbeatInterval must not be negative")
	case cfg.Signing != "" && cfg.Signing != wire.SigningV1 && cfg.Signing != wire.SigningBody:
		return nil, fmt.Errorf("agent: Config.Signing %q is neither %q nor %q", cfg.Signing, wire.SigningV1, wire.SigningBody)
	case cfg.SignatureTolerance < 0:
		return nil, errors.New("agent: Config.SignatureTolerance must not be negative")
	}
	if cfg.Signing == "" {
		cfg.Signing = wire.SigningV1
	}
	u, err := url.Parse(cfg.KernelURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("agent: Config.KernelURL %q is not an http(s) URL", cfg.KernelURL)
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeat
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	opts := []client.Option{client.WithAgent(cfg.ID, cfg.Secret), client.WithSigning(cfg.Signing)}
	if cfg.HTTPClient != nil {
		opts = append(opts, client.WithHTTPClient(cfg.HTTPClient))
	}
	base, stop := context.WithCancelCause(context.Background())
	return &Agent{
		cfg:    cfg,
		kernel: client.New(cfg.KernelURL, opts...),
		log:    log.With("agent_id", cfg.ID),
		base:   base,
		stop:   stop,
		runs:   map[string]*run{},
	}, nil
}

// Kernel returns the agent-signed client the Agent talks to the kernel
// with (reads of its own executions and steps work with it).
func (a *Agent) Kernel() *client.Client { return a.kernel }

// ServeHTTP handles one webhook: 405 for a method other than POST, 401 for
// a missing, wrong or stale signature (checked in constant time, under
// Config.Signing, before anything else is read from the body), 400 for a
// malformed payload, 503 after Shutdown, and 202 otherwise; the handler
// then runs in the background. A v1 signature covers the request target as
// this server received it (r.RequestURI), so a proxy in front of the agent
// must not rewrite the webhook URL's path.
// A webhook for a dispatch already running is acknowledged and ignored; one
// for a newer attempt of a running execution cancels the older handler
// (its cause is LeaseSuperseded) and starts the new one.
func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed, "webhooks are POSTed")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxWebhookBody+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, wire.CodeValidation, "read body: "+err.Error())
		return
	}
	if len(body) > maxWebhookBody {
		writeError(w, http.StatusRequestEntityTooLarge, wire.CodeTooLarge, "webhook body over 64 KiB")
		return
	}
	if err := a.verify(r, body); err != nil {
		writeError(w, http.StatusUnauthorized, wire.CodeUnauthenticated, err.Error())
		return
	}
	var p wire.WebhookPayload
	if err := json.Unmarshal(body, &p); err != nil {
		writeError(w, http.StatusBadRequest, wire.CodeValidation, "webhook payload: "+err.Error())
		return
	}
	if p.ExecutionID == "" || p.DispatchID == "" || p.DispatchAttempt < 1 {
		writeError(w, http.StatusBadRequest, wire.CodeValidation, "webhook payload needs execution_id, dispatch_id and dispatch_attempt >= 1")
		return
	}
	if a.cfg.Signing == wire.SigningV1 && (r.Header.Get(wire.HeaderDispatchID) != p.DispatchID ||
		r.Header.Get(wire.HeaderDispatchAttempt) != strconv.Itoa(p.DispatchAttempt)) {
		writeError(w, http.StatusBadRequest, wire.CodeValidation, "webhook payload and dispatch headers name different leases")
		return
	}
	if !a.start(p) {
		writeError(w, http.StatusServiceUnavailable, wire.CodeUnavailable, "agent is shutting down")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = io.WriteString(w, `{"accepted":true}`)
}

// verify checks a webhook's signature under the configured scheme; a
// webhook signed the other way is refused.
func (a *Agent) verify(r *http.Request, body []byte) error {
	if a.cfg.Signing == wire.SigningBody {
		if !wire.Verify(a.cfg.Secret, body, r.Header.Get(wire.HeaderSignature)) {
			return errors.New("bad or missing " + wire.HeaderSignature + " (this agent uses signing: body)")
		}
		return nil
	}
	err := wire.VerifyV1(a.cfg.Secret, r.Header.Get(wire.HeaderWicketSignature), wire.SignedRequestOf(r, body), time.Now(), a.cfg.SignatureTolerance)
	if err != nil {
		return errors.New(wire.HeaderWicketSignature + ": " + err.Error())
	}
	return nil
}

// start registers and starts the run of p; false after Shutdown.
func (a *Agent) start(p wire.WebhookPayload) bool {
	lease := Lease{DispatchID: p.DispatchID, Attempt: p.DispatchAttempt}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	old := a.runs[p.ExecutionID]
	if old != nil {
		if old.lease == lease {
			return true // a duplicate delivery of the running dispatch
		}
		if old.lease.DispatchID == lease.DispatchID {
			if old.lease.Attempt > lease.Attempt {
				return true // a stale delivery: the newer attempt runs
			}
			// A later attempt of the same dispatch: the old one has lost
			// the lease for certain.
			old.cancel(&LeaseSuperseded{DispatchID: old.lease.DispatchID, Attempt: old.lease.Attempt})
			old = nil
		}
		// Another dispatch: which one is current, only the kernel knows;
		// the new run asks before it cancels the old one.
	}
	ctx, cancel := context.WithCancelCause(a.base)
	r := &run{lease: lease, token: p.LLMGatewayToken, cancel: cancel, prev: old}
	a.runs[p.ExecutionID] = r
	a.wg.Add(1)
	go a.run(ctx, p.ExecutionID, r)
	return true
}

// run is one dispatch: read the execution, run the handler with heartbeats,
// then complete or fail the execution unless the dispatch merely ended.
func (a *Agent) run(ctx context.Context, executionID string, r *run) {
	defer a.wg.Done()
	defer func() {
		a.mu.Lock()
		if a.runs[executionID] == r {
			delete(a.runs, executionID)
		}
		a.mu.Unlock()
		r.cancel(nil)
	}()
	log := a.log.With("execution_id", executionID, "dispatch_id", r.lease.DispatchID, "attempt", r.lease.Attempt)

	x, err := a.kernel.GetExecution(ctx, executionID)
	if err != nil {
		var ls *LeaseSuperseded
		if errors.As(context.Cause(ctx), &ls) {
			// A newer attempt of this dispatch arrived while it read.
			log.Info("stale webhook: a newer attempt arrived before it started; ignored", "cause", ls)
			return
		}
		log.Warn("read execution; the dispatch ends and the kernel will re-deliver it", "err", err)
		return
	}
	if client.IsTerminalStatus(x.Status) {
		log.Debug("execution already ended", "status", x.Status)
		return
	}
	if x.Lease == nil || x.Lease.DispatchID != r.lease.DispatchID || x.Lease.Attempt != r.lease.Attempt {
		// A late or replayed webhook: another attempt holds the execution
		// (or none does). Running the handler could change nothing.
		log.Info("stale webhook: the lease is not the execution's current one; ignored", "current", x.Lease)
		return
	}
	if r.prev != nil {
		r.prev.cancel(&LeaseSuperseded{DispatchID: r.prev.lease.DispatchID, Attempt: r.prev.lease.Attempt})
	}
	ex := &Execution{ID: x.ID, AgentID: x.AgentID, Lease: r.lease, Input: x.Input, Labels: x.Labels, LLMGatewayToken: r.token, k: a.kernel, cancel: r.cancel}
	ex.setLeaseEnd(leaseUntil(x))
	hctx := withExecution(ctx, ex)

	stop := make(chan struct{})
	beat := make(chan struct{})
	go func() {
		defer close(beat)
		ex.heartbeat(ctx, a.cfg.HeartbeatInterval, leaseUntil(x), stop, log)
	}()
	out, herr := a.call(hctx, x.Input)
	close(stop)
	<-beat

	if u := ex.Unwinding(); u != nil {
		var b *Blocked
		if errors.As(u, &b) {
			log.Info("dispatch ends: the execution waits for an approval", "approval_id", b.ApprovalID, "step_id", b.StepID)
		} else {
			log.Info("dispatch ends without a verdict", "why", u)
		}
		return
	}
	if cause := context.Cause(ctx); cause != nil {
		log.Info("dispatch ends without a verdict", "why", cause)
		return
	}
	if herr != nil && ends(herr) {
		log.Info("dispatch ends without a verdict", "why", herr)
		return
	}
	var raw json.RawMessage
	if herr == nil {
		if raw, err = encodeJSON(out); err != nil {
			herr = fmt.Errorf("output is not JSON-serialisable: %w", err)
		}
	}
	if herr != nil {
		var pe *panicError
		if errors.As(herr, &pe) {
			log.Error("handler panicked", "panic", pe.value, "stack", string(pe.stack))
		}
		if err := ex.mutate(ctx, "fail execution", "/fail", wire.ExecutionFailRequest{Error: errorJSON(herr)}, nil); err != nil {
			log.Warn("fail execution", "err", err)
		}
		return
	}
	if err := ex.mutate(ctx, "complete execution", "/complete", wire.ExecutionCompleteRequest{Output: raw}, nil); err != nil {
		log.Warn("complete execution", "err", err)
	}
}

// leaseUntil is when the lease the execution was read under expires
// (zero when the kernel did not say).
func leaseUntil(x *client.Execution) time.Time {
	if x.Dispatch == nil || x.Dispatch.LeaseUntil == nil {
		return time.Time{}
	}
	return *x.Dispatch.LeaseUntil
}

// call runs the handler, turning a panic into an error.
func (a *Agent) call(ctx context.Context, input json.RawMessage) (out any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &panicError{value: p, stack: debug.Stack()}
		}
	}()
	return a.cfg.Handler.Run(ctx, input)
}

// Running returns how many dispatches are running.
func (a *Agent) Running() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.runs)
}

// Shutdown stops accepting webhooks (they get 503) and waits for the
// running handlers. When ctx ends first, the handlers still running are
// cancelled with ErrShutdown as the cause and their dispatches end without
// a verdict (the kernel re-delivers them once their leases expire);
// Shutdown then returns ctx's error.
func (a *Agent) Shutdown(ctx context.Context) error {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
		a.stop(ErrShutdown)
		return nil
	case <-ctx.Done():
		a.stop(ErrShutdown)
		<-done
		return ctx.Err()
	}
}

// ShutdownGrace is how long Serve lets running handlers finish once its
// context ends.
const ShutdownGrace = 10 * time.Second

// Serve serves the agent's webhooks on ln (every path: the path of the
// registered webhook_url is the caller's choice) until ctx ends, then shuts
// down gracefully: new webhooks get 503, running handlers get ShutdownGrace
// to finish (see Shutdown), and the HTTP server closes. It returns nil after
// a shutdown caused by ctx, or the server's error.
//
//	ln, _ := net.Listen("tcp", "127.0.0.1:5001")
//	// register http://127.0.0.1:5001/webhook with the kernel, then:
//	err := a.Serve(ctx, ln)
func (a *Agent) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		_ = a.Shutdown(context.Background())
		return fmt.Errorf("agent: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
	defer cancel()
	aerr := a.Shutdown(sctx)
	herr := srv.Shutdown(sctx)
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("agent: serve: %w", err)
	}
	if aerr != nil {
		return fmt.Errorf("agent: shutdown: %w", aerr)
	}
	if herr != nil {
		return fmt.Errorf("agent: http shutdown: %w", herr)
	}
	return nil
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(wire.ErrorBody{Code: code, Message: msg})
}
