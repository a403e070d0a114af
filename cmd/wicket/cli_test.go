package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// runExit runs the command line as main would and returns stdout, stderr
// and the exit status.
func runExit(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), args, &out, &errb)
	code := exitCode(err, &errb)
	return out.String(), errb.String(), code
}

// closedURL is the URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// TestEveryCommandHelpAndBadFlag: --help on every command exits 0 and names
// its positional arguments; an unknown flag exits 2 and says which.
func TestEveryCommandHelpAndBadFlag(t *testing.T) {
	if len(commands) < 30 {
		t.Fatalf("only %d commands registered", len(commands))
	}
	for _, c := range commands {
		words := strings.Fields(c.name)
		for _, h := range []string{"--help", "-h"} {
			out, errOut, code := runExit(t, append(words, h)...)
			if code != 0 || !strings.HasPrefix(out, "usage: "+c.synopsis()) || errOut != "" {
				t.Errorf("%s %s: exit %d, stdout %q, stderr %q", c.name, h, code, out, errOut)
			}
			if c.args != "" && !strings.Contains(out, " "+c.args+" ") {
				t.Errorf("%s --help does not name its arguments %q: %q", c.name, c.args, out)
			}
		}
		// help after the arguments too
		if out, _, code := runExit(t, append(append(words, "X", "Y"), "--help")...); code != 0 || !strings.HasPrefix(out, "usage: ") {
			t.Errorf("%s X Y --help: exit %d", c.name, code)
		}
		if out, _, code := runExit(t, "help", c.name); code != 0 || !strings.HasPrefix(out, "usage: "+c.synopsis()) {
			t.Errorf("help %s: exit %d, %q", c.name, code, out)
		}
		_, errOut, code := runExit(t, append(words, "--no-such-flag")...)
		if code != 2 || !strings.Contains(errOut, "no-such-flag") || !strings.Contains(errOut, "usage: "+c.synopsis()) {
			t.Errorf("%s --no-such-flag: exit %d, stderr %q", c.name, code, errOut)
		}
	}
}

// TestHelpDefaults: a flag's default is shown as the flag package shows it
// (strings quoted, numbers and durations bare) and left out when it is the
// zero value, so that "0s" never contradicts a usage saying what 0 means.
func TestHelpDefaults(t *testing.T) {
	for _, c := range commands {
		out, _, _ := runExit(t, append(strings.Fields(c.name), "--help")...)
		for _, bad := range []string{`(default "0s")`, `(default 0s)`, `(default "0")`, `(default "false")`} {
			if strings.Contains(out, bad) {
				t.Errorf("%s --help shows %s", c.name, bad)
			}
		}
	}
	serve, _, _ := runExit(t, "serve", "--help")
	for _, want := range []string{`(WICKET_ADDR) (default "127.0.0.1:8080")`, `(WICKET_MAX_BODY) (default 1048576)`, `(WICKET_LEASE_TIMEOUT) (default 1m30s)`,
		`(WICKET_MAX_TENANT_KEYS) (default 1000)`} {
		if !strings.Contains(serve, want) {
			t.Errorf("serve --help lacks %s", want)
		}
	}
	proxy, _, _ := runExit(t, "mcp-proxy", "--help")
	if !strings.Contains(proxy, "is renewed (default 30s; keep it under the kernel's --lease-timeout)\n") {
		t.Errorf("mcp-proxy --help: --heartbeat's default is not 30s alone: %q", proxy)
	}
}

// TestUsageMistakesExitTwo: missing or extra arguments, unknown commands and
// subcommands, and groups without a subcommand exit 2; group help exits 0.
func TestUsageMistakesExitTwo(t *testing.T) {
	for _, args := range [][]string{
		nil, {"frobnicate"}, {"exec"}, {"exec", "frobnicate"}, {"tenant", "key"}, {"tenant", "key", "nope"},
		{"exec", "get"}, {"exec", "get", "a", "b"}, {"tenant", "key", "rm", "t"}, {"serve", "extra"},
		{"policy", "test", "--format", "xml"}, {"policy", "eval"}, {"policy", "build", "x"}, {"store", "backup"},
		{"exec", "create", "a", "--input", "{nope"}, {"help", "nope"},
	} {
		if _, errOut, code := runExit(t, args...); code != 2 || errOut == "" {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
		}
	}
	for _, args := range [][]string{{"--help"}, {"help"}, {"exec", "--help"}, {"exec", "help"}, {"tenant", "key", "-h"}, {"help", "store"}, {"version"}} {
		if out, _, code := runExit(t, args...); code != 0 || out == "" {
			t.Errorf("%q: exit %d", args, code)
		}
	}
}

// TestRefusedConnection: every client command, with its flags after its
// arguments, fails with exit 1 and says that no kernel answers at the URL.
func TestRefusedConnection(t *testing.T) {
	dir := t.TempDir()
	b := filepath.Join(dir, "b")
	_ = os.MkdirAll(b, 0o700)
	_ = os.WriteFile(filepath.Join(b, "bundle.yaml"), []byte("name: b\nrevision: \"1\"\nengine: rules\n"), 0o600)
	_ = os.WriteFile(filepath.Join(b, "rules.yaml"), []byte("default_action: allow\n"), 0o600)
	// Arguments that get each command as far as its first request.
	extra := map[string][]string{
		"bundle put":        {b},
		"agent policy":      {"a", filepath.Join(b, "rules.yaml")},
		"tenant guards":     {"t", "--set", "g"},
		"approval happened": {"a", "--result", `"sent"`},
		"policy eval":       {"--agent", "a"},
		"store backup":      {"-o", filepath.Join(dir, "backup.db")},
	}
	url := closedURL(t)
	n := 0
	for _, c := range commands {
		if !c.client {
			continue
		}
		n++
		args := strings.Fields(c.name)
		for range c.min {
			args = append(args, "x")
		}
		if e, ok := extra[c.name]; ok {
			if c.min > 0 {
				args = args[:len(args)-c.min]
			}
			args = append(args, e...)
		}
		out, errOut, code := runExit(t, append(args, "--url", url, "--key", "k")...)
		if code != 1 || !strings.Contains(errOut, "no kernel answers at "+url) || !strings.Contains(errOut, "`wicket serve` running") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
		// A --url that is not a kernel URL (no scheme, another scheme)
		// is a usage mistake that says what a kernel URL looks like.
		for _, bad := range []string{strings.TrimPrefix(url, "http://"), "ftp://" + strings.TrimPrefix(url, "http://")} {
			out, errOut, code := runExit(t, append(args, "--url", bad, "--key", "k")...)
			if code != 2 || !strings.Contains(errOut, fmt.Sprintf("--url %q is not a kernel URL: want http://HOST:PORT", bad)) {
				t.Errorf("%q --url %s: exit %d, stdout %q, stderr %q", args, bad, code, out, errOut)
			}
		}
	}
	if n < 25 {
		t.Fatalf("only %d client commands", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "backup.db")); err == nil {
		t.Error("a failed backup left its file")
	}
}

// TestFlagsAfterArguments: flags are accepted before, between and after
// the positional arguments; "--" ends them.
func TestFlagsAfterArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pos  []string
		url  string
	}{
		{[]string{"a", "--url", "u1"}, []string{"a"}, "u1"},
		{[]string{"--url", "u2", "a"}, []string{"a"}, "u2"},
		{[]string{"a", "--url=u3", "b"}, []string{"a", "b"}, "u3"},
		{[]string{"a", "--", "--url", "u4"}, []string{"a", "--url", "u4"}, "def"},
		{[]string{"--url", "u5", "--", "-x"}, []string{"-x"}, "u5"},
	} {
		fs := newTestFlagSet()
		url := fs.String("url", "def", "")
		pos, err := parseInterleaved(fs, tc.args)
		if err != nil || strings.Join(pos, " ") != strings.Join(tc.pos, " ") || *url != tc.url {
			t.Errorf("%q: pos %q url %q err %v", tc.args, pos, *url, err)
		}
	}
}

func newTestFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// TestStreamLines: without --brief every item is one JSON object on one
// line, a step delta included (typed "step.delta"); with --brief ids are
// whole and a failed delivery says why.
func TestStreamLines(t *testing.T) {
	stepID := strings.Repeat("9c1f", 16)
	approval := "01a2265a-b8ea-7000-8d69-838ab72b8c51"
	items := []client.StreamItem{
		{Event: &wire.Event{ExecutionID: "x", Seq: 7, Type: "step.awaiting_approval", Payload: json.RawMessage(`{"step_id":"` + stepID + `","kind":"tool_call","target":"deploy","approval_id":"` + approval + `"}`)}},
		{Delta: &wire.StepDeltaEvent{ExecutionID: "x", StepID: stepID, Seq: 3, Data: json.RawMessage(`{"text":"he\nllo"}`)}},
		{Event: &wire.Event{ExecutionID: "x", Seq: 8, Type: "dispatch.failed", Payload: json.RawMessage(`{"dispatch_id":"d","dispatch_attempt":2,"error_class":"connect_refused"}`)}},
	}
	var out bytes.Buffer
	for _, it := range items {
		if err := printItem(&out, it, false); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(items) {
		t.Fatalf("%d lines for %d items:\n%s", len(lines), len(items), out.String())
	}
	for i, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %d is not one JSON object: %q: %v", i, l, err)
		}
		if i == 1 && (m["type"] != "step.delta" || m["step_id"] != stepID || m["seq"] != float64(3)) {
			t.Errorf("delta line: %q", l)
		}
	}
	out.Reset()
	for _, it := range items {
		if err := printItem(&out, it, true); err != nil {
			t.Fatal(err)
		}
	}
	brief := out.String()
	for _, want := range []string{"approval=" + approval, stepID, "attempt=2", "error_class=connect_refused"} {
		if !strings.Contains(brief, want) {
			t.Errorf("brief lines lack %q:\n%s", want, brief)
		}
	}
}

// TestMissingKeyHint: a 401 from a kernel that wants a key, when the
// command was given none, says which flag and variables give one; with a
// wrong key the kernel's answer stands alone.
func TestMissingKeyHint(t *testing.T) {
	t.Setenv("WICKET_API_KEY", "")
	t.Setenv("WICKET_ADMIN_KEY", "")
	s := startServe(t, "--admin-key", "admin-key-0123456789")
	_, errOut, code := runExit(t, "exec", "ls", "--url", s.url)
	if code != 1 || !strings.Contains(errOut, "401 unauthenticated") || !strings.Contains(errOut, "no API key given: set --key or WICKET_API_KEY") {
		t.Errorf("no key: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = runExit(t, "exec", "ls", "--url", s.url, "--key", "not-the-key-0123456789")
	if code != 1 || !strings.Contains(errOut, "401 unauthenticated") || strings.Contains(errOut, "no API key given") {
		t.Errorf("wrong key: exit %d, stderr %q", code, errOut)
	}
	if out, errOut, code := runExit(t, "exec", "ls", "--url", s.url, "--key", "admin-key-0123456789"); code != 0 {
		t.Errorf("the admin key: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
