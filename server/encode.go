package server

import (
	"encoding/json"
	"math"
	"strconv"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

// The answers of the step routes (a StepDecision to every submission, a
// Step to every completion) are encoded by hand, byte for byte as
// encoding/json encodes them (TestAnswerEncodingMatchesJSON and
// FuzzAnswerEncoding compare the two): reflection was a visible share of a
// request's CPU. Anything the hand encoder does not copy as it is (a
// string with a character encoding/json escapes, a raw value that is not
// compact or holds an HTML character, a float, a time outside years
// 0–9999) makes it give up, and the answer goes to encoding/json whole.
//
// Raw fields (args, result, error) are copied without validation: the
// kernel stores them in canonical form. encoding/json would refuse invalid
// JSON there; the hand encoder would send it as it is.

// appendAnswer appends v's JSON to b when v is one of the hand-encoded
// answers; ok is false otherwise (v must then go to encoding/json).
func appendAnswer(b []byte, v any) (_ []byte, ok bool) {
	switch x := v.(type) {
	case wire.StepDecision:
		return appendDecision(b, &x)
	case wire.Step:
		return appendStep(b, &x)
	}
	return b, false
}

func appendDecision(b []byte, d *wire.StepDecision) ([]byte, bool) {
	e := jsonAppender{b: b, ok: true}
	e.str(`{"decision":`, d.Decision)
	if d.StepID != "" {
		e.str(`,"step_id":`, d.StepID)
	}
	e.int(`,"occurrence":`, int64(d.Occurrence))
	if len(d.Result) > 0 {
		e.raw(`,"result":`, d.Result)
	}
	if len(d.Error) > 0 {
		e.raw(`,"error":`, d.Error)
	}
	if d.Reason != "" {
		e.str(`,"reason":`, d.Reason)
	}
	if d.RuleID != "" {
		e.str(`,"rule_id":`, d.RuleID)
	}
	if d.ApprovalID != "" {
		e.str(`,"approval_id":`, d.ApprovalID)
	}
	e.b = append(e.b, '}')
	return e.b, e.ok
}

func appendStep(b []byte, s *wire.Step) ([]byte, bool) {
	e := jsonAppender{b: b, ok: true}
	e.str(`{"id":`, s.ID)
	e.str(`,"execution_id":`, s.ExecutionID)
	e.str(`,"kind":`, s.Kind)
	e.str(`,"target":`, s.Target)
	e.raw(`,"args":`, s.Args)
	e.str(`,"args_hash":`, s.ArgsHash)
	e.int(`,"occurrence":`, int64(s.Occurrence))
	e.str(`,"idempotency":`, s.Idempotency)
	if s.Effect != "" {
		e.str(`,"effect":`, s.Effect)
	}
	e.str(`,"status":`, s.Status)
	if len(s.Result) > 0 {
		e.raw(`,"result":`, s.Result)
	}
	if len(s.Error) > 0 {
		e.raw(`,"error":`, s.Error)
	}
	if u := s.Usage; u != nil {
		e.b = append(e.b, `,"usage":{`...)
		sep := ""
		for _, f := range [...]struct {
			name string
			v    int64
		}{{`"input_tokens":`, u.InputTokens}, {`"output_tokens":`, u.OutputTokens}, {`"total_tokens":`, u.TotalTokens}} {
			if f.v != 0 {
				e.int(sep+f.name, f.v)
				sep = ","
			}
		}
		if u.CostUSD != 0 {
			e.float(sep+`"cost_usd":`, u.CostUSD)
		}
		e.b = append(e.b, '}')
	}
	if l := s.Lease; l != nil {
		e.str(`,"lease":{"dispatch_id":`, l.DispatchID)
		e.int(`,"dispatch_attempt":`, int64(l.Attempt))
		e.b = append(e.b, '}')
	}
	if v := s.Verdict; v != nil {
		e.str(`,"decision":{"action":`, v.Action)
		if v.Reason != "" {
			e.str(`,"reason":`, v.Reason)
		}
		if v.RuleID != "" {
			e.str(`,"rule_id":`, v.RuleID)
		}
		e.str(`,"bundle":{"name":`, v.Bundle.Name)
		e.str(`,"revision":`, v.Bundle.Revision)
		e.str(`,"sha256":`, v.Bundle.Digest)
		e.str(`,"engine":`, v.Bundle.Engine)
		e.int(`},"eval_ns":`, v.EvalTime)
		e.b = append(e.b, '}')
	}
	if s.ApprovalID != "" {
		e.str(`,"approval_id":`, s.ApprovalID)
	}
	e.b = strconv.AppendUint(append(e.b, `,"seq":`...), s.Seq, 10)
	e.time(`,"created_at":`, s.CreatedAt)
	if s.CompletedAt != nil {
		e.time(`,"completed_at":`, *s.CompletedAt)
	}
	e.b = append(e.b, '}')
	return e.b, e.ok
}

// jsonAppender appends JSON to b; ok turns false (and stays so) at the
// first value it does not encode as encoding/json would, and what b holds
// is then to be discarded.
type jsonAppender struct {
	b  []byte
	ok bool
}

// str appends name (the literal before the value) and s quoted: printable
// ASCII without '"', '\\' and the HTML characters encoding/json escapes.
func (e *jsonAppender) str(name, s string) {
	if !e.ok {
		return
	}
	for i := 0; i < len(s); i++ {
		if !plainByte[s[i]] {
			e.ok = false
			return
		}
	}
	e.b = append(append(e.b, name...), '"')
	e.b = append(e.b, s...)
	e.b = append(e.b, '"')
}

// plainByte holds the bytes jsonAppender.str copies as they are: printable
// ASCII except '"', '\\' and the HTML characters encoding/json escapes. A
// table lookup per byte instead of seven comparisons: str checks every
// string of a step's answers (two ids of 64 hex digits among them).
var plainByte = func() (t [256]bool) {
	for c := 0x20; c <= 0x7e; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

func (e *jsonAppender) int(name string, v int64) {
	if !e.ok {
		return
	}
	e.b = strconv.AppendInt(append(e.b, name...), v, 10)
}

// float appends v as encoding/json does in its common range (plain
// decimal digits); outside it (exponent form, NaN, ±Inf) it gives up.
func (e *jsonAppender) float(name string, v float64) {
	if !e.ok {
		return
	}
	if a := math.Abs(v); math.IsNaN(v) || a < 1e-6 || a >= 1e21 {
		e.ok = false
		return
	}
	e.b = strconv.AppendFloat(append(e.b, name...), v, 'f', -1, 64)
}

// raw appends a raw JSON value (null when nil) if it is already compact
// and holds nothing encoding/json's compaction would change: no
// whitespace outside strings, no '<', '>', '&', no U+2028 or U+2029.
func (e *jsonAppender) raw(name string, v json.RawMessage) {
	if !e.ok {
		return
	}
	if v == nil {
		e.b = append(append(e.b, name...), "null"...)
		return
	}
	if len(v) == 0 { // encoding/json refuses an empty, non-nil one
		e.ok = false
		return
	}
	inStr, esc := false, false
	for _, c := range v {
		switch {
		case c == '<' || c == '>' || c == '&' || c == 0xE2:
			e.ok = false
			return
		case inStr:
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			e.ok = false
			return
		}
	}
	e.b = append(append(e.b, name...), v...)
}

// time appends t as time.Time's MarshalJSON does (RFC 3339 with
// nanoseconds) for years 0–9999; other years it leaves to encoding/json.
func (e *jsonAppender) time(name string, t time.Time) {
	if !e.ok {
		return
	}
	if y := t.Year(); y < 0 || y > 9999 {
		e.ok = false
		return
	}
	_, off := t.Zone()
	if off%60 != 0 || off <= -24*3600 || off >= 24*3600 {
		e.ok = false
		return
	}
	e.b = append(append(e.b, name...), '"')
	e.b = t.AppendFormat(e.b, time.RFC3339Nano)
	e.b = append(e.b, '"')
}
