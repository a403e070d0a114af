package mcpproxy_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wicket-run/wicket/internal/mcpproxy"
	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// The test binary is also the stdio upstream: run with upstreamEnv set it
// serves an MCP "files" server on stdin and stdout, logging every call to
// the file the variable names.
const upstreamEnv = "WICKET_TEST_MCP_UPSTREAM_LOG"

func TestMain(m *testing.M) {
	if log := os.Getenv(upstreamEnv); log != "" {
		if err := serveFilesUpstream(log); err != nil {
			fmt.Fprintln(os.Stderr, "upstream:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type pathIn struct {
	Path string `json:"path"`
}

type writeIn struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

// serveFilesUpstream is an MCP server built with the MCP Go SDK: read
// (annotated read-only), write and delete (annotated destructive).
func serveFilesUpstream(logPath string) error {
	logCall := func(what string) {
		f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintln(f, what)
			f.Close()
		}
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "files", Version: "1"}, nil)
	no := false
	mcp.AddTool(s, &mcp.Tool{Name: "read", Description: "read a file", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in pathIn) (*mcp.CallToolResult, any, error) {
			logCall("read " + in.Path)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "content of " + in.Path}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "write", Description: "write a file", Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no}},
		func(_ context.Context, _ *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, any, error) {
			logCall("write " + in.Path)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("wrote %d bytes to %s", len(in.Content), in.Path)}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "delete", Description: "delete a file", Annotations: &mcp.ToolAnnotations{}},
		func(_ context.Context, _ *mcp.CallToolRequest, in pathIn) (*mcp.CallToolResult, any, error) {
			logCall("delete " + in.Path)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deleted " + in.Path}}}, nil, nil
		})
	return s.Run(context.Background(), &mcp.StdioTransport{})
}

// webUpstream is an in-process MCP server over streamable HTTP with a fetch
// tool (no annotations: its effect comes from the --effect flag) that
// counts its calls.
type webUpstream struct {
	fetches atomic.Int32
}

type fetchIn struct {
	URL string `json:"url"`
}

type fetchOut struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
}

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
  - id: no-secret-fetches
    priority: 3
    when:
      target: "web.fetch"
      arguments: {url: {contains: secret}}
    then: {decision: deny, reason: no secrets}
`

// harness is a real kernel with a gate-only agent bound to desktopRules, a
// client key, and the two upstreams.
type harness struct {
	t       *testing.T
	env     *testkit.Env
	admin   *client.Client
	key     string
	web     *webUpstream
	webURL  string
	callLog string
	// approvalWait is the proxies' --approval-wait (a minute unless a
	// test sets it).
	approvalWait time.Duration
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}})
	admin := client.New(env.URL, client.WithAPIKey(testkit.AdminKey))
	ctx := context.Background()
	if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "desktop", Secret: "desktop-secret-0123456789"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetPolicy(ctx, "desktop", desktopRules); err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(ctx, "default", wire.KeyRequest{Role: "client", Principal: "claude-desktop"})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, env: env, admin: admin, key: k.Key, callLog: filepath.Join(t.TempDir(), "calls.log"), approvalWait: time.Minute}
	h.web = &webUpstream{}
	s := mcp.NewServer(&mcp.Implementation{Name: "web", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "fetch", Description: "fetch a URL"},
		func(_ context.Context, _ *mcp.CallToolRequest, in fetchIn) (*mcp.CallToolResult, fetchOut, error) {
			n := h.web.fetches.Add(1)
			if strings.Contains(in.URL, "broken") {
				return nil, fetchOut{}, fmt.Errorf("cannot fetch %s", in.URL)
			}
			return nil, fetchOut{Status: 200, Body: fmt.Sprintf("page %s (fetch #%d)", in.URL, n)}, nil
		})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(ts.Close)
	h.webURL = ts.URL
	return h
}

// proxy starts a proxy (begin a session, or attach to execID) serving
// streamable HTTP on loopback, and returns it with a connected MCP client.
func (h *harness) proxy(execID string, hide bool) (*mcpproxy.Proxy, *mcp.ClientSession, *progressLog) {
	h.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		h.t.Fatal(err)
	}
	files, err := mcpproxy.ParseUpstream("files=" + exe)
	if err != nil {
		h.t.Fatal(err)
	}
	web, err := mcpproxy.ParseUpstream("web=" + h.webURL)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Setenv(upstreamEnv, h.callLog) // inherited by the stdio upstream
	cfg := mcpproxy.Config{KernelURL: h.env.URL, APIKey: h.key, ExecutionID: execID, Upstreams: []mcpproxy.Upstream{files, web},
		HideDenied: hide, Effects: map[string]string{"": "remote_mutation"}, HeartbeatInterval: time.Second,
		ApprovalWait: h.approvalWait, Logger: slog.New(slog.NewTextHandler(testWriter{h.t}, nil))}
	if execID == "" {
		cfg.AgentID = "desktop"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := mcpproxy.New(ctx, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); _ = p.ServeHTTP(sctx, ln) }()
	prog := &progressLog{}
	c := mcp.NewClient(&mcp.Implementation{Name: "test-host", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) { prog.add(r.Params.Message) },
	})
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + ln.Addr().String()}, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		_ = cs.Close()
		stop()
		<-served
		p.Close()
	})
	return p, cs, prog
}

type progressLog struct {
	mu   sync.Mutex
	msgs []string
}

func (p *progressLog) add(m string) { p.mu.Lock(); p.msgs = append(p.msgs, m); p.mu.Unlock() }
func (p *progressLog) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.msgs)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func (h *harness) calls() []string {
	b, _ := os.ReadFile(h.callLog)
	return strings.Fields(strings.ReplaceAll(string(b), " ", "_"))
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res
}

// TestProxy drives the proxy with an MCP client of the MCP Go SDK in front
// of two upstreams built with it (one over stdio, one over streamable
// HTTP): allowed calls forwarded and recorded, a denied call answered with
// the reason and rule, a call waiting for an approval with progress
// notifications until it is granted, and every call replayed from the
// record after the proxy restarts, without reaching the upstream.
func TestProxy(t *testing.T) {
	h := newHarness(t)
	p, cs, prog := h.proxy("", false)
	execID := p.ExecutionID()

	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.Name == "files_read" && (tl.Annotations == nil || !tl.Annotations.ReadOnlyHint || tl.Description != "read a file") {
			t.Errorf("files_read not passed through: %+v", tl)
		}
	}
	if want := []string{"files_delete", "files_read", "files_write", "web_fetch"}; !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	// Allowed: forwarded, recorded.
	r := call(t, cs, "web_fetch", map[string]any{"url": "https://example.com/a"})
	if r.IsError || !strings.Contains(text(r), "fetch #1") {
		t.Fatalf("fetch: %+v", r)
	}
	if r := call(t, cs, "files_read", map[string]any{"path": "notes.txt"}); r.IsError || text(r) != "content of notes.txt" {
		t.Fatalf("read: %q", text(r))
	}
	// An upstream tool error is recorded as the step's failure.
	if r := call(t, cs, "web_fetch", map[string]any{"url": "https://broken.example"}); !r.IsError || !strings.Contains(text(r), "cannot fetch") {
		t.Fatalf("broken fetch: %+v", text(r))
	}
	// Denied: the reason and the rule, nothing sent upstream.
	r = call(t, cs, "files_delete", map[string]any{"path": "notes.txt"})
	if !r.IsError || !strings.Contains(text(r), "deleting files is not allowed") || !strings.Contains(text(r), "rule no-deletes") {
		t.Fatalf("delete: %q", text(r))
	}
	if sc, ok := r.StructuredContent.(map[string]any); !ok || sc["rule_id"] != "no-deletes" || sc["decision"] != "denied" {
		t.Fatalf("delete's structured content: %#v", r.StructuredContent)
	}
	// web_fetch declares an output schema, which a denial's structured
	// content would not conform to (the TypeScript SDK's client refuses
	// such a result): the decision is in _meta only.
	if tl := tools.Tools[slices.IndexFunc(tools.Tools, func(tl *mcp.Tool) bool { return tl.Name == "web_fetch" })]; tl.OutputSchema == nil {
		t.Fatalf("web_fetch lists no output schema: %+v", tl)
	}
	r = call(t, cs, "web_fetch", map[string]any{"url": "https://example.com/secret"})
	if !r.IsError || !strings.Contains(text(r), "rule no-secret-fetches") {
		t.Fatalf("secret fetch: %q", text(r))
	}
	if r.StructuredContent != nil {
		t.Fatalf("a denial of a tool with an output schema carries structured content that does not conform to it: %#v", r.StructuredContent)
	}
	if dec, ok := r.Meta[mcpproxy.DecisionMeta].(map[string]any); !ok || dec["rule_id"] != "no-secret-fetches" || dec["decision"] != "denied" {
		t.Fatalf("secret fetch's _meta: %#v", r.Meta)
	}
	// Pending: the call waits, with progress notifications, until a human
	// grants the approval; then it is forwarded.
	granted := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for ctx.Err() == nil {
			aps, err := h.admin.Approvals(ctx, "pending")
			if err == nil && len(aps) == 1 {
				if aps[0].Target != "files.write" || aps[0].ExecutionID != execID {
					granted <- fmt.Errorf("approval %+v", aps[0])
					return
				}
				// Wait for the call's first progress notification, so the
				// test sees the wait.
				for ctx.Err() == nil && len(prog.all()) == 0 {
					time.Sleep(20 * time.Millisecond)
				}
				_, err := h.admin.Grant(ctx, aps[0].ID, wire.ResolveApprovalRequest{RequestHash: aps[0].RequestHash})
				granted <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		granted <- ctx.Err()
	}()
	params := &mcp.CallToolParams{Name: "files_write", Arguments: map[string]any{"path": "out.txt", "content": "hello"}}
	params.SetProgressToken("write-1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	r, err = cs.CallTool(ctx, params)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatal(err)
	}
	if r.IsError || text(r) != "wrote 5 bytes to out.txt" {
		t.Fatalf("write: %q", text(r))
	}
	if msgs := prog.all(); len(msgs) == 0 || !strings.Contains(msgs[0], "waiting for approval") {
		t.Fatalf("progress %v", msgs)
	}
	if got := h.calls(); !slices.Equal(got, []string{"read_notes.txt", "write_out.txt"}) {
		t.Fatalf("upstream calls %v", got)
	}
	if h.web.fetches.Load() != 2 {
		t.Fatalf("fetches %d", h.web.fetches.Load())
	}

	// The event log has each call as a step with its decision.
	steps, err := h.admin.Steps(context.Background(), execID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range steps {
		got[s.Target+" "+string(s.Args)] = s.Status
	}
	for k, want := range map[string]string{
		`web.fetch {"url":"https://example.com/a"}`:        "succeeded",
		`files.read {"path":"notes.txt"}`:                  "succeeded",
		`web.fetch {"url":"https://broken.example"}`:       "failed",
		`files.delete {"path":"notes.txt"}`:                "denied",
		`web.fetch {"url":"https://example.com/secret"}`:   "denied",
		`files.write {"content":"hello","path":"out.txt"}`: "succeeded",
	} {
		if got[k] != want {
			t.Errorf("step %s: %q, want %q (all: %v)", k, got[k], want, got)
		}
	}
	for _, s := range steps {
		if s.Verdict == nil || s.Verdict.Bundle.Name == "" {
			t.Errorf("step %s has no decision record", s.Target)
		}
		want := map[string]string{"files.read": "read_only", "files.write": "local_mutation", "files.delete": "destructive", "web.fetch": "remote_mutation"}[s.Target]
		if s.Effect != want {
			t.Errorf("step %s: effect %q, want %q", s.Target, s.Effect, want)
		}
	}

	// Restart: the proxy stops (giving its lease up) and a new one attaches
	// with --execution. Identical calls replay the record.
	_ = cs.Close()
	p.Close()
	_, cs2, _ := h.proxy(execID, false)
	if r := call(t, cs2, "web_fetch", map[string]any{"url": "https://example.com/a"}); r.IsError || !strings.Contains(text(r), "fetch #1") {
		t.Fatalf("replayed fetch: %q", text(r))
	}
	if r := call(t, cs2, "files_read", map[string]any{"path": "notes.txt"}); r.IsError || text(r) != "content of notes.txt" {
		t.Fatalf("replayed read: %q", text(r))
	}
	if r := call(t, cs2, "web_fetch", map[string]any{"url": "https://broken.example"}); !r.IsError || !strings.Contains(text(r), "cannot fetch") {
		t.Fatalf("replayed failure: %q", text(r))
	}
	if r := call(t, cs2, "files_write", map[string]any{"path": "out.txt", "content": "hello"}); r.IsError || text(r) != "wrote 5 bytes to out.txt" {
		t.Fatalf("replayed write: %q", text(r))
	}
	if got := h.calls(); len(got) != 2 || h.web.fetches.Load() != 2 {
		t.Fatalf("a replay reached the upstream: %v, %d fetches", got, h.web.fetches.Load())
	}
	// A new call after the replayed ones is new.
	if r := call(t, cs2, "web_fetch", map[string]any{"url": "https://example.com/b"}); r.IsError || !strings.Contains(text(r), "fetch #3") {
		t.Fatalf("new fetch: %q", text(r))
	}
	evs, err := h.admin.AllEvents(context.Background(), execID)
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]int{}
	for _, ev := range evs {
		types[ev.Type]++
	}
	if types["session.attached"] != 2 || types["step.denied"] != 2 || types["approval.granted"] != 1 || types["step.succeeded"] != 4 {
		t.Fatalf("events %v", types)
	}
}

// TestProxyHidesDenied: with --hide-denied, tools/list leaves out a tool
// the policy denies whatever its arguments, and keeps one it denies only
// for some.
func TestProxyHidesDenied(t *testing.T) {
	h := newHarness(t)
	_, cs, _ := h.proxy("", true)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	if want := []string{"files_read", "files_write", "web_fetch"}; !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
}

// TestProxyApprovalWaitBounded: a call waits for its approval at most
// --approval-wait, then answers a tool error saying it is still pending,
// and the approval stays pending; once it is denied, the same call again
// is answered as denied, with the reason. Nothing reaches the upstream.
func TestProxyApprovalWaitBounded(t *testing.T) {
	h := newHarness(t)
	h.approvalWait = 300 * time.Millisecond
	p, cs, _ := h.proxy("", false)
	args := map[string]any{"path": "out.txt", "content": "hello"}
	r := call(t, cs, "files_write", args)
	if !r.IsError || !strings.Contains(text(r), "still pending after 300ms") {
		t.Fatalf("write past --approval-wait: %+v %q", r, text(r))
	}
	ctx := context.Background()
	aps, err := h.admin.Approvals(ctx, "pending")
	if err != nil || len(aps) != 1 || aps[0].Target != "files.write" || aps[0].ExecutionID != p.ExecutionID() {
		t.Fatalf("pending approvals %+v %v", aps, err)
	}
	if !strings.Contains(text(r), aps[0].ID) {
		t.Fatalf("the tool error does not name the approval %s: %q", aps[0].ID, text(r))
	}
	// Calling again waits again (and again gives up): still one approval.
	if r := call(t, cs, "files_write", args); !r.IsError || !strings.Contains(text(r), "still pending") {
		t.Fatalf("second write: %q", text(r))
	}
	if aps2, err := h.admin.Approvals(ctx, "pending"); err != nil || len(aps2) != 1 || aps2[0].ID != aps[0].ID {
		t.Fatalf("pending approvals after a second call %+v %v", aps2, err)
	}
	if _, err := h.admin.Deny(ctx, aps[0].ID, wire.ResolveApprovalRequest{RequestHash: aps[0].RequestHash, Rationale: "not today"}); err != nil {
		t.Fatal(err)
	}
	r = call(t, cs, "files_write", args)
	if !r.IsError || !strings.Contains(text(r), "denied") || strings.Contains(text(r), "still pending") {
		t.Fatalf("write after the denial: %q", text(r))
	}
	if got := h.calls(); len(got) != 0 {
		t.Fatalf("the upstream was called: %v", got)
	}
	steps, err := h.admin.Steps(ctx, p.ExecutionID())
	if err != nil || len(steps) != 1 || steps[0].Target != "files.write" || steps[0].Status != "denied" {
		t.Fatalf("steps %+v %v", steps, err)
	}
}

func TestParseUpstream(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want mcpproxy.Upstream
		err  string
	}{
		{"files=npx -y @modelcontextprotocol/server-filesystem /tmp", mcpproxy.Upstream{Name: "files", Command: []string{"npx", "-y", "@modelcontextprotocol/server-filesystem", "/tmp"}}, ""},
		{"gh=https://api.example.com/mcp", mcpproxy.Upstream{Name: "gh", URL: "https://api.example.com/mcp"}, ""},
		{"files", mcpproxy.Upstream{}, "want NAME=COMMAND"},
		{"=cmd", mcpproxy.Upstream{}, "upstream name"},
		{"a_b=cmd", mcpproxy.Upstream{}, "upstream name"},
		{"x=http://", mcpproxy.Upstream{}, "not a URL"},
	} {
		got, err := mcpproxy.ParseUpstream(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got.Name != tc.want.Name || got.URL != tc.want.URL || !slices.Equal(got.Command, tc.want.Command) {
			t.Errorf("%q: %+v %v", tc.in, got, err)
		}
	}
}

// TestProxyRefusesAnotherAgentsSession: --execution naming a session of
// another agent than --agent is refused before the proxy attaches, so the
// session's own holder is not locked out until a lease it never took
// lapses.
func TestProxyRefusesAnotherAgentsSession(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.admin.PutAgent(ctx, wire.AgentRequest{ID: "other", Secret: "other-secret-0123456789"}); err != nil {
		t.Fatal(err)
	}
	s, err := agent.Begin(ctx, agent.SessionConfig{KernelURL: h.env.URL, APIKey: h.key}, client.SessionRequest{AgentID: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	files, err := mcpproxy.ParseUpstream("web=" + h.webURL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = mcpproxy.New(ctx, mcpproxy.Config{KernelURL: h.env.URL, APIKey: h.key, AgentID: "desktop", ExecutionID: s.ID(),
		Upstreams: []mcpproxy.Upstream{files}, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err == nil || !strings.Contains(err.Error(), "belongs to agent other, not desktop") {
		t.Fatalf("proxy on another agent's session: %v", err)
	}
	// Its holder attaches at once: the proxy took no lease.
	if _, err := client.New(h.env.URL, client.WithAPIKey(h.key)).AttachSession(ctx, s.ID()); err != nil {
		t.Fatalf("attach after the refused proxy: %v", err)
	}
}

// TestProxyRefusesArgumentsNotAnObject: a tools/call whose arguments are
// not a JSON object is refused with invalid params before it becomes a
// step: the upstream never sees it, and the next proper call is the
// upstream's first.
func TestProxyRefusesArgumentsNotAnObject(t *testing.T) {
	h := newHarness(t)
	_, cs, _ := h.proxy("", false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range []any{"https://example.com/a", []any{1, 2}, 5, true} {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "web_fetch", Arguments: args})
		var werr *jsonrpc.Error
		if !errors.As(err, &werr) || werr.Code != jsonrpc.CodeInvalidParams || !strings.Contains(werr.Message, "arguments must be a JSON object") {
			t.Errorf("arguments %v: %v, want invalid params", args, err)
		}
	}
	if got := h.calls(); len(got) != 0 {
		t.Errorf("the upstream was called: %v", got)
	}
	if r := call(t, cs, "web_fetch", map[string]any{"url": "https://example.com/a"}); r.IsError || !strings.Contains(text(r), "fetch #1") {
		t.Fatalf("fetch after the refusals: %+v", text(r))
	}
}
