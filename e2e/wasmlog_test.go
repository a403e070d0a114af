package e2e

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
)

// printingWasm is a Wicket-ABI module that writes "hello from the policy"
// to its stdout (WASI fd_write) on every evaluation and allows.
func printingWasm(t testing.TB) []byte {
	b, err := hex.DecodeString("0061736d0100000001140360047f7f7f7f017f60017f017f60027f7f017e02230116776173695f736e617073686f745f70726576696577310866645f7772697465000003030201020503010001072b03066d656d6f727902000c7769636b65745f616c6c6f6300010f7769636b65745f6576616c7561746500020a1d0205004180200b1500410141104101410810001a42a38080808080020b0b52030041100b0820000000160000000041200b1668656c6c6f2066726f6d2074686520706f6c6963790a004180100b237b226465636973696f6e223a22616c6c6f77222c2272756c655f6964223a226f6b227d")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWasmOutputInServeLog: what a wasm policy granted "stdout" prints, and
// the wasm engine's own warnings, go to serve's log in its format. Before,
// serve did not give the engine its logger, so with --log-format json they
// came out as plain text lines of Go's default logger among the JSON
// records (and ignored --log-level).
func TestWasmOutputInServeLog(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t), "--log-format", "json", "--log-level", "info")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	keys := tenantAdmins(t, p.url, "acme")
	if _, err := testkit.BearerWithHeaders(p.url, keys["acme"], "PUT", "/v0/bundles/printer", map[string]string{"Content-Type": "application/gzip"},
		wasmArchive(t, "name: printer\nrevision: \"1\"\nengine: wasm\nsandbox: {grants: [stdout]}\n", printingWasm(t)), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := testkit.Bearer(p.url, keys["acme"], "POST", "/v0/agents", map[string]any{
		"id": "bot", "webhook_url": "http://127.0.0.1:9/hook", "secret": "wasm-log-test-secret-0123456789", "bundle": "printer"}, nil); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Decision string `json:"decision"`
	}
	if _, err := testkit.Bearer(p.url, keys["acme"], "POST", "/v0/policy/eval",
		map[string]any{"agent_id": "bot", "step": map[string]any{"kind": "tool_call", "target": "x"}}, &res); err != nil || res.Decision != "allow" {
		t.Fatalf("eval: %v %q", err, res.Decision)
	}
	// The module wrote its line during the evaluation; the serve process's
	// standard error reaches this one through a pipe, so its record may
	// still be on the way.
	deadline := time.Now().Add(20 * time.Second)
	for {
		found := false
		out := p.stderrString()
		out = out[:strings.LastIndex(out, "\n")+1] // whole lines only
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			line := sc.Text()
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("not a JSON log record: %q", line)
			}
			if rec["msg"] == "wasm policy output" && rec["line"] == "hello from the policy" && rec["bundle"] == "printer" {
				found = true
			}
		}
		if found {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no JSON record of the policy's output in:\n%s", p.stderrString())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
