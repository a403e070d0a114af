// Package mcpproxy is `wicket mcp-proxy`: an MCP server in front of one or
// more upstream MCP servers that puts every tools/call through a Wicket
// session (docs/gate.md). Each call is proposed to the kernel as a
// tool_call step with target "<server>.<tool>": allowed calls are
// forwarded and their results recorded, denied calls answer an MCP tool
// error naming the reason and rule, calls waiting for an approval wait
// (with progress notifications), and a call the session already recorded
// replays its result without reaching the upstream.
//
// It is the one package that imports the MCP Go SDK
// (github.com/modelcontextprotocol/go-sdk); internal/archtest holds it to
// that.
package mcpproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// Upstream is one upstream MCP server: a command run over stdio, or a
// streamable-HTTP endpoint.
type Upstream struct {
	// Name prefixes its tools: the step target is "<Name>.<tool>".
	Name string
	// Command is the program and its arguments (stdio), or nil.
	Command []string
	// URL is the streamable-HTTP endpoint, or "".
	URL string
}

var upstreamName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,31}$`)

// ParseUpstream parses a --upstream value, NAME=COMMAND or NAME=URL: a
// value starting with http:// or https:// is a streamable-HTTP endpoint;
// anything else is a command, split on spaces.
func ParseUpstream(s string) (Upstream, error) {
	name, val, ok := strings.Cut(s, "=")
	if !ok || val == "" {
		return Upstream{}, fmt.Errorf("upstream %q: want NAME=COMMAND or NAME=URL", s)
	}
	if !upstreamName.MatchString(name) {
		return Upstream{}, fmt.Errorf("upstream name %q: want 1-32 of [A-Za-z0-9-], starting with a letter or digit", name)
	}
	if strings.HasPrefix(val, "http://") || strings.HasPrefix(val, "https://") {
		u, err := url.Parse(val)
		if err != nil || u.Host == "" {
			return Upstream{}, fmt.Errorf("upstream %s: %q is not a URL", name, val)
		}
		return Upstream{Name: name, URL: val}, nil
	}
	return Upstream{Name: name, Command: strings.Fields(val)}, nil
}

// Config configures a Proxy.
type Config struct {
	// KernelURL and APIKey reach the kernel; the key holds the session's
	// lease (client role or above).
	KernelURL, APIKey string
	// AgentID is the agent a new session belongs to (policy is its
	// bundle's); ExecutionID, when set, attaches to that session instead
	// (which must then be AgentID's, when both are given).
	AgentID, ExecutionID string
	// Upstreams are the servers whose tools the proxy serves.
	Upstreams []Upstream
	// ApprovalWait bounds how long one call waits for an approval (default
	// 10 minutes); past it the call answers a tool error and the approval
	// stays pending (calling again goes on waiting).
	ApprovalWait time.Duration
	// HideDenied leaves out of tools/list the tools that policy denies
	// whatever their arguments.
	HideDenied bool
	// Effects are side-effect classes for tools without annotations:
	// "" is the default for every tool, "<server>.<tool>" one tool's.
	Effects map[string]string
	// Labels are the labels of a new session.
	Labels map[string]string
	// HeartbeatInterval is how often the session's lease is renewed
	// (default agent.DefaultHeartbeat).
	HeartbeatInterval time.Duration
	// HTTPClient reaches the kernel and HTTP upstreams (nil: defaults).
	HTTPClient *http.Client
	// Logger receives diagnostics; on stdio it must not write to stdout.
	Logger *slog.Logger
	// Version is announced to MCP clients and upstreams.
	Version string
}

// DefaultApprovalWait is Config.ApprovalWait's default.
const DefaultApprovalWait = 10 * time.Minute

// Proxy is a running proxy: its upstream connections, its Wicket session
// and the MCP server it serves.
type Proxy struct {
	cfg    Config
	log    *slog.Logger
	kernel *client.Client
	server *mcp.Server

	upstreams []*upstream
	tools     map[string]*tool // by exposed name

	mu        sync.Mutex // guards session
	session   *agent.Session
	closeOnce sync.Once
}

type upstream struct {
	Upstream
	cs *mcp.ClientSession
}

// tool is an upstream tool as the proxy serves it.
type tool struct {
	up          *upstream
	name        string // upstream name
	exposed     string // name served: <server>_<tool>
	target      string // step target: <server>.<tool>
	effect      string
	idempotency string
	def         *mcp.Tool
}

// New connects to the upstreams, lists their tools, begins (or attaches
// to) the session, and builds the MCP server. Close releases it all.
func New(ctx context.Context, cfg Config) (*Proxy, error) {
	if cfg.KernelURL == "" {
		return nil, errors.New("mcp-proxy: the kernel's URL is required (--url or WICKET_URL)")
	}
	if cfg.AgentID == "" && cfg.ExecutionID == "" {
		return nil, errors.New("mcp-proxy: give --agent (begin a session) or --execution (attach to one)")
	}
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("mcp-proxy: at least one --upstream is required")
	}
	for k, v := range cfg.Effects {
		if !validEffect(v) {
			return nil, fmt.Errorf("mcp-proxy: effect %q of %q is invalid (want read_only, local_mutation, remote_mutation or destructive)", v, k)
		}
	}
	if cfg.ApprovalWait <= 0 {
		cfg.ApprovalWait = DefaultApprovalWait
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	opts := []client.Option{client.WithAPIKey(cfg.APIKey)}
	if cfg.HTTPClient != nil {
		opts = append(opts, client.WithHTTPClient(cfg.HTTPClient))
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, kernel: client.New(cfg.KernelURL, opts...), tools: map[string]*tool{}}
	ok := false
	defer func() {
		if !ok {
			p.Close()
		}
	}()
	names := map[string]bool{}
	for _, u := range cfg.Upstreams {
		if names[u.Name] {
			return nil, fmt.Errorf("mcp-proxy: two upstreams are named %s", u.Name)
		}
		names[u.Name] = true
		up, err := p.connect(ctx, u)
		if err != nil {
			return nil, err
		}
		p.upstreams = append(p.upstreams, up)
		if err := p.listTools(ctx, up); err != nil {
			return nil, err
		}
	}
	if err := p.startSession(ctx); err != nil {
		return nil, err
	}
	if err := p.buildServer(ctx); err != nil {
		return nil, err
	}
	ok = true
	return p, nil
}

// connect starts or reaches one upstream and initialises an MCP client
// session with it.
func (p *Proxy) connect(ctx context.Context, u Upstream) (*upstream, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "wicket-mcp-proxy", Version: p.cfg.Version}, nil)
	var t mcp.Transport
	if u.URL != "" {
		st := &mcp.StreamableClientTransport{Endpoint: u.URL}
		if p.cfg.HTTPClient != nil {
			st.HTTPClient = p.cfg.HTTPClient
		}
		t = st
	} else {
		if len(u.Command) == 0 {
			return nil, fmt.Errorf("mcp-proxy: upstream %s has no command", u.Name)
		}
		t = &mcp.CommandTransport{Command: exec.Command(u.Command[0], u.Command[1:]...)}
	}
	cs, err := c.Connect(ctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("mcp-proxy: connect to upstream %s: %w", u.Name, err)
	}
	return &upstream{Upstream: u, cs: cs}, nil
}

// listTools reads an upstream's tools and decides how each is served.
func (p *Proxy) listTools(ctx context.Context, up *upstream) error {
	for t, err := range up.cs.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("mcp-proxy: list the tools of upstream %s: %w", up.Name, err)
		}
		exposed := up.Name + "_" + t.Name
		if len(exposed) > 128 {
			p.log.Warn("tool name too long once prefixed; not served", "upstream", up.Name, "tool", t.Name)
			continue
		}
		if prev, dup := p.tools[exposed]; dup {
			return fmt.Errorf("mcp-proxy: tools %s.%s and %s both serve as %s: rename an upstream", prev.up.Name, prev.name, up.Name+"."+t.Name, exposed)
		}
		tl := &tool{up: up, name: t.Name, exposed: exposed, target: up.Name + "." + t.Name, def: t}
		tl.effect, tl.idempotency = effectOf(t.Annotations, p.cfg.Effects, tl.target)
		p.tools[exposed] = tl
	}
	return nil
}

// startSession begins the session, or attaches to cfg.ExecutionID
// (waiting for a previous holder's lease to lapse).
func (p *Proxy) startSession(ctx context.Context) error {
	scfg := agent.SessionConfig{KernelURL: p.cfg.KernelURL, APIKey: p.cfg.APIKey, HeartbeatInterval: p.cfg.HeartbeatInterval,
		HTTPClient: p.cfg.HTTPClient, Logger: p.log}
	var s *agent.Session
	var err error
	if p.cfg.ExecutionID == "" {
		s, err = agent.Begin(ctx, scfg, client.SessionRequest{AgentID: p.cfg.AgentID, Labels: p.cfg.Labels})
		if err != nil {
			return fmt.Errorf("mcp-proxy: begin a session of agent %s: %w", p.cfg.AgentID, err)
		}
		p.log.Info("session begun; resume it after a restart with --execution "+s.ID(), "execution_id", s.ID(), "agent_id", p.cfg.AgentID)
	} else {
		// Whose session it is is checked before attaching: a refused
		// attach would hold the lease, locking the session's own holder
		// out until it lapsed.
		if p.cfg.AgentID != "" {
			x, err := p.kernel.GetExecution(ctx, p.cfg.ExecutionID)
			if err != nil {
				return fmt.Errorf("mcp-proxy: read session %s: %w", p.cfg.ExecutionID, err)
			}
			if x.AgentID != p.cfg.AgentID {
				return fmt.Errorf("mcp-proxy: session %s belongs to agent %s, not %s", x.ID, x.AgentID, p.cfg.AgentID)
			}
		}
		if s, err = p.attach(ctx, p.cfg.ExecutionID); err != nil {
			return err
		}
	}
	p.mu.Lock()
	p.session = s
	p.mu.Unlock()
	return nil
}

// attach attaches to a session, waiting while its lease is held (by a
// proxy that died without giving it up).
func (p *Proxy) attach(ctx context.Context, id string) (*agent.Session, error) {
	scfg := agent.SessionConfig{KernelURL: p.cfg.KernelURL, APIKey: p.cfg.APIKey, HeartbeatInterval: p.cfg.HeartbeatInterval,
		HTTPClient: p.cfg.HTTPClient, Logger: p.log}
	for {
		s, err := agent.Attach(ctx, scfg, id)
		if err == nil {
			p.log.Info("attached to the session", "execution_id", id, "attempt", s.DispatchAttempt)
			return s, nil
		}
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Code != wire.CodeExecutionLeased {
			return nil, fmt.Errorf("mcp-proxy: attach to session %s: %w", id, err)
		}
		wait := time.Second
		if s, ok := ae.Details["lease_until"].(string); ok {
			if until, perr := time.Parse(time.RFC3339Nano, s); perr == nil {
				wait = max(min(time.Until(until)+100*time.Millisecond, 30*time.Second), 100*time.Millisecond)
			}
		}
		p.log.Info("the session's lease is still held; waiting for it to lapse", "execution_id", id, "retry_in", wait.Round(time.Millisecond))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("mcp-proxy: attach to session %s: %w", id, ctx.Err())
		case <-t.C:
		}
	}
}

// current returns the session.
func (p *Proxy) current() *agent.Session {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.session
}

// reattach replaces a session that lost its lease (it lapsed, say while
// the machine slept) by attaching again; calls recorded before replay.
func (p *Proxy) reattach(ctx context.Context, lost *agent.Session) (*agent.Session, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.session != lost {
		return p.session, nil // another call already did
	}
	lost.Close()
	p.log.Warn("the session's lease was lost; attaching again", "execution_id", lost.ID())
	s, err := p.attach(ctx, lost.ID())
	if err != nil {
		return nil, err
	}
	p.session = s
	return s, nil
}

// ExecutionID is the id of the session's execution.
func (p *Proxy) ExecutionID() string { return p.current().ID() }

// Server is the MCP server the proxy serves; run it on a transport (Run) or
// behind a streamable-HTTP handler (Handler).
func (p *Proxy) Server() *mcp.Server { return p.server }

// Run serves one MCP client over t (stdio for desktop hosts) until it
// disconnects or ctx ends.
func (p *Proxy) Run(ctx context.Context, t mcp.Transport) error { return p.server.Run(ctx, t) }

// Handler serves MCP clients over streamable HTTP.
func (p *Proxy) Handler() http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return p.server }, nil)
}

// Close gives the session's lease up (so that a restarted proxy attaches
// at once) and stops the upstreams. The execution goes on.
func (p *Proxy) Close() { p.closeOnce.Do(p.close) }

func (p *Proxy) close() {
	if s := p.current(); s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.Detach(ctx); err != nil {
			p.log.Warn("give the session's lease up", "execution_id", s.ID(), "err", err)
		}
		cancel()
	}
	for _, up := range p.upstreams {
		if err := up.cs.Close(); err != nil {
			p.log.Debug("close upstream", "upstream", up.Name, "err", err)
		}
	}
}

// buildServer registers the served tools (all, or those policy does not
// deny outright with HideDenied).
func (p *Proxy) buildServer(ctx context.Context) error {
	p.server = mcp.NewServer(&mcp.Implementation{Name: "wicket-mcp-proxy", Version: p.cfg.Version},
		&mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}}})
	names := make([]string, 0, len(p.tools))
	for n := range p.tools {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		t := p.tools[n]
		if p.cfg.HideDenied {
			denied, err := p.deniedOutright(ctx, t)
			if err != nil {
				return err
			}
			if denied {
				p.log.Info("tool hidden: policy denies it whatever its arguments", "tool", t.target)
				continue
			}
		}
		def := *t.def
		def.Name = t.exposed
		def.Meta = nil
		if def.InputSchema == nil {
			def.InputSchema = map[string]any{"type": "object"}
		}
		if err := addTool(p.server, &def, p.handler(t)); err != nil {
			p.log.Warn("tool not served", "tool", t.target, "err", err)
		}
	}
	return nil
}

// addTool adds a tool, turning the SDK's panic on a schema it refuses (an
// upstream's input schema that is not an object) into an error.
func addTool(s *mcp.Server, t *mcp.Tool, h mcp.ToolHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	s.AddTool(t, h)
	return nil
}

// deniedOutright asks the kernel whether policy denies the tool whatever
// its arguments.
func (p *Proxy) deniedOutright(ctx context.Context, t *tool) (bool, error) {
	var out wire.StepProbe
	err := p.kernel.Do(ctx, http.MethodPost, "/v0/executions/"+url.PathEscape(p.current().ID())+"/probe", nil,
		wire.StepProbeRequest{Kind: agent.KindToolCall, Target: t.target, Effect: t.effect, Idempotency: t.idempotency}, &out)
	if err != nil {
		return false, fmt.Errorf("mcp-proxy: ask the kernel about %s: %w", t.target, err)
	}
	return out.DeniedOutright, nil
}

// ServeStdio serves one MCP client on the process's stdin and stdout (a
// desktop host that started the proxy) until the client disconnects or ctx
// ends.
func (p *Proxy) ServeStdio(ctx context.Context) error {
	err := p.Run(ctx, &mcp.StdioTransport{})
	if err != nil && ctx.Err() != nil {
		return nil
	}
	return err
}

// ServeHTTP serves MCP clients over streamable HTTP on ln until ctx ends.
func (p *Proxy) ServeHTTP(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: p.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("mcp-proxy: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-errc
	return nil
}
