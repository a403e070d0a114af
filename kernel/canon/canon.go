package canon

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strconv"
)

// Limits enforced by [Canonical]. Inputs beyond them are rejected rather than
// canonicalised, because they cannot be canonicalised safely or cheaply.
const (
	// MaxDepth is the deepest allowed nesting of arrays and objects: a value
	// inside 256 levels of brackets is accepted, one more level is
	// [ErrTooDeep].
	MaxDepth = 256
	// MaxNumberLen is the longest allowed number literal, in bytes
	// (sign, digits, fraction and exponent included). Longer is
	// [ErrNumberTooLong].
	MaxNumberLen = 256
	// MaxInputLen is the longest accepted input, in bytes ([ErrTooLarge]).
	// It is far beyond any request size the server accepts; it exists
	// because the parser indexes the input with 32-bit offsets.
	MaxInputLen = math.MaxInt32
)

// Canonical parses the JSON text raw and returns its canonical form
// (docs/identity.md):
//
//   - object members sorted by the UTF-8 bytes of their (unescaped) keys;
//     this is not the UTF-16 order of RFC 8785 (JCS): U+FF61 sorts before
//     U+1F600 here;
//   - no insignificant whitespace;
//   - number literals copied exactly as received (1.0 stays 1.0, 1E+2 stays
//     1E+2, -0 stays -0, big integers keep every digit), after checking
//     them against the JSON number grammar;
//   - literals true, false, null as is;
//   - strings unescaped and re-escaped exactly as encoding/json's Marshal
//     does by default in Go 1.26: \" and \\; \b \f \n \r \t for U+0008,
//     U+000C, U+000A, U+000D, U+0009; every other control character below
//     U+0020 as \u00XX with lowercase hex (e.g. \u0000, \u001f); <, >, & as
//     \u003c \u003e \u0026; U+2028 and U+2029 as \u2028 \u2029; everything
//     else, including '/', U+007F and all other non-ASCII characters, as raw
//     UTF-8. An input escape such as \u00e9 or \/ is decoded first, so
//     "\u00e9" becomes "é" and "\/" becomes "/".
//
// Note on control characters: the rule (docs/identity.md) is encoding/json's
// default escaping, which writes U+0008 and U+000C as \b and \f (Go 1.22 and
// later; verified on Go 1.26.8), and Canonical does the same. Canonical does not
// call encoding/json, so a future change there cannot move args hashes; the
// tests would report the divergence.
//
// For every input Canonical accepts, the result is byte-for-byte what
// json.Marshal produces for the value decoded by a json.Decoder with
// UseNumber into an any (the tests and the fuzzer check this). Canonical
// differs from that round trip in rejecting what encoding/json silently
// accepts or repairs (duplicate keys, invalid UTF-8, lone surrogates), in
// its limits, and in speed: it builds no value tree and, for typical
// inputs, allocates only the result.
//
// Canonical rejects, with an *[Error] (use errors.Is with the Err* values):
// anything that is not exactly one JSON value surrounded by optional
// whitespace ([ErrSyntax], [ErrTrailingData]), nesting deeper than
// [MaxDepth] ([ErrTooDeep]), duplicate object keys after unescaping
// ([ErrDuplicateKey]), invalid UTF-8 ([ErrInvalidUTF8]), \u escapes of
// unpaired surrogates ([ErrLoneSurrogate]), number literals longer than
// [MaxNumberLen] ([ErrNumberTooLong]) and inputs longer than [MaxInputLen]
// ([ErrTooLarge]).
//
// Canonical does not retain raw. It is safe for concurrent use.
func Canonical(raw []byte) ([]byte, error) {
	if len(raw) > MaxInputLen {
		return nil, newError(ErrTooLarge, MaxInputLen, "input longer than "+strconv.Itoa(MaxInputLen)+" bytes")
	}
	p := getParser(raw)
	defer putParser(p)
	if err := p.parse(); err != nil {
		return nil, err
	}
	out := make([]byte, 0, p.outLen)
	out = p.emit(out, 0)
	return out, nil
}

// Hash returns the lowercase hex SHA-256 of canonical, the args_hash of
// docs/identity.md. It hashes the bytes it is given; pass the output of [Canonical].
func Hash(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	var dst [2 * sha256.Size]byte
	hex.Encode(dst[:], sum[:])
	return string(dst[:])
}

// ArgsHash canonicalises raw with [Canonical] and hashes the result with
// [Hash]. On error it returns the error of Canonical and no hash.
func ArgsHash(raw []byte) (canonical []byte, hash string, err error) {
	canonical, err = Canonical(raw)
	if err != nil {
		return nil, "", err
	}
	return canonical, Hash(canonical), nil
}

// StepID returns the deterministic id of a step (docs/identity.md): the lowercase hex
// SHA-256 of the concatenation, for each field f of
// [executionID, kind, target, argsHash, decimal(occurrence)], of
// decimal(len(f)) + ":" + f, where len counts bytes and decimal is the
// base-10 form without leading zeros (a negative occurrence, which the
// kernel never produces, would be written with a leading '-').
//
// The length prefixes make the encoding injective: no two different field
// tuples hash the same bytes. argsHash is normally the result of [Hash].
func StepID(executionID, kind, target, argsHash string, occurrence int) string {
	var stack [256]byte
	buf := stack[:0]
	buf = appendField(buf, executionID)
	buf = appendField(buf, kind)
	buf = appendField(buf, target)
	buf = appendField(buf, argsHash)
	var occ [24]byte
	o := strconv.AppendInt(occ[:0], int64(occurrence), 10)
	buf = strconv.AppendInt(buf, int64(len(o)), 10)
	buf = append(buf, ':')
	buf = append(buf, o...)
	return Hash(buf)
}

func appendField(buf []byte, f string) []byte {
	buf = strconv.AppendInt(buf, int64(len(f)), 10)
	buf = append(buf, ':')
	return append(buf, f...)
}
