package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// The exec, agent, approval and tenant commands are clients of a running
// kernel, built on sdk/client. They print the kernel's answers as indented
// JSON.

// clientOpts are the connection flags of the client commands.
type clientOpts struct {
	url, key, tenant string
}

// clientFlags adds --url, --key and --tenant (WICKET_URL, WICKET_API_KEY,
// WICKET_TENANT) to fs.
func clientFlags(fs *flag.FlagSet) *clientOpts {
	o := &clientOpts{}
	fs.StringVar(&o.url, "url", envString("WICKET_URL", "http://127.0.0.1:8080"), "kernel base URL (WICKET_URL)")
	fs.StringVar(&o.key, "key", envString("WICKET_API_KEY", os.Getenv("WICKET_ADMIN_KEY")), "API key (WICKET_API_KEY, else WICKET_ADMIN_KEY)")
	fs.StringVar(&o.tenant, "tenant", envString("WICKET_TENANT", ""), "tenant to act in; admin keys only (WICKET_TENANT)")
	return o
}

// client builds the API client the flags describe.
func (o *clientOpts) client() *client.Client {
	opts := []client.Option{client.WithUserAgent("wicket-cli/" + version)}
	if o.key != "" {
		opts = append(opts, client.WithAPIKey(o.key))
	}
	if o.tenant != "" {
		opts = append(opts, client.WithTenant(o.tenant))
	}
	return client.New(o.url, opts...)
}

// printJSON writes v as indented JSON and a newline.
func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// printAnswer prints v unless err is set.
func printAnswer[T any](w io.Writer, v T, err error) error {
	if err != nil {
		return err
	}
	return printJSON(w, v)
}

// printStream watches an execution and prints each event as one line of
// JSON, and each live step delta as "step.delta <JSON>", until the
// terminal event.
func printStream(ctx context.Context, c *client.Client, id string, o client.WatchOptions, brief bool, w io.Writer) error {
	return c.WatchWith(ctx, id, o, func(it client.StreamItem) error {
		if brief {
			_, err := fmt.Fprintln(w, briefItem(it))
			return err
		}
		prefix, v := "", any(it.Event)
		if it.Delta != nil {
			prefix, v = client.EventStepDelta+" ", it.Delta
		}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s%s\n", prefix, b)
		return err
	})
}

// briefItem is one event or delta as a short line for people:
// "  7  step.allowed          tool_call greet  rule=lookups".
func briefItem(it client.StreamItem) string {
	if it.Delta != nil {
		return fmt.Sprintf("%4s  %-22s %s #%d %s", "", client.EventStepDelta, shortID(it.Delta.StepID), it.Delta.Seq, clip(string(it.Delta.Data), 80))
	}
	return briefEvent(*it.Event)
}

// briefEvent summarises one event on a line: its seq, type, and the payload
// fields a reader looks for first.
func briefEvent(ev wire.Event) string {
	var p map[string]any
	_ = json.Unmarshal(ev.Payload, &p)
	var parts []string
	for _, k := range []string{"kind", "target", "occurrence", "approval_id", "dispatch_attempt", "rule_id", "reason", "decided_by", "status"} {
		v, ok := p[k]
		if !ok || v == nil || v == "" {
			continue
		}
		switch k {
		case "kind", "target":
			parts = append(parts, fmt.Sprint(v))
		case "approval_id":
			parts = append(parts, "approval="+shortID(fmt.Sprint(v)))
		case "dispatch_attempt":
			parts = append(parts, fmt.Sprintf("attempt=%v", v))
		case "occurrence":
			if f, ok := v.(float64); ok && f > 0 {
				parts = append(parts, fmt.Sprintf("#%v", v))
			}
		default:
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		}
	}
	return strings.TrimRight(fmt.Sprintf("%4d  %-22s %s", ev.Seq, ev.Type, clip(strings.Join(parts, "  "), 100)), " ")
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

// parseArgs parses fs and checks the number of positional arguments.
func parseArgs(fs *flag.FlagSet, args []string, n int, usage string) ([]string, error) {
	// Allow flags after positional arguments ("exec get ID --url X").
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != n {
		return nil, usageError{"usage: wicket " + usage}
	}
	return pos, nil
}

func subcommand(args []string, usage string) (string, []string, error) {
	if len(args) == 0 {
		return "", nil, usageError{"usage: wicket " + usage}
	}
	return args[0], args[1:], nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

const execUsage = `exec ls [--agent A] [--status S] [--limit N] [--cursor C]
       | create AGENT [--input JSON] [--idempotency-key K] [--wait [--brief]]
       | get ID | events ID [--after N] [--brief] | watch ID [--after N] [--poll] [--brief] | cancel ID
  events prints the whole log after N as {"events": [...]}, paging through it.
  watch prints one JSON event per line and live step output as "step.delta <JSON>"
  lines, until the execution ends. create --wait does the same from the first
  event, then prints the final execution, and fails unless it completed.
  --brief prints one short line per event (seq, type, the payload's key fields).
  Flags of every command: --url (WICKET_URL), --key (WICKET_API_KEY), --tenant.`

func execCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, rest, err := subcommand(args, execUsage)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("exec "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := clientFlags(fs)
	switch sub {
	case "ls":
		agent := fs.String("agent", "", "agent id")
		status := fs.String("status", "", "pending, running, blocked, completed, failed or cancelled")
		limit := fs.Int("limit", 0, "page size (default 50, at most 1000)")
		cursor := fs.String("cursor", "", "next_cursor of the previous page")
		if _, err := parseArgs(fs, rest, 0, execUsage); err != nil {
			return err
		}
		l, err := o.client().ListExecutions(ctx, client.ListOptions{AgentID: *agent, Status: *status, Cursor: *cursor, Limit: *limit})
		return printAnswer(stdout, l, err)
	case "create":
		input := fs.String("input", "null", "input JSON")
		idem := fs.String("idempotency-key", "", "Idempotency-Key: a retry with the same key returns the same execution")
		wait := fs.Bool("wait", false, "print the events until the execution ends, then the execution; fail unless it completed")
		brief := fs.Bool("brief", false, "with --wait: one short line per event instead of its JSON")
		pos, err := parseArgs(fs, rest, 1, execUsage)
		if err != nil {
			return err
		}
		if !json.Valid([]byte(*input)) {
			return usageError{"exec create: --input is not valid JSON"}
		}
		c := o.client()
		x, err := c.CreateExecution(ctx, wire.CreateExecutionRequest{AgentID: pos[0], Input: json.RawMessage(*input)}, *idem)
		if err != nil || !*wait {
			return printAnswer(stdout, x, err)
		}
		if err := printStream(ctx, c, x.ID, client.WatchOptions{}, *brief, stdout); err != nil {
			return err
		}
		final, err := c.GetExecution(ctx, x.ID)
		if err := printAnswer(stdout, final, err); err != nil {
			return err
		}
		if final.Status != "completed" {
			return fmt.Errorf("execution %s %s", final.ID, final.Status)
		}
		return nil
	case "get", "cancel":
		pos, err := parseArgs(fs, rest, 1, execUsage)
		if err != nil {
			return err
		}
		c := o.client()
		if sub == "get" {
			x, err := c.GetExecution(ctx, pos[0])
			return printAnswer(stdout, x, err)
		}
		if err := c.Cancel(ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "cancelled", pos[0])
		return nil
	case "events":
		after := fs.Uint64("after", 0, "events after this seq")
		brief := fs.Bool("brief", false, "one short line per event instead of JSON")
		pos, err := parseArgs(fs, rest, 1, execUsage)
		if err != nil {
			return err
		}
		evs, err := o.client().EventsAfter(ctx, pos[0], *after)
		if err != nil || !*brief {
			return printAnswer(stdout, wire.EventList{Events: evs}, err)
		}
		for _, ev := range evs {
			if _, err := fmt.Fprintln(stdout, briefEvent(ev)); err != nil {
				return err
			}
		}
		return nil
	case "watch":
		after := fs.Uint64("after", 0, "events after this seq")
		poll := fs.Bool("poll", false, "poll the event log instead of streaming it (no step deltas)")
		brief := fs.Bool("brief", false, "one short line per event instead of JSON")
		pos, err := parseArgs(fs, rest, 1, execUsage)
		if err != nil {
			return err
		}
		err = printStream(ctx, o.client(), pos[0], client.WatchOptions{AfterSeq: *after, Poll: *poll}, *brief, stdout)
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil // interrupted
		}
		return err
	}
	return usageError{"usage: wicket " + execUsage}
}

const agentUsage = "agent ls | get ID | rm ID | put ID [--webhook-url URL] --secret S [--bundle B] [--signing v1|body] [--on-interrupted indeterminate|approval] (--bundle '' unbinds; no webhook: gate-only, driven by sessions)"

func agentCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, rest, err := subcommand(args, agentUsage)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("agent "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := clientFlags(fs)
	switch sub {
	case "ls":
		if _, err := parseArgs(fs, rest, 0, agentUsage); err != nil {
			return err
		}
		as, err := o.client().Agents(ctx)
		return printAnswer(stdout, wire.AgentList{Agents: as}, err)
	case "get", "rm":
		pos, err := parseArgs(fs, rest, 1, agentUsage)
		if err != nil {
			return err
		}
		c := o.client()
		if sub == "get" {
			a, err := c.Agent(ctx, pos[0])
			return printAnswer(stdout, a, err)
		}
		if err := c.DeleteAgent(ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "deleted", pos[0])
		return nil
	case "put":
		hook := fs.String("webhook-url", "", "webhook URL")
		secret := fs.String("secret", os.Getenv("WICKET_AGENT_SECRET"), "HMAC secret (WICKET_AGENT_SECRET)")
		bundle := fs.String("bundle", "", "bundle to bind ('' unbinds; omitted keeps the binding)")
		signing := fs.String("signing", "", "signature scheme: v1 or body (omitted: v1 for a new agent, unchanged for an existing one)")
		interrupted := fs.String("on-interrupted", "", "an at_most_once step found in flight: indeterminate (fail it) or approval (ask an operator); omitted keeps it")
		pos, err := parseArgs(fs, rest, 1, agentUsage)
		if err != nil {
			return err
		}
		req := wire.AgentRequest{ID: pos[0], WebhookURL: *hook, Secret: *secret, Signing: *signing}
		if flagSet(fs, "bundle") {
			req.Policy = bundle
		}
		if flagSet(fs, "on-interrupted") {
			req.OnInterrupted = interrupted
		}
		a, err := o.client().PutAgent(ctx, req)
		return printAnswer(stdout, a, err)
	}
	return usageError{"usage: wicket " + agentUsage}
}

const approvalUsage = "approval ls [--status S] | get ID | grant|deny ID [--rationale R] [--request-hash H] [--by NAME] | retry ID | happened ID --result JSON (retry and happened answer an interrupted_side_effect approval)"

func approvalCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, rest, err := subcommand(args, approvalUsage)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("approval "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := clientFlags(fs)
	switch sub {
	case "ls":
		status := fs.String("status", "", "pending, granted, denied, expired or happened")
		if _, err := parseArgs(fs, rest, 0, approvalUsage); err != nil {
			return err
		}
		as, err := o.client().Approvals(ctx, *status)
		return printAnswer(stdout, wire.ApprovalList{Approvals: as}, err)
	case "get":
		pos, err := parseArgs(fs, rest, 1, approvalUsage)
		if err != nil {
			return err
		}
		a, err := o.client().Approval(ctx, pos[0])
		return printAnswer(stdout, a, err)
	case "grant", "deny", "retry", "happened":
		by := fs.String("by", "", "admin keys only: the person the decision is made for (otherwise the key's principal decides)")
		rationale := fs.String("rationale", "", "why")
		hash := fs.String("request-hash", "", "the request hash the approver saw")
		result := fs.String("result", "", "happened: the effect's result, as JSON (recorded as the step's result)")
		pos, err := parseArgs(fs, rest, 1, approvalUsage)
		if err != nil {
			return err
		}
		req := wire.ResolveApprovalRequest{DecidedBy: *by, Rationale: *rationale, RequestHash: *hash}
		if sub == "happened" {
			if !json.Valid([]byte(*result)) {
				return usageError{"happened needs --result with the effect's result as JSON (e.g. '\"sent\"' or '{\"id\": 7}')"}
			}
			req.Result = json.RawMessage(*result)
		} else if *result != "" {
			return usageError{"--result goes with happened only"}
		}
		c := o.client()
		resolve := map[string]func(context.Context, string, wire.ResolveApprovalRequest) (*wire.Approval, error){
			"grant": c.Grant, "deny": c.Deny, "retry": c.Retry, "happened": c.Happened}[sub]
		a, err := resolve(ctx, pos[0], req)
		return printAnswer(stdout, a, err)
	}
	return usageError{"usage: wicket " + approvalUsage}
}

const tenantUsage = "tenant ls | create ID | guards TENANT --set a,b (\"\" removes them) | key create TENANT --role R --principal P | key ls TENANT | key rm TENANT KEY_ID"

func tenantCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, rest, err := subcommand(args, tenantUsage)
	if err != nil {
		return err
	}
	if sub == "key" {
		if sub, rest, err = subcommand(rest, tenantUsage); err != nil {
			return err
		}
		sub = "key " + sub
	}
	fs := flag.NewFlagSet("tenant "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := clientFlags(fs)
	switch sub {
	case "ls":
		if _, err := parseArgs(fs, rest, 0, tenantUsage); err != nil {
			return err
		}
		ts, err := o.client().Tenants(ctx)
		return printAnswer(stdout, wire.TenantList{Tenants: ts}, err)
	case "guards":
		set := fs.String("set", "", "comma-separated guard bundles: admin-owned bundles of the tenant (\"\" removes them)")
		pos, err := parseArgs(fs, rest, 1, tenantUsage)
		if err != nil {
			return err
		}
		if !flagSet(fs, "set") {
			return usageError{"tenant guards: --set is required (--set \"\" removes every guard)"}
		}
		var guards []string
		if *set != "" {
			guards = strings.Split(*set, ",")
		}
		t, err := o.client().SetTenantGuards(ctx, pos[0], guards)
		return printAnswer(stdout, t, err)
	case "create":
		guards := fs.String("guards", "", "comma-separated guard bundles (they must exist in the tenant already: use tenant guards)")
		pos, err := parseArgs(fs, rest, 1, tenantUsage)
		if err != nil {
			return err
		}
		req := wire.TenantRequest{ID: pos[0]}
		if *guards != "" {
			req.Guards = strings.Split(*guards, ",")
		}
		t, err := o.client().CreateTenant(ctx, req)
		return printAnswer(stdout, t, err)
	case "key create":
		role := fs.String("role", wire.RoleClient, "client, approver, tenant-admin or admin (admin: an admin key, in the default tenant)")
		principal := fs.String("principal", "", "who holds the key")
		pos, err := parseArgs(fs, rest, 1, tenantUsage)
		if err != nil {
			return err
		}
		k, err := o.client().CreateKey(ctx, pos[0], wire.KeyRequest{Role: *role, Principal: *principal})
		return printAnswer(stdout, k, err)
	case "key ls":
		pos, err := parseArgs(fs, rest, 1, tenantUsage)
		if err != nil {
			return err
		}
		ks, err := o.client().Keys(ctx, pos[0])
		return printAnswer(stdout, wire.KeyList{Keys: ks}, err)
	case "key rm":
		pos, err := parseArgs(fs, rest, 2, tenantUsage)
		if err != nil {
			return err
		}
		if err := o.client().DeleteKey(ctx, pos[0], pos[1]); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "revoked", pos[1])
		return nil
	}
	return usageError{"usage: wicket " + tenantUsage}
}
