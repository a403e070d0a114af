package policy

import (
	"encoding/json"
	"strings"
	"testing"
)

const sample = `{"tenant":"default","agent_id":"bot","execution_id":"e1",
"step":{"kind":"tool_call","target":"shell.exec","args":{"cmd":"rm -rf /","n":3},"args_hash":"h","idempotency":"","effect":"destructive","occurrence":1},
"execution":{"status":"running","labels":{"team":"a"},"totals":{"steps":1,"llm_calls":0,"tokens":0,"cost_usd":0},"created_at":"2026-11-29T10:00:00Z"}}`

// withHandler installs fn for one test.
func withHandler(t *testing.T, fn Func) {
	t.Helper()
	old := handler
	handler = nil
	Handle(fn)
	t.Cleanup(func() { handler = old })
}

func TestEvaluate(t *testing.T) {
	withHandler(t, func(in *Input) *Decision {
		cmd, ok := in.Step.StringArg("cmd")
		if !ok {
			t.Errorf("StringArg(cmd) missing")
		}
		if _, ok := in.Step.StringArg("n"); ok {
			t.Errorf("StringArg(n) reported a number as a string")
		}
		if in.Execution.Labels["team"] != "a" || in.Execution.CreatedAt.Year() != 2026 {
			t.Errorf("execution = %+v", in.Execution)
		}
		return Deny("no " + cmd).WithRule("r1").WithRateLimit(RateLimit{MaxCalls: 1, Window: "1m"})
	})
	var d Decision
	if err := json.Unmarshal(Evaluate([]byte(sample)), &d); err != nil {
		t.Fatal(err)
	}
	if d.Decision != ActionDeny || d.Reason != "no rm -rf /" || d.RuleID != "r1" || d.RateLimit.MaxCalls != 1 {
		t.Fatalf("decision = %+v", d)
	}
}

func TestEvaluateOutputs(t *testing.T) {
	cases := []struct {
		name  string
		fn    Func
		input string
		want  string
	}{
		{"no match", func(*Input) *Decision { return nil }, sample, `null`},
		{"approval", func(*Input) *Decision {
			return RequireApproval("x").WithApproval(Approval{Approvers: []string{"ops"}})
		}, sample, `{"decision":"require_approval","reason":"x","approval":{"approvers":["ops"]}}`},
		{"abort", func(*Input) *Decision { return Abort("stop") }, sample, `{"decision":"abort","reason":"stop"}`},
		{"allow", func(*Input) *Decision { return Allow("") }, sample, `{"decision":"allow"}`},
		{"panic", func(*Input) *Decision { panic("boom") }, sample, `{"error":"panic: boom"}`},
		{"bad input", func(*Input) *Decision { return nil }, `{"step":`, `{"error":"decode input: unexpected end of JSON input"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			withHandler(t, c.fn)
			if got := string(Evaluate([]byte(c.input))); got != c.want {
				t.Fatalf("Evaluate = %s, want %s", got, c.want)
			}
		})
	}
}

func TestNoHandler(t *testing.T) {
	old := handler
	handler = nil
	defer func() { handler = old }()
	if got := string(Evaluate([]byte(sample))); !strings.Contains(got, "call policy.Handle from init") {
		t.Fatalf("Evaluate without handler = %s", got)
	}
}

func TestHandlePanics(t *testing.T) {
	withHandler(t, func(*Input) *Decision { return nil })
	for name, fn := range map[string]Func{"nil": nil, "twice": func(*Input) *Decision { return nil }} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("Handle did not panic")
				}
			}()
			Handle(fn)
		})
	}
}

func TestDecodeArgs(t *testing.T) {
	s := Step{Args: json.RawMessage(`{"cmd":"ls","n":3}`)}
	var v struct {
		Cmd string `json:"cmd"`
		N   int    `json:"n"`
	}
	if err := s.DecodeArgs(&v); err != nil || v.Cmd != "ls" || v.N != 3 {
		t.Fatalf("DecodeArgs = %+v, %v", v, err)
	}
	if raw, ok := s.Arg("n"); !ok || string(raw) != "3" {
		t.Fatalf("Arg(n) = %s, %v", raw, ok)
	}
	if _, ok := (&Step{Args: json.RawMessage(`[1]`)}).Arg("n"); ok {
		t.Fatal("Arg on an array reported a value")
	}
	if err := (&Step{}).DecodeArgs(&v); err == nil {
		t.Fatal("DecodeArgs without args succeeded")
	}
}

func TestStringArg(t *testing.T) {
	s := Step{Args: []byte(`{"s":"x","e":"","n":1,"z":null,"o":{"a":"b"},"l":["x"]}`)}
	for key, want := range map[string]struct {
		v  string
		ok bool
	}{
		"s": {"x", true}, "e": {"", true}, "n": {"", false}, "z": {"", false},
		"o": {"", false}, "l": {"", false}, "missing": {"", false},
	} {
		if v, ok := s.StringArg(key); v != want.v || ok != want.ok {
			t.Errorf("StringArg(%q) = %q, %v; want %q, %v", key, v, ok, want.v, want.ok)
		}
	}
}
