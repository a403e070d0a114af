package agent_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// kernelProcessEnv makes this test binary, run as TestKernelProcess, a
// kernel for TestAllocsStep: a process of its own, so that the
// allocations counted in the test's process are the SDK's alone.
const kernelProcessEnv = "WICKET_SDK_TEST_KERNEL_PROCESS"

// TestKernelProcess is not a test: in the child that TestAllocsStep
// starts, it serves a real kernel (bbolt, fsync on, HTTP on loopback),
// prints its URL and serves until its stdin closes.
func TestKernelProcess(t *testing.T) {
	if os.Getenv(kernelProcessEnv) != "1" {
		return // run as a test: nothing to do
	}
	env := testkit.Start(t, testkit.Options{})
	fmt.Printf("url=%s\n", env.URL)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// startKernelProcess starts TestKernelProcess in a child process and
// returns its URL; the child ends with the test.
func startKernelProcess(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestKernelProcess$", "-test.count", "1")
	cmd.Env = append(os.Environ(), kernelProcessEnv+"=1")
	var stderr strings.Builder // the kernel's log, shown if the test fails
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("the kernel process's log:\n%s", stderr.String())
		}
	})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "url="); ok {
				urls <- u
				break
			}
		}
		close(urls)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case u, ok := <-urls:
		if !ok {
			t.Fatal("the kernel process ended without serving")
		}
		return u
	case <-time.After(2 * time.Minute):
		t.Fatal("the kernel process did not start within 2 minutes")
	}
	return ""
}

// maxStepAllocs is the ceiling on the heap allocations of one step (a
// signed submit and a signed complete through Execution, with the
// default client's net/http Transport) in the agent's process. It sits a
// little above what the code does today (see the test's log); lower it
// when the count falls, raise it only for a reason.
const maxStepAllocs = 144

// TestAllocsStep counts the agent process's heap allocations per step
// against a real kernel over loopback, in another process (as `wicket
// bench` runs its load), and holds them under maxStepAllocs. It runs
// without -race (.ci/run reruns TestAllocs* so).
func TestAllocsStep(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector are not the program's")
	}
	url := startKernelProcess(t)
	type result struct {
		allocs float64
		err    error
	}
	res := make(chan result, 1)
	handler := agent.HandlerFunc(func(ctx context.Context, _ json.RawMessage) (any, error) {
		ex, err := agent.FromContext(ctx)
		if err != nil {
			res <- result{err: err}
			return nil, err
		}
		var failed error
		n := 0
		var args, out []byte
		step := func() {
			n++
			args = append(strconv.AppendInt(append(args[:0], `{"n":`...), int64(n), 10), `,"q":"allocs"}`...)
			d, err := ex.Submit(ctx, wire.StepSubmitRequest{Kind: agent.KindToolCall, Target: "search", Args: args})
			if err == nil && d.Decision != wire.DecisionProceed {
				err = fmt.Errorf("decision %+v", d)
			}
			if err == nil {
				out = append(strconv.AppendInt(append(out[:0], `{"n":`...), int64(n), 10), '}')
				err = ex.Complete(ctx, d.StepID, out, nil)
			}
			if err != nil && failed == nil {
				failed = err
			}
		}
		step() // the connections dialled, the maps grown
		allocs := testing.AllocsPerRun(200, step)
		res <- result{allocs: allocs, err: failed}
		return nil, failed
	})
	a, err := agent.New(agent.Config{ID: "allocs", Secret: []byte(secret), KernelURL: url, Handler: handler,
		HeartbeatInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
		srv.Close()
	})
	admin := client.New(url, client.WithAPIKey(testkit.AdminKey))
	ctx := context.Background()
	if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "allocs", WebhookURL: srv.URL + "/webhook", Secret: secret}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateExecution(ctx, wire.CreateExecutionRequest{AgentID: "allocs", Input: json.RawMessage(`{}`)}, ""); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-res:
	case <-time.After(3 * time.Minute):
		t.Fatal("the handler did not report within 3 minutes")
	}
	if r.err != nil {
		t.Fatalf("a step failed: %v", r.err)
	}
	t.Logf("%.0f heap allocations per step, submit and complete (ceiling %d)", r.allocs, maxStepAllocs)
	if r.allocs > maxStepAllocs {
		t.Errorf("%.0f heap allocations per step, ceiling %d", r.allocs, maxStepAllocs)
	}
}
