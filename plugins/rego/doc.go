// Package rego is the OPA Rego policy engine for Wicket (docs/policy.md, engine
// "rego"). It is the only package of the module that imports OPA.
//
// # Basics
//
//	eng := rego.New()
//	ev, err := eng.Compile(ctx, b) // b is a *bundle.Bundle with engine: rego
//	if err != nil { ... }          // refused whole: the running revision stays
//	defer ev.Close()
//	d, err := ev.Evaluate(ctx, in) // nil, nil: no rule matched
//
// [Engine.Compile] parses every *.rego file of the bundle (files under tests/
// are skipped) as Rego v1, compiles them, loads data.json as data and prepares
// the manifest's entrypoint (default data.wicket.decision) once. Evaluation
// reuses the prepared query; nothing is parsed or compiled per step.
//
// # Input and output
//
// The policy sees the [policy.Input] document as input, built directly as an
// OPA value with the same shape and values encoding/json would give it
// (input.step.args is the step's JSON arguments, input.execution.created_at an
// RFC 3339 string).
//
// The entrypoint must be undefined (no match) or an object:
//
//	{"decision": "allow" | "deny" | "require_approval" | "abort",
//	 "reason": "...", "rule_id": "...",
//	 "approval": {"approvers": [...], "timeout": "15m", "message": "..."},
//	 "rate_limit": {"max_calls": 10, "window": "1m", "per": "execution",
//	                "algorithm": "sliding", "on_limiter_error": "fail_closed"}}
//
// Only decision is required; a null field counts as absent; approvers may be
// an array or a set of strings. null and an empty object are no match too,
// so that an entrypoint built from ref-head rules (decision.decision :=
// "deny" if ...) answers nothing when none of them holds. An entrypoint not
// named decision may also answer a boolean (allow := true) or a set of deny
// messages (deny contains msg if ...), mapped by [policy.FromBoolean] and
// [policy.FromMessages]. Any other value (a string, a field of the wrong
// type, an unknown field, a decision [policy.Answer.Validate] refuses, a
// conflict between rules) is an evaluation error, which the kernel turns
// into a denial.
//
// # Determinism and sandboxing
//
// [policy.Evaluator] requires evaluation to be deterministic for a given input
// and bundle revision, so a bundle that calls a builtin reaching the network,
// the host environment, the wall clock or a random source is refused at
// compile time, with the file and line of the call: http.send,
// net.lookup_ip_addr, opa.runtime, time.now_ns, rand.intn, uuid.rfc4122,
// io.jwt.decode_verify, io.jwt.encode_sign(_raw), json.match_schema,
// json.verify_schema, crypto.x509.parse_and_verify_certificates(_with_options)
// and any other builtin OPA marks nondeterministic. Time-based rules use
// input.execution.created_at instead of the clock. The pure net.cidr_*
// helpers stay available. print statements are compiled out.
//
// A builtin that fails at evaluation (a bad regex, to_number("x")) is
// undefined, as in OPA without strict builtin errors and as in OPA-compiled
// wasm, which cannot report the errors of the builtins compiled into the
// module: one rule for both engines (docs/policy.md, "Builtin errors and
// empty answers").
//
// [HostBuiltins] gives the wasm engine OPA's builtin implementations, with
// the same forbidden list ([Forbidden]).
package rego
