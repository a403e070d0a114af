package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// Lease is the (dispatch id, attempt) pair a dispatch arrived with. Every
// mutation sends it back; once a newer attempt holds the execution, the
// kernel refuses this one's mutations with lease_superseded.
type Lease struct {
	DispatchID string
	Attempt    int
}

// Execution is the execution context of one dispatch: the Go counterpart of
// the Rebuno SDKs' ambient ExecutionContext. The Agent puts it in the handler's
// context.Context; Tool.Call, Step and the LLM Transport find it there, so
// no object is threaded through the agent's code. FromContext returns it.
//
// An Execution is safe for concurrent use, but the kernel numbers identical
// submissions (same kind, target and arguments) in the order they arrive,
// so run identical effects sequentially if their replay must line up.
type Execution struct {
	// ID is the execution id.
	ID string
	// AgentID is the agent the execution belongs to.
	AgentID string
	// Lease is this dispatch's lease.
	Lease Lease
	// Input is the execution's input, as created.
	Input json.RawMessage
	// Labels are the execution's labels.
	Labels map[string]string
	// LLMGatewayToken authenticates this dispatch's calls to the kernel's
	// LLM gateway (/llm/...), for model clients that do not go through
	// Transport: give it as their API key (docs/llm-gateway.md). Empty when
	// the kernel does not serve the gateway. It is valid while this
	// dispatch holds the lease.
	LLMGatewayToken string

	k      *client.Client
	cancel context.CancelCauseFunc

	mu     sync.Mutex // guards unwind, occ
	unwind error      // Blocked, Terminated or LeaseSuperseded, once seen
	// occ counts this attempt's submissions of each (kind, target,
	// args_hash), as the kernel does, to compute the step id sent in
	// Rebuno-Step-Id.
	occ map[occurrenceKey]*occurrence

	// leaseEnd is when the lease is known to expire, in Unix nanoseconds
	// (0: unknown): from the execution read at the start, then from each
	// heartbeat. Retrying a step's outcome stops there.
	leaseEnd atomic.Int64

	// leaseHdr is the lease headers of the mutations, built once for the
	// Lease they name (read-only once built: requests only read them).
	leaseHdr atomic.Pointer[leaseHeader]
	// paths is the execution's paths, built once for the ID they name.
	paths atomic.Pointer[execPaths]
}

// execPaths is an execution's path and the path of its submissions.
type execPaths struct {
	id, exec, steps string
}

// stepHeader is the headers of one submission: the lease headers and
// the step id, with one array for the values. Submissions take them from
// stepHeaders and give them back once the request is sent (the client
// copies what it sends; see client.Client.Do).
type stepHeader struct {
	lease Lease
	vals  [3]string
	h     http.Header
}

var stepHeaders = sync.Pool{New: func() any { return new(stepHeader) }}

// stepHeader returns the headers of a submission of stepID under the
// current lease; putStepHeader gives them back.
func (e *Execution) stepHeader(stepID string) *stepHeader {
	sh := stepHeaders.Get().(*stepHeader)
	if sh.h == nil || sh.lease != e.Lease {
		sh.lease = e.Lease
		sh.vals[0], sh.vals[1] = e.Lease.DispatchID, strconv.Itoa(e.Lease.Attempt)
		if sh.h == nil {
			sh.h = make(http.Header, 3)
			sh.h[wire.HeaderDispatchID] = sh.vals[0:1:1]
			sh.h[wire.HeaderDispatchAttempt] = sh.vals[1:2:2]
			sh.h[wire.HeaderStepID] = sh.vals[2:3:3]
		}
	}
	sh.vals[2] = stepID
	return sh
}

func putStepHeader(sh *stepHeader) {
	sh.vals[2] = ""
	stepHeaders.Put(sh)
}

// leaseHeader is the lease headers built for one lease.
type leaseHeader struct {
	lease Lease
	h     http.Header
}

// occurrenceKey is the (kind, target, args_hash) whose submissions an
// occurrence counts.
type occurrenceKey struct{ kind, target, argsHash string }

// occurrence is the SDK's count of one (kind, target, args_hash) in this
// dispatch attempt. Its mutex is held for a submission's round trip, so
// identical submissions reach the kernel in the order they were numbered.
type occurrence struct {
	mu   sync.Mutex
	next int
}

// occurrenceOf returns the counter of key, creating it.
func (e *Execution) occurrenceOf(key occurrenceKey) *occurrence {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.occ == nil {
		e.occ = map[occurrenceKey]*occurrence{}
	}
	o := e.occ[key]
	if o == nil {
		o = &occurrence{}
		e.occ[key] = o
	}
	return o
}

type ctxKey struct{}

// FromContext returns the execution of the handler ctx belongs to, or
// ErrNoExecution.
func FromContext(ctx context.Context) (*Execution, error) {
	if ctx == nil {
		return nil, ErrNoExecution
	}
	if e, ok := ctx.Value(ctxKey{}).(*Execution); ok && e != nil {
		return e, nil
	}
	return nil, ErrNoExecution
}

// withExecution returns ctx carrying e.
func withExecution(ctx context.Context, e *Execution) context.Context {
	return context.WithValue(ctx, ctxKey{}, e)
}

// Unwinding returns the Blocked, Terminated or LeaseSuperseded error this
// dispatch has seen, or nil. Once set it does not change: the dispatch is
// over, whatever the handler does with the error.
func (e *Execution) Unwinding() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.unwind
}

// remember records an error that ends the dispatch (the first one wins) and
// returns the one that is remembered. A superseded lease also cancels the
// handler's context.
func (e *Execution) remember(err error) error {
	e.mu.Lock()
	if e.unwind == nil {
		e.unwind = err
	}
	u := e.unwind
	e.mu.Unlock()
	var ls *LeaseSuperseded
	var t *Terminated
	if (errors.As(err, &ls) || errors.As(err, &t)) && e.cancel != nil {
		e.cancel(err)
	}
	return u
}

// leaseHeader returns the lease headers of a mutation.
// The header is shared by every mutation: callers must not change it.
func (e *Execution) leaseHeader() http.Header {
	if lh := e.leaseHdr.Load(); lh != nil && lh.lease == e.Lease {
		return lh.h
	}
	vals := [2]string{e.Lease.DispatchID, strconv.Itoa(e.Lease.Attempt)}
	lh := &leaseHeader{lease: e.Lease, h: http.Header{wire.HeaderDispatchID: vals[0:1:1], wire.HeaderDispatchAttempt: vals[1:2:2]}}
	e.leaseHdr.Store(lh)
	return lh.h
}

// path returns the execution's path plus suffix.
func (e *Execution) path(suffix string) string {
	return e.execPaths().exec + suffix
}

// execPaths returns the execution's paths, built once.
func (e *Execution) execPaths() *execPaths {
	if p := e.paths.Load(); p != nil && p.id == e.ID {
		return p
	}
	exec := "/v0/executions/" + url.PathEscape(e.ID)
	p := &execPaths{id: e.ID, exec: exec, steps: exec + "/steps"}
	e.paths.Store(p)
	return p
}

// mutate sends one signed mutation under the lease and maps the kernel's
// answers to the SDK's errors: lease_superseded → LeaseSuperseded (and the
// handler is cancelled), an unreachable kernel or a 5xx → KernelError, and
// a ctx that ended first → an error wrapping its cause.
func (e *Execution) mutate(ctx context.Context, op, suffix string, body, out any) error {
	return e.mutateAt(ctx, op, e.path(suffix), e.leaseHeader(), body, out)
}

// mutateAt is mutate with the whole path and the request headers given
// (the lease headers and any others).
func (e *Execution) mutateAt(ctx context.Context, op, path string, header http.Header, body, out any) error {
	err := e.k.Do(ctx, http.MethodPost, path, header, body, out)
	if err == nil {
		return nil
	}
	var ae *client.APIError
	if errors.As(err, &ae) {
		switch {
		case ae.Code == wire.CodeLeaseSuperseded:
			return e.remember(&LeaseSuperseded{DispatchID: e.Lease.DispatchID, Attempt: e.Lease.Attempt})
		case ae.Status >= 500:
			return &KernelError{Op: op, Err: err}
		}
		return err
	}
	if ctx.Err() != nil {
		// The caller's own deadline or cancellation, not an unreachable
		// kernel: returned by the handler it fails the execution. A
		// cancellation by the Agent (a superseded lease, a terminated
		// execution, a shutdown) is the cause, and still ends the
		// dispatch without a verdict.
		return fmt.Errorf("agent: %s: %w", op, context.Cause(ctx))
	}
	return &KernelError{Op: op, Err: err}
}

// Submit submits one step and returns the kernel's decision as is. It is
// the primitive under Tool.Call, Step and the Transport; use it to build
// other integrations (a gateway, another tool framework). After a proceed
// the caller must Complete or Fail the step.
//
// Submit computes the step id itself (canonical args, args_hash, and the
// occurrence of this kind, target and args in the dispatch attempt) and
// sends it in Rebuno-Step-Id; identical submissions are sent one at a
// time, in order. Should the kernel compute another id, it refuses the
// submission with 409 step_id_divergence (an *client.APIError) before
// recording anything, so no effect runs that could not be recorded.
func (e *Execution) Submit(ctx context.Context, req wire.StepSubmitRequest) (*wire.StepDecision, error) {
	if u := e.Unwinding(); u != nil {
		return nil, u
	}
	args := req.Args
	if len(args) == 0 {
		args = json.RawMessage("null")
	}
	var o *occurrence
	var stepID string
	if _, hash, err := canon.ArgsHash(args); err == nil {
		// Args that cannot be canonicalised are sent as they are: the
		// kernel's 400 says what is wrong with them.
		o = e.occurrenceOf(occurrenceKey{req.Kind, req.Target, hash})
		o.mu.Lock()
		defer o.mu.Unlock()
		stepID = canon.StepID(e.ID, req.Kind, req.Target, hash, o.next)
	}
	var d wire.StepDecision
	var err error
	if stepID != "" {
		sh := e.stepHeader(stepID)
		err = e.mutateAt(ctx, "submit step", e.execPaths().steps, sh.h, req, &d)
		putStepHeader(sh)
	} else {
		err = e.mutateAt(ctx, "submit step", e.execPaths().steps, e.leaseHeader(), req, &d)
	}
	if err != nil {
		return nil, err
	}
	switch {
	case o == nil || d.StepID == "":
	case d.Decision == wire.DecisionBlocked:
		// A blocked answer consumes no occurrence: proposed again under
		// this lease (a session after Wait), the step keeps its id.
		o.next = d.Occurrence
	default: // the kernel counted this submission
		o.next = d.Occurrence + 1
	}
	return &d, nil
}

// Complete records the result (any JSON) and usage of a step that was told
// to proceed. It runs even if ctx is cancelled, and tries again while the
// kernel cannot be reached (a restart, a 5xx), for up to 30 s and while the
// lease lasts: a result the effect already produced must not be thrown
// away.
func (e *Execution) Complete(ctx context.Context, stepID string, result json.RawMessage, usage *wire.Usage) error {
	return e.record(ctx, "complete step", stepID, e.execPaths().exec+"/steps/"+url.PathEscape(stepID)+"/complete",
		wire.StepCompleteRequest{Result: result, Usage: usage})
}

// Fail records the error (any JSON but null, which the kernel refuses: a
// replay reads a null error as none) of a step that was told to proceed.
// Like Complete it runs even if ctx is cancelled, and tries again while the
// kernel cannot be reached.
func (e *Execution) Fail(ctx context.Context, stepID string, stepErr json.RawMessage) error {
	return e.record(ctx, "fail step", stepID, e.execPaths().exec+"/steps/"+url.PathEscape(stepID)+"/fail",
		wire.StepFailRequest{Error: stepErr})
}

// stepCancelled is the status of a step whose execution ended while it ran
// (a conflict's details.status when its outcome comes too late).
const stepCancelled = "cancelled"

// Pauses between two tries of a step outcome the kernel did not answer:
// the first, doubled up to the last.
const (
	recordRetryFirst = 50 * time.Millisecond
	recordRetryMax   = time.Second
)

// record sends a step's outcome under the settle window (see settle),
// trying again after a KernelError until the kernel answers, the window
// ends, or the lease is known to have expired (the kernel then gives the
// execution to another attempt, and the dispatch had better end). The
// effect has happened; dropping its outcome because the kernel was
// restarting would make an at_most_once step indeterminate and run a
// safe_to_retry one again. Sending it twice is safe: the kernel takes the
// same outcome of a step again as a no-op. Any answer (lease_superseded,
// a conflict) ends the tries. A step the kernel has cancelled (its
// execution ended while the effect ran) is *Terminated, remembered like a
// terminal decision.
func (e *Execution) record(ctx context.Context, op, stepID, path string, body any) error {
	ctx, cancel := settle(ctx)
	defer cancel()
	pause := recordRetryFirst
	for {
		err := e.mutateAt(ctx, op, path, e.leaseHeader(), body, nil)
		if err == nil {
			return nil
		}
		var ae *client.APIError
		if errors.As(err, &ae) && ae.Code == wire.CodeConflict && ae.Details["status"] == stepCancelled {
			return e.remember(&Terminated{StepID: stepID, Reason: ae.Message})
		}
		var ke *KernelError
		if !errors.As(err, &ke) {
			if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
				// The settle window ended during the request: the kernel
				// gave no answer.
				return &KernelError{Op: op, Err: err}
			}
			return err
		}
		if e.leaseLapsed() {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		pause = min(2*pause, recordRetryMax)
	}
}

// Delta posts one ephemeral piece of a running step's output to the
// execution's stream observers. It is never stored.
func (e *Execution) Delta(ctx context.Context, stepID string, seq int64, data json.RawMessage) error {
	return e.mutate(ctx, "stream delta", "/steps/"+url.PathEscape(stepID)+"/stream", wire.StreamDelta{Seq: seq, Data: data}, nil)
}

// Heartbeat renews the lease and returns when it now expires (zero while
// the dispatch is parked on an approval: no timer runs then). A superseded
// lease returns LeaseSuperseded and an execution that has ended returns
// Terminated; both cancel the handler's context.
func (e *Execution) Heartbeat(ctx context.Context) (time.Time, error) {
	var hr wire.HeartbeatResponse
	err := e.mutate(ctx, "heartbeat", "/heartbeat", struct{}{}, &hr)
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Code == wire.CodeConflict {
		return time.Time{}, e.remember(&Terminated{Reason: ae.Message})
	}
	if err != nil || hr.LeaseUntil == nil {
		return time.Time{}, err
	}
	e.setLeaseEnd(*hr.LeaseUntil)
	return *hr.LeaseUntil, nil
}

// leaseWarning is logged once when the kernel's lease is shorter than the
// heartbeat interval.
const leaseWarning = "the heartbeat interval is longer than the kernel's lease: the lease lapses between beats; lower Config.HeartbeatInterval"

// setLeaseEnd records when the lease expires (a zero t: unknown).
func (e *Execution) setLeaseEnd(t time.Time) {
	if t.IsZero() {
		e.leaseEnd.Store(0)
		return
	}
	e.leaseEnd.Store(t.UnixNano())
}

// leaseLapsed reports whether the lease is known to have expired.
func (e *Execution) leaseLapsed() bool {
	end := e.leaseEnd.Load()
	return end != 0 && time.Now().UnixNano() > end
}

// settleTimeout bounds a Complete or Fail that runs after the handler's
// context was cancelled.
const settleTimeout = 30 * time.Second

// settle returns a context that keeps ctx's values but not its
// cancellation, bounded by settleTimeout.
func settle(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
}

// heartbeat renews the lease every interval until stop is closed, or until
// the kernel says the lease is superseded or the execution has ended (both
// cancel the handler through remember). It warns once when the kernel's
// lease is shorter than the interval: the lease would lapse between beats.
// until is when the lease held at the start expires (zero: unknown); a
// lease that ends before the first beat is warned about at once, since no
// beat would ever get through to show it.
func (e *Execution) heartbeat(ctx context.Context, interval time.Duration, until time.Time, stop <-chan struct{}, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	warned := false
	if left := time.Until(until); !until.IsZero() && left < interval {
		warned = true
		log.Warn(leaseWarning, "interval", interval, "lease_left", left.Round(time.Millisecond))
	}
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
			hctx, cancel := context.WithTimeout(ctx, interval)
			until, err := e.Heartbeat(hctx)
			cancel()
			if err == nil {
				if left := time.Until(until); !until.IsZero() && left < interval && !warned {
					warned = true
					log.Warn(leaseWarning, "interval", interval, "lease_left", left.Round(time.Millisecond))
				}
				continue
			}
			var ls *LeaseSuperseded
			var tm *Terminated
			if errors.As(err, &ls) || errors.As(err, &tm) {
				return
			}
			log.Warn("heartbeat", "err", err) // transient: the next beat may get through
		}
	}
}
