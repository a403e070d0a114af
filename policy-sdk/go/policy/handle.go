package policy

import (
	"encoding/json"
	"fmt"
)

// ABIVersion is the Wicket wasm ABI version this SDK implements.
const ABIVersion = 1

// Func decides one step. It returns nil when the policy has no opinion (no
// match), letting the bundle's default_action apply.
type Func func(in *Input) *Decision

var handler Func

// Handle registers fn as the module's policy. Call it exactly once, from an
// init function: c-shared modules never run main.main. It panics when fn is
// nil or a handler is already registered.
func Handle(fn Func) {
	if fn == nil {
		panic("policy.Handle: nil handler")
	}
	if handler != nil {
		panic("policy.Handle: handler already registered")
	}
	handler = fn
}

// errorOutput is the ABI's way to report that the policy could not decide.
type errorOutput struct {
	Error string `json:"error"`
}

// Evaluate runs the registered handler on one input document and returns the
// ABI output bytes: a decision object, "null" for no match, or an
// {"error": …} object. The wasm exports call it; tests of a policy can call
// it directly on the host.
func Evaluate(input []byte) []byte {
	out, err := evaluate(input)
	if err != nil {
		b, _ := json.Marshal(errorOutput{Error: err.Error()})
		return b
	}
	return out
}

func evaluate(input []byte) (out []byte, err error) {
	if handler == nil {
		return nil, fmt.Errorf("no handler registered: call policy.Handle from init")
	}
	var in Input
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, fmt.Errorf("decode input: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("panic: %v", r)
		}
	}()
	d := handler(&in)
	if d == nil {
		return []byte("null"), nil
	}
	b, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode decision: %w", err)
	}
	return b, nil
}
