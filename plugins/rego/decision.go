package rego

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	opa "github.com/open-policy-agent/opa/v1/rego"

	"github.com/wicket-run/wicket/kernel/policy"
)

// decoded is what decisionGenerator hands back through OPA's result set: the
// decision read straight from the result term, or why it could not be read.
type decoded struct {
	d   *policy.Answer
	err error
}

// decisionGenerator returns the function that replaces OPA's AST-to-JSON
// conversion of the result of entry: it decodes the term into a Decision
// directly, which saves building a map[string]any and keeps the difference
// between a set and an array for error messages. It never fails, so that OPA
// does not rewrap the error.
func decisionGenerator(entry string) func(t *ast.Term, _ *opa.EvalContext) (any, error) {
	return func(t *ast.Term, _ *opa.EvalContext) (any, error) {
		d, err := decodeAnswer(entry, t.Value)
		return decoded{d: d, err: err}, nil
	}
}

// decodeAnswer maps the entrypoint's value to a decision (nil: no match):
// a decision object; null or an empty object, no match; unless the
// entrypoint is named decision, a boolean or a set (or array) of deny
// messages, mapped by policy.FromBoolean and policy.FromMessages, as the
// OPA-ABI wasm engine does.
func decodeAnswer(entry string, v ast.Value) (*policy.Answer, error) {
	if _, null := v.(ast.Null); null {
		return nil, nil
	}
	if !policy.AcceptsShapes(entry) {
		return decodeDecision(v, "want an object with a decision field")
	}
	switch x := v.(type) {
	case ast.Boolean:
		return policy.FromBoolean(entry, bool(x)), nil
	case ast.Set:
		return messages(entry, x.Sorted())
	case *ast.Array:
		return messages(entry, x)
	}
	return decodeDecision(v, "want an object with a decision field, a boolean or a set of deny messages")
}

// messages maps deny messages: strings as they are, objects with a msg
// string (Gatekeeper's violation shape) by it, anything else as its JSON.
func messages(entry string, arr *ast.Array) (*policy.Answer, error) {
	msgs := make([]string, 0, arr.Len())
	for i := range arr.Len() {
		e := arr.Elem(i).Value
		if s, ok := e.(ast.String); ok {
			msgs = append(msgs, string(s))
			continue
		}
		if obj, ok := e.(ast.Object); ok {
			if t := obj.Get(keyMsg); t != nil {
				if m, ok := t.Value.(ast.String); ok {
					msgs = append(msgs, string(m))
					continue
				}
			}
		}
		j, err := ast.JSON(e)
		if err != nil {
			return nil, fmt.Errorf("returned a deny message that is not JSON: %w", err)
		}
		b, err := json.Marshal(j)
		if err != nil {
			return nil, fmt.Errorf("returned a deny message that is not JSON: %w", err)
		}
		msgs = append(msgs, string(b))
	}
	return policy.FromMessages(entry, msgs), nil
}

// Field names of the decision object.
var (
	keyMsg       = ast.StringTerm("msg")
	keyDecision  = ast.StringTerm("decision")
	keyReason    = ast.StringTerm("reason")
	keyRuleID    = ast.StringTerm("rule_id")
	keyApproval  = ast.StringTerm("approval")
	keyRateLimit = ast.StringTerm("rate_limit")

	keyApprovers = ast.StringTerm("approvers")
	keyTimeout   = ast.StringTerm("timeout")
	keyMessage   = ast.StringTerm("message")

	keyMaxCalls       = ast.StringTerm("max_calls")
	keyWindow         = ast.StringTerm("window")
	keyPer            = ast.StringTerm("per")
	keyAlgorithm      = ast.StringTerm("algorithm")
	keyOnLimiterError = ast.StringTerm("on_limiter_error")
)

// decodeDecision reads a decision object; an empty object is no match
// (nil, nil). Errors complete the sentence "rego: entrypoint data.x.y ...".
func decodeDecision(v ast.Value, want string) (*policy.Answer, error) {
	obj, ok := v.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("returned %s, %s", describe(v), want)
	}
	if obj.Len() == 0 {
		// Partial-object and ref-head rules (decision.decision := "deny" if
		// ...) make the entrypoint an empty object when none of them holds.
		return nil, nil
	}
	f := fields{obj: obj}
	var d policy.Answer
	dt := f.get(keyDecision)
	if isAbsent(dt) {
		return nil, fmt.Errorf("returned an object without a decision field (keys: %s)", keyList(obj))
	}
	s, ok := dt.Value.(ast.String)
	if !ok {
		return nil, fmt.Errorf("returned an invalid decision: field decision is %s, want a string", describe(dt.Value))
	}
	d.Action = policy.Action(s)

	var err error
	if d.Reason, err = f.str("reason", keyReason); err != nil {
		return nil, invalid(err)
	}
	if d.RuleID, err = f.str("rule_id", keyRuleID); err != nil {
		return nil, invalid(err)
	}
	if d.Approval, err = decodeApproval(f.get(keyApproval)); err != nil {
		return nil, invalid(err)
	}
	if d.RateLimit, err = decodeRateLimit(f.get(keyRateLimit)); err != nil {
		return nil, invalid(err)
	}
	if err := f.unknown("", "decision", "reason", "rule_id", "approval", "rate_limit"); err != nil {
		return nil, invalid(err)
	}
	return &d, nil
}

func invalid(err error) error {
	return fmt.Errorf("returned an invalid decision: %w", err)
}

func decodeApproval(t *ast.Term) (*policy.Approval, error) {
	if isAbsent(t) {
		return nil, nil
	}
	obj, ok := t.Value.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("field approval is %s, want an object", describe(t.Value))
	}
	f := fields{obj: obj}
	var a policy.Approval
	var err error
	if a.Approvers, err = f.strs("approval.approvers", keyApprovers); err != nil {
		return nil, err
	}
	if a.Timeout, err = f.str("approval.timeout", keyTimeout); err != nil {
		return nil, err
	}
	if a.Message, err = f.str("approval.message", keyMessage); err != nil {
		return nil, err
	}
	if err := f.unknown("approval.", "approvers", "timeout", "message"); err != nil {
		return nil, err
	}
	return &a, nil
}

func decodeRateLimit(t *ast.Term) (*policy.RateLimit, error) {
	if isAbsent(t) {
		return nil, nil
	}
	obj, ok := t.Value.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("field rate_limit is %s, want an object", describe(t.Value))
	}
	f := fields{obj: obj}
	var rl policy.RateLimit
	var err error
	if mc := f.get(keyMaxCalls); !isAbsent(mc) {
		n, ok := mc.Value.(ast.Number)
		if !ok {
			return nil, fmt.Errorf("field rate_limit.max_calls is %s, want an integer", describe(mc.Value))
		}
		i, ok := policy.IntegerNumber(string(n))
		if !ok {
			return nil, fmt.Errorf("field rate_limit.max_calls is %s, want an integer", n)
		}
		rl.MaxCalls = i
	}
	if rl.Window, err = f.str("rate_limit.window", keyWindow); err != nil {
		return nil, err
	}
	if rl.Per, err = f.str("rate_limit.per", keyPer); err != nil {
		return nil, err
	}
	if rl.Algorithm, err = f.str("rate_limit.algorithm", keyAlgorithm); err != nil {
		return nil, err
	}
	if rl.OnLimiterError, err = f.str("rate_limit.on_limiter_error", keyOnLimiterError); err != nil {
		return nil, err
	}
	if err := f.unknown("rate_limit.", "max_calls", "window", "per", "algorithm", "on_limiter_error"); err != nil {
		return nil, err
	}
	return &rl, nil
}

// fields reads an object's known keys and counts them, so that unknown keys
// can be reported afterwards.
type fields struct {
	obj   ast.Object
	known int
}

func (f *fields) get(k *ast.Term) *ast.Term {
	t := f.obj.Get(k)
	if t != nil {
		f.known++
	}
	return t
}

// str reads an optional string field; null counts as absent.
func (f *fields) str(name string, k *ast.Term) (string, error) {
	t := f.get(k)
	if isAbsent(t) {
		return "", nil
	}
	s, ok := t.Value.(ast.String)
	if !ok {
		return "", fmt.Errorf("field %s is %s, want a string", name, describe(t.Value))
	}
	return string(s), nil
}

// strs reads an optional array or set of strings; a set comes out sorted.
func (f *fields) strs(name string, k *ast.Term) ([]string, error) {
	t := f.get(k)
	if isAbsent(t) {
		return nil, nil
	}
	var arr *ast.Array
	switch x := t.Value.(type) {
	case *ast.Array:
		arr = x
	case ast.Set:
		arr = x.Sorted()
	default:
		return nil, fmt.Errorf("field %s is %s, want an array of strings", name, describe(t.Value))
	}
	out := make([]string, 0, arr.Len())
	for i := range arr.Len() {
		e := arr.Elem(i)
		s, ok := e.Value.(ast.String)
		if !ok {
			return nil, fmt.Errorf("field %s[%d] is %s, want a string", name, i, describe(e.Value))
		}
		out = append(out, string(s))
	}
	return out, nil
}

// unknown reports the keys that are none of allowed. Every allowed key
// present was counted by get, so the common case costs no iteration.
func (f *fields) unknown(prefix string, allowed ...string) error {
	if f.obj.Len() == f.known {
		return nil
	}
	var names []string
	f.obj.Foreach(func(k, _ *ast.Term) {
		s, ok := k.Value.(ast.String)
		if !ok {
			names = append(names, prefix+k.String())
			return
		}
		if !slices.Contains(allowed, string(s)) {
			names = append(names, strconv.Quote(prefix+string(s)))
		}
	})
	sort.Strings(names)
	return fmt.Errorf("unknown field %s (want %s)", strings.Join(names, ", "), strings.Join(allowed, ", "))
}

func isAbsent(t *ast.Term) bool {
	if t == nil {
		return true
	}
	_, null := t.Value.(ast.Null)
	return null
}

// describe names a value's type with its article: "a string", "an object".
func describe(v ast.Value) string {
	switch v.(type) {
	case ast.Null:
		return "null"
	case ast.Object:
		return "an object"
	case *ast.Array:
		return "an array"
	default:
		return "a " + ast.ValueName(v)
	}
}

// keyList lists an object's keys for error messages.
func keyList(obj ast.Object) string {
	ks := make([]string, 0, obj.Len())
	for _, k := range obj.Keys() {
		ks = append(ks, k.String())
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}
