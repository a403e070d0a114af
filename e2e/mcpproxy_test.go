package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

const desktopRules = `default_action: allow
rules:
  - id: no-deletes
    priority: 1
    when: {target: "files.delete"}
    then: {decision: deny, reason: deleting files is not allowed}
  - id: writes-need-a-human
    priority: 2
    when: {target: "files.write"}
    then: {decision: require_approval, reason: a human reviews every write}
`

func mcpText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// The desktop-host setup of docs/gate.md, all real processes: `wicket
// serve`, `wicket mcp-proxy` started over stdio by an MCP client of the MCP
// Go SDK (as a desktop host starts it), in front of an upstream MCP server
// process. Allowed, denied and approved calls; the proxy is SIGKILLed and
// started again with --execution, and the same calls replay from the
// record without reaching the upstream.
func TestMCPProxyProcess(t *testing.T) {
	dir := t.TempDir()
	p := startServe(t, filepath.Join(dir, "data"), freeAddr(t), "--lease-timeout", "2s")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	admin := client.New(p.url, client.WithAPIKey(testkit.AdminKey))
	ctx := context.Background()
	if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "desktop", Secret: "desktop-secret-0123456789"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetPolicy(ctx, "desktop", desktopRules); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(ctx, "default", wire.KeyRequest{Role: "client", Principal: "desktop-host"})
	if err != nil {
		t.Fatal(err)
	}
	journal := filepath.Join(dir, "journal")
	files := testBinary(t, "mcpfiles") + " --journal " + journal

	connect := func(args ...string) (*exec.Cmd, *mcp.ClientSession, *syncBuffer) {
		t.Helper()
		cmd := exec.Command(wicketBinary(t), append([]string{"mcp-proxy", "--url", p.url, "--key", k.Key,
			"--upstream", "files=" + files, "--heartbeat", "300ms"}, args...)...)
		stderr := &syncBuffer{}
		cmd.Stderr = stderr
		c := mcp.NewClient(&mcp.Implementation{Name: "desktop-host", Version: "1"}, nil)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cs, err := c.Connect(cctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("connect to wicket mcp-proxy: %v\n%s", err, stderr)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cmd, cs, stderr
	}
	call := func(cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}

	cmd, cs, stderr := connect("--agent", "desktop")
	if r := call(cs, "files_read", map[string]any{"path": "todo.md"}); r.IsError || mcpText(r) != "content of todo.md" {
		t.Fatalf("read: %q\n%s", mcpText(r), stderr)
	}
	if r := call(cs, "files_delete", map[string]any{"path": "todo.md"}); !r.IsError || !strings.Contains(mcpText(r), "rule no-deletes") {
		t.Fatalf("delete: %q", mcpText(r))
	}
	// The write waits for a human.
	granted := make(chan error, 1)
	go func() {
		for i := 0; i < 600; i++ {
			aps, err := admin.Approvals(ctx, "pending")
			if err == nil && len(aps) == 1 {
				_, err = admin.Grant(ctx, aps[0].ID, wire.ResolveApprovalRequest{RequestHash: aps[0].RequestHash})
				granted <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		granted <- fmt.Errorf("no pending approval")
	}()
	if r := call(cs, "files_write", map[string]any{"path": "done.md", "content": "shipped"}); r.IsError || mcpText(r) != "wrote 7 bytes to done.md" {
		t.Fatalf("write: %q", mcpText(r))
	}
	if err := <-granted; err != nil {
		t.Fatal(err)
	}
	if got := readLines(t, journal); strings.Join(got, "|") != "read todo.md|write done.md" {
		t.Fatalf("upstream calls %q", got)
	}
	list, err := admin.ListExecutions(ctx, client.ListOptions{AgentID: "desktop"})
	if err != nil || len(list.Executions) != 1 {
		t.Fatalf("executions %+v %v", list, err)
	}
	id := list.Executions[0].ID

	// The proxy dies without giving its lease up; the host starts it again
	// on the same session, and it waits for the lease to lapse.
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cs.Close()
	_, cs, stderr = connect("--execution", id)
	if r := call(cs, "files_read", map[string]any{"path": "todo.md"}); r.IsError || mcpText(r) != "content of todo.md" {
		t.Fatalf("replayed read: %q\n%s", mcpText(r), stderr)
	}
	if r := call(cs, "files_write", map[string]any{"path": "done.md", "content": "shipped"}); r.IsError || mcpText(r) != "wrote 7 bytes to done.md" {
		t.Fatalf("replayed write: %q", mcpText(r))
	}
	if got := readLines(t, journal); len(got) != 2 {
		t.Fatalf("a replay reached the upstream: %q", got)
	}
	if !strings.Contains(stderr.String(), "waiting for it to lapse") {
		t.Errorf("the restarted proxy did not wait for the dead one's lease:\n%s", stderr)
	}
	steps, err := admin.Steps(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range steps {
		got[s.Target] = s.Status
		if s.Decision == nil || s.Decision.RuleID == "" {
			t.Errorf("step %s has no decision", s.Target)
		}
	}
	if got["files.read"] != "succeeded" || got["files.delete"] != "denied" || got["files.write"] != "succeeded" {
		t.Fatalf("steps %v", got)
	}
}
