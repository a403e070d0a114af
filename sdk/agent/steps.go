package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"runtime/debug"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

// Step kinds (docs/README.md).
const (
	KindToolCall = "tool_call"
	KindLLMCall  = "llm_call"
	KindLocal    = "local"
)

// Idempotency modes: what the kernel does with a step found executing when
// a new dispatch attempt submits it again (an orphan of a crash).
const (
	// SafeToRetry runs the orphan again under the same step id (usable as
	// the provider's idempotency key). The default of llm_call and local.
	SafeToRetry = "safe_to_retry"
	// AtMostOnce fails the orphan with an "indeterminate" error instead.
	// The default of tool_call.
	AtMostOnce = "at_most_once"
)

// Side-effect classes a step may declare for policy.
const (
	ReadOnly       = "read_only"
	LocalMutation  = "local_mutation"
	RemoteMutation = "remote_mutation"
	Destructive    = "destructive"
)

// StepOptions are the optional fields of a submission.
type StepOptions struct {
	// Idempotency is SafeToRetry or AtMostOnce; empty means the kind's default.
	Idempotency string
	// Effect is the declared side-effect class; empty means undeclared.
	Effect string
	// Reconcile, when set, is asked what became of the step should the
	// kernel find it interrupted (an at_most_once step in flight when an
	// earlier attempt ended): see Reconciliation. Without it the
	// agent's on_interrupted applies (the step replays as an
	// indeterminate *ToolError, or waits for an operator's approval).
	Reconcile func(ctx context.Context, stepID string) (Reconciliation, error)
}

// Outcomes of a Reconciliation.
const (
	// ReconcileContinue: the effect did not happen; run the body again.
	ReconcileContinue = wire.ReconcileContinue
	// ReconcileCompleted: the effect happened; Result is its result.
	ReconcileCompleted = wire.ReconcileCompleted
	// ReconcileConflict: the outcome cannot be reconciled; the execution
	// fails with reason reconcile_conflict and Detail.
	ReconcileConflict = wire.ReconcileConflict
	// ReconcileApproval: the code cannot tell; an operator answers an
	// interrupted_side_effect approval (the call returns *Blocked).
	ReconcileApproval = wire.ReconcileApproval
)

// Reconciliation is what a Reconcile function says became of an
// interrupted step; the kernel records it as step.reconciled.
type Reconciliation struct {
	// Outcome is ReconcileContinue, ReconcileCompleted, ReconcileConflict
	// or ReconcileApproval.
	Outcome string
	// Result is the effect's result (JSON), with ReconcileCompleted.
	Result json.RawMessage
	// Detail says why; with ReconcileConflict, the execution's error.
	Detail string
}

// Body is the work of a step: it runs only on proceed, and its result (any
// JSON) and usage are recorded with the step.
type Body func(ctx context.Context) (result json.RawMessage, usage *wire.Usage, err error)

// Invoke is the step contract every recording primitive goes through:
// submit the effect, then act on the decision. On proceed it runs body and
// records its result (Complete) or its error (Fail, returned as a
// *ToolError); on replay it returns the recorded result or the recorded
// error without running body. Other decisions return *PolicyError,
// *RateLimited, *Blocked or *Terminated. A panic in body is recorded as the
// step's failure and returned as a *ToolError.
func Invoke(ctx context.Context, kind, target string, args any, opts StepOptions, body Body) (json.RawMessage, error) {
	ex, err := FromContext(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := encodeJSON(args)
	if err != nil {
		return nil, &ArgsError{Target: target, Err: err}
	}
	d, err := ex.Submit(ctx, wire.StepSubmitRequest{Kind: kind, Target: target, Args: raw, Idempotency: opts.Idempotency,
		Effect: opts.Effect, Reconcile: opts.Reconcile != nil})
	if err != nil {
		return nil, err
	}
	if d.Decision == wire.DecisionInterrupted && opts.Reconcile != nil {
		if d, err = ex.reconcile(ctx, d.StepID, target, opts.Reconcile); err != nil {
			return nil, err
		}
	}
	switch d.Decision {
	case wire.DecisionProceed:
	case wire.DecisionReplay:
		if isSet(d.Error) {
			return nil, &ToolError{StepID: d.StepID, Target: target, Recorded: d.Error, Replayed: true}
		}
		return d.Result, nil
	default:
		return nil, ex.refused(d, target)
	}
	res, usage, berr := runBody(withStepID(ctx, d.StepID), body)
	if berr != nil {
		rec := errorJSON(berr)
		if err := ex.Fail(ctx, d.StepID, rec); err != nil {
			return nil, err
		}
		return nil, &ToolError{StepID: d.StepID, Target: target, Recorded: rec, Err: berr}
	}
	if len(res) == 0 {
		res = json.RawMessage("null")
	}
	if err := ex.Complete(ctx, d.StepID, res, usage); err != nil {
		return nil, err
	}
	return res, nil
}

type stepKey struct{}

func withStepID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, stepKey{}, id)
}

// StepID returns the id of the step whose body ctx belongs to. The id is
// the same on every attempt of the same effect, so it is the natural
// idempotency key for the provider a body calls: a safe_to_retry step
// orphaned by a crash runs again under the same id, and a provider that
// honours idempotency keys then applies it once.
func StepID(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(stepKey{}).(string)
	return id, ok && id != ""
}

// reconcile asks fn what became of an interrupted step and records the
// answer; the kernel answers like a submission (proceed, replay,
// execution_terminal, blocked).
func (e *Execution) reconcile(ctx context.Context, stepID, target string, fn func(context.Context, string) (Reconciliation, error)) (*wire.StepDecision, error) {
	rc, err := fn(withStepID(ctx, stepID), stepID)
	if err != nil {
		return nil, fmt.Errorf("agent: reconcile step %s (%s): %w", short(stepID), target, err)
	}
	var d wire.StepDecision
	if err := e.mutate(ctx, "reconcile step", "/steps/"+url.PathEscape(stepID)+"/reconcile",
		wire.ReconcileRequest{Outcome: rc.Outcome, Result: rc.Result, Detail: rc.Detail}, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// refused maps a decision other than proceed and replay to its error,
// remembering the ones that end the dispatch.
func (e *Execution) refused(d *wire.StepDecision, target string) error {
	switch d.Decision {
	case wire.DecisionDenied:
		return &PolicyError{StepID: d.StepID, Target: target, Reason: d.Reason, RuleID: d.RuleID}
	case wire.DecisionRateLimited:
		return &RateLimited{StepID: d.StepID, Target: target, Reason: d.Reason, RuleID: d.RuleID}
	case wire.DecisionBlocked, wire.DecisionExecutionBlocked:
		return e.remember(&Blocked{StepID: d.StepID, Target: target, ApprovalID: d.ApprovalID, Reason: d.Reason,
			Execution: d.Decision == wire.DecisionExecutionBlocked})
	case wire.DecisionExecutionTerminal:
		return e.remember(&Terminated{StepID: d.StepID, Reason: d.Reason})
	}
	return fmt.Errorf("agent: step %s: unknown decision %q", short(d.StepID), d.Decision)
}

// runBody runs body, turning a panic into an error.
func runBody(ctx context.Context, body Body) (res json.RawMessage, usage *wire.Usage, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &panicError{value: p, stack: debug.Stack()}
		}
	}()
	if body == nil {
		return nil, nil, nil
	}
	return body(ctx)
}

// panicError is a recovered panic of a step body or a handler.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string { return fmt.Sprintf("panic: %v", p.value) }

// errorJSON is the recorded form of a body's error: {"message": ...}, plus
// "code" when the error has a Code() string method.
func errorJSON(err error) json.RawMessage {
	m := map[string]string{"message": err.Error()}
	var c interface{ Code() string }
	if errors.As(err, &c) && c.Code() != "" {
		m["code"] = c.Code()
	}
	b, _ := json.Marshal(m)
	return b
}

// encodeJSON encodes a step's arguments or a handler's output; a
// json.RawMessage is sent as it is once checked to be JSON.
func encodeJSON(v any) (json.RawMessage, error) {
	switch a := v.(type) {
	case nil:
		return json.RawMessage("null"), nil
	case json.RawMessage:
		if !json.Valid(a) {
			return nil, errors.New("invalid JSON")
		}
		return a, nil
	}
	return json.Marshal(v)
}

func isSet(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// Tool is a typed tool definition: a named effect with JSON arguments In
// and a JSON result Out. Call runs it as a tool_call step.
type Tool[In, Out any] struct {
	// Name is the step target (the tool id policy sees).
	Name string
	// Options are the tool's idempotency and effect class.
	Options   StepOptions
	fn        func(context.Context, In) (Out, error)
	reconcile func(context.Context, In) (Reconciled[Out], error)
}

// ToolOption configures a Tool.
type ToolOption func(*StepOptions)

// WithIdempotency sets a tool's idempotency mode (SafeToRetry or AtMostOnce).
func WithIdempotency(mode string) ToolOption { return func(o *StepOptions) { o.Idempotency = mode } }

// WithEffect declares a tool's side-effect class (ReadOnly, LocalMutation,
// RemoteMutation, Destructive).
func WithEffect(class string) ToolOption { return func(o *StepOptions) { o.Effect = class } }

// NewTool defines a tool. fn is its body: it runs only when the kernel
// says proceed, never on replay.
func NewTool[In, Out any](name string, fn func(ctx context.Context, in In) (Out, error), opts ...ToolOption) *Tool[In, Out] {
	t := &Tool[In, Out]{Name: name, fn: fn}
	for _, o := range opts {
		o(&t.Options)
	}
	return t
}

// Reconciled is a typed tool's Reconciliation: Result is its Out.
type Reconciled[Out any] struct {
	// Outcome is ReconcileContinue, ReconcileCompleted, ReconcileConflict
	// or ReconcileApproval.
	Outcome string
	// Result is the effect's result, with ReconcileCompleted.
	Result Out
	// Detail says why; with ReconcileConflict, the execution's error.
	Detail string
}

// WithReconcile gives the tool a reconciliation: when the kernel finds a
// call of it interrupted (in flight when an earlier attempt ended, so the
// effect may or may not have happened), fn is called with the call's
// input (and the step id in ctx, see StepID) and says what happened: run
// it again, it completed with this result, or it cannot be reconciled. The
// kernel records the answer (step.reconciled) without an operator. It
// returns t.
func (t *Tool[In, Out]) WithReconcile(fn func(ctx context.Context, in In) (Reconciled[Out], error)) *Tool[In, Out] {
	t.reconcile = fn
	return t
}

// Call runs the tool as a step of the execution in ctx: the body's result
// on proceed, the recorded result on replay. Errors are *ToolError (the
// body failed, now or on record), *PolicyError, *RateLimited, *Blocked,
// *Terminated, *LeaseSuperseded, *ArgsError, *KernelError, or
// ErrNoExecution.
func (t *Tool[In, Out]) Call(ctx context.Context, in In) (Out, error) {
	var out Out
	opts := t.Options
	if t.reconcile != nil {
		opts.Reconcile = func(ctx context.Context, _ string) (Reconciliation, error) {
			r, err := t.reconcile(ctx, in)
			if err != nil {
				return Reconciliation{}, err
			}
			rc := Reconciliation{Outcome: r.Outcome, Detail: r.Detail}
			if r.Outcome == ReconcileCompleted {
				if rc.Result, err = json.Marshal(r.Result); err != nil {
					return Reconciliation{}, fmt.Errorf("encode reconciled result: %w", err)
				}
			}
			return rc, nil
		}
	}
	raw, err := Invoke(ctx, KindToolCall, t.Name, in, opts, func(ctx context.Context) (json.RawMessage, *wire.Usage, error) {
		v, err := t.fn(ctx, in)
		if err != nil {
			return nil, nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, nil, fmt.Errorf("encode result: %w", err)
		}
		return b, nil, nil
	})
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("agent: decode result of %s: %w", t.Name, err)
	}
	return out, nil
}

// Step records a local value: fn runs once, and every later dispatch of the
// execution gets the recorded value back. Wrap in Step whatever differs
// between runs (the clock, randomness, fresh ids) so that the arguments of
// later steps, and hence their ids, stay the same on replay. Repeated calls
// with one name are distinct steps (occurrence 0, 1, ...).
func Step[T any](ctx context.Context, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	var out T
	raw, err := Invoke(ctx, KindLocal, name, nil, StepOptions{}, func(ctx context.Context) (json.RawMessage, *wire.Usage, error) {
		v, err := fn(ctx)
		if err != nil {
			return nil, nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, nil, fmt.Errorf("encode value: %w", err)
		}
		return b, nil, nil
	})
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("agent: decode value of %s: %w", name, err)
	}
	return out, nil
}

// Now returns the current time, recorded: a replay returns the first
// run's time. The time is sent with the step's submission, so that the
// kernel records it in the commit that decides the step (one request, one
// commit).
func Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := recordValue(ctx, "wicket.now", time.Now().UTC(), &t)
	return t, err
}

// NewID returns a fresh random id (a UUIDv4 string), recorded, sent with
// the step's submission as Now's time is.
func NewID(ctx context.Context) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var id string
	err := recordValue(ctx, "wicket.new_id", fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), &id)
	return id, err
}

// recordValue submits the local step name with its value v and decodes
// the value the kernel recorded (v, or on replay the first run's) into
// out. Computing v costs nothing and has no effect, so it is computed
// before the kernel says whether the step is new. A kernel that answers
// proceed (one that records values only on completion) gets the value
// through a completion.
func recordValue(ctx context.Context, name string, v, out any) error {
	ex, err := FromContext(ctx)
	if err != nil {
		return err
	}
	val, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("agent: encode value of %s: %w", name, err)
	}
	d, err := ex.Submit(ctx, wire.StepSubmitRequest{Kind: KindLocal, Target: name, Args: json.RawMessage("null"), Result: val})
	if err != nil {
		return err
	}
	raw := d.Result
	switch d.Decision {
	case wire.DecisionReplay:
		if isSet(d.Error) {
			return &ToolError{StepID: d.StepID, Target: name, Recorded: d.Error, Replayed: true}
		}
	case wire.DecisionProceed:
		if err := ex.Complete(ctx, d.StepID, val, nil); err != nil {
			return err
		}
		raw = val
	default:
		return ex.refused(d, name)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("agent: decode value of %s: %w", name, err)
	}
	return nil
}
