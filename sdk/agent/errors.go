package agent

import (
	"encoding/json"
	"errors"
	"fmt"
)

// ErrNoExecution is returned by FromContext, and by every recording
// primitive (Tool.Call, Step, the LLM Transport), when the context carries
// no execution: they can only run inside a handler the Agent started.
var ErrNoExecution = errors.New("agent: no execution in context (steps run only inside an agent handler)")

// PolicyError is a step that policy, a limit, or a denied or expired
// approval refused (decision "denied"). The step was recorded as denied;
// the handler may carry on with something else.
type PolicyError struct {
	StepID string
	Target string
	Reason string
	RuleID string
}

// Error implements error.
func (e *PolicyError) Error() string {
	return fmt.Sprintf("agent: step %s (%s) denied by policy: %s%s", short(e.StepID), e.Target, e.Reason, rule(e.RuleID))
}

// RateLimited is a step refused for a rate limit (decision "rate_limited").
// Submitting the same effect again later is a new step (a new occurrence).
type RateLimited struct {
	StepID string
	Target string
	Reason string
	RuleID string
}

// Error implements error.
func (e *RateLimited) Error() string {
	return fmt.Sprintf("agent: step %s (%s) rate limited: %s%s", short(e.StepID), e.Target, e.Reason, rule(e.RuleID))
}

// Blocked means the execution waits on an approval (decision "blocked" for
// this step, "execution_blocked" for another). The kernel has parked the
// dispatch; the handler should return, and the Agent ends the dispatch
// without completing or failing the execution. Resolving the approval
// starts a new dispatch, which replays what was recorded and goes on.
//
// Blocked is remembered on the execution: a handler that swallows it still
// unwinds, and every later step of the dispatch returns it again.
type Blocked struct {
	StepID     string
	Target     string
	ApprovalID string
	Reason     string
	// Execution is true for "execution_blocked": the approval that blocks
	// the execution belongs to another step.
	Execution bool
}

// Error implements error.
func (e *Blocked) Error() string {
	if e.Execution {
		return "agent: execution is blocked on an approval of another step"
	}
	return fmt.Sprintf("agent: step %s (%s) awaits approval %s", short(e.StepID), e.Target, e.ApprovalID)
}

// Terminated means the execution is already completed, failed or cancelled
// (decision "execution_terminal", or a heartbeat refused because of it).
// Like Blocked it is remembered on the execution and ends the dispatch.
type Terminated struct {
	StepID string
	Reason string
}

// Error implements error.
func (e *Terminated) Error() string {
	if e.Reason != "" {
		return "agent: execution is terminal: " + e.Reason
	}
	return "agent: execution is terminal"
}

// LeaseSuperseded means a newer dispatch attempt holds the execution's
// lease: this attempt may change nothing more. The handler's context is
// cancelled with it as the cause (context.Cause), and the Agent ends the
// dispatch quietly.
type LeaseSuperseded struct {
	DispatchID string
	Attempt    int
}

// Error implements error.
func (e *LeaseSuperseded) Error() string {
	return fmt.Sprintf("agent: lease superseded: dispatch %s attempt %d is no longer current", e.DispatchID, e.Attempt)
}

// ToolError is a step whose body failed: either now (the error was recorded
// with the step and Err is the body's error) or on an earlier attempt
// (Replayed is true and only the recorded error remains). Recorded is the
// error JSON the kernel holds; the recorded error of an at_most_once step
// orphaned by a crash is {"code": "indeterminate", ...} (see Indeterminate).
type ToolError struct {
	StepID   string
	Target   string
	Recorded json.RawMessage
	Replayed bool
	Err      error
}

// Error implements error.
func (e *ToolError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("agent: step %s (%s) failed: %v", short(e.StepID), e.Target, e.Err)
	}
	return fmt.Sprintf("agent: step %s (%s) failed: %s", short(e.StepID), e.Target, e.Message())
}

// Unwrap returns the body's error (nil on replay).
func (e *ToolError) Unwrap() error { return e.Err }

// Message is the recorded error's "message" field, or its JSON text.
func (e *ToolError) Message() string {
	var m struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(e.Recorded, &m) == nil && m.Message != "" {
		return m.Message
	}
	return string(e.Recorded)
}

// Code is the recorded error's "code" field ("" when it has none).
func (e *ToolError) Code() string {
	var m struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(e.Recorded, &m)
	return m.Code
}

// Indeterminate reports whether the step's outcome is unknown: an
// at_most_once step that was executing when its dispatch was lost. The
// effect may or may not have happened; the kernel will not run it again.
func (e *ToolError) Indeterminate() bool {
	if e.Code() == "indeterminate" {
		return true
	}
	var s string
	return json.Unmarshal(e.Recorded, &s) == nil && s == "indeterminate"
}

// ArgsError is a step whose arguments cannot be encoded as JSON; nothing
// was submitted.
type ArgsError struct {
	Target string
	Err    error
}

// Error implements error.
func (e *ArgsError) Error() string {
	return fmt.Sprintf("agent: arguments of %s are not JSON-serialisable: %v", e.Target, e.Err)
}

// Unwrap returns the encoding error.
func (e *ArgsError) Unwrap() error { return e.Err }

// KernelError is a kernel call that did not get an answer (network error,
// timeout, or a 5xx). The dispatch ends without failing the execution: its
// lease expires and the kernel re-delivers it, and the new attempt replays
// what was recorded. A call whose own context ended first is not a
// KernelError: it returns an error wrapping the context's cause.
type KernelError struct {
	Op  string
	Err error
}

// Error implements error.
func (e *KernelError) Error() string { return "agent: kernel " + e.Op + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *KernelError) Unwrap() error { return e.Err }

// ends reports whether err ends the dispatch without a verdict on the
// execution (Blocked, Terminated, LeaseSuperseded, KernelError).
func ends(err error) bool {
	var b *Blocked
	var t *Terminated
	var l *LeaseSuperseded
	var k *KernelError
	return errors.As(err, &b) || errors.As(err, &t) || errors.As(err, &l) || errors.As(err, &k)
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func rule(id string) string {
	if id == "" {
		return ""
	}
	return " (rule " + id + ")"
}
