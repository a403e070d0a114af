package e2e

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
)

// registerAgent registers an agent on a running kernel and returns the
// status and error of the answer.
func registerAgent(p *process, id, webhook string) (int, error) {
	return testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/agents",
		map[string]any{"id": id, "webhook_url": webhook, "secret": secret}, nil)
}

// waitEvent polls an execution's log until an event of typ appears.
func waitEvent(t *testing.T, p *process, id, typ string) kernel.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := testkit.AllEvents(p.url, testkit.AdminKey, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if string(ev.Type) == typ {
				return ev
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in %v", typ, testkit.Types(evs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func createExecution(t *testing.T, p *process, agentID string) string {
	t.Helper()
	var x kernel.Execution
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/executions", map[string]any{"agent_id": agentID, "input": 1}, &x); err != nil {
		t.Fatal(err)
	}
	return x.ID
}

// TestWebhookAddressPolicy runs a real `wicket serve`: webhook URLs that
// lead to cloud metadata, link-local addresses or the kernel itself are
// refused at registration; a delivery failure records a class, not the
// dial error (which goes to the kernel's log); a stored agent whose address
// becomes forbidden (here by --webhook-deny-cidr after a restart) is refused
// at dial time, and its listener never sees a connection.
func TestWebhookAddressPolicy(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	p := startServe(t, dir, addr, "--dispatch-max-attempts", "1")
	stop := func(p *process) string {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		return p.stderr.String()
	}
	defer func() { stop(p) }()
	_, port, _ := net.SplitHostPort(addr)

	for _, tc := range []struct{ url, reason string }{
		{"http://169.254.169.254/latest/meta-data/iam/security-credentials/", "cloud metadata"},
		{"http://[fd00:ec2::254]/latest/meta-data/", "cloud metadata"},
		{"http://[::ffff:169.254.169.254]/", "cloud metadata"},
		{"http://169.254.10.5:8080/hook", "link-local"},
		{"http://[fe80::1]:8080/hook", "link-local"},
		{"http://" + addr + "/v0/executions", "own listen address"},
		{"http://localhost:" + port + "/v0/agents", "own listen address"},
		{"http://0.0.0.0:" + port + "/", "unspecified"},
	} {
		st, err := registerAgent(p, "bad", tc.url)
		if st != http.StatusBadRequest || err == nil || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("register %s: %d %v, want 400 naming %q", tc.url, st, err, tc.reason)
		}
	}
	if st, err := testkit.Bearer(p.url, testkit.AdminKey, "GET", "/v0/agents/bad", nil, nil); st != http.StatusNotFound {
		t.Errorf("a refused agent was stored: %d %v", st, err)
	}

	// Nothing listens: the event says connect_refused and nothing else.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	if _, err := registerAgent(p, "gone", "http://"+closedAddr+"/hook"); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, p, createExecution(t, p, "gone"), string(kernel.EvDispatchFailed))
	var payload map[string]any
	if err := json.Unmarshal(ev.Payload, &payload); err != nil {
		t.Fatal(err)
	}
	if payload["error"] != kernel.DeliveryConnectRefused {
		t.Errorf("dispatch.failed payload %s: want error connect_refused", ev.Payload)
	}
	for _, leak := range []string{closedAddr, "dial", "refused:", "tcp"} {
		if strings.Contains(string(ev.Payload), leak) {
			t.Errorf("dispatch.failed payload %s carries %q", ev.Payload, leak)
		}
	}

	// An agent on 127.0.0.2, allowed now.
	var conns atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2: %v", err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()
	if _, err := registerAgent(p, "moved", "http://"+ln.Addr().String()+"/hook"); err != nil {
		t.Fatalf("127.0.0.2 before the deny: %v", err)
	}
	log := stop(p)
	if !strings.Contains(log, "webhook delivery failed") || !strings.Contains(log, "connection refused") || !strings.Contains(log, closedAddr) {
		t.Errorf("the kernel log lacks the full delivery error:\n%s", log)
	}

	// Restart denying 127.0.0.2 and admitting one link-local address.
	p = startServe(t, dir, addr, "--dispatch-max-attempts", "1",
		"--webhook-deny-cidr", "127.0.0.2/32", "--webhook-allow-cidr", "169.254.10.0/24")
	id := createExecution(t, p, "moved")
	ev = waitEvent(t, p, id, string(kernel.EvDispatchFailed))
	if err := json.Unmarshal(ev.Payload, &payload); err != nil {
		t.Fatal(err)
	}
	if payload["error"] != kernel.DeliveryForbiddenAddress {
		t.Errorf("dispatch.failed payload %s: want error forbidden_address", ev.Payload)
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("the forbidden agent saw %d connections, want 0", n)
	}
	if st, err := registerAgent(p, "moved2", "http://"+ln.Addr().String()+"/hook"); st != http.StatusBadRequest || !strings.Contains(err.Error(), "--webhook-deny-cidr 127.0.0.2/32") {
		t.Errorf("register on a denied prefix: %d %v", st, err)
	}
	if _, err := registerAgent(p, "linklocal", "http://169.254.10.5:8080/hook"); err != nil {
		t.Errorf("register on an allowed link-local prefix: %v", err)
	}
	if st, _ := registerAgent(p, "meta", "http://169.254.169.254/"); st != http.StatusBadRequest {
		t.Errorf("metadata under an allowed link-local prefix: %d, want 400", st)
	}
}
