package rego

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// jsonValueStd is the reference for jsonValue: encoding/json with exact
// numbers, then OPA's own conversion.
func jsonValueStd(raw []byte) (ast.Value, error) {
	if len(raw) == 0 {
		return ast.NullValue, nil
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("invalid JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		return nil, err
	}
	return ast.InterfaceToValue(x)
}

var jsonCorpus = []string{
	``, `null`, `true`, `false`, `0`, `-0`, `1`, `-1`, `12345678901234567890123`, `1.5`, `-0.000001`, `1e400`, `2E-3`, `1.0e+10`,
	`""`, `"plain"`, `"tab\there"`, `"\u00e9\ud83d\ude00"`, `"\ud800"`, `"\\\"\/\b\f\n\r\t"`, "\"caf\xc3\xa9\"", "\"bad \xff utf8\"",
	`[]`, `{}`, ` [ 1 , "a" , null , true , { } , [ ] ] `, `{"a": {"b": {"c": [1, 2, {"d": "e"}]}}}`, `{"a": 1, "a": 2}`,
	`{"cmd": "ls", "argv": ["-l", 1, 2.5, true, null, {"deep": [[]]}]}`, "\n\t{\r\n\"k\"\t:\n1}\n",
	// invalid
	`nul`, `tru`, `falsy`, `-`, `01`, `1.`, `.5`, `1e`, `1e+`, `+1`, `0x10`, `NaN`, `Infinity`, `"unterminated`, `"ctl` + "\x01" + `"`,
	`"bad \x escape"`, `"\u12"`, `[1,]`, `[1 2]`, `{"a" 1}`, `{"a":}`, `{a: 1}`, `{"a": 1,}`, `{,}`, `[`, `{`, `]`, `}`, `1 2`, `{} x`,
	`"\`, `[` + strings.Repeat(" ", 3) + `"x"`, `'single'`,
}

func TestJSONValueMatchesStd(t *testing.T) {
	for _, s := range jsonCorpus {
		checkJSONValue(t, []byte(s))
	}
	deep := strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth)
	checkJSONValue(t, []byte(deep))
	tooDeep := strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1)
	if _, err := jsonValue([]byte(tooDeep)); err == nil {
		t.Fatal("no error for nesting deeper than maxJSONDepth")
	}
}

func checkJSONValue(t *testing.T, raw []byte) {
	t.Helper()
	want, wantErr := jsonValueStd(raw)
	got, gotErr := jsonValue(raw)
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("%q: got error %v, reference error %v", raw, gotErr, wantErr)
	}
	if gotErr == nil && got.Compare(want) != 0 {
		t.Fatalf("%q: got %v, reference %v", raw, got, want)
	}
}

// FuzzJSONValue checks that the direct decoder accepts, refuses and decodes
// exactly like encoding/json plus ast.InterfaceToValue.
func FuzzJSONValue(f *testing.F) {
	for _, s := range jsonCorpus {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkJSONValue(t, raw)
	})
}
