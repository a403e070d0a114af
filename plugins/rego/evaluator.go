package rego

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/metrics"
	opa "github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"

	"github.com/wicket-run/wicket/kernel/policy"
)

var _ policy.Evaluator = (*evaluator)(nil)

// errClosed is returned by Evaluate after Close.
var errClosed = errors.New("evaluator closed")

// noMetrics spares every evaluation the allocation of OPA's metrics
// registry, which nothing reads.
var noMetrics = metrics.NoOp()

// evaluator is one prepared bundle revision. The prepared query is immutable
// and OPA documents PreparedEvalQuery as safe for concurrent use; the
// atomic pointer only lets Close drop it without a lock on the hot path.
type evaluator struct {
	entry   string
	timeout time.Duration
	pq      atomic.Pointer[opa.PreparedEvalQuery]
}

func newEvaluator(entry string, pq opa.PreparedEvalQuery, timeout time.Duration) *evaluator {
	e := &evaluator{entry: entry, timeout: timeout}
	e.pq.Store(&pq)
	return e
}

// Evaluate runs the prepared entrypoint against in, under the bundle's
// deadline (sandbox.timeout). It returns (nil, nil) when the entrypoint is
// undefined, and an error when the policy fails (a builtin error,
// conflicting rule outputs, ctx done) or answers something that is not a
// valid decision object. An evaluation that outlasts the deadline is
// stopped: "rego: evaluate data.x.y: timed out after 1s", an error matching
// context.DeadlineExceeded. A cancelled or expired ctx stops the evaluation
// and the error wraps ctx.Err().
func (e *evaluator) Evaluate(ctx context.Context, in *policy.Input) (*policy.Answer, error) {
	pq := e.pq.Load()
	if pq == nil {
		return nil, fmt.Errorf("rego: evaluate %s: %w", e.entry, errClosed)
	}
	if in == nil {
		return nil, fmt.Errorf("rego: evaluate %s: nil input", e.entry)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rego: evaluate %s: %w", e.entry, err)
	}
	input, err := inputValue(in)
	if err != nil {
		return nil, fmt.Errorf("rego: evaluate %s: input: %w", e.entry, err)
	}

	// OPA would start a goroutine per evaluation to watch ctx; AfterFunc
	// only costs a registration. The deadline is a timer that sets the same
	// cancel flag, which topdown checks at every step and in its long
	// builtins (numbers.range...).
	cancel := topdown.NewCancel()
	stop := context.AfterFunc(ctx, cancel.Cancel)
	var expired atomic.Bool
	timer := time.AfterFunc(e.timeout, func() { expired.Store(true); cancel.Cancel() })
	rs, err := pq.Eval(ctx,
		opa.EvalParsedInput(input),
		opa.EvalMetrics(noMetrics),
		opa.EvalExternalCancel(cancel),
	)
	timer.Stop()
	stop()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("rego: evaluate %s: %w", e.entry, cerr)
		}
		if expired.Load() {
			return nil, &timeoutError{entry: e.entry, after: e.timeout}
		}
		return nil, fmt.Errorf("rego: evaluate %s: %w", e.entry, err)
	}

	switch len(rs) {
	case 0:
		return nil, nil
	case 1:
	default:
		return nil, fmt.Errorf("rego: entrypoint %s returned %d results, want one", e.entry, len(rs))
	}
	if len(rs[0].Expressions) != 1 {
		return nil, fmt.Errorf("rego: entrypoint %s returned %d expressions, want one", e.entry, len(rs[0].Expressions))
	}
	res, ok := rs[0].Expressions[0].Value.(decoded)
	if !ok {
		return nil, fmt.Errorf("rego: entrypoint %s: unexpected result %T", e.entry, rs[0].Expressions[0].Value)
	}
	if res.err != nil {
		return nil, fmt.Errorf("rego: entrypoint %s %w", e.entry, res.err)
	}
	if res.d == nil {
		return nil, nil
	}
	if err := res.d.Validate(); err != nil {
		return nil, fmt.Errorf("rego: entrypoint %s returned an invalid decision: %w", e.entry, err)
	}
	return res.d, nil
}

// timeoutError reports that an evaluation outlasted its deadline. It
// matches context.DeadlineExceeded with errors.Is.
type timeoutError struct {
	entry string
	after time.Duration
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("rego: evaluate %s: timed out after %s", e.entry, e.after)
}

func (e *timeoutError) Is(target error) bool { return target == context.DeadlineExceeded }

// Close releases the prepared query. Evaluate returns an error afterwards;
// evaluations already running finish normally. Close is idempotent.
func (e *evaluator) Close() error {
	e.pq.Store(nil)
	return nil
}
