package rego

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/builtins"
	"github.com/open-policy-agent/opa/v1/topdown/print"
)

// HostBuiltins gives OPA-compiled wasm modules the builtins OPA's wasm
// compiler leaves to the host (sprintf, time.*, most strings.*, crypto.*,
// yaml.*, …), implemented by OPA's own Go code: topdown's builtin registry,
// the code the Rego engine runs. It refuses, by name, the builtins
// [Forbidden] lists, so both engines allow the same builtins.
//
// The wasm engine takes it as its Config.Builtins; it satisfies that
// interface without either package importing the other. Its zero value is
// not usable; call [NewHostBuiltins]. It is safe for concurrent use.
type HostBuiltins struct {
	caps *ast.Capabilities
}

// NewHostBuiltins returns OPA's builtins for wasm hosts.
func NewHostBuiltins() *HostBuiltins {
	caps, _ := capabilities()
	return &HostBuiltins{caps: caps}
}

// Lookup returns the implementation of the builtin name for a bundle granted
// grants, or an error naming the builtin and saying why it is refused.
//
// The function it returns takes the builtin's arguments and returns its
// result as OPA values in Rego's value notation (what OPA's opa_value_dump
// writes and opa_value_parse reads). A nil result means undefined. As in
// OPA's evaluation without strict builtin errors (the rule of both Wicket
// engines), a builtin that fails makes its call undefined; the returned
// error is kept for what must stop the evaluation: malformed arguments and
// cancellation.
func (h *HostBuiltins) Lookup(name string, grants []string) (func(ctx context.Context, args [][]byte) ([]byte, error), error) {
	if why := Forbidden(name, grants); why != "" {
		return nil, fmt.Errorf("builtin %s is not allowed in wicket policies: %s", name, why)
	}
	decl, ok := ast.BuiltinMap[name]
	f := topdown.GetBuiltin(name)
	if !ok || f == nil {
		return nil, fmt.Errorf("builtin %s is not one of OPA's builtins", name)
	}
	arity := len(decl.Decl.FuncArgs().Args)
	seeded := slices.Contains(grants, grantRandom)
	clock := slices.Contains(grants, grantClock)
	return func(ctx context.Context, args [][]byte) ([]byte, error) {
		if len(args) != arity {
			return nil, fmt.Errorf("builtin %s takes %d arguments, called with %d", name, arity, len(args))
		}
		terms := make([]*ast.Term, len(args))
		for i, a := range args {
			t, err := parseValue(a)
			if err != nil {
				return nil, fmt.Errorf("builtin %s: argument %d: %w", name, i+1, err)
			}
			terms[i] = t
		}
		if err := checkAmplification(name, terms); err != nil {
			return nil, err
		}
		st, _ := ctx.Value(evalStateKey{}).(*evalState)
		if st == nil {
			st = &evalState{}
		}
		bctx := topdown.BuiltinContext{
			Context:      ctx,
			Metrics:      noMetrics,
			Cache:        st.memo(),
			Capabilities: h.caps,
			Location:     &ast.Location{File: "policy.wasm"},
		}
		if clock {
			bctx.Time = st.now()
		}
		if seeded {
			bctx.Seed = rand.Reader
		}
		if st.stdout != nil {
			bctx.PrintHook = st
		}
		cancel := topdown.NewCancel()
		bctx.Cancel = cancel
		stop := context.AfterFunc(ctx, cancel.Cancel)
		var out *ast.Term
		err := f(bctx, terms, func(t *ast.Term) error {
			out = t
			return nil
		})
		stop()
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return nil, fmt.Errorf("builtin %s: %w", name, cerr)
			}
			var halt topdown.Halt
			if errors.As(err, &halt) {
				return nil, fmt.Errorf("builtin %s: %w", name, halt.Err)
			}
			return nil, nil // undefined, as OPA without strict builtin errors
		}
		if out == nil {
			// A builtin without a result (internal.print) answers true.
			if decl.Decl.Result() == nil {
				return []byte("true"), nil
			}
			return nil, nil
		}
		return appendValue(nil, out.Value)
	}, nil
}

// Evaluation returns ctx carrying the state the builtin calls of one
// evaluation share: OPA's per-evaluation builtin cache (two calls of
// rand.intn("k", n) agree within an evaluation), the evaluation's time (for
// time.now_ns, when the clock is granted) and where print output goes
// (stdout may be nil: print does nothing).
func (h *HostBuiltins) Evaluation(ctx context.Context, stdout io.Writer) context.Context {
	return context.WithValue(ctx, evalStateKey{}, &evalState{stdout: stdout})
}

type evalStateKey struct{}

// evalState is shared by the builtin calls of one evaluation, which runs on
// one goroutine.
type evalState struct {
	cache  builtins.Cache
	start  *ast.Term
	stdout io.Writer
}

func (s *evalState) memo() builtins.Cache {
	if s.cache == nil {
		s.cache = builtins.Cache{}
	}
	return s.cache
}

func (s *evalState) now() *ast.Term {
	if s.start == nil {
		s.start = ast.NumberTerm(json.Number(strconv.FormatInt(time.Now().UnixNano(), 10)))
	}
	return s.start
}

// Print implements OPA's print.Hook.
func (s *evalState) Print(_ print.Context, msg string) error {
	_, err := io.WriteString(s.stdout, msg+"\n")
	return err
}

// maxValueDepth bounds the nesting of a builtin argument.
const maxValueDepth = 1000

// parseValue reads an OPA value in Rego's value notation. JSON, which is
// what opa_value_dump writes for anything without sets or non-string keys,
// takes the fast JSON decoder; the rest goes through OPA's parser and must
// be a ground value (no references, variables or comprehensions).
func parseValue(b []byte) (*ast.Term, error) {
	if t, err := jsonTerm(b); err == nil {
		return t, nil
	}
	t, err := ast.ParseTerm(string(b))
	if err != nil {
		return nil, err
	}
	if !t.IsGround() {
		return nil, fmt.Errorf("not a value: %s", clipText(string(b)))
	}
	var bad error
	ast.WalkTerms(t, func(x *ast.Term) bool {
		switch x.Value.(type) {
		case ast.Null, ast.Boolean, ast.Number, ast.String, *ast.Array, ast.Object, ast.Set:
			return false
		}
		bad = fmt.Errorf("not a value: %s", clipText(x.String()))
		return true
	})
	return t, bad
}

func clipText(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// appendValue writes v in Rego's value notation for opa_value_parse: JSON,
// except that sets are {a, b} (set() when empty) and object keys may be any
// value. Strings use JSON escapes, which OPA's parser reads, where Go's %q
// (ast.String.String) would write \x escapes it does not.
func appendValue(b []byte, v ast.Value) ([]byte, error) {
	return appendValueDepth(b, v, 0)
}

func appendValueDepth(b []byte, v ast.Value, depth int) ([]byte, error) {
	if depth > maxValueDepth {
		return nil, fmt.Errorf("value nested deeper than %d", maxValueDepth)
	}
	var err error
	switch x := v.(type) {
	case ast.Null:
		return append(b, "null"...), nil
	case ast.Boolean:
		return strconv.AppendBool(b, bool(x)), nil
	case ast.Number:
		return appendNumber(b, x)
	case ast.String:
		return appendString(b, string(x)), nil
	case *ast.Array:
		b = append(b, '[')
		for i := range x.Len() {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendValueDepth(b, x.Elem(i).Value, depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case ast.Object:
		b = append(b, '{')
		first := true
		err = x.Iter(func(k, e *ast.Term) error {
			if !first {
				b = append(b, ',')
			}
			first = false
			var err error
			if b, err = appendValueDepth(b, k.Value, depth+1); err != nil {
				return err
			}
			b = append(b, ':')
			b, err = appendValueDepth(b, e.Value, depth+1)
			return err
		})
		if err != nil {
			return nil, err
		}
		return append(b, '}'), nil
	case ast.Set:
		if x.Len() == 0 {
			return append(b, "set()"...), nil
		}
		b = append(b, '{')
		first := true
		err = x.Iter(func(e *ast.Term) error {
			if !first {
				b = append(b, ',')
			}
			first = false
			var err error
			b, err = appendValueDepth(b, e.Value, depth+1)
			return err
		})
		if err != nil {
			return nil, err
		}
		return append(b, '}'), nil
	default:
		return nil, fmt.Errorf("result is not a value: %s", clipText(v.String()))
	}
}

// appendNumber writes a number as a JSON number. OPA numbers are JSON
// number literals already, except big ones made by arithmetic, which
// big.Float formats.
func appendNumber(b []byte, n ast.Number) ([]byte, error) {
	s := string(n)
	if validNumber(s) {
		return append(b, s...), nil
	}
	f, ok := new(big.Float).SetString(s)
	if !ok {
		return nil, fmt.Errorf("result is not a number: %s", clipText(s))
	}
	return f.Append(b, 'g', -1), nil
}

// validNumber reports whether s is a JSON number literal.
func validNumber(s string) bool {
	d := jsonDecoder{b: []byte(s)}
	if s == "" || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return false
	}
	_, err := d.number()
	return err == nil && d.i == len(s)
}

// appendString writes s as a JSON string; invalid UTF-8 becomes U+FFFD, as
// encoding/json does.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c >= 0x20:
				b = append(b, c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, "\ufffd"...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
