package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// driver implements one ABI on top of a compiled module.
type driver interface {
	// instantiate creates and initialises one instance.
	instantiate(ctx context.Context, ev *evaluator, out *outputs) (instance, error)
	// close releases what the driver holds beyond the compiled module.
	close(ctx context.Context) error
}

// instance is one instantiated module, used by one evaluation at a time.
type instance interface {
	// evaluate runs the policy on the input JSON. It returns the raw output
	// (nil or "null" for no match). Errors from the wasm call are returned
	// as *callError so they can be classified.
	evaluate(ctx context.Context, input []byte) ([]byte, error)
	// decode validates the output of evaluate and maps it to a decision
	// (nil: no match).
	decode(out []byte) (*policy.Answer, error)
	// module is the instance whose memory holds the state (for diagnostics).
	module() api.Module
	outputs() *outputs
	close(ctx context.Context) error
}

// callError wraps an error returned by a wasm function call.
type callError struct {
	fn  string
	err error
}

func (e *callError) Error() string { return e.fn + ": " + e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

// evaluator is one compiled bundle revision with its instance pool.
type evaluator struct {
	engine *Engine
	mod    *module
	rt     *sandboxRuntime
	cm     wazero.CompiledModule
	sb     *sandbox
	ref    policy.BundleRef
	drv    driver

	// slots holds one token per live-or-being-created instance in use; its
	// capacity is the pool size. idle holds instances not in use.
	slots chan struct{}
	idle  chan instance

	closeOnce  sync.Once
	finishOnce sync.Once
	closed     atomic.Bool
	// instances counts instantiations, for tests and diagnostics.
	instances atomic.Int64
}

var _ policy.Evaluator = (*evaluator)(nil)

// Evaluate runs the module on in. It borrows an instance from the pool
// (creating one if fewer than the pool size exist, waiting otherwise), runs
// it under the bundle's deadline and validates the output.
//
// # Errors
//
// Every error means the step must be denied; its text is the reason:
// "wasm: evaluation timed out after 100ms", "wasm: trap: unreachable",
// "wasm: output is not valid JSON: …" and so on (policy-sdk/ABI.md §3). The
// instance that failed is closed, never returned to the pool.
func (ev *evaluator) Evaluate(ctx context.Context, in *policy.Input) (*policy.Answer, error) {
	if in == nil {
		return nil, errors.New("wasm: nil input")
	}
	input, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("wasm: encode input: %w", err)
	}
	inst, err := ev.acquire(ctx)
	if err != nil {
		return nil, err
	}
	inst.outputs().stderr.reset()
	cctx, cancel := context.WithTimeout(ctx, ev.sb.timeout)
	out, err := inst.evaluate(cctx, input)
	if err != nil && ranOutAboveGarbage(inst, ev.rt.pages) {
		// Whether an evaluation fits in memory must not depend on what
		// earlier evaluations left on an OPA instance's heap: run it again
		// on a fresh instance, in the time that is left.
		_ = inst.close(context.Background())
		fresh, ierr := ev.instantiate(ctx)
		if ierr != nil {
			cancel()
			<-ev.slots
			return nil, ierr
		}
		inst = fresh
		out, err = inst.evaluate(cctx, input)
	}
	cancel()
	if err != nil {
		err = ev.explain(ctx, inst, err)
		ev.discard(inst)
		return nil, err
	}
	d, err := inst.decode(out)
	if err != nil {
		ev.discard(inst)
		return nil, err
	}
	ev.release(inst)
	return d, nil
}

// ranOutAboveGarbage reports whether inst failed with its memory full
// while its heap held what earlier evaluations left (an OPA instance keeps
// its heap between evaluations for OPA's builtin cache).
func ranOutAboveGarbage(inst instance, pages uint32) bool {
	d, ok := inst.(interface{ dirtyHeap() bool })
	return ok && d.dirtyHeap() && memoryFull(inst.module(), pages)
}

// acquire borrows an instance, creating one when the pool has room.
func (ev *evaluator) acquire(ctx context.Context) (instance, error) {
	if ev.closed.Load() {
		return nil, errors.New("wasm: evaluator closed")
	}
	select {
	case ev.slots <- struct{}{}: // a free slot is taken even if ctx is done
	default:
		select {
		case ev.slots <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("wasm: waiting for a free instance: %w", ctx.Err())
		}
	}
	if ev.closed.Load() { // closed while waiting: its module may be gone
		ev.returnSlot()
		return nil, errors.New("wasm: evaluator closed")
	}
	select {
	case inst := <-ev.idle:
		return inst, nil
	default:
	}
	inst, err := ev.instantiate(ctx)
	if err != nil {
		ev.returnSlot()
		return nil, err
	}
	return inst, nil
}

// release returns a healthy instance to the pool.
func (ev *evaluator) release(inst instance) {
	if ev.closed.Load() {
		_ = inst.close(context.Background())
	} else {
		ev.idle <- inst // never blocks: idle instances ≤ pool size
		// Close may have drained idle between the check and the send.
		if ev.closed.Load() {
			ev.drain()
		}
	}
	ev.returnSlot()
}

// returnSlot gives back an instance slot; the last one of a closed
// evaluator finishes it.
func (ev *evaluator) returnSlot() {
	<-ev.slots
	if ev.closed.Load() && len(ev.slots) == 0 {
		ev.finish()
	}
}

// discard closes a failed instance; the next evaluation creates a fresh one.
func (ev *evaluator) discard(inst instance) {
	_ = inst.close(context.Background())
	ev.returnSlot()
}

// instantiate creates one instance under the instantiation deadline.
func (ev *evaluator) instantiate(ctx context.Context) (instance, error) {
	timeout := ev.sb.startTimeout
	ictx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := ev.engine.newOutputs(ev.sb, ev.ref.Name, ev.ref.Revision)
	inst, err := ev.drv.instantiate(ictx, ev, out)
	if err != nil {
		var exit *sys.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded && ctx.Err() == nil {
			return nil, fmt.Errorf("wasm: instantiate: timed out after %s", timeout)
		}
		if errors.As(err, &exit) && exit.ExitCode() != sys.ExitCodeDeadlineExceeded && exit.ExitCode() != sys.ExitCodeContextCanceled {
			msg := fmt.Sprintf("wasm: instantiate: module exited with code %d", exit.ExitCode())
			if l := out.stderr.summary(); l != "" {
				msg += ": " + l
			}
			return nil, errors.New(msg)
		}
		var ce *callError
		if errors.As(err, &ce) {
			return nil, fmt.Errorf("wasm: instantiate: %s: %s", ce.fn, describeCallError(ce.err))
		}
		return nil, fmt.Errorf("wasm: instantiate: %w", err)
	}
	ev.instances.Add(1)
	return inst, nil
}

// explain turns an error from a wasm call into the reason a step is denied.
func (ev *evaluator) explain(parent context.Context, inst instance, err error) error {
	var ce *callError
	if !errors.As(err, &ce) {
		return err // already a complete "wasm: …" error
	}
	var exit *sys.ExitError
	if errors.As(ce.err, &exit) {
		switch exit.ExitCode() {
		case sys.ExitCodeDeadlineExceeded, sys.ExitCodeContextCanceled:
			if perr := parent.Err(); perr != nil {
				return fmt.Errorf("wasm: evaluation cancelled: %w", perr)
			}
			return &timeoutError{after: ev.sb.timeout}
		}
	}
	reason := describeCallError(ce.err)
	stderr := inst.outputs().stderr.summary()
	if stderr != "" {
		reason += ": " + stderr
	}
	if strings.Contains(stderr, "out of memory") || memoryFull(inst.module(), ev.rt.pages) {
		return fmt.Errorf("wasm: memory limit of %s exhausted: %s", pagesString(ev.rt.pages), reason)
	}
	return errors.New("wasm: " + reason)
}

// memoryFull reports whether mod's memory has reached the cap.
func memoryFull(mod api.Module, pages uint32) bool {
	mem := mod.Memory()
	return mem != nil && uint64(mem.Size()) >= uint64(pages)*65536
}

// describeCallError summarises a wazero call error in one line: "trap: …",
// "module exited with code N", or the host function's error.
func describeCallError(err error) string {
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		return fmt.Sprintf("module exited with code %d", exit.ExitCode())
	}
	var abort *opaAbortError
	if errors.As(err, &abort) {
		return abort.Error()
	}
	// Anything else is a trap ("wasm error: unreachable", "stack
	// overflow", …). Drop wazero's stack trace.
	msg := err.Error()
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	return "trap: " + strings.TrimPrefix(msg, "wasm error: ")
}

// timeoutError reports that the per-evaluation deadline passed. It matches
// context.DeadlineExceeded with errors.Is.
type timeoutError struct{ after time.Duration }

func (e *timeoutError) Error() string {
	return fmt.Sprintf("wasm: evaluation timed out after %s", e.after)
}

func (e *timeoutError) Is(target error) bool { return target == context.DeadlineExceeded }

func pagesString(pages uint32) string { return bundle.PagesString(pages) }

// Close closes the idle instances and the compiled module; instances in use
// are closed when their evaluation ends. Evaluate fails after Close.
func (ev *evaluator) Close() error {
	var err error
	ev.closeOnce.Do(func() {
		ev.closed.Store(true)
		ev.drain()
		ctx := context.Background()
		err = errors.Join(ev.drv.close(ctx), ev.cm.Close(ctx))
		if len(ev.slots) == 0 {
			ev.finish()
		}
		if err != nil {
			err = fmt.Errorf("wasm: close %s@%s: %w", ev.ref.Name, ev.ref.Revision, err)
		}
	})
	return err
}

// finish gives the module back to the engine once the evaluator is closed
// and no instance is in use (its runtime may then be closed).
func (ev *evaluator) finish() {
	ev.finishOnce.Do(func() { ev.engine.release(ev.mod) })
}

// drain closes every idle instance.
func (ev *evaluator) drain() {
	for {
		select {
		case inst := <-ev.idle:
			_ = inst.close(context.Background())
		default:
			return
		}
	}
}

// decodeOutput validates a module's output as the answer format of docs/policy.md.
// rateLimitOut is an answer's rate_limit as a module writes it: max_calls
// is any integral number (10, 10.0, 1e1), as the Rego engine reads it.
type rateLimitOut struct {
	MaxCalls       json.RawMessage `json:"max_calls"`
	Window         string          `json:"window"`
	Per            string          `json:"per"`
	Algorithm      string          `json:"algorithm"`
	OnLimiterError string          `json:"on_limiter_error"`
}

func decodeOutput(out []byte) (*policy.Answer, error) {
	trimmed := bytes.TrimSpace(out)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return nil, nil
	}
	if !json.Valid(trimmed) {
		return nil, fmt.Errorf("wasm: output is not valid JSON: %s", snippet(string(trimmed)))
	}
	if trimmed[0] != '{' {
		return nil, fmt.Errorf("wasm: output is not a decision: want a JSON object or null, got %s", snippet(string(trimmed)))
	}
	// One strict pass: the decision's fields and the ABI's error field.
	var w struct {
		Decision  *policy.Action   `json:"decision"`
		Reason    string           `json:"reason"`
		RuleID    string           `json:"rule_id"`
		Approval  *policy.Approval `json:"approval"`
		RateLimit *rateLimitOut    `json:"rate_limit"`
		Error     *string          `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("wasm: output is not a decision: %w", err)
	}
	if w.Error != nil {
		if w.Decision != nil {
			return nil, fmt.Errorf("wasm: output is not a decision: has both error and decision")
		}
		return nil, fmt.Errorf("wasm: policy error: %s", clip(*w.Error))
	}
	if w.Decision == nil {
		return nil, fmt.Errorf("wasm: output is not a decision: no decision field in %s", snippet(string(trimmed)))
	}
	d := &policy.Answer{Action: *w.Decision, Reason: w.Reason, RuleID: w.RuleID, Approval: w.Approval}
	if rl := w.RateLimit; rl != nil {
		d.RateLimit = &policy.RateLimit{Window: rl.Window, Per: rl.Per, Algorithm: rl.Algorithm, OnLimiterError: rl.OnLimiterError}
		if mc := string(rl.MaxCalls); mc != "" && mc != "null" {
			n, ok := policy.IntegerNumber(mc)
			if !ok {
				return nil, fmt.Errorf("wasm: output is not a decision: rate_limit.max_calls is %s, want an integer", snippet(mc))
			}
			d.RateLimit.MaxCalls = n
		}
	}
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("wasm: invalid decision: %w", err)
	}
	return d, nil
}

// clip shortens untrusted text for an error message and drops control
// characters.
func clip(s string) string {
	const max = 300
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// snippet shortens untrusted text for an error message and quotes it.
func snippet(s string) string {
	const max = 120
	if len(s) > max {
		s = s[:max] + "…"
	}
	return fmt.Sprintf("%q", s)
}
