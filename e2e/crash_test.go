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
func wicketBinary(t testing.TB) string {
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
	// started is when it was started; boot how long it took to become
	// ready.
	started time.Time
	boot    time.Duration
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
	p, ready := spawnServe(t, dir, addr, extra...)
	p.awaitReady(t, ready)
	return p
}

// spawnServe starts `wicket serve` and returns at once, with the file
// that appears once it is ready.
func spawnServe(t *testing.T, dir, addr string, extra ...string) (*process, string) {
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
	return &process{cmd: cmd, url: "http://" + addr, stderr: stderr, started: time.Now()}, ready
}

// awaitReady waits until the process has written its ready file.
func (p *process) awaitReady(t *testing.T, ready string) {
	t.Helper()
	deadline := p.started.Add(20 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			p.boot = time.Since(p.started)
			return
		}
		if time.Now().After(deadline) {
			_ = p.cmd.Process.Kill()
			t.Fatalf("wicket serve did not become ready: %s", p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// crashGate holds every execution's handler inside a chosen step until the
// test has killed the kernel: the kill lands at that step, not wherever a
// timer happens to fall.
type crashGate struct {
	step    int // the step index to hold at
	mu      sync.Mutex
	arrived map[string]bool
	all     chan struct{} // closed when every execution is held
	release chan struct{} // closed by the test after the kill
	n       int
}

func newCrashGate(step, n int) *crashGate {
	return &crashGate{step: step, n: n, arrived: map[string]bool{}, all: make(chan struct{}), release: make(chan struct{})}
}

// hold records that execution id reached the gate and waits for release.
func (g *crashGate) hold(ctx context.Context, id string) {
	g.mu.Lock()
	if !g.arrived[id] {
		g.arrived[id] = true
		if len(g.arrived) == g.n {
			close(g.all)
		}
	}
	g.mu.Unlock()
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

// wait waits until every execution is held.
func (g *crashGate) wait(t *testing.T, what string, p *process) {
	t.Helper()
	select {
	case <-g.all:
	case <-time.After(90 * time.Second):
		g.mu.Lock()
		n := len(g.arrived)
		g.mu.Unlock()
		t.Fatalf("%s: only %d of %d executions reached step %d; kernel log:\n%s", what, n, g.n, g.step, p.stderr.String())
	}
}

// TestCrashRecovery kills a real `wicket serve` with SIGKILL while every
// execution is inside step 5, restarts it on the same data dir, kills it
// again during recovery while every execution is inside step 10 of its
// re-run, and restarts it once more. Every event read before each kill is
// still there, unchanged and in order; the steps before each kill replay;
// the steps in flight at each kill run again under the new attempt
// (safe_to_retry); no step has two outcomes; every execution completes.
func TestCrashRecovery(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	p := startServe(t, dir, addr)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()

	const steps, n = 15, 24
	first, second := newCrashGate(5, n), newCrashGate(10, n)
	var phase atomic.Int32 // which kernel process serves: 1, 2, 3
	phase.Store(1)
	agent := testkit.NewAgent("crashy", secret, p.url, func(ctx context.Context, r *testkit.Run) (any, error) {
		for i := range steps {
			_, err := r.Step(ctx, "tool_call", "work", map[string]int{"i": i}, testkit.StepOpts{Idempotency: "safe_to_retry"}, func() (any, error) {
				switch {
				case phase.Load() == 1 && i == first.step:
					first.hold(ctx, r.ExecutionID)
				case phase.Load() == 2 && i == second.step:
					second.hold(ctx, r.ExecutionID)
				}
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
	ids := make([]string, n)
	for i := range n {
		var x kernel.Execution
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/executions", map[string]any{"agent_id": "crashy", "input": i}, &x); err != nil {
			t.Fatal(err)
		}
		ids[i] = x.ID
	}
	snapshot := func(url string) map[string][]kernel.Event {
		t.Helper()
		out := map[string][]kernel.Event{}
		for _, id := range ids {
			evs, err := testkit.AllEvents(url, testkit.AdminKey, id)
			if err != nil {
				t.Fatal(err)
			}
			out[id] = evs
		}
		return out
	}
	kill := func(p *process) {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = p.cmd.Wait()
	}

	// First kill: every execution is inside step 5 (steps 0-4 succeeded,
	// step 5 executing). What the kernel acknowledged is read, then it dies.
	first.wait(t, "first run", p)
	before := snapshot(p.url)
	kill(p)
	close(first.release)    // the held steps finish against a dead kernel
	waitAgentIdle(t, agent) // ... and their runs end there, before a kernel comes back
	for id, evs := range before {
		if got := testkit.Count(evs, kernel.EvStepSucceeded); got != first.step || isTerminal(evs[len(evs)-1].Type) {
			t.Fatalf("%s at the first kill: %d steps succeeded (want %d), last event %s", id, got, first.step, evs[len(evs)-1].Type)
		}
	}

	// Second kill, during recovery: the restarted kernel re-delivers, the
	// agent replays steps 0-4, re-runs step 5 and holds inside step 10.
	phase.Store(2)
	pr := startServe(t, dir, addr)
	second.wait(t, "recovery", pr)
	mid := snapshot(pr.url)
	for _, id := range ids {
		checkPrefix(t, id, before[id], mid[id])
	}
	kill(pr)
	close(second.release)
	waitAgentIdle(t, agent)

	phase.Store(3)
	p2 := startServe(t, dir, addr)
	defer func() { _ = p2.cmd.Process.Kill(); _ = p2.cmd.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
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
		checkPrefix(t, id, mid[id], after)
		if got := testkit.Count(after, kernel.EvStepSucceeded); got != steps {
			t.Errorf("%s: %d steps succeeded, want %d", id, got, steps)
		}
		// The steps in flight at the kills ran again under a later attempt.
		if got := countOrphanReruns(t, after); got < 2 {
			t.Errorf("%s: %d orphaned steps re-ran, want at least the two in flight at the kills", id, got)
		}
	}
}

// waitAgentIdle waits until the agent has finished every dispatch.
func waitAgentIdle(t *testing.T, a *testkit.Agent) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for a.Running() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d agent runs still going", a.Running())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// countOrphanReruns counts step.executing events of steps found in flight
// under an earlier attempt.
func countOrphanReruns(t *testing.T, evs []kernel.Event) int {
	t.Helper()
	n := 0
	for _, ev := range evs {
		if ev.Type == kernel.EvStepExecuting && bytes.Contains(ev.Payload, []byte(`"orphaned_from"`)) {
			n++
		}
	}
	return n
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

func isTerminal(typ kernel.EventType) bool {
	return typ == kernel.EvExecutionCompleted || typ == kernel.EvExecutionFailed || typ == kernel.EvExecutionCancelled
}
