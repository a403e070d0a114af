package client

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/wicket-run/wicket/server/wire"
)

// rawSamples are json.RawMessage values the encoders meet: plain ones
// (taken as they are) and ones that go through encoding/json (spaces,
// HTML characters, non-ASCII, invalid JSON).
var rawSamples = []string{"", "null", "1", "-0.5e3", `"x"`, `{"n":1,"q":"bench"}`, `[1,2,{"a":[]}]`, `{"a":"b c"}`,
	`{ "a" : 1 }`, "\n[1]\n", `"<tag>&"`, `"é"`, "\"\u2028\"", `{"a":`, `{"a":1}x`, `tru`, `"\u00e9\n"`, `{"a":"\\"}`, `[]`, `{}`}

var stringSamples = []string{"", "tool_call", "search", "a b", `q"uote`, `back\slash`, "<x>", "a&b", "é", "\x01", "\x7f", "safe_to_retry"}

func checkEncode(t *testing.T, v any, got []byte, ok bool) {
	t.Helper()
	want, err := json.Marshal(v)
	if !ok {
		return // declined: encoding/json encodes it, as before
	}
	if err != nil {
		t.Fatalf("%#v: fast encoding gave %s where encoding/json fails: %v", v, got, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%#v:\n fast %s\n json %s", v, got, want)
	}
}

// TestEncodeStepSubmitMatchesEncodingJSON: whatever the fast encoder
// accepts, it encodes byte for byte as json.Marshal does; and it accepts
// the plain shape every step of the bench has.
func TestEncodeStepSubmitMatchesEncodingJSON(t *testing.T) {
	for _, kind := range stringSamples {
		for _, args := range rawSamples {
			for _, result := range []string{"", "1", `{"a":[1]}`, "{ }"} {
				for _, reconcile := range []bool{false, true} {
					r := wire.StepSubmitRequest{Kind: kind, Target: "search", Args: json.RawMessage(args), Idempotency: kind,
						Effect: "read_only", Reconcile: reconcile, Result: json.RawMessage(result)}
					got, ok := encodeStepSubmit(&r)
					checkEncode(t, r, got, ok)
					r.Target, r.Effect = kind, ""
					got, ok = encodeStepSubmit(&r)
					checkEncode(t, r, got, ok)
				}
			}
		}
	}
	r := wire.StepSubmitRequest{Kind: "tool_call", Target: "search", Args: json.RawMessage(`{"n":1,"q":"bench"}`)}
	if _, ok := encodeStepSubmit(&r); !ok {
		t.Fatal("the plain shape was declined")
	}
}

func TestEncodeStepCompleteMatchesEncodingJSON(t *testing.T) {
	for _, res := range rawSamples {
		for _, usage := range []*wire.Usage{nil, {InputTokens: 3, CostUSD: 0.25}} {
			r := wire.StepCompleteRequest{Result: json.RawMessage(res), Usage: usage}
			got, ok := encodeStepComplete(&r)
			checkEncode(t, r, got, ok)
		}
	}
	r := wire.StepCompleteRequest{Result: json.RawMessage(`{"n":1}`)}
	if _, ok := encodeStepComplete(&r); !ok {
		t.Fatal("the plain shape was declined")
	}
}

func FuzzEncodeStepSubmit(f *testing.F) {
	for _, s := range rawSamples {
		f.Add("tool_call", "search", s, "", false)
	}
	f.Add("local", "wicket.now", "null", `"2026-12-01T00:00:00Z"`, true)
	f.Fuzz(func(t *testing.T, kind, target, args, result string, reconcile bool) {
		r := wire.StepSubmitRequest{Kind: kind, Target: target, Args: json.RawMessage(args), Result: json.RawMessage(result), Reconcile: reconcile}
		got, ok := encodeStepSubmit(&r)
		checkEncode(t, r, got, ok)
		c := wire.StepCompleteRequest{Result: json.RawMessage(args)}
		got, ok = encodeStepComplete(&c)
		checkEncode(t, c, got, ok)
	})
}

// decisionSamples are answers to a submission: the kernel's own, and
// shapes only encoding/json should decide (other cases, escapes, unknown
// keys, wrong types, invalid JSON).
var decisionSamples = []string{
	`{"decision":"proceed","step_id":"4f2a","occurrence":0}`,
	`{"decision":"replay","step_id":"4f2a","occurrence":3,"result":{"n":1,"a":[1,"}"]}}`,
	`{"decision":"replay","step_id":"s","occurrence":1,"error":{"message":"boom \"x\""}}`,
	`{"decision":"denied","step_id":"s","occurrence":0,"reason":"no","rule_id":"r1"}`,
	`{"decision":"blocked","step_id":"s","occurrence":2,"approval_id":"ap1","reason":"needs a human"}`,
	` { "decision" : "proceed" , "occurrence" : 7 , "result" : [ 1 , 2 ] } `,
	`{"decision":null,"step_id":null,"occurrence":null,"result":null,"error":null}`,
	`{}`, `null`, `[]`, `"proceed"`, `{"decision":"proceed"}x`, `{"decision":"proceed"`, ``, `   `,
	`{"Decision":"proceed"}`, `{"decision":"pro\u0063eed"}`, `{"decision":"é"}`, `{"unknown":1,"decision":"proceed"}`,
	`{"occurrence":1.5}`, `{"occurrence":1e2}`, `{"occurrence":"1"}`, `{"occurrence":-1}`, `{"occurrence":99999999999999999999}`,
	`{"decision":1}`, `{"decision":"a","decision":"b"}`, `{"result":"x","result":{"y":[]}}`, `{"occurrence":-0}`,
	`{"decision":"proceed","step_id":"s","occurrence":0,"result":"\\\"}"}`,
}

// testStrings is the string cache of the decoding tests, shared by all.
var testStrings = new(stringCache)

func checkDecode(t *testing.T, data string, prior wire.StepDecision) {
	t.Helper()
	fast, slow := prior, prior
	if prior.Result != nil {
		fast.Result = bytes.Clone(prior.Result)
		slow.Result = bytes.Clone(prior.Result)
	}
	ok := decodeStepDecision([]byte(data), &fast, "", nil)
	// The same with the strings it may reuse: the step id sent and
	// those of earlier answers.
	hinted := prior
	if prior.Result != nil {
		hinted.Result = bytes.Clone(prior.Result)
	}
	for _, id := range []string{"", "s", "4f2a", "old"} {
		if hok := decodeStepDecision([]byte(data), &hinted, id, testStrings); hok != ok || !reflect.DeepEqual(hinted, fast) {
			t.Fatalf("%s with step id %q and cached strings: %v %+v, without: %v %+v", data, id, hok, hinted, ok, fast)
		}
	}
	if !ok {
		if !reflect.DeepEqual(fast, prior) {
			t.Fatalf("%s: declined but changed the decision: %+v", data, fast)
		}
		return
	}
	if err := json.Unmarshal([]byte(data), &slow); err != nil {
		t.Fatalf("%s: fast decoding accepted what encoding/json refuses: %v", data, err)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("%s:\n fast %+v\n json %+v", data, fast, slow)
	}
}

// TestDecodeStepDecisionMatchesEncodingJSON: whatever the fast decoder
// accepts, it decodes as json.Unmarshal does (into a fresh decision and
// into one already holding values); what it declines it leaves alone; and
// it accepts the kernel's usual answers.
func TestDecodeStepDecisionMatchesEncodingJSON(t *testing.T) {
	prior := wire.StepDecision{Decision: "old", StepID: "old", Occurrence: 9, Result: json.RawMessage(`"old"`), Reason: "old"}
	for _, s := range decisionSamples {
		checkDecode(t, s, wire.StepDecision{})
		checkDecode(t, s, prior)
	}
	for _, s := range decisionSamples[:7] {
		var d wire.StepDecision
		if !decodeStepDecision([]byte(s), &d, "", nil) {
			t.Errorf("%s: declined", s)
		}
	}
	if testing.AllocsPerRun(100, func() {
		var d wire.StepDecision
		decodeStepDecision([]byte(`{"decision":"proceed","step_id":"4f2a","occurrence":0}`), &d, "", nil)
	}) > 1 {
		t.Error("decoding a proceed allocates more than its step id")
	}
	// The kernel's usual answer, its step id the one sent, its reason and
	// rule seen before: nothing to allocate.
	answer := []byte(`{"decision":"proceed","step_id":"4f2a","occurrence":0,"reason":"kernel default policy: allow","rule_id":"kernel_default"}`)
	strs := new(stringCache)
	if n := testing.AllocsPerRun(100, func() {
		var d wire.StepDecision
		if !decodeStepDecision(answer, &d, "4f2a", strs) || d.StepID != "4f2a" || d.RuleID != "kernel_default" {
			t.Fatalf("decoded %+v", d)
		}
	}); n > 0 {
		t.Errorf("decoding the usual answer allocates %.0f times", n)
	}
}

// TestStringCache: the cache gives back equal strings, concurrently,
// whatever collides in its slots, and leaves long strings alone.
func TestStringCache(t *testing.T) {
	c := new(stringCache)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				b := []byte("reason " + strconv.Itoa((g*7+i)%37))
				if got := c.get(b); got != string(b) {
					t.Errorf("got %q for %q", got, b)
					return
				}
			}
		}()
	}
	wg.Wait()
	long := bytes.Repeat([]byte("x"), maxCachedString+1)
	if c.get(long) != string(long) || testing.AllocsPerRun(10, func() { c.get(long) }) != 1 {
		t.Error("a long string was cached")
	}
	var nilCache *stringCache
	if nilCache.get([]byte("a")) != "a" {
		t.Error("a nil cache")
	}
}

func FuzzDecodeStepDecision(f *testing.F) {
	for _, s := range decisionSamples {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		checkDecode(t, data, wire.StepDecision{})
		checkDecode(t, data, wire.StepDecision{Decision: "x", Result: json.RawMessage("1"), Occurrence: 4})
	})
}

func TestPlainStringMatchesEncodingJSON(t *testing.T) {
	for c := 0; c < 256; c++ {
		s := "a" + string([]byte{byte(c)}) + "b"
		want, _ := json.Marshal(s)
		if plainString(s) && string(want) != `"`+s+`"` {
			t.Errorf("byte %#x: plain but encoding/json writes %s", c, want)
		}
	}
	if !plainString(strings.Repeat("az09_-.:/ ", 3)) {
		t.Error("a plain string was declined")
	}
}
