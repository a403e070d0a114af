package wasm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// TestCSDKReader builds testdata/cpolicy/reader.c with policy-sdk/c/build.sh
// and checks what the SDK's JSON reader extracts from awkward inputs.
func TestCSDKReader(t *testing.T) {
	if !haveClang() {
		t.Skip("clang and wasm-ld not installed (apt-get install -y clang lld)")
	}
	out := filepath.Join(t.TempDir(), "reader.wasm")
	cmd := exec.Command("bash", "../../policy-sdk/c/build.sh", "testdata/cpolicy/reader.c", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, b)
	}
	mod, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	ev := compile(t, newEngine(t, Config{}), newBundle("reader", mod, bundle.Sandbox{}))

	// Arguments before "q" hold strings with braces, quotes and escapes,
	// nested arrays and objects: skipping them must not lose the place.
	args := map[string]any{
		"a": `tricky } ] { [ " \ value`,
		"b": []any{map[string]any{"q": "inner, not this"}, "x]", 1.5, nil, true},
		"c": map[string]any{"d": map[string]any{"e": "}}"}},
		"q": "tab\t quote\" slash\\ é \u2603 \U0001F600 <&> \u2028 end", // Go escapes <, &, >, U+2028 as \uXXXX
	}
	reason := func(target string, args map[string]any) string {
		t.Helper()
		in := input("tool_call", target, "", args)
		in.Execution.Totals.CostUSD = 12.34
		return wantDecision(t, ev, in, policy.Allow, target).Reason
	}
	if got, want := reason("arg", args), args["q"]; got != want {
		t.Errorf("arg q = %q, want %q", got, want)
	}
	if got := reason("label", nil); got != "a" {
		t.Errorf("label = %q", got)
	}
	if got := reason("tokens", nil); got != "90000" { // 900 × 100
		t.Errorf("tokens×100 = %q", got)
	}
	if got := reason("cost", nil); got != "1234" {
		t.Errorf("cost×100 = %q", got)
	}
	if got := reason("missing", args); got != "<absent>" {
		t.Errorf("missing = %q", got)
	}
	if got := reason("tenant", nil); got != "default" {
		t.Errorf("tenant = %q", got)
	}
	wantDecision(t, ev, input("tool_call", "pre.x.post", "", nil), policy.Deny, "affix")
	wantDecision(t, ev, input("tool_call", "pre.x", "", nil), "", "")
	wantError(t, ev, input("tool_call", "error", "", nil), `wasm: policy error: cannot decide "this"`)
}

// TestCSDKOptions builds testdata/cpolicy/options.c and checks that the C
// SDK's approval and rate-limit options reach the decision.
func TestCSDKOptions(t *testing.T) {
	if !haveClang() {
		t.Skip("clang and wasm-ld not installed (apt-get install -y clang lld; .ci/run installs them)")
	}
	out := filepath.Join(t.TempDir(), "options.wasm")
	cmd := exec.Command("bash", "../../policy-sdk/c/build.sh", "testdata/cpolicy/options.c", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, b)
	}
	mod, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	ev := compile(t, newEngine(t, Config{}), newBundle("options", mod, bundle.Sandbox{}))
	d := wantDecision(t, ev, input("tool_call", "deploy", "", nil), policy.RequireApproval, "deploy")
	if a := d.Approval; a == nil || strings.Join(a.Approvers, "|") != "alice|ops|bob" || a.Timeout != "30m" || a.Message != `deploy "prod"?` {
		t.Errorf("approval %+v", d.Approval)
	}
	d = wantDecision(t, ev, input("tool_call", "search", "", nil), policy.Allow, "search")
	if r := d.RateLimit; r == nil || *r != (policy.RateLimit{MaxCalls: 25, Window: "1m", Per: "agent", Algorithm: "fixed", OnLimiterError: "fail_open"}) {
		t.Errorf("rate limit %+v", d.RateLimit)
	}
	wantDecision(t, ev, input("tool_call", "other", "", nil), "", "")
}
