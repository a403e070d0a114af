package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/wicket-run/wicket/internal/mcpproxy"
)

const mcpProxyHelp = `An MCP server in front of upstream MCP servers: every tools/call is a
tool_call step of a Wicket session (target "<server>.<tool>"), decided by
the agent's policy, recorded, and replayed after a restart. It speaks MCP on
stdin and stdout (a desktop host starts it), or streamable HTTP with
--listen. Logs go to stderr. Give --agent ID (begin a session) or
--execution ID (attach to one), and at least one --upstream. See
docs/gate.md.`

// repeated is a repeatable string flag.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func init() {
	register(&command{name: "mcp-proxy", max: 0, summary: "an MCP server whose tool calls go through a Wicket session",
		help: mcpProxyHelp, setup: mcpProxySetup})
}

// mcpProxySetup defines the flags of `wicket mcp-proxy`.
func mcpProxySetup(fs *flag.FlagSet, _ *clientOpts) runFunc {
	kernelURL := fs.String("url", envString("WICKET_URL", "http://127.0.0.1:8080"), "kernel base URL (WICKET_URL)")
	key := fs.String("key", envString("WICKET_API_KEY", ""), "API key that holds the session: client role or above (WICKET_API_KEY)")
	agentID := fs.String("agent", "", "begin a session of this agent")
	execID := fs.String("execution", "", "attach to this session of --agent instead (after a restart), waiting for a dead holder's lease to lapse")
	listen := fs.String("listen", "", "serve streamable HTTP on this address (e.g. 127.0.0.1:8765) instead of stdio")
	wait := fs.Duration("approval-wait", mcpproxy.DefaultApprovalWait, "how long one call waits for an approval")
	hide := fs.Bool("hide-denied", false, "leave out of tools/list the tools policy denies whatever their arguments")
	heartbeat := fs.Duration("heartbeat", 0, "how often the session's lease is renewed (default 30s; keep it under the kernel's --lease-timeout)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	var upstreams, effects, labels repeated
	fs.Var(&upstreams, "upstream", "NAME=COMMAND (run over stdio, split on spaces) or NAME=https://… (streamable HTTP); repeatable")
	fs.Var(&effects, "effect", "side-effect class of tools without MCP annotations: CLASS for all, or SERVER.TOOL=CLASS; repeatable")
	fs.Var(&labels, "label", "KEY=VALUE label of a new session; repeatable")
	return func(ctx context.Context, _ []string, _, stderr io.Writer) error {
		return mcpProxy(ctx, stderr, *kernelURL, *key, *agentID, *execID, *listen, *wait, *hide, *heartbeat, *logLevel, upstreams, effects, labels)
	}
}

// mcpProxy runs `wicket mcp-proxy`.
func mcpProxy(ctx context.Context, stderr io.Writer, kernelURL, key, agentID, execID, listen string, wait time.Duration, hide bool,
	heartbeat time.Duration, logLevel string, upstreams, effects, labels repeated) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return usageError{"--log-level: " + err.Error()}
	}
	cfg := mcpproxy.Config{KernelURL: kernelURL, APIKey: key, AgentID: agentID, ExecutionID: execID,
		ApprovalWait: wait, HideDenied: hide, HeartbeatInterval: heartbeat, Version: version,
		Effects: map[string]string{}, Labels: map[string]string{},
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))}
	if agentID == "" && execID == "" {
		return usageError{"give --agent ID (begin a session) or --execution ID (attach to one)"}
	}
	for _, u := range upstreams {
		up, err := mcpproxy.ParseUpstream(u)
		if err != nil {
			return usageError{"--upstream: " + err.Error()}
		}
		cfg.Upstreams = append(cfg.Upstreams, up)
	}
	if len(cfg.Upstreams) == 0 {
		return usageError{"at least one --upstream NAME=COMMAND|URL is required"}
	}
	for _, e := range effects {
		k, v, ok := strings.Cut(e, "=")
		if !ok {
			k, v = "", e
		}
		cfg.Effects[k] = v
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return usageError{fmt.Sprintf("--label %q: want KEY=VALUE", l)}
		}
		cfg.Labels[k] = v
	}
	var ln net.Listener
	if listen != "" {
		var err error
		if ln, err = net.Listen("tcp", listen); err != nil {
			return fmt.Errorf("mcp-proxy: listen: %w", err)
		}
		defer ln.Close()
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	p, err := mcpproxy.New(sctx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer p.Close()
	if ln != nil {
		cfg.Logger.Info("serving MCP over streamable HTTP", "addr", ln.Addr().String(), "execution_id", p.ExecutionID())
		return p.ServeHTTP(ctx, ln)
	}
	return p.ServeStdio(ctx)
}
