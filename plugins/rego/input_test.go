package rego

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/wicket-run/wicket/kernel/policy"
)

// jsonInputValue is the reference conversion: the input as encoding/json
// marshals it, decoded with exact numbers, converted by OPA.
func jsonInputValue(t testing.TB, in *policy.Input) ast.Value {
	t.Helper()
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		t.Fatal(err)
	}
	v, err := ast.InterfaceToValue(x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestInputValueMatchesJSON holds the direct conversion to what a JSON round
// trip of the same input gives, so that Rego policies see exactly the
// document the other engines see.
func TestInputValueMatchesJSON(t *testing.T) {
	zone := time.FixedZone("X", 2*3600+30*60)
	tests := []struct {
		name string
		edit func(*policy.Input)
	}{
		{"typical", func(*policy.Input) {}},
		{"zero value", func(in *policy.Input) { *in = policy.Input{} }},
		{"nil labels", func(in *policy.Input) { in.Execution.Labels = nil }},
		{"empty labels", func(in *policy.Input) { in.Execution.Labels = map[string]string{} }},
		{"many labels", func(in *policy.Input) {
			in.Execution.Labels = map[string]string{"a": "1", "b": "", "ünï": "çødé", "z": "\"quoted\"\n"}
		}},
		{"empty args", func(in *policy.Input) { in.Step.Args = nil }},
		{"null args", func(in *policy.Input) { in.Step.Args = json.RawMessage(`null`) }},
		{"scalar args", func(in *policy.Input) { in.Step.Args = json.RawMessage(`"just a string"`) }},
		{"nested args", func(in *policy.Input) {
			in.Step.Args = json.RawMessage(`{"cmd": "ls", "argv": ["-l", 1, 2.5, true, null, {"deep": [[]]}], "n": 12345678901234567890123, "e": 1e400, "neg": -0.000001}`)
		}},
		{"escaped strings", func(in *policy.Input) {
			in.Step.Args = json.RawMessage(`{"s": "tab\there \u00e9 \ud83d\ude00 \\ \" \/"}`)
			in.Step.Target = "\u2028weird\x00"
		}},
		{"float totals", func(in *policy.Input) { in.Execution.Totals.CostUSD = 0.1 + 0.2 }},
		{"huge float", func(in *policy.Input) { in.Execution.Totals.CostUSD = 1e21 }},
		{"tiny float", func(in *policy.Input) { in.Execution.Totals.CostUSD = 1e-7 }},
		{"large ints", func(in *policy.Input) {
			in.Execution.Totals.Tokens = math.MaxInt64
			in.Execution.Totals.Steps = -1
			in.Step.Occurrence = 1 << 40
		}},
		{"nanosecond time in a zone", func(in *policy.Input) {
			in.Execution.CreatedAt = time.Date(2026, 2, 3, 4, 5, 6, 789, zone)
		}},
		{"zero time", func(in *policy.Input) { in.Execution.CreatedAt = time.Time{} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := step("fs.read", `{"path": "/tmp/x", "n": 3}`, policy.EffectReadOnly)
			tc.edit(in)
			got, err := inputValue(in)
			if err != nil {
				t.Fatal(err)
			}
			want := jsonInputValue(t, in)
			if got.Compare(want) != 0 {
				t.Fatalf("direct conversion differs from JSON\ngot  %v\nwant %v", got, want)
			}
		})
	}
}

func TestInputValueRefusesNonFiniteCost(t *testing.T) {
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		in := step("x", `{}`, "")
		in.Execution.Totals.CostUSD = f
		if _, err := inputValue(in); err == nil {
			t.Fatalf("cost %v: got no error", f)
		}
	}
}
