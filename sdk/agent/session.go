package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// SessionConfig configures Begin and Attach.
type SessionConfig struct {
	// KernelURL is the kernel's base URL, e.g. http://127.0.0.1:8080.
	KernelURL string
	// APIKey is the bearer key that holds the session's lease (a client,
	// tenant-admin or admin key). Only this key may drive the session.
	APIKey string
	// HeartbeatInterval is how often the session renews its lease in the
	// background (zero: DefaultHeartbeat). Keep it well under the
	// kernel's --lease-timeout.
	HeartbeatInterval time.Duration
	// HTTPClient sends the requests (nil: a default client).
	HTTPClient *http.Client
	// Logger receives diagnostics (nil: slog.Default()).
	Logger *slog.Logger
}

// Session is a hold on an execution that the program's own loop drives,
// with no webhook: the gate (docs/gate.md). Begin starts one and Attach
// takes one over after its holder is gone. The session's Context carries
// the execution, so Tool.Call, Step, Now, NewID and the LLM Transport work
// exactly as in an agent handler: each call is proposed to the kernel,
// decided by policy, recorded, and replayed on a later attach.
//
// The decisions map to errors as for agents, with one difference: after a
// *Blocked (the call waits for an approval) the loop calls Wait and then
// makes the same call again, which the kernel answers under the same step
// id (proceed once granted, a *PolicyError once denied). A session that
// lost its lease (*LeaseSuperseded, its lease expired or another process
// attached) changes nothing more; Attach again to go on, from the top of
// the loop: what was recorded replays.
//
// The session renews its lease in the background until Complete, Fail,
// Detach or Close.
type Session struct {
	// Session is the kernel's answer when the lease was taken.
	wire.Session
	ex  *Execution
	k   *client.Client
	log *slog.Logger

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func sessionClient(cfg SessionConfig) (*client.Client, error) {
	if cfg.KernelURL == "" {
		return nil, errors.New("agent: SessionConfig.KernelURL is required")
	}
	if cfg.HeartbeatInterval < 0 {
		return nil, errors.New("agent: SessionConfig.HeartbeatInterval must not be negative")
	}
	opts := []client.Option{client.WithAPIKey(cfg.APIKey)}
	if cfg.HTTPClient != nil {
		opts = append(opts, client.WithHTTPClient(cfg.HTTPClient))
	}
	return client.New(cfg.KernelURL, opts...), nil
}

// Begin begins a session of req.AgentID held by cfg.APIKey.
func Begin(ctx context.Context, cfg SessionConfig, req client.SessionRequest) (*Session, error) {
	k, err := sessionClient(cfg)
	if err != nil {
		return nil, err
	}
	s, err := k.BeginSession(ctx, req)
	if err != nil {
		return nil, err
	}
	return startSession(cfg, k, s), nil
}

// Attach takes over the session executionID once its holder is gone. While
// the previous holder's lease is live the kernel refuses with 409
// execution_leased (an *client.APIError whose Details name lease_until).
func Attach(ctx context.Context, cfg SessionConfig, executionID string) (*Session, error) {
	k, err := sessionClient(cfg)
	if err != nil {
		return nil, err
	}
	s, err := k.AttachSession(ctx, executionID)
	if err != nil {
		return nil, err
	}
	return startSession(cfg, k, s), nil
}

func startSession(cfg SessionConfig, k *client.Client, ws *client.Session) *Session {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	interval := cfg.HeartbeatInterval
	if interval == 0 {
		interval = DefaultHeartbeat
	}
	x := ws.Execution
	s := &Session{Session: *ws, k: k, stop: make(chan struct{}), done: make(chan struct{}),
		log: log.With("execution_id", x.ID, "attempt", ws.DispatchAttempt)}
	s.ex = &Execution{ID: x.ID, AgentID: x.AgentID, Lease: Lease{DispatchID: ws.DispatchID, Attempt: ws.DispatchAttempt},
		Input: x.Input, Labels: x.Labels, k: k}
	s.ex.setLeaseEnd(ws.LeaseUntil)
	go func() {
		defer close(s.done)
		s.ex.heartbeat(context.Background(), interval, ws.LeaseUntil, s.stop, s.log)
	}()
	return s
}

// ID is the execution id (give it to Attach to take the session over).
func (s *Session) ID() string { return s.ex.ID }

// Execution is the session's execution context: what Tool.Call and Step
// find in the Context.
func (s *Session) Execution() *Execution { return s.ex }

// Context returns ctx carrying the session's execution, for Tool.Call,
// Step and the LLM Transport.
func (s *Session) Context(ctx context.Context) context.Context { return withExecution(ctx, s.ex) }

// Heartbeat renews the lease now (the session also does it in the
// background) and returns when it expires.
func (s *Session) Heartbeat(ctx context.Context) (time.Time, error) { return s.ex.Heartbeat(ctx) }

// Wait waits until the execution no longer waits on an approval (after a
// call returned *Blocked), polling the execution, and keeps the lease
// meanwhile. It returns nil once the loop may make the call again, a
// *Terminated if the execution ended, or ctx's error. A kernel that cannot
// be reached meanwhile (a restart: network errors, 5xx) is waited for too;
// any other refusal is returned.
func (s *Session) Wait(ctx context.Context) error {
	wait := 200 * time.Millisecond
	for {
		x, err := s.k.GetExecution(ctx, s.ex.ID)
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil && !unreachable(err):
			return err
		case err != nil:
			s.log.Warn("waiting for the approval: the kernel cannot be reached; trying again", "err", err)
		case client.IsTerminalStatus(x.Status):
			return s.ex.remember(&Terminated{Reason: "execution is " + x.Status})
		case x.Status != "blocked":
			s.ex.clearBlocked()
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// Complete completes the execution with output (any JSON-serialisable
// value) and ends the session.
func (s *Session) Complete(ctx context.Context, output any) (*client.Execution, error) {
	raw, err := encodeJSON(output)
	if err != nil {
		return nil, fmt.Errorf("agent: output is not JSON-serialisable: %w", err)
	}
	var x client.Execution
	err = s.ex.mutate(ctx, "complete execution", "/complete", wire.ExecutionCompleteRequest{Output: raw}, &x)
	if err != nil {
		return nil, err
	}
	s.Close()
	return &x, nil
}

// Fail fails the execution with cause ({"message": ..., "code"?: ...}) and
// ends the session.
func (s *Session) Fail(ctx context.Context, cause error) (*client.Execution, error) {
	var x client.Execution
	err := s.ex.mutate(ctx, "fail execution", "/fail", wire.ExecutionFailRequest{Error: errorJSON(cause)}, &x)
	if err != nil {
		return nil, err
	}
	s.Close()
	return &x, nil
}

// Detach gives the lease up now, so that another process (or this one
// later) can Attach without waiting for it to expire, and stops the
// heartbeats. The execution goes on.
func (s *Session) Detach(ctx context.Context) error {
	s.Close()
	return s.ex.mutate(ctx, "detach", "/detach", struct{}{}, nil)
}

// Close stops the background heartbeats without giving the lease up: it
// lapses after the kernel's lease timeout (a holder that crashes does the
// same).
func (s *Session) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
}

// unreachable reports whether err says the kernel gave no answer (a
// network error) or a 5xx one: a kernel restarting.
func unreachable(err error) bool {
	var ae *client.APIError
	return !errors.As(err, &ae) || ae.Status >= 500
}

// clearBlocked forgets a remembered *Blocked: a session's loop goes on
// after Wait, under the same lease.
func (e *Execution) clearBlocked() {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b *Blocked
	if errors.As(e.unwind, &b) {
		e.unwind = nil
	}
}
