package rego

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// Pathological policies: each runs for minutes (and takes gigabytes) when
// nothing stops it.
const (
	// cubePolicy builds a 4000³ comprehension.
	cubePolicy = `package wicket
r := numbers.range(1, 4000)
decision := {"decision": "deny", "reason": sprintf("%d", [count([x | some i in r; some j in r; some k in r; x := i * j * k])])}
`
	// rangePolicy asks numbers.range for input.step.args.n numbers.
	rangePolicy = `package wicket
decision := {"decision": "deny", "reason": sprintf("%d", [count(numbers.range(1, input.step.args.n))])}
`
)

// evalWithin evaluates in a goroutine and fails the test if no answer comes
// within a minute (an evaluation nothing stops).
func evalWithin(t *testing.T, ev policy.Evaluator, in *policy.Input) (*policy.Answer, error) {
	t.Helper()
	type result struct {
		d   *policy.Answer
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := ev.Evaluate(context.Background(), in)
		done <- result{d, err}
	}()
	select {
	case r := <-done:
		return r.d, r.err
	case <-time.After(time.Minute):
		t.Fatal("evaluation not stopped within a minute")
		return nil, nil
	}
}

// TestEvaluationDeadline: an evaluation that outlasts the bundle's
// sandbox.timeout (or the kernel's default) is stopped and reported as a
// timeout; the evaluator keeps answering afterwards.
func TestEvaluationDeadline(t *testing.T) {
	eng := New(WithLimits(bundle.Limits{Timeout: 200 * time.Millisecond, MaxTimeout: time.Second}))
	for _, c := range []struct {
		name, policy, timeout, want string
		args                        string
	}{
		{"4000³ comprehension, default timeout", cubePolicy, "", "rego: evaluate data.wicket.decision: timed out after 200ms", `{}`},
		{"4000³ comprehension, manifest timeout", cubePolicy, "50ms", "rego: evaluate data.wicket.decision: timed out after 50ms", `{}`},
		{"numbers.range of 2·10⁷", rangePolicy, "", "rego: evaluate data.wicket.decision: timed out after 200ms", `{"n": 20000000}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := mkBundle(map[string]string{"policy.rego": c.policy}, "")
			b.Manifest.Sandbox.Timeout = c.timeout
			ev, err := eng.Compile(context.Background(), b)
			if err != nil {
				t.Fatal(err)
			}
			defer ev.Close()
			_, err = evalWithin(t, ev, step("x", c.args, ""))
			if err == nil || err.Error() != c.want {
				t.Fatalf("got %v, want %s", err, c.want)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("errors.Is(%v, context.DeadlineExceeded) = false", err)
			}
		})
	}
	// A small range finishes: the deadline is per evaluation, not per evaluator.
	b := mkBundle(map[string]string{"policy.rego": rangePolicy}, "")
	ev, err := eng.Compile(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	for range 3 {
		if _, err := evalWithin(t, ev, step("x", `{"n": 20000000}`, "")); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("large range: %v", err)
		}
		d, err := evalWithin(t, ev, step("x", `{"n": 10}`, ""))
		if err != nil || d == nil || d.Reason != "10" {
			t.Fatalf("small range after a timeout: %+v, %v", d, err)
		}
	}
}

// TestTimeoutCeiling: a Rego bundle asking for a longer deadline than the
// kernel allows is refused at Compile.
func TestTimeoutCeiling(t *testing.T) {
	b := mkBundle(map[string]string{"policy.rego": rangePolicy}, "")
	b.Manifest.Sandbox.Timeout = "87600h"
	_, err := New().Compile(context.Background(), b)
	want := `rego: compile bundle "test" rev 1: bundle.yaml: sandbox.timeout: 87600h0m0s exceeds the kernel's ceiling of 2s (serve --sandbox-max-timeout)`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
	if !errors.Is(err, bundle.ErrCeiling) {
		t.Errorf("%v does not match bundle.ErrCeiling", err)
	}
}

// testEngine is an engine whose deadline tolerates a loaded machine under
// the race detector (the deadline itself is tested above).
func testEngine() *Engine {
	return New(WithLimits(bundle.Limits{Timeout: time.Minute, MaxTimeout: time.Minute}))
}
