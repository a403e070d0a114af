package rules

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/kernel/policy"
)

// fuzzInputs are the fixed inputs a fuzzed rule set is evaluated on.
var fuzzInputs = []string{
	`{}`,
	`{"command":"ls -la","repo":"acme/web","labels":["bug","urgent"],"n":2,"nested":{"a":[1,{"b":"\u003cx\u003e"}]}}`,
	`[1,2,3]`,
	`"str"`,
	`{"a":{"b":{"c":{"d":[[[]]]}}}}`,
}

// FuzzRules parses fuzzed rules.yaml: Parse must never panic, only return
// *bundle.Error, and a parsed rule set must evaluate the fixed inputs
// without panicking, answering valid decisions.
func FuzzRules(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*/rules.yaml")
	for _, p := range seeds {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"default_action: allow\nrules:\n  - id: a\n    when: {arguments: {x.0: {equals: {a: [1, 2.0]}}, y: {contains: z, regex: '^z'}}}\n    then: {decision: deny}\n",
		"rules:\n  - id: b\n    priority: -3\n    when: {targets: ['*x?', 'a\\*'], step_kinds: [local], effects: [read_only]}\n    then: {decision: require_approval, approval_config: {approvers: [a]}, rate_limit: {max_calls: 1, window: 1s}}\n",
		"rules:\n  - id: c\n    when: {arguments: {n: {one_of: [1, 0x10, .5, null, true]}}}\n    then: {decision: abort}\n",
		"rules: [{id: d, then: {decision: allow}}, {id: d, then: {decision: allow}}]",
		"rules:\n  - &r {id: e, then: {decision: allow}}\n  - *r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		rs, err := Parse(src)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "rules.yaml") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		ev := rs.Evaluator()
		for _, kind := range []string{"tool_call", "llm_call", "local"} {
			for _, args := range fuzzInputs {
				in := &policy.Input{AgentID: "a", Step: policy.Step{Kind: kind, Target: "fs.read", Effect: "read_only", Args: json.RawMessage(args)}}
				d, err := ev.Evaluate(context.Background(), in)
				if err != nil {
					t.Fatal(err)
				}
				if err := d.Validate(); err != nil {
					t.Fatalf("invalid decision %+v: %v", d, err)
				}
			}
		}
		_ = rs.DefaultAction()
	})
}

// FuzzLookup checks the raw-bytes scanner against encoding/json: for every
// document the canonicaliser accepts, the value found at a path is the
// value a full decode finds there, in both the raw and the canonical form.
// On anything else the scanner must simply not panic.
func FuzzLookup(f *testing.F) {
	for _, s := range fuzzInputs {
		f.Add([]byte(s), "nested.a.1.b")
	}
	f.Add([]byte(` { "a" : [ 1 , { "\u0062" : "x\"y" } ] } `), "a.1.b")
	f.Add([]byte(`{"a":{"":1}}`), "a")
	f.Fuzz(func(t *testing.T, doc []byte, path string) {
		p, err := parsePath(path)
		if err != nil {
			return
		}
		s, e, ok := lookup(doc, p)
		if ok && (s < 0 || e > len(doc) || s >= e) {
			t.Fatalf("bounds %d..%d of %d", s, e, len(doc))
		}
		c, err := canon.Canonical(doc)
		if err != nil {
			return
		}
		want, wantOK := refLookup(t, c, p)
		for _, d := range [][]byte{doc, c} {
			s, e, ok := lookup(d, p)
			if ok != wantOK {
				t.Fatalf("lookup(%s, %q) found=%v, want %v", d, path, ok, wantOK)
			}
			if !ok {
				continue
			}
			got, err := canon.Canonical(d[s:e])
			if err != nil {
				t.Fatalf("lookup(%s, %q) = %s, not JSON: %v", d, path, d[s:e], err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("lookup(%s, %q) = %s, want %s", d, path, got, want)
			}
		}
	})
}

// refLookup walks a decoded document.
func refLookup(t *testing.T, doc []byte, p []pathSeg) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	for _, s := range p {
		switch c := v.(type) {
		case map[string]any:
			e, ok := c[s.key]
			if !ok {
				return nil, false
			}
			v = e
		case []any:
			if s.idx < 0 || s.idx >= len(c) {
				return nil, false
			}
			v = c[s.idx]
		default:
			return nil, false
		}
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out, true
}

// FuzzEqual checks equals against a decode-and-compare reference.
func FuzzEqual(f *testing.F) {
	f.Add([]byte(`{"a":[1,2.0,"x"]}`), []byte(`{"a":[1.0,2,"x"]}`))
	f.Add([]byte(`"a\u00e9"`), []byte(`"aé"`))
	f.Add([]byte(`1e2`), []byte(`100`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		ca, err1 := canon.Canonical(a)
		cb, err2 := canon.Canonical(b)
		if err1 != nil || err2 != nil {
			return
		}
		v, err := parseValue(cb)
		if err != nil {
			t.Fatal(err)
		}
		got := equal(ca, v)
		if want := refEqual(t, ca, cb); got != want {
			t.Fatalf("equal(%s, %s) = %v, want %v", ca, cb, got, want)
		}
	})
}

func refEqual(t *testing.T, a, b []byte) bool {
	decode := func(x []byte) any {
		d := json.NewDecoder(bytes.NewReader(x))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	var eq func(x, y any) bool
	eq = func(x, y any) bool {
		switch xv := x.(type) {
		case json.Number:
			yv, ok := y.(json.Number)
			return ok && numEqual([]byte(xv), []byte(yv)) // numbers: checked by TestNumEqual
		case map[string]any:
			yv, ok := y.(map[string]any)
			if !ok || len(xv) != len(yv) {
				return false
			}
			for k, e := range xv {
				f, ok := yv[k]
				if !ok || !eq(e, f) {
					return false
				}
			}
			return true
		case []any:
			yv, ok := y.([]any)
			if !ok || len(xv) != len(yv) {
				return false
			}
			for i := range xv {
				if !eq(xv[i], yv[i]) {
					return false
				}
			}
			return true
		}
		return x == y
	}
	return eq(decode(a), decode(b))
}

func TestMemo(t *testing.T) {
	// More distinct paths than memo slots, and repeated paths, some missing.
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := 0; i < maxMemo+4; i++ {
		b.WriteString("  - id: p" + strconv.Itoa(i) + "\n    when: {arguments: {k" + strconv.Itoa(i) + ": {equals: 1}, missing: {equals: 1}}}\n    then: {decision: deny}\n")
	}
	for i := 0; i < maxMemo+4; i++ {
		b.WriteString("  - id: q" + strconv.Itoa(i) + "\n    when: {arguments: {k" + strconv.Itoa(i) + ": {equals: " + strconv.Itoa(i) + "}}}\n    then: {decision: allow}\n")
	}
	rs := mustParse(t, b.String())
	for i := 0; i < maxMemo+4; i++ {
		args := `{"k` + strconv.Itoa(i) + `":` + strconv.Itoa(i) + `}`
		if got, want := ruleID(rs.Evaluate(input(t, "tool_call", "x", args))), "q"+strconv.Itoa(i); got != want {
			t.Errorf("args %s: got %s, want %s", args, got, want)
		}
	}
	if got := ruleID(rs.Evaluate(input(t, "tool_call", "x", `{"k1":1,"missing":1}`))); got != "p1" {
		t.Errorf("got %s, want p1", got)
	}
	if got := ruleID(rs.Evaluate(input(t, "tool_call", "x", `{"k19":1,"missing":1}`))); got != "p19" {
		t.Errorf("got %s, want p19", got)
	}
}
