package wasm

import (
	"context"
	"io"
)

// HostBuiltins supplies the builtins an OPA-compiled module leaves to its
// host (the module's "builtins" export lists them; OPA's wasm compiler
// implements the rest inside the module). The kernel passes
// rego.NewHostBuiltins(), which runs OPA's own Go implementations and
// refuses the builtins the sandbox forbids; this package does not import
// OPA itself.
type HostBuiltins interface {
	// Lookup returns the builtin called name for a bundle granted grants
	// (sandbox.grants, sorted), or an error, naming the builtin, that says
	// why the sandbox refuses it. The module is refused at load with that
	// error.
	//
	// The function takes the arguments and returns the result as OPA
	// values in Rego's value notation (opa_value_dump / opa_value_parse);
	// a nil result is undefined. An error aborts the evaluation (the step
	// is denied with it as the reason).
	Lookup(name string, grants []string) (func(ctx context.Context, args [][]byte) ([]byte, error), error)
	// Evaluation returns ctx carrying the state that the builtin calls of
	// one evaluation share; stdout receives print output.
	Evaluation(ctx context.Context, stdout io.Writer) context.Context
}
