package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
	"github.com/wicket-run/wicket/store/bbolt"
)

// served is a `wicket serve` run in-process by startServe.
type served struct {
	url    string
	data   string
	stderr *syncBuffer
	stop   func() error
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServe runs `wicket serve` with args on a fresh loopback port and
// data directory (--data in args overrides it) until the test ends or stop
// is called.
func startServe(t *testing.T, args ...string) *served {
	t.Helper()
	dir := t.TempDir()
	s := &served{data: filepath.Join(dir, "data"), stderr: &syncBuffer{}}
	ready := filepath.Join(dir, "ready")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	all := append([]string{"serve", "--data", s.data, "--addr", "127.0.0.1:0", "--ready-file", ready}, args...)
	for i, a := range args {
		if a == "--data" && i+1 < len(args) {
			s.data = args[i+1]
		}
	}
	go func() { done <- run(ctx, all, &syncBuffer{}, s.stderr) }()
	var once sync.Once
	var stopErr error
	s.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(30 * time.Second):
				stopErr = fmt.Errorf("serve did not stop")
			}
		})
		return stopErr
	}
	t.Cleanup(func() { _ = s.stop() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if addr, err := os.ReadFile(ready); err == nil && len(addr) > 0 {
			s.url = "http://" + string(addr)
			return s
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended: %v\n%s", err, s.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %s", s.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServeRefusesDamagedStore: serve checks the store file at boot and
// refuses an empty or truncated one with a clear error (bbolt would start
// the first empty and crash on the second).
func TestServeRefusesDamagedStore(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(path string) error
		want   string
	}{
		{"empty", func(p string) error { return os.Truncate(p, 0) }, "empty (0 bytes)"},
		{"truncated", func(p string) error { return os.Truncate(p, 3*4096) }, "truncated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServe(t)
			c := client.New(s.url)
			for i := range 100 {
				if _, err := c.PutAgent(t.Context(), wire.AgentRequest{ID: fmt.Sprint("a", i), WebhookURL: "http://127.0.0.1:9/", Secret: strings.Repeat("s", 16) + strings.Repeat("x", 200)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.stop(); err != nil {
				t.Fatal(err)
			}
			path := storePath(s.data)
			if err := tc.damage(path); err != nil {
				t.Fatal(err)
			}
			out, errOut, code := runExit(t, "serve", "--data", s.data, "--addr", "127.0.0.1:0")
			if code != 1 || !strings.Contains(errOut, "store file is damaged") || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, path) {
				t.Fatalf("serve on a damaged store: exit %d\nstdout %s\nstderr %s", code, out, errOut)
			}
			_, errOut, code = runExit(t, "store", "check", "--data", s.data)
			if code != 1 || !strings.Contains(errOut, "damaged") {
				t.Fatalf("store check of a damaged store: exit %d: %s", code, errOut)
			}
		})
	}
}

// TestBundleCommands drives bundle put, ls, get, rm and policy eval --agent
// against a running kernel, and bundle rm --data against its stopped store.
func TestBundleCommands(t *testing.T) {
	s := startServe(t)
	dir := t.TempDir()
	b := filepath.Join(dir, "gate")
	_ = os.MkdirAll(b, 0o700)
	_ = os.WriteFile(filepath.Join(b, "bundle.yaml"), []byte("name: gate\nrevision: \"7\"\nengine: rules\n"), 0o600)
	_ = os.WriteFile(filepath.Join(b, "rules.yaml"), []byte("default_action: allow\nrules:\n  - id: no-rm\n    priority: 1\n    when: {target: rm}\n    then: {decision: deny, reason: destructive}\n"), 0o600)
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		return runExit(t, append(args, "--url", s.url)...)
	}
	out, errOut, code := cli("bundle", "put", b)
	if code != 0 || !strings.Contains(out, `"name": "gate"`) || !strings.Contains(out, `"revision": "7"`) {
		t.Fatalf("bundle put: %d %s %s", code, out, errOut)
	}
	if _, errOut, code := cli("bundle", "put", b, "--name", "other"); code != 2 || !strings.Contains(errOut, "other") {
		t.Fatalf("bundle put --name mismatch: %d %s", code, errOut)
	}
	out, _, code = cli("bundle", "ls")
	// The table says who owns each bundle (an admin key stored this one,
	// so its tenant-admins cannot replace it).
	if code != 0 || !strings.HasPrefix(out, "NAME") || !strings.Contains(out, "\ngate ") || !strings.Contains(out, " rules ") ||
		!strings.Contains(out, " OWNER ") || !strings.Contains(out, " admin ") {
		t.Fatalf("bundle ls: %d %s", code, out)
	}
	out, _, code = cli("bundle", "get", "gate")
	if code != 0 || !strings.Contains(out, `"sha256"`) {
		t.Fatalf("bundle get: %d %s", code, out)
	}
	tgz := filepath.Join(dir, "gate.tar.gz")
	if _, errOut, code := cli("bundle", "get", "gate", "-o", tgz); code != 0 {
		t.Fatalf("bundle get -o: %d %s", code, errOut)
	}
	if out, _, code := runExit(t, "policy", "test", tgz, "--allow-empty"); code != 0 || !strings.Contains(out, "0 failed") {
		t.Fatalf("the downloaded archive is not the bundle: %d %s", code, out)
	}

	// policy eval --agent: the kernel's own eval of the agent's binding.
	if out, errOut, code := cli("agent", "put", "ops", "--webhook-url", "http://127.0.0.1:9/", "--secret", "ops-secret-0123456789", "--bundle", "gate"); code != 0 {
		t.Fatalf("agent put: %s %s", out, errOut)
	}
	out, errOut, code = cli("policy", "eval", "--agent", "ops", "--target", "rm", "--args", `{"path":"/"}`)
	var r wire.PolicyEvalResponse
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.Action != "deny" || r.RuleID != "no-rm" || r.Bundle.Name != "gate" {
		t.Fatalf("policy eval --agent: %d %s %s", code, out, errOut)
	}
	out, _, code = cli("policy", "eval", "--agent", "ops", "--target", "ls")
	if code != 0 || !strings.Contains(out, `"decision": "allow"`) {
		t.Fatalf("policy eval --agent (allowed): %d %s", code, out)
	}
	if _, _, code := cli("policy", "eval", "--agent", "ops", "--bundle", b); code != 2 {
		t.Fatalf("policy eval with --agent and --bundle: exit %d", code)
	}
	// --url and a request document naming the agent.
	req := filepath.Join(dir, "req.json")
	_ = os.WriteFile(req, []byte(`{"agent_id":"ops","step":{"kind":"tool_call","target":"rm"}}`), 0o600)
	if out, errOut, code := cli("policy", "eval", "--input", req); code != 0 || !strings.Contains(out, `"rule_id": "no-rm"`) {
		t.Fatalf("policy eval --url --input: %d %s %s", code, out, errOut)
	}

	// agent policy: native rules from a file, bound at once.
	rules := filepath.Join(dir, "rules.yaml")
	_ = os.WriteFile(rules, []byte("default_action: deny\n"), 0o600)
	if out, errOut, code := cli("agent", "policy", "ops", rules); code != 0 || !strings.Contains(out, `"name": "agent-ops"`) {
		t.Fatalf("agent policy: %d %s %s", code, out, errOut)
	}
	if out, _, _ := cli("policy", "eval", "--agent", "ops", "--target", "ls"); !strings.Contains(out, `"decision": "deny"`) {
		t.Fatalf("after agent policy: %s", out)
	}
	if out, errOut, code := cli("agent", "put", "ops", "--webhook-url", "http://127.0.0.1:9/", "--secret", "ops-secret-0123456789", "--bundle", "gate"); code != 0 {
		t.Fatalf("agent put: %s %s", out, errOut)
	}

	// bundle rm --data on a running kernel: refused, the lock is held.
	if _, errOut, code := runExit(t, "bundle", "rm", "gate", "--data", s.data); code != 1 || !strings.Contains(errOut, "stop it first") {
		t.Fatalf("bundle rm --data on a running kernel: %d %s", code, errOut)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runExit(t, "bundle", "rm", "gate", "--data", s.data); code != 0 || !strings.Contains(out, "deleted default/gate") {
		t.Fatalf("bundle rm --data: %d %s %s", code, out, errOut)
	}
	if _, errOut, code := runExit(t, "bundle", "rm", "gate", "--data", s.data); code != 1 || !strings.Contains(errOut, "not in") {
		t.Fatalf("second bundle rm --data: %d %s", code, errOut)
	}
	if _, errOut, code := runExit(t, "store", "check", "--data", s.data); code != 0 {
		t.Fatalf("store check after bundle rm: %s", errOut)
	}
	if out, errOut, code := runExit(t, "store", "stats", "--data", s.data); code != 0 || !strings.Contains(out, "agents        record") ||
		!strings.Contains(out, "leaf inuse") {
		t.Fatalf("store stats: %d %s %s", code, out, errOut)
	}
	// The kernel boots without the bundle; the agent bound to it fails closed.
	s2 := startServe(t, "--data", s.data)
	if out, _, code := runExit(t, "bundle", "ls", "--url", s2.url); code != 0 || strings.Contains(out, "gate") {
		t.Fatalf("bundle ls after rm --data: %s", out)
	}
	out, _, _ = runExit(t, "policy", "eval", "--agent", "ops", "--target", "ls", "--url", s2.url)
	if !strings.Contains(out, `"decision": "deny"`) {
		t.Fatalf("an agent bound to a removed bundle is not denied: %s", out)
	}
	// And online rm.
	if _, errOut, code := runExit(t, "bundle", "put", b, "--url", s2.url); code != 0 {
		t.Fatal(errOut)
	}
	if out, errOut, code := runExit(t, "bundle", "rm", "gate", "--url", s2.url); code != 0 || !strings.Contains(out, "deleted gate") {
		t.Fatalf("bundle rm: %s %s", out, errOut)
	}
}

// TestStoreBackupUnderLoad takes `wicket store backup` from a serving
// kernel while clients create executions, and checks the copy opens, passes
// `wicket store check` and holds every execution acknowledged before the
// backup started; then restores it and serves from it.
func TestStoreBackupUnderLoad(t *testing.T) {
	s := startServe(t)
	ctx := t.Context()
	c := client.New(s.url)
	if _, err := c.PutAgent(ctx, wire.AgentRequest{ID: "a", WebhookURL: "http://127.0.0.1:9/", Secret: "a-secret-0123456789"}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var acked []string
	var n atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				x, err := c.CreateExecution(ctx, wire.CreateExecutionRequest{AgentID: "a", Input: json.RawMessage(`{"pad":"` + strings.Repeat("p", 500) + `"}`)}, "")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked = append(acked, x.ID)
				mu.Unlock()
				n.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(60 * time.Second)
	for n.Load() < 100 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	before := append([]string(nil), acked...)
	mu.Unlock()
	backup := filepath.Join(t.TempDir(), "backup.db")
	out, errOut, code := runExit(t, "store", "backup", "--url", s.url, "-o", backup)
	during := n.Load()
	close(stop)
	wg.Wait()
	if code != 0 || !strings.Contains(out, "checked") {
		t.Fatalf("store backup: %d %s %s", code, out, errOut)
	}
	t.Logf("%s; %d executions before, %d by the end of the backup", strings.TrimSpace(out), len(before), during)
	if len(before) < 100 {
		t.Fatalf("only %d executions before the backup", len(before))
	}
	if out, errOut, code := runExit(t, "store", "check", "--file", backup); code != 0 || !strings.HasPrefix(out, "ok: ") {
		t.Fatalf("store check of the backup: %d %s %s", code, out, errOut)
	}
	st, err := bbolt.Open(backup, bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	err = st.View(ctx, func(tx kernel.ReadTx) error {
		for _, id := range before {
			if _, err := tx.Execution(kernel.DefaultTenant, id); err != nil {
				return fmt.Errorf("execution %s, acknowledged before the backup, is not in it: %w", id, err)
			}
		}
		return nil
	})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Restore: a data directory holding the backup serves its executions.
	restored := filepath.Join(t.TempDir(), "restored")
	if err := os.MkdirAll(restored, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(backup, storePath(restored)); err != nil {
		t.Fatal(err)
	}
	s2 := startServe(t, "--data", restored)
	if _, err := client.New(s2.url).GetExecution(ctx, before[len(before)-1]); err != nil {
		t.Fatalf("the restored kernel: %v", err)
	}
	// Compact the stopped original: it still checks and serves.
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	copyTo := filepath.Join(t.TempDir(), "compacted.db")
	if out, errOut, code := runExit(t, "store", "compact", "--data", s.data, "-o", copyTo); code != 0 || !strings.HasPrefix(out, "compacted "+storePath(s.data)+" into "+copyTo+": ") {
		t.Fatalf("store compact -o: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := runExit(t, "store", "compact", "--data", s.data); code != 0 || !strings.HasPrefix(out, "compacted "+storePath(s.data)+": ") {
		t.Fatalf("store compact: %d %s %s", code, out, errOut)
	}
	if _, errOut, code := runExit(t, "store", "check", "--data", s.data); code != 0 {
		t.Fatalf("store check after compact: %s", errOut)
	}
}

// TestStoreBackupUnwritableOutput: -o in a directory that does not exist
// names -o and the directory, not the temporary file the copy goes to.
func TestStoreBackupUnwritableOutput(t *testing.T) {
	out := filepath.Join(t.TempDir(), "missing", "backup.db")
	_, errOut, code := runExit(t, "store", "backup", "--url", closedURL(t), "-o", out)
	if code != 1 || !strings.Contains(errOut, "-o "+out+": cannot write in "+filepath.Dir(out)) || strings.Contains(errOut, ".part") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

// TestStoreBackupToADirectory: -o naming a directory is a usage mistake
// found before anything is downloaded. It used to download and check the
// whole store, then fail to rename it ("rename .DIR.part…: file exists").
func TestStoreBackupToADirectory(t *testing.T) {
	dir := t.TempDir()
	_, errOut, code := runExit(t, "store", "backup", "--url", closedURL(t), "-o", dir)
	if code != 2 || !strings.Contains(errOut, "-o "+dir+" is a directory") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

// TestStoreCopyIntoItself: --from and --to naming one data directory in
// two spellings is a usage mistake. It used to wait 2 s for the lock the
// copy itself held on the source and then blame another `wicket serve`.
func TestStoreCopyIntoItself(t *testing.T) {
	dir := t.TempDir()
	st, err := bbolt.Open(storePath(dir), bbolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{dir + "/", filepath.Join(dir, ".", ".")} {
		_, errOut, code := runExit(t, "store", "copy", "--from", dir, "--to", to)
		if code != 2 || !strings.Contains(errOut, "--from and --to name the same store") {
			t.Errorf("--to %s: exit %d, stderr %q", to, code, errOut)
		}
	}
}
