package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// wicketBinary builds cmd/wicket once per test binary.
func wicketBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "wicket-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "wicket")
		out, err := exec.Command("go", "build", "-o", binPath, "../cmd/wicket").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// process is a running `wicket serve`.
type process struct {
	cmd    *exec.Cmd
	url    string
	stderr *syncBuffer
}

// stderrString is what the process has logged so far.
func (p *process) stderrString() string { return p.stderr.String() }

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func startServe(t *testing.T, dir, addr string, extra ...string) *process {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	args := append([]string{"serve", "--data", dir, "--addr", addr, "--admin-key", testkit.AdminKey,
		"--ready-file", ready, "--lease-timeout", "1s", "--dispatch-timeout", "300ms", "--log-level", "warn"}, extra...)
	cmd := exec.Command(wicketBinary(t), args...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, url: "http://" + addr, stderr: stderr}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return p
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("wicket serve did not become ready: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCrashRecovery kills a real `wicket serve` with SIGKILL in the middle
// of many executions, restarts it on the same data dir, kills it again while
// it recovers, and restarts it once more: every event read before each kill
// is still there in order, no step has two outcomes, and the interrupted
// executions finish.
func TestCrashRecovery(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	p := startServe(t, dir, addr)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()

	const steps = 15
	agent := testkit.NewAgent("crashy", secret, p.url, func(ctx context.Context, r *testkit.Run) (any, error) {
		for i := range steps {
			_, err := r.Step(ctx, "tool_call", "work", map[string]int{"i": i}, testkit.StepOpts{Idempotency: "safe_to_retry"}, func() (any, error) {
				time.Sleep(2 * time.Millisecond)
				return i * i, nil
			})
			if err != nil {
				return nil, err
			}
		}
		return "finished", nil
	})
	agent.HeartbeatEvery = 200 * time.Millisecond
	defer agent.Close()
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/agents", map[string]any{"id": "crashy", "webhook_url": agent.WebhookURL(), "secret": secret}, nil); err != nil {
		t.Fatal(err)
	}
	const n = 24
	ids := make([]string, n)
	for i := range n {
		var x kernel.Execution
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/executions", map[string]any{"agent_id": "crashy", "input": i}, &x); err != nil {
			t.Fatal(err)
		}
		ids[i] = x.ID
	}
	// Let the run get going, snapshot what the kernel has acknowledged, kill.
	time.Sleep(150 * time.Millisecond)
	before := map[string][]kernel.Event{}
	for _, id := range ids {
		evs, err := testkit.AllEvents(p.url, testkit.AdminKey, id)
		if err != nil {
			t.Fatal(err)
		}
		before[id] = evs
	}
	time.Sleep(30 * time.Millisecond)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	var unfinished int
	for _, evs := range before {
		if len(evs) > 0 && !isTerminal(evs[len(evs)-1].Type) {
			unfinished++
		}
	}
	if unfinished == 0 {
		t.Log("every execution finished before the kill; the test proves less this run")
	}

	// Second crash, during recovery: restart, let re-delivery and replay
	// begin, snapshot again (it must extend the first), kill again.
	pr := startServe(t, dir, addr)
	time.Sleep(300 * time.Millisecond)
	for _, id := range ids {
		evs, err := testkit.AllEvents(pr.url, testkit.AdminKey, id)
		if err != nil {
			t.Fatal(err)
		}
		checkPrefix(t, id, before[id], evs)
		before[id] = evs
	}
	_ = pr.cmd.Process.Signal(syscall.SIGKILL)
	_ = pr.cmd.Wait()

	p2 := startServe(t, dir, addr)
	defer func() { _ = p2.cmd.Process.Kill(); _ = p2.cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	var completed atomic.Int64
	for _, id := range ids {
		for {
			var x kernel.Execution
			if _, err := testkit.Bearer(p2.url, testkit.AdminKey, "GET", "/v0/executions/"+id, nil, &x); err != nil {
				t.Fatal(err)
			}
			if x.Status.Terminal() {
				if x.Status != kernel.ExecCompleted {
					t.Errorf("%s ended %s (%s)", id, x.Status, x.Error)
				}
				completed.Add(1)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still %s after restart; kernel log:\n%s", id, x.Status, p2.stderr.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, id := range ids {
		after, err := testkit.AllEvents(p2.url, testkit.AdminKey, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := testkit.CheckLog(after); err != nil {
			t.Errorf("%s: %v\n%v", id, err, testkit.Types(after))
		}
		checkPrefix(t, id, before[id], after)
		if got := testkit.Count(after, kernel.EvStepSucceeded); got != steps {
			t.Errorf("%s: %d steps succeeded, want %d", id, got, steps)
		}
	}
	t.Logf("%d executions were unfinished at the kill; all %d completed after restart", unfinished, completed.Load())
}

// checkPrefix requires every event read before a kill to be in the log
// read after it, unchanged and in the same place.
func checkPrefix(t *testing.T, id string, old, after []kernel.Event) {
	t.Helper()
	if len(after) < len(old) {
		t.Fatalf("%s: %d events after restart, %d before the kill", id, len(after), len(old))
	}
	for i, ev := range old {
		a := after[i]
		if a.Seq != ev.Seq || a.Type != ev.Type || !bytes.Equal(a.Payload, ev.Payload) || !a.Time.Equal(ev.Time) {
			t.Fatalf("%s: acknowledged event %d changed: %s %s -> %s %s", id, ev.Seq, ev.Type, ev.Payload, a.Type, a.Payload)
		}
	}
}

func isTerminal(typ string) bool {
	return typ == kernel.EvExecutionCompleted || typ == kernel.EvExecutionFailed || typ == kernel.EvExecutionCancelled
}
