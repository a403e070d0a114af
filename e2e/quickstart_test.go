package e2e

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReadmeQuickStart follows the README's "Your first agent" as a new
// user would, with real processes: `wicket serve` with no key (loopback,
// client auth off), the hello example started right after it (it waits for
// the kernel), `wicket exec create hello --wait --brief`, then
// `wicket exec events ID --brief`. Only the addresses differ from the
// README, so that the test runs beside anything on 8080 and 5001.
// syncBuffer is a bytes.Buffer a process writes to while the test reads it.
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

func TestReadmeQuickStart(t *testing.T) {
	wicket := wicketBinary(t)
	hello := filepath.Join(t.TempDir(), "hello")
	if out, err := exec.Command("go", "build", "-o", hello, "../examples/hello").CombinedOutput(); err != nil {
		t.Fatalf("go build examples/hello: %v\n%s", err, out)
	}
	dir := t.TempDir()
	kernelAddr, agentAddr := freeAddr(t), freeAddr(t)
	url := "http://" + kernelAddr

	var serveOut, helloOut syncBuffer
	serve := exec.Command(wicket, "serve", "--data", filepath.Join(dir, "wicket-data"), "--addr", kernelAddr)
	serve.Stdout, serve.Stderr = &serveOut, &serveOut
	agent := exec.Command(hello, "--kernel", url, "--listen", agentAddr)
	agent.Stdout, agent.Stderr = &helloOut, &helloOut
	// The agent first, as a user who is quick with the second terminal:
	// it must wait for the kernel rather than give up. Gate: the agent
	// listens (it does so before it waits for the kernel), then the kernel
	// starts.
	for _, c := range []*exec.Cmd{agent, serve} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		if c != agent {
			continue
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			conn, err := net.Dial("tcp", agentAddr)
			if err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the hello agent never listened: %v\n%s", err, helloOut.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(helloOut.String(), "is registered") {
		if time.Now().After(deadline) {
			t.Fatalf("the hello agent never registered.\nserve:\n%s\nhello:\n%s", serveOut.String(), helloOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	cli := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, wicket, args...)
		cmd.Env = append(os.Environ(), "WICKET_URL="+url)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("wicket %s: %v\n%s\nhello:\n%s", strings.Join(args, " "), err, out, helloOut.String())
		}
		return string(out)
	}
	out := cli("exec", "create", "hello", "--input", `{"name":"Ada"}`, "--wait", "--brief")
	for _, want := range []string{"execution.created", "tool_call  greet", "step.succeeded", "execution.completed", `"status": "completed"`, "Hello, Ada!"} {
		if !strings.Contains(out, want) {
			t.Fatalf("exec create --wait --brief does not show %q:\n%s", want, out)
		}
	}
	id := regexp.MustCompile(`"id": "([0-9a-f-]{36})"`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("no execution id in:\n%s", out)
	}
	events := cli("exec", "events", id[1], "--brief")
	lines := strings.Split(strings.TrimSpace(events), "\n")
	if !strings.HasPrefix(strings.TrimSpace(lines[0]), "1  execution.created") || !strings.Contains(lines[len(lines)-1], "execution.completed") {
		t.Fatalf("exec events --brief:\n%s", events)
	}
}
