package main

import (
	"bytes"
	"context"
	"flag"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func runCmd(t *testing.T, ctx context.Context, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(ctx, args, &out, &errb)
	return out.String(), errb.String(), err
}

func TestVersionAndUsage(t *testing.T) {
	out, _, err := runCmd(t, context.Background(), "version")
	if err != nil || !strings.HasPrefix(out, "wicket ") {
		t.Fatalf("version: %q %v", out, err)
	}
	if _, _, err := runCmd(t, context.Background(), "frobnicate"); err == nil {
		t.Fatal("unknown command accepted")
	} else if _, ok := err.(usageError); !ok {
		t.Fatalf("unknown command: %T %v, want a usage error", err, err)
	}
}

func TestServeRefusesNonLoopbackWithoutKey(t *testing.T) {
	_, _, err := runCmd(t, context.Background(), "serve", "--data", t.TempDir(), "--addr", "0.0.0.0:0")
	if err == nil || !strings.Contains(err.Error(), "without an API key") {
		t.Fatalf("got %v", err)
	}
	if _, _, err := runCmd(t, context.Background(), "serve", "--data", t.TempDir(), "--addr", "0.0.0.0:0", "--admin-key", "short"); err == nil {
		t.Fatal("a short admin key was accepted")
	}
}

func TestServeRefusesWritableStore(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "wicket.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(db, 0o666); err != nil {
		t.Fatal(err)
	}
	_, _, err := runCmd(t, context.Background(), "serve", "--data", dir, "--addr", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "0666") {
		t.Fatalf("a world-writable store was opened: %v", err)
	}
}

// TestServeAddressInUse: a port another process listens on fails serve
// with an error naming the flag, the address once, and what to do; a data
// directory another serve holds names --data.
func TestServeAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	_, _, err = runCmd(t, context.Background(), "serve", "--data", t.TempDir(), "--addr", addr)
	if err == nil {
		t.Fatal("serve listened on a port in use")
	}
	msg := err.Error()
	if !strings.Contains(msg, "--addr "+addr+": bind: address already in use") || strings.Count(msg, addr) != 1 || !strings.Contains(msg, "choose another --addr") {
		t.Errorf("port in use: %q", msg)
	}
	_, _, err = runCmd(t, context.Background(), "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--metrics-addr", addr)
	if err == nil || !strings.Contains(err.Error(), "--metrics-addr "+addr+": bind: address already in use") {
		t.Errorf("metrics port in use: %v", err)
	}
}

func TestServeDataInUse(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(t.TempDir(), "ready")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		var out, errb bytes.Buffer
		done <- run(ctx, []string{"serve", "--data", dir, "--addr", "127.0.0.1:0", "--ready-file", ready}, &out, &errb)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("first serve: %v", err)
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, err := os.ReadFile(ready); err == nil && len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("first serve not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, _, err := runCmd(t, context.Background(), "serve", "--data", dir, "--addr", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "locked by another process") || !strings.Contains(err.Error(), "running with --data "+dir+"?") {
		t.Errorf("second serve on the same --data: %v", err)
	}
}

// TestServeLifecycle starts serve in-process, checks health and the store's
// mode, and shuts it down gracefully by cancelling the context (what
// SIGTERM/SIGINT do).
func TestServeLifecycle(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out, errb bytes.Buffer
	go func() {
		done <- run(ctx, []string{"serve", "--data", filepath.Join(dir, "data"), "--addr", "127.0.0.1:0", "--ready-file", ready}, &out, &errb)
	}()
	var addr []byte
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if addr, err = os.ReadFile(ready); err == nil && len(addr) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Get("http://" + string(addr) + "/v0/ready")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("ready: %v %v", resp, err)
	}
	resp.Body.Close()
	st, err := os.Stat(filepath.Join(dir, "data", "wicket.db"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("store mode: %v %v", st.Mode(), err)
	}
	if !strings.Contains(errb.String(), "authentication is DISABLED") {
		t.Errorf("no warning about disabled auth in %q", errb.String())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not shut down")
	}
}

func TestPolicyInspectBuildEval(t *testing.T) {
	dir := t.TempDir()
	b := filepath.Join(dir, "b")
	_ = os.MkdirAll(filepath.Join(b, "tests"), 0o700)
	_ = os.WriteFile(filepath.Join(b, "bundle.yaml"), []byte("name: b\nrevision: \"3\"\nengine: rules\n"), 0o600)
	_ = os.WriteFile(filepath.Join(b, "rules.yaml"), []byte("default_action: deny\nrules:\n  - id: ok\n    priority: 1\n    when: {target: ok}\n    then: {decision: allow}\n"), 0o600)
	_ = os.WriteFile(filepath.Join(b, "tests", "cases.yaml"), []byte("cases:\n  - name: ok\n    step: {kind: tool_call, target: ok}\n    expect: {decision: allow, rule_id: ok}\n  - name: other\n    step: {kind: tool_call, target: other}\n    expect: {decision: deny}\n"), 0o600)
	ctx := context.Background()
	out, _, err := runCmd(t, ctx, "policy", "test", b)
	if err != nil || !strings.Contains(out, "2 passed, 0 failed") {
		t.Fatalf("policy test: %q %v", out, err)
	}
	out, _, err = runCmd(t, ctx, "policy", "inspect", b)
	if err != nil || !strings.Contains(out, "revision:       3") || !strings.Contains(out, "tests:          2 cases") {
		t.Fatalf("inspect: %q %v", out, err)
	}
	tgz := filepath.Join(dir, "b.tar.gz")
	if out, _, err = runCmd(t, ctx, "policy", "build", b, "-o", tgz); err != nil || !strings.Contains(out, "sha256:") {
		t.Fatalf("build: %q %v", out, err)
	}
	if out, _, err = runCmd(t, ctx, "policy", "test", tgz); err != nil || !strings.Contains(out, "2 passed") {
		t.Fatalf("policy test of the archive: %q %v", out, err)
	}
	in := filepath.Join(dir, "in.json")
	_ = os.WriteFile(in, []byte(`{"tenant":"default","agent_id":"a","execution_id":"e","step":{"kind":"tool_call","target":"ok","args":{}}}`), 0o600)
	if out, _, err = runCmd(t, ctx, "policy", "eval", "--bundle", b, "--input", in); err != nil || !strings.Contains(out, `"decision": "allow"`) {
		t.Fatalf("eval: %q %v", out, err)
	}
	// A failing case fails the command and says which.
	_ = os.WriteFile(filepath.Join(b, "tests", "cases.yaml"), []byte("cases:\n  - name: wrong\n    step: {kind: tool_call, target: other}\n    expect: {decision: allow}\n"), 0o600)
	out, _, err = runCmd(t, ctx, "policy", "test", b)
	if err == nil || !strings.Contains(out, "--- FAIL: b/wrong") || !strings.Contains(out, filepath.Join(b, "tests", "cases.yaml")+":2: unexpected decision") || !strings.Contains(out, "0 passed, 1 failed") {
		t.Fatalf("failing case: %q %v", out, err)
	}
}

// TestBench runs the bench with its load in this process (the default,
// the load in a child process running this binary, is
// e2e.TestBenchChildLoad: here the binary is the test's).
func TestBench(t *testing.T) {
	out, _, err := runCmd(t, context.Background(), "bench", "--executions", "3", "--steps", "60", "--data", t.TempDir(), "--load-in-process")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"steps:           60 over HTTP through sdk/agent, 3 concurrent executions, fsync true, store disk",
		"steps/s", "p99", "updates/commit", "page writes/commit", "s per 1,000 steps (kernel and load, one process", "bytes per step"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench output lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runCmd(t, context.Background(), "bench", "--executions", "2", "--steps", "20", "--store", "memory", "--load-in-process")
	if err != nil || !strings.Contains(out, "fsync false, store memory") {
		t.Errorf("bench --store memory: %v\n%s", err, out)
	}
	out, _, err = runCmd(t, context.Background(), "bench", "--idle", "5", "--store", "memory")
	if err != nil || !strings.Contains(out, "5 executions created and held by their agent") || !strings.Contains(out, "bytes per idle execution") {
		t.Errorf("bench --idle: %v\n%s", err, out)
	}
	for _, bad := range [][]string{{"--executions", "0"}, {"--store", "tape"}, {"extra"}, {"--idle", "-1"},
		{"--url", "http://127.0.0.1:1", "--cpuprofile", "a.prof", "--load-cpuprofile", "b.prof"}, {"--load-in-process", "--load-cpuprofile", "b.prof"}} {
		if _, _, err := runCmd(t, context.Background(), append([]string{"bench"}, bad...)...); err == nil {
			t.Errorf("bench %v accepted", bad)
		} else if _, ok := err.(usageError); !ok {
			t.Errorf("bench %v: %v, want a usage error", bad, err)
		}
	}
}

// TestServePprof: --pprof serves Go's profiler on its own loopback
// listener, not on the API's, and refuses any other address.
func TestServePprof(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:6060", ":6060", "192.0.2.1:6060"} {
		_, _, err := runCmd(t, context.Background(), "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--pprof", addr)
		if _, ok := err.(usageError); !ok || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("--pprof %s: %v, want a usage error about loopback", addr, err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pprofAddr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out, errb bytes.Buffer
	go func() {
		done <- run(ctx, []string{"serve", "--data", filepath.Join(dir, "data"), "--addr", "127.0.0.1:0", "--ready-file", ready, "--pprof", pprofAddr}, &out, &errb)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("serve did not shut down")
		}
	}()
	var addr []byte
	deadline := time.Now().Add(20 * time.Second)
	for {
		if addr, err = os.ReadFile(ready); err == nil && len(addr) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	get := func(url string) int {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := get("http://" + pprofAddr + "/debug/pprof/cmdline"); st != http.StatusOK {
		t.Errorf("profiler: %d", st)
	}
	if st := get("http://" + string(addr) + "/debug/pprof/cmdline"); st != http.StatusNotFound {
		t.Errorf("the API listener answers /debug/pprof/ with %d, want 404", st)
	}
}

func TestServeAdminKeyFileErrors(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	for _, tc := range []struct {
		name, content string
		args          []string
		want          string
	}{
		{"both flags", "admin-key-0123456789\n", []string{"--admin-key", "admin-key-0123456789"}, "not both"},
		{"empty file", "\n", nil, "is empty"},
		{"two lines", "admin-key-0123456789\nsecond-line\n", nil, "more than one line"},
		{"short key", "short\n", nil, "is 5 bytes; it must be at least 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(key, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--admin-key-file", key}, tc.args...)
			_, _, err := runCmd(t, context.Background(), args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
	_, _, err := runCmd(t, context.Background(), "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--admin-key-file", filepath.Join(dir, "missing"))
	if err == nil || !strings.Contains(err.Error(), "--admin-key-file") {
		t.Fatalf("a missing key file: %v", err)
	}
}

// TestWebhookCIDRFlags: the flags repeat, the environment twins are
// comma-separated, flags replace the environment, and a bad prefix is a
// usage error.
func TestWebhookCIDRFlags(t *testing.T) {
	t.Setenv("WICKET_WEBHOOK_DENY_CIDR", "10.0.0.0/8, 192.168.0.0/16")
	t.Setenv("WICKET_WEBHOOK_ALLOW_CIDR", "169.254.10.0/24")
	parse := func(args ...string) serveOptions {
		t.Helper()
		var o serveOptions
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		serveFlags(&o, fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return o
	}
	o := parse()
	if got := o.webhookDeny.String(); got != "10.0.0.0/8,192.168.0.0/16" {
		t.Errorf("deny from the environment: %q", got)
	}
	if got := o.webhookAllow.String(); got != "169.254.10.0/24" {
		t.Errorf("allow from the environment: %q", got)
	}
	o = parse("--webhook-deny-cidr", "172.16.0.0/12", "--webhook-deny-cidr", "127.0.0.2")
	if got := o.webhookDeny.String(); got != "172.16.0.0/12,127.0.0.2" {
		t.Errorf("deny flags: %q (flags replace the environment)", got)
	}
	g, err := webhookGuard(o)
	if err != nil {
		t.Fatal(err)
	}
	for a, refused := range map[string]bool{"172.16.1.1:80": true, "127.0.0.2:80": true, "10.1.1.1:80": false, "169.254.10.9:80": false, "169.254.11.9:80": true} {
		if err := g.Check(netip.MustParseAddrPort(a)); refused != (err != nil) {
			t.Errorf("%s: %v, want refused=%v", a, err, refused)
		}
	}
	_, _, err = runCmd(t, context.Background(), "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--webhook-allow-cidr", "10.0.0.0/99")
	if _, ok := err.(usageError); !ok || !strings.Contains(err.Error(), "--webhook-allow-cidr") {
		t.Errorf("a bad prefix: %T %v, want a usage error naming the flag", err, err)
	}
}

// TestSignatureToleranceFlag: the default is 300 s, WICKET_SIGNATURE_TOLERANCE
// sets it, the flag overrides it, and a non-positive value is refused.
func TestSignatureToleranceFlag(t *testing.T) {
	parse := func(args ...string) serveOptions {
		t.Helper()
		var o serveOptions
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		serveFlags(&o, fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return o
	}
	if o := parse(); o.signatureTolerance != 300*time.Second {
		t.Errorf("default %s", o.signatureTolerance)
	}
	t.Setenv("WICKET_SIGNATURE_TOLERANCE", "90s")
	if o := parse(); o.signatureTolerance != 90*time.Second {
		t.Errorf("from the environment: %s", o.signatureTolerance)
	}
	if o := parse("--signature-tolerance", "2m"); o.signatureTolerance != 2*time.Minute {
		t.Errorf("flag: %s", o.signatureTolerance)
	}
	_, _, err := runCmd(t, context.Background(), "serve", "--data", t.TempDir(), "--addr", "127.0.0.1:0", "--signature-tolerance", "0s")
	if _, ok := err.(usageError); !ok {
		t.Errorf("zero tolerance: %T %v, want a usage error", err, err)
	}
}

// TestServeMalformedAddress: a listen address that cannot be listened on
// whatever the machine (no port, a port past 65535, an unknown service
// name) is a usage mistake found before the data directory is made. It
// used to open (and create) the store, load the bundles and apply the
// manifest first, then fail with exit 1.
func TestServeMalformedAddress(t *testing.T) {
	for _, flagName := range []string{"--addr", "--metrics-addr", "--llm-addr", "--pprof"} {
		for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1", "127.0.0.1:notaport"} {
			data := filepath.Join(t.TempDir(), "data")
			args := []string{"serve", "--data", data, "--addr", "127.0.0.1:0", flagName, addr}
			_, errOut, code := runExit(t, args...)
			if code != 2 || !strings.Contains(errOut, flagName+" "+addr) {
				t.Errorf("%s %s: exit %d, %q", flagName, addr, code, errOut)
			}
			if _, err := os.Stat(data); err == nil {
				t.Errorf("%s %s: the data directory was made", flagName, addr)
			}
		}
	}
}

// TestServeLLMAddrWithoutProviders: --llm-addr without llm_providers in
// the manifest is refused before the data directory is made (it used to
// be refused once the store was opened and the bundles loaded).
func TestServeLLMAddrWithoutProviders(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	_, errOut, code := runExit(t, "serve", "--data", data, "--addr", "127.0.0.1:0", "--llm-addr", "127.0.0.1:0")
	if code != 2 || !strings.Contains(errOut, "--llm-addr needs llm_providers") {
		t.Errorf("exit %d, %q", code, errOut)
	}
	if _, err := os.Stat(data); err == nil {
		t.Errorf("the data directory was made")
	}
}
