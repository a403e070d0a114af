package wasm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/wicket-run/wicket/kernel/policy"
)

// decodeOPA maps the answer of an OPA entrypoint (entry, written
// data.pkg.rule) to a decision the way the Rego engine does: undefined,
// null and {} are no match; a decision object is validated as for the
// Wicket ABI; unless the entrypoint is named decision, a boolean and an
// array of deny messages (a set, which opa_json_dump writes as an array)
// map by policy.FromBoolean and policy.FromMessages.
func decodeOPA(entry string, out []byte) (*policy.Answer, error) {
	trimmed := bytes.TrimSpace(out)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return nil, nil
	}
	switch trimmed[0] {
	case '{':
		if len(bytes.TrimSpace(trimmed[1:len(trimmed)-1])) == 0 {
			return nil, nil // {}: ref-head rules of which none holds
		}
		return decodeOutput(trimmed)
	case 't', 'f':
		if policy.AcceptsShapes(entry) && (string(trimmed) == "true" || string(trimmed) == "false") {
			return policy.FromBoolean(entry, trimmed[0] == 't'), nil
		}
	case '[':
		if policy.AcceptsShapes(entry) {
			return denyMessages(entry, trimmed)
		}
	}
	if !json.Valid(trimmed) {
		return nil, fmt.Errorf("wasm: output is not valid JSON: %s", snippet(string(trimmed)))
	}
	if !policy.AcceptsShapes(entry) {
		return nil, fmt.Errorf("wasm: output is not a decision: want a JSON object or null, got %s", snippet(string(trimmed)))
	}
	return nil, fmt.Errorf("wasm: output is not a decision: want a JSON object, a boolean, an array of deny messages or null, got %s", snippet(string(trimmed)))
}

// denyMessages maps an array of deny messages: strings as they are,
// objects with a msg string by it, anything else as its JSON with sorted
// keys (what the Rego engine writes).
func denyMessages(entry string, arr []byte) (*policy.Answer, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal(arr, &elems); err != nil {
		return nil, fmt.Errorf("wasm: output is not a decision: %w", err)
	}
	msgs := make([]string, 0, len(elems))
	for _, e := range elems {
		var s string
		if e[0] == '"' && json.Unmarshal(e, &s) == nil { // not null, which decodes as ""
			msgs = append(msgs, s)
			continue
		}
		var withMsg struct {
			Msg *string `json:"msg"`
		}
		if e[0] == '{' && json.Unmarshal(e, &withMsg) == nil && withMsg.Msg != nil {
			msgs = append(msgs, *withMsg.Msg)
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(e))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("wasm: output is not a decision: %w", err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("wasm: output is not a decision: %w", err)
		}
		msgs = append(msgs, string(b))
	}
	return policy.FromMessages(entry, msgs), nil
}

// entryRef writes an OPA entrypoint name (authz/allow) as a reference
// (data.authz.allow), the form the Rego engine names it by.
func entryRef(name string) string {
	return "data." + strings.ReplaceAll(name, "/", ".")
}
