package mcpproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/server/wire"
)

// handler is the tools/call handler of one served tool: the call is a
// tool_call step of the session.
func (p *Proxy) handler(t *tool) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := json.RawMessage("{}")
		if req.Params != nil && len(req.Params.Arguments) > 0 && string(req.Params.Arguments) != "null" {
			args = req.Params.Arguments
		}
		if a := bytes.TrimLeft(args, " \t\r\n"); len(a) == 0 || a[0] != '{' {
			// MCP's arguments are an object: anything else is the
			// client's mistake, refused before it is a step.
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("tools/call %s: arguments must be a JSON object, not %.40s", t.def.Name, args)}
		}
		return p.call(ctx, t, args, progressOf(req))
	}
}

// progress sends progress notifications for one call, when its client
// asked for them (a progress token).
type progress struct {
	req   *mcp.CallToolRequest
	token any
	n     float64
}

func progressOf(req *mcp.CallToolRequest) *progress {
	if req == nil || req.Params == nil || req.Session == nil {
		return nil
	}
	tok := req.Params.GetProgressToken()
	if tok == nil {
		return nil
	}
	return &progress{req: req, token: tok}
}

func (pr *progress) notify(ctx context.Context, msg string) {
	if pr == nil {
		return
	}
	pr.n++
	_ = pr.req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: pr.token, Progress: pr.n, Message: msg})
}

// call proposes the call to the kernel and acts on the decision.
func (p *Proxy) call(ctx context.Context, t *tool, args json.RawMessage, pr *progress) (*mcp.CallToolResult, error) {
	s := p.current()
	var waited time.Duration
	for lost := 0; ; {
		ex := s.Execution()
		d, err := ex.Submit(ctx, wire.StepSubmitRequest{Kind: agent.KindToolCall, Target: t.target, Args: args,
			Idempotency: t.idempotency, Effect: t.effect})
		var ls *agent.LeaseSuperseded
		if errors.As(err, &ls) && lost == 0 {
			lost++
			if s, err = p.reattach(ctx, s); err != nil {
				return toolError("the proxy lost its session and could not attach again: %v", err), nil
			}
			continue
		}
		if err != nil {
			return toolError("the Wicket kernel did not decide this call: %v", err), nil
		}
		switch d.Decision {
		case wire.DecisionProceed:
			return p.forward(ctx, t, ex, d.StepID, args)
		case wire.DecisionReplay:
			return replayed(d), nil
		case wire.DecisionDenied, wire.DecisionRateLimited:
			return denied(d, t.def.OutputSchema != nil), nil
		case wire.DecisionBlocked, wire.DecisionExecutionBlocked:
			left := p.cfg.ApprovalWait - waited
			if left <= 0 {
				return toolError("approval %s is still pending after %s; call the tool again once it has been decided", d.ApprovalID, p.cfg.ApprovalWait), nil
			}
			start := time.Now()
			err := p.waitApproval(ctx, s, d, left, pr)
			waited += time.Since(start)
			if err != nil {
				var tm *agent.Terminated
				if errors.As(err, &tm) {
					return toolError("the Wicket session has ended: %s", tm.Reason), nil
				}
				if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
					return toolError("approval %s is still pending after %s; call the tool again once it has been decided", d.ApprovalID, p.cfg.ApprovalWait), nil
				}
				return nil, err
			}
		case wire.DecisionExecutionTerminal:
			return toolError("the Wicket session has ended: %s", d.Reason), nil
		default:
			return toolError("the Wicket kernel answered %q", d.Decision), nil
		}
	}
}

// waitApproval waits, at most left, until the session no longer waits on
// the approval, with a progress notification at every look.
func (p *Proxy) waitApproval(ctx context.Context, s *agent.Session, d *wire.StepDecision, left time.Duration, pr *progress) error {
	ctx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	msg := "waiting for approval " + d.ApprovalID
	if d.Reason != "" {
		msg += ": " + d.Reason
	}
	pr.notify(ctx, msg)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	done := make(chan error, 1)
	go func() { done <- s.Wait(ctx) }()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			pr.notify(ctx, msg)
		}
	}
}

// forward calls the upstream for an allowed step and records the outcome:
// the CallToolResult as the step's result, or as its error when the tool
// reported one.
func (p *Proxy) forward(ctx context.Context, t *tool, ex *agent.Execution, stepID string, args json.RawMessage) (*mcp.CallToolResult, error) {
	res, err := t.up.cs.CallTool(ctx, &mcp.CallToolParams{Name: t.name, Arguments: args})
	if err != nil {
		rec, _ := json.Marshal(map[string]string{"code": "upstream_error", "message": err.Error()})
		if ferr := ex.Fail(ctx, stepID, rec); ferr != nil {
			p.log.Warn("record a failed call", "tool", t.target, "step_id", stepID, "err", ferr)
		}
		return toolError("upstream %s: %v", t.up.Name, err), nil
	}
	raw, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("mcp-proxy: encode the result of %s: %w", t.target, err)
	}
	if res.IsError {
		err = ex.Fail(ctx, stepID, raw)
	} else {
		err = ex.Complete(ctx, stepID, raw, nil)
	}
	if err != nil {
		// The effect happened; its result is not on record. The caller
		// still gets it.
		p.log.Warn("record a call's result", "tool", t.target, "step_id", stepID, "err", err)
	}
	return res, nil
}

// replayed is the recorded result of a call (never sent upstream again).
func replayed(d *wire.StepDecision) *mcp.CallToolResult {
	rec := d.Result
	if len(d.Error) > 0 && string(d.Error) != "null" {
		rec = d.Error
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal(rec, &res); err == nil && res.Content != nil {
		if len(d.Error) > 0 && string(d.Error) != "null" {
			res.IsError = true
		}
		return &res
	}
	// Not a tool result: an error the kernel or the proxy recorded
	// (indeterminate, interrupted, upstream_error).
	var m struct{ Code, Message string }
	if json.Unmarshal(rec, &m) == nil && m.Message != "" {
		return toolError("recorded failure (%s): %s", m.Code, m.Message)
	}
	return toolError("recorded outcome: %s", rec)
}

// DecisionMeta is the key of a denied call's _meta that holds the
// decision ({decision, reason, rule_id, step_id}).
const DecisionMeta = "wicket/decision"

// denied is a tool error naming the policy's reason and rule. The decision
// is in its _meta, and in its structuredContent unless the tool declares
// an output schema: MCP requires structured content to conform to that
// schema, and clients that check it (the TypeScript SDK's) would turn the
// denial into a protocol error and lose its reason.
func denied(d *wire.StepDecision, hasOutputSchema bool) *mcp.CallToolResult {
	what := "denied by policy"
	if d.Decision == wire.DecisionRateLimited {
		what = "rate limited by policy"
	}
	msg := what
	if d.Reason != "" {
		msg += ": " + d.Reason
	}
	if d.RuleID != "" {
		msg += " (rule " + d.RuleID + ")"
	}
	res := toolError("%s", msg)
	dec := map[string]any{"decision": d.Decision, "reason": d.Reason, "rule_id": d.RuleID, "step_id": d.StepID}
	res.Meta = mcp.Meta{DecisionMeta: dec}
	if !hasOutputSchema {
		res.StructuredContent = dec
	}
	return res
}

func toolError(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "wicket: " + fmt.Sprintf(format, args...)}}}
}

// effectOf is a tool's side-effect class and idempotency: from its MCP
// annotations when it has them (readOnlyHint, destructiveHint,
// openWorldHint, idempotentHint, with the MCP defaults), else from the
// --effect flags (the tool's own, then the default).
func effectOf(a *mcp.ToolAnnotations, flags map[string]string, target string) (effect, idempotency string) {
	switch {
	case a != nil && a.ReadOnlyHint:
		effect = agent.ReadOnly
	case a != nil && (a.DestructiveHint == nil || *a.DestructiveHint):
		effect = agent.Destructive
	case a != nil && (a.OpenWorldHint == nil || *a.OpenWorldHint):
		effect = agent.RemoteMutation
	case a != nil:
		effect = agent.LocalMutation
	case flags[target] != "":
		effect = flags[target]
	default:
		effect = flags[""]
	}
	idempotency = agent.AtMostOnce
	if effect == agent.ReadOnly || (a != nil && a.IdempotentHint) {
		idempotency = agent.SafeToRetry
	}
	return effect, idempotency
}

func validEffect(e string) bool {
	switch e {
	case agent.ReadOnly, agent.LocalMutation, agent.RemoteMutation, agent.Destructive:
		return true
	}
	return false
}
