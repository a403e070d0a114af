package kernel

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
)

// payloadsOf builds every hand-encoded payload around the strings s and t.
func payloadsOf(s, t string, n int) []any {
	ref := stepRef{StepID: s, Kind: "tool_call", Target: t}
	v := verdictPayload{stepRef: ref, Decision: policy.Allow, Reason: t, RuleID: s,
		Bundle: policy.BundleRef{Name: s, Revision: t, Digest: s, Engine: t}, Engine: t, EvalNS: int64(n) * 1000}
	vr := v
	vr.RateLimitID, vr.ApprovalID = s, t
	lease := Lease{DispatchID: s, Attempt: n}
	return []any{
		proposedPayload{stepRef: ref, ArgsHash: s, Occurrence: n, Idempotency: AtMostOnce, Effect: t, DispatchID: s, DispatchAttempt: -n},
		v, vr,
		executingPayload{stepRef: ref, DispatchID: t, DispatchAttempt: n},
		executingPayload{stepRef: ref, DispatchID: t, DispatchAttempt: n, ApprovalID: s},
		executingPayload{stepRef: ref, OrphanedFrom: &lease},
		outcomePayload{stepRef: ref},
		outcomePayload{stepRef: ref, Error: json.RawMessage(`{"message":"x"}`)},
		outcomePayload{stepRef: ref, Usage: &Usage{InputTokens: int64(n), CostUSD: 0.25}},
	}
}

// TestPayloadEncodingMatchesJSON: the hand-written encoders produce the
// bytes encoding/json produces, for plain strings and for every kind of
// string encoding/json escapes.
func TestPayloadEncodingMatchesJSON(t *testing.T) {
	for _, s := range []string{"", "plain", "0190a5f2-7c3e", `quote"d`, `back\slash`, "<html>&", "line\nbreak\ttab\x01\x7f",
		"caf\u00e9", "\u2028sep\u2029", "bad\xffutf8", "emoji \U0001F600"} {
		for _, p := range payloadsOf(s, "web.search/"+s, len(s)) {
			checkPayload(t, p)
		}
	}
}

func FuzzPayloadEncoding(f *testing.F) {
	f.Add("step", "target", 3)
	f.Add("<&>", "\x00\"\\", -1)
	f.Fuzz(func(t *testing.T, s, u string, n int) {
		for _, p := range payloadsOf(s, u, n) {
			checkPayload(t, p)
		}
	})
}

func checkPayload(t *testing.T, p any) {
	t.Helper()
	want, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := encodePayload(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%T:\n got %s\nwant %s", p, got, want)
	}
}
