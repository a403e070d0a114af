package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/server/wire"
)

func TestDecode(t *testing.T) {
	type inner struct {
		B int `json:"b"`
	}
	type req struct {
		A  string          `json:"a"`
		N  int             `json:"n"`
		I  inner           `json:"i"`
		L  []int           `json:"l"`
		M  map[string]bool `json:"m"`
		IS []inner         `json:"is"`
		IP *inner          `json:"ip"`
		Sk string          `json:"sk"`
	}
	tests := []struct {
		name    string
		body    string
		wantErr string // "" = ok; otherwise a substring of the message
	}{
		{"object", `{"a":"x","n":1}`, ""},
		{"empty body is {}", ``, ""},
		{"whitespace body is {}", " \n ", ""},
		{"unknown fields ignored", `{"a":"x","future":{"z":[1,2]}}`, ""},
		{"escaped duplicate keys", `{"a":"x","\u0062":1,"b":2}`, `duplicate key "b"`},
		{"trailing whitespace", "{\"a\":\"x\"}\n\t ", ""},
		{"array", `[1,2]`, "must be a JSON object, got an array"},
		{"string", `"x"`, "must be a JSON object, got a string"},
		{"number", `12`, "must be a JSON object, got a number"},
		{"null", `null`, "must be a JSON object, got null"},
		{"malformed", `{"a":}`, "malformed JSON at byte offset"},
		{"truncated", `{"a":"x"`, "unexpected end"},
		{"trailing data", `{"a":"x"} {"a":"y"}`, "unexpected data after the top-level object"},
		{"trailing garbage", `{"a":"x"}x`, "unexpected data after the top-level object"},
		{"duplicate top-level key", `{"a":"x","a":"y"}`, `duplicate key "a" in the top-level object`},
		{"duplicate via escape", `{"a":"x","\u0061":"y"}`, `duplicate key "a"`},
		{"duplicate nested", `{"i":{"b":1,"b":2}}`, `duplicate key "b" in i`},
		{"duplicate in array", `{"l":[1],"m":{},"x":[{"k":1},{"k":1,"k":2}]}`, `duplicate key "k" in x[1]`},
		{"wrong type", `{"n":"one"}`, "field n: expected an integer, got JSON string"},
		{"wrong nested type", `{"i":{"b":true}}`, "field i.b: expected an integer, got JSON bool"},
		{"invalid utf-8", "{\"a\":\"\xff\"}", "not valid UTF-8"},
		// Field names are case-sensitive: encoding/json would take "A" for
		// "a" (and the last of the two would win).
		{"case variant overrides", `{"a":"x","A":"y"}`, `field "A" in the top-level object is not "a"`},
		{"case variant alone", `{"N":1}`, `field "N" in the top-level object is not "n"`},
		{"case variant nested", `{"i":{"B":1}}`, `field "B" in i is not "b"`},
		{"case variant through a pointer", `{"ip":{"B":1}}`, `field "B" in ip is not "b"`},
		{"case variant in an array of objects", `{"is":[{"b":1},{"B":2}]}`, `field "B" in is[1] is not "b"`},
		{"case variant by Unicode folding", "{\"\u017fk\":\"x\"}", `is not "sk"`}, // ſ folds to s
		{"case variant escaped", `{"\u0041":"y"}`, `field "A"`},
		{"free-form keys keep their case", `{"m":{"X":true,"x":false},"future":{"A":1,"a":2}}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r req
			err := decode([]byte(tc.body), &r)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestDuplicateKeysManyKeys(t *testing.T) {
	var b strings.Builder
	b.WriteString("{")
	for i := 0; i < 100; i++ {
		b.WriteString(`"k` + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `":1,`)
	}
	b.WriteString(`"ka":2}`) // "ka" alone is new; "kaa" exists
	if err := checkDuplicateKeys([]byte(b.String())); err != nil {
		t.Fatalf("no duplicate expected: %v", err)
	}
	dup := strings.TrimSuffix(b.String(), `"ka":2}`) + `"kza":2}`
	if err := checkDuplicateKeys([]byte(dup)); err == nil {
		t.Fatal("duplicate among many keys not found")
	}
}

// TestMalformedBodies drives the strict decoding through the HTTP routes.
func TestMalformedBodies(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	steps := "/v0/executions/" + r.id + "/steps"
	deep := `{"kind":"tool_call","target":"t","args":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}`
	tests := []struct {
		name string
		body string
		want string
	}{
		{"malformed JSON", `{"kind":"tool_call",`, "malformed JSON"},
		{"not an object", `["tool_call"]`, "must be a JSON object"},
		{"trailing data", `{"kind":"local","target":"t"}{}`, "unexpected data after"},
		{"duplicate top-level key", `{"kind":"local","kind":"tool_call","target":"t"}`, `duplicate key "kind"`},
		{"duplicate key in args", `{"kind":"tool_call","target":"t","args":{"to":"alice","to":"mallory"}}`, `duplicate key "to" in args`},
		{"deep nesting in args", deep, "nesting too deep"},
		{"args not JSON", `{"kind":"tool_call","target":"t","args":NaN}`, "malformed JSON"},
		{"lone surrogate in args", `{"kind":"tool_call","target":"t","args":"\ud800"}`, "surrogate"},
		// A step's target is part of its identity: encoding/json read a lone
		// surrogate escape as U+FFFD, so "t\ud800" and "t\udfff" were
		// recorded as one target "t\ufffd" (and one step id), a value the
		// agent never sent, while the same code point sent raw (invalid
		// UTF-8) was refused.
		{"lone surrogate in target", `{"kind":"tool_call","target":"t\ud800","args":{}}`, "surrogate"},
		{"lone low surrogate in target", `{"kind":"tool_call","target":"\udfff","args":{}}`, "surrogate"},
		{"surrogates reversed in target", `{"kind":"tool_call","target":"\ude00\ud83d","args":{}}`, "surrogate"},
		{"lone surrogate in an unknown field", `{"kind":"tool_call","target":"t","note":"\\\ud800"}`, "surrogate"},
		{"huge number literal in args", `{"kind":"tool_call","target":"t","args":` + strings.Repeat("9", 300) + `}`, "number literal too long"},
		{"kind wrong type", `{"kind":1,"target":"t"}`, "field kind: expected a string"},
		{"bad kind", `{"kind":"shell","target":"t"}`, `kind "shell" is invalid`},
		{"no target", `{"kind":"local"}`, "target is required"},
		{"bad effect", `{"kind":"local","target":"t","effect":"nuclear"}`, "effect"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := e.agent(r.as, "POST", steps, rawBody(tc.body)).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
			if !strings.Contains(body.Message, tc.want) {
				t.Fatalf("message %q does not say %q", body.Message, tc.want)
			}
		})
	}
	// None of them recorded a step.
	var l wire.StepList
	e.admin("GET", steps, nil).want(t, http.StatusOK).decode(t, &l)
	if len(l.Steps) != 0 {
		t.Fatalf("steps recorded: %+v", l)
	}
	// An escaped backslash before a u is no escape, and a pair is one
	// character: both accepted.
	for _, target := range []string{`t\\ud800`, `t\ud83d\ude00`} {
		e.agent(r.as, "POST", steps, rawBody(`{"kind":"tool_call","target":"`+target+`","args":{}}`)).want(t, http.StatusOK)
	}
	// Client routes decode the same way.
	e.admin("POST", "/v0/executions", rawBody(`{"agent_id":"bot"`)).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("POST", "/v0/executions", rawBody(`{"agent_id":"bot","labels":{"team":"\udc00"}}`)).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	e.admin("POST", "/v0/executions", rawBody(`"bot"`)).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
}

func TestBodyTooLarge(t *testing.T) {
	e := newEnv(t, func(o *envOpts) { o.scfg.MaxBodyBytes = 4096 })
	r := e.start("bot")
	big := `{"kind":"tool_call","target":"t","args":"` + strings.Repeat("x", 5000) + `"}`
	// Agent route: the body is read (and refused) before the signature is checked.
	e.agent(r.as, "POST", "/v0/executions/"+r.id+"/steps", rawBody(big)).wantErr(t, http.StatusRequestEntityTooLarge, wire.CodeTooLarge)
	e.admin("POST", "/v0/executions", rawBody(big)).wantErr(t, http.StatusRequestEntityTooLarge, wire.CodeTooLarge)
	// Without a Content-Length (chunked), MaxBytesReader catches it.
	req, _ := http.NewRequest("POST", e.ts.URL+"/v0/executions", struct{ *bytes.Reader }{bytes.NewReader([]byte(big))})
	req.Header.Set("Authorization", "Bearer "+testAdminKey)
	res, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked: status %d", res.StatusCode)
	}
	// Exactly at the limit is fine (and then merely a bad request).
	atLimit := `{"agent_id":"ghost","input":"` + strings.Repeat("x", 4096-len(`{"agent_id":"ghost","input":""}`)) + `"}`
	if len(atLimit) != 4096 {
		t.Fatalf("len %d", len(atLimit))
	}
	e.admin("POST", "/v0/executions", rawBody(atLimit)).wantErr(t, http.StatusNotFound, wire.CodeNotFound)
}

func TestDefaultBodyLimit(t *testing.T) {
	e := newEnv(t)
	big := `{"agent_id":"bot","input":"` + strings.Repeat("x", 1<<20) + `"}`
	e.admin("POST", "/v0/executions", rawBody(big)).wantErr(t, http.StatusRequestEntityTooLarge, wire.CodeTooLarge)
}

// FuzzDecode holds the strict body decoder to independent references:
// kernel/canon's parser (which finds duplicate keys itself) and
// encoding/json. A body canon accepts and that is an object decodes; a
// valid body in which canon finds a duplicate key is refused for it; and
// nothing panics, whatever the bytes.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"a":"x","n":1}`, `{"a":"x","\u0062":1,"b":2}`, `{"i":{"b":1,"b":2}}`,
		`{"x":[{"k":1},{"k":1,"k":2}]}`, `[1]`, `{"a":}`, "{\"a\":\"\xff\"}", `{"a":"\ud800","b":1}`, `{"a":1} x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var v map[string]any
		err := decode(body, &v)
		trimmed := bytes.TrimLeft(body, " \t\r\n")
		if len(trimmed) == 0 {
			if err != nil {
				t.Fatalf("empty body: %v", err)
			}
			return
		}
		if err != nil && !errors.Is(err, kernel.ErrValidation) {
			t.Fatalf("%q: error %v is not a validation error", body, err)
		}
		valid := utf8.Valid(body) && json.Valid(body)
		if !valid || trimmed[0] != '{' {
			if err == nil {
				t.Fatalf("%q: accepted", body)
			}
			return
		}
		if err := checkDuplicateKeys(body); err != nil && !strings.Contains(err.Error(), "duplicate key") && !strings.Contains(err.Error(), "lone surrogate") {
			t.Fatalf("%q: %v", body, err)
		}
		_, cerr := canon.Canonical(body)
		switch {
		case cerr == nil && err != nil:
			t.Fatalf("%q: canonical JSON object refused: %v", body, err)
		case errors.Is(cerr, canon.ErrDuplicateKey) && (err == nil || !strings.Contains(err.Error(), "duplicate key") && !strings.Contains(err.Error(), "lone surrogate")):
			t.Fatalf("%q: canon finds a duplicate key (%v), decode says %v", body, cerr, err)
		case errors.Is(cerr, canon.ErrLoneSurrogate) && err == nil:
			t.Fatalf("%q: canon finds a lone surrogate (%v), decode accepts it", body, cerr)
		}
	})
}

// TestCaseVariantFieldsRefused: over HTTP, a body that names a field in
// another case is refused and records nothing. Before, encoding/json took
// {"agent_id": "bot", "AGENT_ID": "other"} as agent "other" (the last one).
func TestCaseVariantFieldsRefused(t *testing.T) {
	e := newEnv(t)
	res := e.admin("POST", "/v0/executions", rawBody(`{"agent_id":"bot","AGENT_ID":"other"}`))
	if msg := res.wantErr(t, http.StatusBadRequest, wire.CodeValidation).Message; !strings.Contains(msg, `"AGENT_ID"`) || !strings.Contains(msg, `"agent_id"`) {
		t.Fatalf("message %q must name both", msg)
	}
	var l wire.ExecutionList
	e.admin("GET", "/v0/executions", nil).want(t, http.StatusOK).decode(t, &l)
	if len(l.Executions) != 0 {
		t.Fatalf("an execution was created: %+v", l.Executions)
	}
	// The same in a nested object and on an agent route.
	e.admin("POST", "/v0/policy/eval", rawBody(`{"agent_id":"bot","step":{"kind":"tool_call","target":"x","Target":"wire_money"}}`)).
		wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	r := e.start("bot")
	e.agent(r.as, "POST", "/v0/executions/"+r.id+"/steps", rawBody(`{"kind":"tool_call","target":"x","TARGET":"forbidden"}`)).
		wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	// An approval decided_by in another case cannot slip past the decider check.
	e.admin("POST", "/v0/approvals/nope/grant", rawBody(`{"Decided_By":"alice"}`)).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
}

// checkFast compares decodeFast with encoding/json's path for body: when
// the fast path takes a body, the full path must give the same error (from
// checkKeys, which both run) or none and the same value.
func checkFast[T any](t *testing.T, body []byte) (taken bool) {
	t.Helper()
	if !utf8.Valid(body) {
		return false
	}
	var fast T
	if !decodeFast(body, &fast) {
		var zero T
		if !reflect.DeepEqual(fast, zero) {
			t.Fatalf("decodeFast declined %q but changed the value: %#v", body, fast)
		}
		return false
	}
	// decode runs checkKeys after the fast path; the full path runs it too.
	errFast := checkKeys(body, schemaOf(reflect.TypeOf(&fast)))
	var full T
	errFull := decodeFull(body, &full)
	if (errFast == nil) != (errFull == nil) || (errFull != nil && errFast.Error() != errFull.Error()) {
		t.Fatalf("decodeFast took %q: fast path error %v, full path error %v", body, errFast, errFull)
	}
	if errFull == nil && !reflect.DeepEqual(fast, full) {
		t.Fatalf("decodeFast and encoding/json disagree on %q:\nfast %#v\nfull %#v", body, fast, full)
	}
	return true
}

func TestDecodeFast(t *testing.T) {
	for _, c := range []struct {
		body string
		fast bool
	}{
		{`{"kind":"tool_call","target":"search","args":{"n":1,"q":"a b"}}`, true},
		{` { "kind" : "local" , "target" : "now", "result" : "2026-12-01T00:00:00Z", "reconcile" : true } `, true},
		{`{"kind":"tool_call","target":"x","args":null,"idempotency":"at_most_once","effect":"read_only","reconcile":false}`, true},
		{`{"kind":"tool_call","target":"x","args":[1, {"a" : [true,null,-1.5e3]}, "\u00e9\"\\"]}`, true},
		{`{"kind":"tool_call","target":"x","args":12}`, true},
		{`{"kind":"tool_call","target":"x","args":"s"}`, true},
		{`{"target":"café","kind":"llm_call"}`, true},
		{`{}`, true},
		{`{"kind":"tool_call","kind":"local"}`, false}, // duplicate: the full path's error
		{`{"Kind":"tool_call"}`, false},                // case-folded key
		{`{"kind":"tool\u005fcall"}`, false},           // escape
		{`{"kind":"tool_call","other":1}`, false},      // unknown key: ignored by the full path
		{`{"kind":1}`, false},                          // wrong type
		{`{"kind":null}`, false},                       // null string
		{`{"kind":"x","args":{"a":1}`, false},          // truncated
		{`{"kind":"x"} {}`, false},                     // trailing data
		{`{"kind":"x","args":tru}`, false},             // invalid raw
		{`{"kind":"x","reconcile":truex}`, false},      // not a literal
		{`{"kind":"x","reconcile":"true"}`, false},     // a string for a bool
		{`{"kind":"x","args":{"a":1,"a":2}}`, true},    // inner duplicate: checkKeys refuses it after
		{`{"kind":"x",}`, false},                       // trailing comma
	} {
		var got bool
		if got = checkFast[wire.StepSubmitRequest](t, []byte(c.body)); got != c.fast {
			t.Errorf("%s: fast path taken %v, want %v", c.body, got, c.fast)
		}
	}
	for _, c := range []struct {
		body string
		fast bool
	}{
		{`{"result":{"hits":3}}`, true},
		{`{"result":null}`, true},
		{`{}`, true},
		{`{"result":1,"usage":{"total_tokens":3}}`, false},
		{`{"error":"x"}`, false},
	} {
		if got := checkFast[wire.StepCompleteRequest](t, []byte(c.body)); got != c.fast {
			t.Errorf("%s: fast path taken %v, want %v", c.body, got, c.fast)
		}
	}
	// Through decode: an inner duplicate key is still refused.
	var req wire.StepSubmitRequest
	if err := decode([]byte(`{"kind":"x","args":{"a":1,"a":2}}`), &req); err == nil {
		t.Error("decode accepted a duplicate key inside args")
	}
}

func FuzzDecodeFast(f *testing.F) {
	for _, s := range []string{
		`{"kind":"tool_call","target":"search","args":{"n":1,"q":"a b"}}`,
		`{"kind":"local","target":"now","result":"x","reconcile":true}`,
		`{"result":{"hits":[1,2]}}`,
		`{"args":[1,"\u00e9",{"b":null}],"effect":"read_only"}`,
		` {"kind" : "x" , "args" : -0.5e-3 } `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFast[wire.StepSubmitRequest](t, body)
		checkFast[wire.StepCompleteRequest](t, body)
	})
}

// checkKeysRef is checkKeys as first written (keys as strings, paths built
// as objects open): the reference checkKeys must match, error text
// included (FuzzCheckKeys).
func checkKeysRef(b []byte, sc *schema) error {
	type frame struct {
		obj  bool
		keys []string
		set  map[string]int
		path string
		idx  int
		sc   *schema
	}
	var stack []frame
	var lastKey string
	i := 0
	childPath := func() string {
		if len(stack) == 0 {
			return ""
		}
		f := &stack[len(stack)-1]
		if f.obj {
			return joinPath(f.path, lastKey)
		}
		return fmt.Sprintf("%s[%d]", f.path, f.idx)
	}
	expectKey := false
	for i < len(b) {
		c := b[i]
		switch c {
		case '{', '[':
			p := childPath()
			vsc := sc
			if len(stack) > 0 {
				f := &stack[len(stack)-1]
				vsc = f.sc.child([]byte(lastKey), f.obj)
			}
			stack = append(stack, frame{obj: c == '{', path: p, sc: vsc})
			expectKey = c == '{'
			i++
		case '}', ']':
			stack = stack[:len(stack)-1]
			expectKey = false
			i++
		case ',':
			f := &stack[len(stack)-1]
			if f.obj {
				expectKey = true
			} else {
				f.idx++
			}
			i++
		case '"':
			j := i + 1
			esc := false
			for ; j < len(b); j++ {
				if b[j] == '\\' {
					esc = true
					j++
					continue
				}
				if b[j] == '"' {
					break
				}
			}
			if expectKey {
				key := string(b[i+1 : j])
				if esc {
					var s string
					if err := json.Unmarshal(b[i:j+1], &s); err == nil {
						key = s
					}
				}
				f := &stack[len(stack)-1]
				dup := false
				if f.set != nil {
					_, dup = f.set[key]
					f.set[key] = 0
				} else {
					for _, k := range f.keys {
						dup = dup || k == key
					}
					f.keys = append(f.keys, key)
					if len(f.keys) > 16 {
						f.set = make(map[string]int, 2*len(f.keys))
						for _, k := range f.keys {
							f.set[k] = 0
						}
						f.keys = nil
					}
				}
				where := f.path
				if where == "" {
					where = "the top-level object"
				}
				if dup {
					return errorf(kernel.CodeValidation, "malformed JSON: duplicate key %q in %s at byte offset %d", key, where, i)
				}
				if name, ok := f.sc.foldedField([]byte(key)); ok {
					return errorf(kernel.CodeValidation, "field %q in %s is not %q: field names are case-sensitive", key, where, name)
				}
				lastKey = key
				expectKey = false
			}
			i = j + 1
		default:
			i++
		}
	}
	return nil
}

// FuzzCheckKeys compares checkKeys with checkKeysRef on valid JSON, under
// no schema and the schemas of request types with nested fields.
func FuzzCheckKeys(f *testing.F) {
	for _, s := range []string{
		`{"kind":"x","args":{"a":1,"a":2}}`,
		`{"Kind":"x"}`,
		`{"agent_id":"a","limits":{"Max_Steps":1}}`,
		`{"a":[{"b":1},{"c":[{"d":1,"d":2}]}]}`,
		`{"k\u0069nd":1,"kind":2}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17,"a":18}`,
		`{"x":{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17,"r":{"s":1,"s":1}}}`,
		`[{"a":{"b":[[{"c":1,"c":1}]]}}]`,
	} {
		f.Add([]byte(s))
	}
	schemas := []*schema{nil, schemaOf(reflect.TypeOf(&wire.StepSubmitRequest{})), schemaOf(reflect.TypeOf(&wire.CreateExecutionRequest{})),
		schemaOf(reflect.TypeOf(&wire.StepCompleteRequest{}))}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return
		}
		for _, sc := range schemas {
			got, want := checkKeys(body, sc), checkKeysRef(body, sc)
			if (got == nil) != (want == nil) || got != nil && got.Error() != want.Error() {
				t.Fatalf("%q: checkKeys %v, reference %v", body, got, want)
			}
		}
	})
}
