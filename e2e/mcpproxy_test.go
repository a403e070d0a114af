package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// gateQuickStart reads docs/gate.md's quick start: its manifest (the
// first yaml block) and its desktop host config (the first json block).
func gateQuickStart(t *testing.T) (manifest string, host struct {
	MCPServers map[string]struct {
		Command string            `json:"command"`
		Args    []string          `json:"args"`
		Env     map[string]string `json:"env"`
	} `json:"mcpServers"`
}) {
	t.Helper()
	doc, err := os.ReadFile("../docs/gate.md")
	if err != nil {
		t.Fatal(err)
	}
	block := func(lang string) string {
		_, rest, ok := strings.Cut(string(doc), "```"+lang+"\n")
		if !ok {
			t.Fatalf("docs/gate.md has no %s block", lang)
		}
		b, _, _ := strings.Cut(rest, "```")
		// The quick start's blocks are indented in a list item.
		var out []string
		for _, l := range strings.Split(b, "\n") {
			out = append(out, strings.TrimPrefix(l, "   "))
		}
		return strings.Join(out, "\n")
	}
	if err := json.Unmarshal([]byte(block("json")), &host); err != nil {
		t.Fatalf("docs/gate.md's host config: %v", err)
	}
	return block("yaml"), host
}

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
	manifest, host := gateQuickStart(t)
	key, secret := "desktop-key-0123456789abcdef", "desktop-secret-0123456789"
	t.Setenv("DESKTOP_KEY", key)
	t.Setenv("DESKTOP_SECRET", secret)
	mpath := filepath.Join(dir, "wicket.yaml")
	if err := os.WriteFile(mpath, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, filepath.Join(dir, "data"), freeAddr(t), "--lease-timeout", "2s", "--config", mpath)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	admin := client.New(p.url, client.WithAPIKey(testkit.AdminKey))
	ctx := context.Background()
	srv, ok := host.MCPServers["files"]
	if !ok || srv.Command != "wicket" || len(srv.Args) < 1 || srv.Args[0] != "mcp-proxy" {
		t.Fatalf("docs/gate.md's host config: %+v", host)
	}
	journal := filepath.Join(dir, "journal")
	files := testBinary(t, "mcpfiles") + " --journal " + journal
	// The documented arguments, with the upstream replaced by the test's
	// and --agent dropped when attaching; the documented environment.
	docArgs := func(attach string) []string {
		var out []string
		for i := 1; i < len(srv.Args); i++ {
			switch a := srv.Args[i]; {
			case a == "--upstream":
				i++
				name, _, _ := strings.Cut(srv.Args[i], "=")
				out = append(out, a, name+"="+files)
			case a == "--agent" && attach != "":
				i++
				out = append(out, a, srv.Args[i], "--execution", attach) // a restart: the same args and --execution
			default:
				out = append(out, a)
			}
		}
		return append(out, "--heartbeat", "300ms")
	}
	env := os.Environ()
	for k, v := range srv.Env {
		switch k {
		case "WICKET_URL":
			v = p.url
		case "WICKET_API_KEY":
			v = key
		}
		env = append(env, k+"="+v)
	}

	connect := func(args ...string) (*exec.Cmd, *mcp.ClientSession, *syncBuffer) {
		t.Helper()
		cmd := exec.Command(wicketBinary(t), append([]string{"mcp-proxy"}, args...)...)
		cmd.Env = env
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

	cmd, cs, stderr := connect(docArgs("")...)
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
	_, cs, stderr = connect(docArgs(id)...)
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
		if s.Verdict == nil || s.Verdict.RuleID == "" {
			t.Errorf("step %s has no decision", s.Target)
		}
	}
	if got["files.read"] != "succeeded" || got["files.delete"] != "denied" || got["files.write"] != "succeeded" {
		t.Fatalf("steps %v", got)
	}
}

// `wicket mcp-proxy --listen`: the real binary serves streamable HTTP in
// front of a streamable-HTTP upstream (a tool without annotations, whose
// effect comes from --effect); two MCP clients of the MCP Go SDK share its
// one session (labelled by --label); on SIGTERM it gives its lease up, so
// the session is attached again at once.
func TestMCPProxyListen(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}})
	admin := client.New(env.URL, client.WithAPIKey(testkit.AdminKey))
	ctx := context.Background()
	if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "ide", Secret: "ide-secret-0123456789abc"}); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(ctx, "default", wire.KeyRequest{Role: "client", Principal: "ide"})
	if err != nil {
		t.Fatal(err)
	}
	var fetches atomic.Int32
	up := mcp.NewServer(&mcp.Implementation{Name: "web", Version: "1"}, nil)
	mcp.AddTool(up, &mcp.Tool{Name: "fetch", Description: "fetch a URL"},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			URL string `json:"url"`
		}) (*mcp.CallToolResult, any, error) {
			n := fetches.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("page %s #%d", in.URL, n)}}}, nil, nil
		})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up }, nil))
	defer ts.Close()

	addr := freeAddr(t)
	cmd := exec.Command(wicketBinary(t), "mcp-proxy", "--url", env.URL, "--key", k.Key, "--agent", "ide", "--listen", addr,
		"--upstream", "web="+ts.URL, "--effect", "web.fetch=read_only", "--label", "team=docs")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(stderr.String(), "serving MCP over streamable HTTP") {
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not serve:\n%s", stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	connect := func(name string) *mcp.ClientSession {
		c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, nil)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cs, err := c.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr}, nil)
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, stderr)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	for i, cs := range []*mcp.ClientSession{connect("one"), connect("two")} {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "web_fetch", Arguments: map[string]any{"url": "https://example.com"}})
		cancel()
		if err != nil || res.IsError || mcpText(res) != fmt.Sprintf("page https://example.com #%d", i+1) {
			t.Fatalf("client %d: %+v %v\n%s", i, res, err, stderr)
		}
	}
	list, err := admin.ListExecutions(ctx, client.ListOptions{AgentID: "ide"})
	if err != nil || len(list.Executions) != 1 {
		t.Fatalf("executions %+v %v", list, err)
	}
	x := list.Executions[0]
	if x.Labels["team"] != "docs" || x.Status != "running" {
		t.Fatalf("session %+v", x)
	}
	steps, err := admin.Steps(ctx, x.ID)
	if err != nil || len(steps) != 2 {
		t.Fatalf("steps %+v %v", steps, err)
	}
	for _, s := range steps {
		if s.Target != "web.fetch" || s.Status != "succeeded" || s.Effect != "read_only" || s.Idempotency != "safe_to_retry" {
			t.Fatalf("step %+v", s)
		}
	}

	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the proxy's exit: %v\n%s", err, stderr)
	}
	evs, err := admin.AllEvents(ctx, x.ID)
	if err != nil {
		t.Fatal(err)
	}
	detached := 0
	for _, ev := range evs {
		if ev.Type == string(kernel.EvSessionDetached) && strings.Contains(string(ev.Payload), `"reason":"detached"`) {
			detached++
		}
	}
	if detached != 1 {
		t.Fatalf("no session.detached (detached) after SIGTERM:\n%s", stderr)
	}
	if _, err := client.New(env.URL, client.WithAPIKey(k.Key)).AttachSession(ctx, x.ID); err != nil {
		t.Fatalf("attach after the proxy stopped: %v", err)
	}
}
