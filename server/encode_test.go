package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

// checkAnswer compares the hand encoding of v with encoding/json's: equal
// bytes when the hand encoder takes v, and a fallback only for values it
// is documented to leave to encoding/json.
func checkAnswer(t *testing.T, v any, wantHand bool) {
	t.Helper()
	want, err := json.Marshal(v)
	got, ok := appendAnswer(nil, v)
	if err != nil {
		if ok {
			t.Fatalf("encoding/json refuses %#v (%v); the hand encoder gave %s", v, err, got)
		}
		return
	}
	if !ok {
		if wantHand {
			t.Fatalf("hand encoder gave up on %#v (encoding/json: %s)", v, want)
		}
		return
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("hand encoding differs\n got %s\nwant %s", got, want)
	}
}

func TestAnswerEncodingMatchesJSON(t *testing.T) {
	now := time.Date(2026, 12, 1, 17, 30, 0, 123456789, time.UTC)
	done := now.Add(time.Second)
	full := wire.Step{ID: "9404d32c", ExecutionID: "01a232a5-67a0-7000", Kind: "tool_call", Target: "search",
		Args: json.RawMessage(`{"n":1,"q":"a b\"c\\\\d"}`), ArgsHash: "ab12", Occurrence: 3, Idempotency: "at_most_once",
		Effect: "read_only", Status: "succeeded", Result: json.RawMessage(`{"hits":[1,2.5,-3e7,true,null,"x y"]}`),
		Error: json.RawMessage(`{"code":"boom"}`), Usage: &wire.Usage{InputTokens: 10, OutputTokens: 5, TotalTokens: 15, CostUSD: 0.0125},
		Lease: &wire.Lease{DispatchID: "d-1", Attempt: 2}, ApprovalID: "ap-1", Seq: 42, CreatedAt: now, CompletedAt: &done,
		Verdict: &wire.StepVerdict{Action: "allow", Reason: "ok", RuleID: "r1",
			Bundle: wire.BundleRef{Name: "b", Revision: "7", Digest: "abc", Engine: "rego"}, EvalTime: 12345}}
	hand := []struct {
		name string
		v    any
	}{
		{"decision proceed", wire.StepDecision{Decision: "proceed", StepID: "abc", Occurrence: 0}},
		{"decision replay", wire.StepDecision{Decision: "replay", StepID: "abc", Occurrence: 2, Result: json.RawMessage(`{"a":[1,{"b":"c d"}]}`)}},
		{"decision replay error", wire.StepDecision{Decision: "replay", StepID: "abc", Error: json.RawMessage(`"x"`)}},
		{"decision denied", wire.StepDecision{Decision: "denied", StepID: "abc", Reason: "no", RuleID: "r", ApprovalID: "a"}},
		{"decision empty", wire.StepDecision{}},
		{"step full", full},
		{"step minimal", wire.Step{}},
		{"step verdict without reason", wire.Step{ID: "s", Args: json.RawMessage(`null`), CreatedAt: now,
			Verdict: &wire.StepVerdict{Action: "allow", Bundle: wire.BundleRef{Engine: "builtin"}}}},
		{"step usage tokens only", wire.Step{ID: "s", Usage: &wire.Usage{OutputTokens: 3}, CreatedAt: now}},
		{"step usage cost only", wire.Step{ID: "s", Usage: &wire.Usage{CostUSD: 12.5}, CreatedAt: now}},
		{"step usage empty", wire.Step{ID: "s", Usage: &wire.Usage{}, CreatedAt: now}},
		{"step zone", wire.Step{ID: "s", CreatedAt: now.In(time.FixedZone("x", 5*3600+1800))}},
		{"step escaped string in raw", wire.Step{ID: "s", Args: json.RawMessage(`["\u00e9\n\"\u003c"]`)}},
	}
	for _, c := range hand {
		t.Run(c.name, func(t *testing.T) { checkAnswer(t, c.v, true) })
	}
	fallback := []struct {
		name string
		v    any
	}{
		{"html in string", wire.StepDecision{Decision: "denied", Reason: "a <b> & c"}},
		{"non-ASCII string", wire.StepDecision{Decision: "denied", Reason: "café"}},
		{"quote in string", wire.StepDecision{Decision: "denied", Reason: `say "no"`}},
		{"control in string", wire.StepDecision{Decision: "denied", Reason: "a\tb"}},
		{"raw with spaces", wire.StepDecision{Decision: "replay", Result: json.RawMessage(`{ "a" : 1 }`)}},
		{"raw with html", wire.StepDecision{Decision: "replay", Result: json.RawMessage(`"<b>"`)}},
		{"raw with U+2028", wire.StepDecision{Decision: "replay", Result: json.RawMessage("\"a\u2028b\"")}},
		{"tiny cost", wire.Step{Usage: &wire.Usage{CostUSD: 1e-9}}},
		{"huge cost", wire.Step{Usage: &wire.Usage{CostUSD: 1e22}}},
		{"year 10000", wire.Step{CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}},
		{"not an answer", wire.Status{Status: "ok"}},
	}
	for _, c := range fallback {
		t.Run(c.name, func(t *testing.T) {
			if _, ok := appendAnswer(nil, c.v); ok {
				t.Fatalf("hand encoder took %#v; it should leave it to encoding/json", c.v)
			}
			checkAnswer(t, c.v, false)
		})
	}
}

func FuzzAnswerEncoding(f *testing.F) {
	f.Add("proceed", "9404d32c", 1, []byte(`{"hits":1}`), "reason", int64(5), 0.25, int64(1764610200), int64(123))
	f.Add("replay", "", 0, []byte(`null`), "", int64(0), 0.0, int64(0), int64(0))
	f.Add("denied", "a<b", -3, []byte(`[1, 2]`), "é", int64(-1), math.Inf(1), int64(-62135596800), int64(999999999))
	f.Fuzz(func(t *testing.T, s, id string, n int, raw []byte, reason string, tokens int64, cost float64, sec, nsec int64) {
		if len(raw) > 0 && !json.Valid(raw) {
			return // the kernel stores valid JSON only (see encode.go)
		}
		at := time.Unix(sec, nsec).UTC()
		checkAnswer(t, wire.StepDecision{Decision: s, StepID: id, Occurrence: n, Result: raw, Reason: reason, RuleID: reason}, false)
		checkAnswer(t, wire.Step{ID: id, ExecutionID: s, Kind: s, Target: reason, Args: raw, ArgsHash: id, Occurrence: n,
			Idempotency: s, Effect: reason, Status: s, Result: raw, Error: raw, Usage: &wire.Usage{InputTokens: tokens, TotalTokens: -tokens, CostUSD: cost},
			Lease: &wire.Lease{DispatchID: id, Attempt: n}, Verdict: &wire.StepVerdict{Action: s, Reason: reason, EvalTime: tokens},
			Seq: uint64(tokens), CreatedAt: at, CompletedAt: &at}, false)
	})
}

// TestAnswerContentLength checks that every JSON answer carries its
// Content-Length and is never chunked, over HTTP/1.1 and HTTP/2: writeJSON
// leaves a small answer's length to net/http (autoContentLength) and sets
// a larger one's itself.
func TestAnswerContentLength(t *testing.T) {
	s := &Server{}
	for _, n := range []int{0, 100, autoContentLength - 40, autoContentLength - 10, autoContentLength, autoContentLength + 1, 4096, 5000, 300 << 10} {
		d := wire.StepDecision{Decision: "replay", StepID: "s", Result: json.RawMessage(`"` + strings.Repeat("x", n) + `"`)}
		want, _ := appendAnswer(nil, d)
		want = append(want, '\n')
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.writeJSON(w, http.StatusOK, d) })
		for _, h2 := range []bool{false, true} {
			srv := httptest.NewUnstartedServer(h)
			srv.EnableHTTP2 = h2
			if h2 {
				srv.StartTLS()
			} else {
				srv.Start()
			}
			resp, err := srv.Client().Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			srv.Close()
			if err != nil {
				t.Fatal(err)
			}
			if h2 != (resp.ProtoMajor == 2) {
				t.Fatalf("%d bytes: served over %s", len(want), resp.Proto)
			}
			if !bytes.Equal(body, want) || resp.ContentLength != int64(len(want)) || len(resp.TransferEncoding) != 0 ||
				resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("%d-byte answer over %s: Content-Length %d, Transfer-Encoding %v, Content-Type %q, body %d bytes",
					len(want), resp.Proto, resp.ContentLength, resp.TransferEncoding, resp.Header.Get("Content-Type"), len(body))
			}
		}
	}
}

// keepingWriter is a ResponseWriter whose Write fails and keeps the bytes
// it was given, as net/http's HTTP/2 server may when the client resets the
// stream while an answer is being written.
type keepingWriter struct {
	h    http.Header
	kept []byte
}

func (w *keepingWriter) Header() http.Header { return w.h }
func (w *keepingWriter) WriteHeader(int)     {}
func (w *keepingWriter) Write(b []byte) (int, error) {
	w.kept = b
	return 0, errors.New("stream reset")
}

// TestAnswerBufferKeptAfterFailedWrite: a buffer whose Write failed is
// not handed to the next answer, whose bytes would otherwise be written
// into what the failed Write may still be sending.
func TestAnswerBufferKeptAfterFailedWrite(t *testing.T) {
	s := &Server{}
	kw := &keepingWriter{h: http.Header{}}
	s.writeJSON(kw, http.StatusOK, wire.StepDecision{Decision: wire.DecisionProceed, StepID: strings.Repeat("a", 64)})
	want := string(kw.kept)
	if !strings.Contains(want, strings.Repeat("a", 64)) {
		t.Fatalf("the failed Write was given %q", want)
	}
	for i := range 20 {
		s.writeJSON(httptest.NewRecorder(), http.StatusOK, wire.StepDecision{Decision: wire.DecisionDenied, StepID: strings.Repeat(string(rune('b'+i%20)), 64), Reason: "no"})
		if got := string(kw.kept); got != want {
			t.Fatalf("after %d more answers the failed Write's bytes are %q, were %q", i+1, got, want)
		}
	}
}
