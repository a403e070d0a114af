package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
)

// TestAckedStepSurvivesKillAfterResponse runs eight executions that submit
// and complete steps as fast as they can against a real `wicket serve`
// (fsync on, the group commit busy), and SIGKILLs the process the instant
// one chosen answer has been read: once right after a step's complete was
// answered, once right after a submission was answered proceed. After a
// restart on the same data directory every step whose completion was
// answered is succeeded with the result sent, every step answered proceed
// is recorded executing (or later), and no event is recorded twice. The
// kill is taken by the agent goroutine that read the answer, before it
// sends anything else. (A process kill leaves the page cache alone: this
// proves nothing is answered before its commit; that the commit is on disk
// before the answer is the write-ahead log's fdatasync, which comes before
// bbolt's commit, or with --no-wal bbolt's Commit, which fsyncs before it
// returns; store/bbolt's TestWALSurvivesLostWrites simulates the power
// cut.) With the log, the kill leaves it beside the file: `store check`
// refuses the file until the restarted kernel has applied it.
func TestAckedStepSurvivesKillAfterResponse(t *testing.T) {
	for _, mode := range []string{"wal", "no-wal"} {
		for _, at := range []string{"complete", "proceed"} {
			t.Run(mode+"/"+at, func(t *testing.T) { ackKill(t, at, mode == "wal") })
		}
	}
}

// ack is one answered request: the step and, for a completion, its result.
type ack struct {
	exec, step string
	result     string // "" for a proceed
}

func ackKill(t *testing.T, at string, wal bool) {
	dir := t.TempDir()
	addr := freeAddr(t)
	var extra []string
	if !wal {
		extra = append(extra, "--no-wal")
	}
	p := startServe(t, dir, addr, extra...)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()

	const n, killAfter = 8, 60 // executions; answers before the kill
	var (
		mu     sync.Mutex
		acks   []ack
		killed = make(chan struct{})
		once   sync.Once
	)
	record := func(a ack) {
		mu.Lock()
		acks = append(acks, a)
		count := len(acks)
		mu.Unlock()
		if count >= killAfter && (a.result != "") == (at == "complete") {
			once.Do(func() {
				_ = p.cmd.Process.Signal(syscall.SIGKILL)
				close(killed)
			})
		}
	}
	agent := testkit.NewAgent("acker", secret, p.url, func(ctx context.Context, r *testkit.Run) (any, error) {
		select {
		case <-killed: // a run delivered by the restarted kernel does nothing
			<-ctx.Done()
			return nil, ctx.Err()
		default:
		}
		c := r.Client()
		for i := 0; ; i++ {
			var d kernel.StepDecision
			body := map[string]any{"kind": "tool_call", "target": "work", "args": map[string]int{"i": i}, "idempotency": "safe_to_retry"}
			if err := c.Do(ctx, "POST", "/v0/executions/"+r.ExecutionID+"/steps", &r.Lease, body, &d); err != nil {
				return nil, err
			}
			if d.Decision != kernel.DecisionProceed {
				return nil, fmt.Errorf("step %d: %s", i, d.Decision)
			}
			record(ack{exec: r.ExecutionID, step: d.StepID})
			res := fmt.Sprintf(`{"exec":%q,"i":%d}`, r.ExecutionID, i)
			if err := c.Do(ctx, "POST", "/v0/executions/"+r.ExecutionID+"/steps/"+d.StepID+"/complete", &r.Lease,
				map[string]any{"result": json.RawMessage(res)}, nil); err != nil {
				return nil, err
			}
			record(ack{exec: r.ExecutionID, step: d.StepID, result: res})
		}
	})
	defer agent.Close()
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/agents", map[string]any{"id": "acker", "webhook_url": agent.WebhookURL(), "secret": secret}, nil); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/executions", map[string]any{"agent_id": "acker", "input": i}, nil); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-killed:
	case <-time.After(120 * time.Second):
		t.Fatalf("the kill point was not reached; kernel log:\n%s", p.stderrString())
	}
	_ = p.cmd.Wait()
	if ps := p.cmd.ProcessState; ps == nil || ps.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the kernel did not die of SIGKILL: %v", ps)
	}
	waitAgentIdle(t, agent)
	mu.Lock()
	answered := append([]ack(nil), acks...)
	mu.Unlock()

	_, statErr := os.Stat(filepath.Join(dir, "wicket.db-wal"))
	if wal != (statErr == nil) {
		t.Fatalf("after the kill, with the log %v: the log directory: %v", wal, statErr)
	}
	if wal {
		out, err := exec.Command(wicketBinary(t), "store", "check", "--data", dir).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "write-ahead log") {
			t.Fatalf("store check of a killed kernel's store: %v %s, want a refusal naming the log", err, out)
		}
	}

	p2 := startServe(t, dir, addr, extra...)
	defer func() { _ = p2.cmd.Process.Kill(); _ = p2.cmd.Wait() }()
	proceeds, completes := 0, 0
	for _, a := range answered {
		var s kernel.Step
		if _, err := testkit.Bearer(p2.url, testkit.AdminKey, "GET", "/v0/executions/"+a.exec+"/steps/"+a.step, nil, &s); err != nil {
			t.Fatalf("step %s of %s was answered before the kill and is gone after it: %v", a.step, a.exec, err)
		}
		if a.result == "" {
			proceeds++
			if s.Status != kernel.StepExecuting && !s.Status.Terminal() {
				t.Errorf("step %s was answered proceed before the kill; after it, %s", a.step, s.Status)
			}
			continue
		}
		completes++
		if s.Status != kernel.StepSucceeded || string(s.Result) != a.result {
			t.Errorf("step %s was answered complete (%s) before the kill; after it, %s %s", a.step, a.result, s.Status, s.Result)
		}
	}
	if proceeds == 0 || completes == 0 || len(answered) < killAfter {
		t.Fatalf("answered before the kill: %d proceeds, %d completes (want both, %d answers at least)", proceeds, completes, killAfter)
	}
	execs := map[string]bool{}
	for _, a := range answered {
		execs[a.exec] = true
	}
	for id := range execs {
		evs, err := testkit.AllEvents(p2.url, testkit.AdminKey, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := testkit.CheckLog(evs); err != nil {
			t.Errorf("%s: %v\n%v", id, err, testkit.Types(evs))
		}
	}
	t.Logf("%s: %d proceeds and %d completions answered before the kill, all back after the restart", at, proceeds, completes)
}
