package client

import (
	"encoding/json"
	"strconv"
	"sync/atomic"

	"github.com/wicket-run/wicket/server/wire"
)

// This file encodes the bodies and decodes the answer of the two requests
// every step makes (submit and complete) without reflection. Each function
// handles the common shape and declines anything else (escapes to write or
// read, a usage record, unknown or differently cased keys, ...), which then
// goes through encoding/json as before: the bytes sent and the values
// decoded are encoding/json's in every case (fastjson_test.go compares
// them on generated and fuzzed inputs).

// plainString reports whether encoding/json writes s as it is between
// quotes: printable ASCII without '"', '\\' and the HTML-escaped '<', '>'
// and '&'.
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// plainRaw reports whether encoding/json writes the json.RawMessage m as
// it is: valid JSON that is compact and has nothing to HTML-escape. It
// declines every space (one in a string would have to be told apart from
// one between tokens) and every byte outside ASCII.
func plainRaw(m []byte) bool {
	for _, c := range m {
		if c <= ' ' || c >= 0x7f || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return json.Valid(m)
}

func appendField(b []byte, first bool, name string) []byte {
	if !first {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

func appendPlainString(b []byte, s string) []byte {
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// encodeStepSubmit returns json.Marshal(r), or false when r is not of
// the plain shape.
func encodeStepSubmit(r *wire.StepSubmitRequest) ([]byte, bool) {
	if !plainString(r.Kind) || !plainString(r.Target) || !plainString(r.Idempotency) || !plainString(r.Effect) ||
		(len(r.Args) > 0 && !plainRaw(r.Args)) || (len(r.Result) > 0 && !plainRaw(r.Result)) {
		return nil, false
	}
	b := make([]byte, 0, 64+len(r.Kind)+len(r.Target)+len(r.Args)+len(r.Idempotency)+len(r.Effect)+len(r.Result))
	b = append(b, '{')
	b = appendPlainString(appendField(b, true, "kind"), r.Kind)
	b = appendPlainString(appendField(b, false, "target"), r.Target)
	if len(r.Args) > 0 {
		b = append(appendField(b, false, "args"), r.Args...)
	}
	if r.Idempotency != "" {
		b = appendPlainString(appendField(b, false, "idempotency"), r.Idempotency)
	}
	if r.Effect != "" {
		b = appendPlainString(appendField(b, false, "effect"), r.Effect)
	}
	if r.Reconcile {
		b = append(appendField(b, false, "reconcile"), "true"...)
	}
	if len(r.Result) > 0 {
		b = append(appendField(b, false, "result"), r.Result...)
	}
	return append(b, '}'), true
}

// encodeStepComplete returns json.Marshal(r), or false when r is not of
// the plain shape (a usage record declines).
func encodeStepComplete(r *wire.StepCompleteRequest) ([]byte, bool) {
	if r.Usage != nil || (len(r.Result) > 0 && !plainRaw(r.Result)) {
		return nil, false
	}
	if len(r.Result) == 0 {
		return []byte("{}"), true
	}
	b := make([]byte, 0, len(`{"result":}`)+len(r.Result))
	b = append(b, `{"result":`...)
	b = append(b, r.Result...)
	return append(b, '}'), true
}

// decodeStepDecision is json.Unmarshal(data, d) for the answers a kernel
// gives; it returns false, with d unchanged, for anything else (so that
// encoding/json decides, errors included). Its strings are new ones, or
// equal ones it already has: the decision constants, stepID (the step id
// the request sent; "" for none) and what strs remembers (nil: nothing).
func decodeStepDecision(data []byte, d *wire.StepDecision, stepID string, strs *stringCache) bool {
	if !json.Valid(data) {
		return false
	}
	// data is valid JSON from here on: the scan below only tokenises it.
	t := *d
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	if data[i] == '}' {
		*d = t
		return true
	}
	for {
		// A key, plain.
		ks, ke, ok := plainStringAt(data, i)
		if !ok {
			return false
		}
		key := data[ks:ke]
		i = skipSpace(data, ke+1)
		i = skipSpace(data, i+1) // the ':'
		ve := valueEnd(data, i)
		v := data[i:ve]
		isNull := v[0] == 'n'
		switch string(key) {
		case "decision", "step_id", "reason", "rule_id", "approval_id":
			if isNull {
				break
			}
			ss, se, ok := plainStringAt(data, i)
			if !ok || se+1 != ve {
				return false
			}
			str := data[ss:se]
			switch string(key) {
			case "decision":
				t.Decision = internDecision(str)
			case "step_id":
				if string(str) == stepID {
					t.StepID = stepID
				} else {
					t.StepID = string(str)
				}
			case "reason":
				t.Reason = strs.get(str)
			case "rule_id":
				t.RuleID = strs.get(str)
			case "approval_id":
				t.ApprovalID = string(str)
			}
		case "occurrence":
			if isNull {
				break
			}
			n, err := strconv.Atoi(string(v))
			if err != nil {
				return false // a fraction, an exponent, a string, out of range...
			}
			t.Occurrence = n
		case "result":
			t.Result = append(json.RawMessage(nil), v...)
		case "error":
			t.Error = append(json.RawMessage(nil), v...)
		default:
			return false
		}
		i = skipSpace(data, ve)
		if data[i] == '}' {
			break
		}
		i = skipSpace(data, i+1) // the ','
	}
	if skipSpace(data, i+1) != len(data) {
		return false
	}
	*d = t
	return true
}

// internDecision returns the decision constants without allocating, and
// any other string as a copy.
func internDecision(b []byte) string {
	switch string(b) {
	case wire.DecisionProceed:
		return wire.DecisionProceed
	case wire.DecisionReplay:
		return wire.DecisionReplay
	}
	return string(b)
}

// stringCache hands out strings equal to recently seen ones without
// allocating: the reason and rule id of a policy's decisions repeat from
// one step to the next. A nil *stringCache copies every string. It is
// safe for concurrent use.
type stringCache struct {
	slots [8]atomic.Pointer[string]
}

// maxCachedString bounds the strings a stringCache keeps.
const maxCachedString = 128

// get returns string(b), the one already cached when there is one.
func (c *stringCache) get(b []byte) string {
	if c == nil || len(b) > maxCachedString {
		return string(b)
	}
	h := uint32(2166136261) // FNV-1a
	for _, x := range b {
		h = (h ^ uint32(x)) * 16777619
	}
	slot := &c.slots[h%uint32(len(c.slots))]
	if p := slot.Load(); p != nil && *p == string(b) {
		return *p
	}
	s := string(b)
	slot.Store(&s)
	return s
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// plainStringAt returns the bounds of the contents of the string starting
// at data[i], when it holds only printable ASCII without escapes (what
// encoding/json decodes to itself).
func plainStringAt(data []byte, i int) (start, end int, ok bool) {
	if i >= len(data) || data[i] != '"' {
		return 0, 0, false
	}
	for j := i + 1; j < len(data); j++ {
		c := data[j]
		switch {
		case c == '"':
			return i + 1, j, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return 0, 0, false
		}
	}
	return 0, 0, false
}

// valueEnd returns the index just past the JSON value starting at data[i]
// (data is valid JSON).
func valueEnd(data []byte, i int) int {
	switch data[i] {
	case '"':
		return stringEnd(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				j = stringEnd(data, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(data)
	}
	j := i
	for j < len(data) {
		switch data[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
		j++
	}
	return j
}

// stringEnd returns the index just past the string starting at data[i].
func stringEnd(data []byte, i int) int {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(data)
}
