// Package canon computes step identity (docs/identity.md): the canonical form of a
// step's JSON arguments, its args_hash, and the step id.
//
// The canonical form is JSON with object keys sorted by their UTF-8 bytes,
// no insignificant whitespace, number literals kept exactly as received and
// strings escaped exactly as Go's encoding/json Marshal escapes them by
// default (see [Canonical] for the precise rules, including the control
// characters: \b \f \n \r \t, else \u00XX in lowercase hex). Inputs that
// cannot be canonicalised safely are rejected with an *[Error]: invalid
// JSON, trailing data, nesting deeper than [MaxDepth], duplicate keys,
// invalid UTF-8, lone surrogates, number literals longer than
// [MaxNumberLen].
//
// # Basics
//
// Canonicalise and hash a step's arguments, then derive its id:
//
//	canonical, argsHash, err := canon.ArgsHash(rawArgs)
//	if err != nil {
//		// A client error (HTTP 400): err.Error() says what and at which
//		// byte; errors.Is(err, canon.ErrDuplicateKey) and the other Err*
//		// values give the class, errors.As(err, &e) with e *canon.Error the offset.
//		return err
//	}
//	id := canon.StepID(executionID, "tool_call", "search", argsHash, occurrence)
//
// [Canonical] and [Hash] can be used separately; [ArgsHash] is both.
//
// # Test vectors
//
// testdata/vectors.json holds published vectors for canonical forms,
// args hashes, step ids and rejected inputs; other implementations (agent
// SDKs in other languages) can check themselves against it. The tests
// regenerate it with
//
//	go test ./kernel/canon -run TestVectors -update
//
// and cross-check every canonical vector against encoding/json.
package canon
