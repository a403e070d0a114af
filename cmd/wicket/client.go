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
	"time"

	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// The exec, agent, approval, tenant and bundle commands are clients of a
// running kernel, built on sdk/client. They print the kernel's answers as
// indented JSON, and lists as tables (--json for the answer itself).

// clientOpts are the connection flags of the client commands.
type clientOpts struct {
	url, key, tenant string
	// used is set once the command built a client: its error may then
	// come from a --url that is not a kernel URL.
	used bool
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
	o.used = true
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

// printLine writes v as JSON on one line.
func printLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
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

// deltaLine is how a live step delta is printed by watch: one JSON object
// whose type is "step.delta", like an event's.
type deltaLine struct {
	Type string `json:"type"`
	wire.StepDeltaEvent
}

// printStream watches an execution and prints each event, and each live
// step delta, as one line of JSON, until the terminal event.
func printStream(ctx context.Context, c *client.Client, id string, o client.WatchOptions, brief bool, w io.Writer) error {
	return c.WatchWith(ctx, id, o, func(it client.StreamItem) error { return printItem(w, it, brief) })
}

// printItem prints one event or delta: one JSON object on a line, or with
// brief one short line.
func printItem(w io.Writer, it client.StreamItem, brief bool) error {
	if brief {
		_, err := fmt.Fprintln(w, briefItem(it))
		return err
	}
	if it.Delta != nil {
		return printLine(w, deltaLine{Type: client.EventStepDelta, StepDeltaEvent: *it.Delta})
	}
	return printLine(w, it.Event)
}

// briefItem is one event or delta as a short line for people:
// "   7  step.allowed           tool_call greet  rule_id=lookups".
func briefItem(it client.StreamItem) string {
	if it.Delta != nil {
		return fmt.Sprintf("%4s  %-22s %s #%d %s", "", client.EventStepDelta, it.Delta.StepID, it.Delta.Seq, clip(string(it.Delta.Data), 80))
	}
	return briefEvent(*it.Event)
}

// briefFields are the payload fields a brief line shows, in order.
var briefFields = []string{"kind", "target", "occurrence", "approval_id", "dispatch_attempt", "rule_id", "reason", "decided_by", "status", "error_class", "error"}

// briefEvent summarises one event on a line: its seq, type, and the payload
// fields a reader looks for first. Identifiers are never shortened; free
// text (reason, error) is clipped.
func briefEvent(ev wire.Event) string {
	var p map[string]any
	_ = json.Unmarshal(ev.Payload, &p)
	var parts []string
	for _, k := range briefFields {
		v, ok := p[k]
		if !ok || v == nil || v == "" {
			continue
		}
		switch k {
		case "kind", "target":
			parts = append(parts, fmt.Sprint(v))
		case "approval_id":
			parts = append(parts, "approval="+fmt.Sprint(v))
		case "dispatch_attempt":
			parts = append(parts, fmt.Sprintf("attempt=%v", v))
		case "occurrence":
			if f, ok := v.(float64); ok && f > 0 {
				parts = append(parts, fmt.Sprintf("#%v", v))
			}
		case "reason", "error":
			s, ok := v.(string)
			if !ok {
				b, _ := json.Marshal(v)
				s = string(b)
			}
			parts = append(parts, fmt.Sprintf("%s=%q", k, clip(s, 160)))
		default:
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		}
	}
	return strings.TrimRight(fmt.Sprintf("%4d  %-22s %s", ev.Seq, ev.Type, strings.Join(parts, "  ")), " ")
}

func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// when formats a time for a table.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

const watchHelp = `Each event is printed as one JSON object per line, and so is each live
piece of step output ({"type":"step.delta","execution_id":…,"step_id":…,"seq":…,"data":…}),
until the execution ends. --brief prints one short line per event instead
(seq, type, the payload's key fields).`

func init() {
	register(
		&command{name: "exec ls", client: true, max: 0, summary: "list executions, newest first",
			help: "Prints a table; --json prints the kernel's answer (with next_cursor).",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				agent := fs.String("agent", "", "only this agent's executions")
				status := fs.String("status", "", "pending, running, blocked, completed, failed or cancelled")
				limit := fs.Int("limit", 0, "page size (default 50, at most 1000)")
				cursor := fs.String("cursor", "", "next_cursor of the previous page")
				asJSON := fs.Bool("json", false, "print the answer as JSON instead of a table")
				return func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
					l, err := o.client().ListExecutions(ctx, client.ListOptions{AgentID: *agent, Status: *status, Cursor: *cursor, Limit: *limit})
					if err != nil || *asJSON {
						return printAnswer(stdout, l, err)
					}
					rows := make([][]string, 0, len(l.Executions))
					for _, x := range l.Executions {
						note := x.Reason
						if x.BlockedOn != "" {
							note = "on " + x.BlockedOn
						}
						rows = append(rows, []string{x.ID, x.AgentID, x.Status, when(x.CreatedAt), when(x.UpdatedAt), orDash(note)})
					}
					if err := table(stdout, []string{"ID", "AGENT", "STATUS", "CREATED", "UPDATED", "NOTE"}, rows); err != nil {
						return err
					}
					if l.NextCursor != "" {
						fmt.Fprintf(stderr, "more: --cursor %s\n", l.NextCursor)
					}
					return nil
				}
			}},
		&command{name: "exec create", args: "AGENT", min: 1, max: 1, client: true, summary: "start an execution of AGENT",
			help: "Prints the new execution. With --wait, prints its events until it ends and then\nthe final execution, and fails unless it completed.\n\n" + watchHelp +
				"\nWithout --brief the final execution is one JSON line too; with --brief it is indented.",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				input := fs.String("input", "null", "input JSON")
				idem := fs.String("idempotency-key", "", "Idempotency-Key: a retry with the same key returns the same execution")
				wait := fs.Bool("wait", false, "print the events until the execution ends, then the execution; fail unless it completed")
				brief := fs.Bool("brief", false, "with --wait: one short line per event instead of its JSON")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					if !json.Valid([]byte(*input)) {
						return usagef("exec create: --input is not valid JSON")
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
					if err != nil {
						return err
					}
					if *brief {
						err = printJSON(stdout, final)
					} else {
						err = printLine(stdout, final)
					}
					if err != nil {
						return err
					}
					if final.Status != "completed" {
						return fmt.Errorf("execution %s %s", final.ID, final.Status)
					}
					return nil
				}
			}},
		&command{name: "exec get", args: "ID", min: 1, max: 1, client: true, summary: "print one execution",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					x, err := o.client().GetExecution(ctx, pos[0])
					return printAnswer(stdout, x, err)
				}
			}},
		&command{name: "exec events", args: "ID", min: 1, max: 1, client: true, summary: "print an execution's event log",
			help: `Prints the whole log after --after as {"events": [...]}, paging through it;
--brief prints one short line per event.`,
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				after := fs.Uint64("after", 0, "events after this seq")
				brief := fs.Bool("brief", false, "one short line per event instead of JSON")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
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
				}
			}},
		&command{name: "exec watch", args: "ID", min: 1, max: 1, client: true, summary: "follow an execution's events live until it ends",
			help: watchHelp,
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				after := fs.Uint64("after", 0, "events after this seq")
				poll := fs.Bool("poll", false, "poll the event log instead of streaming it (no step deltas)")
				brief := fs.Bool("brief", false, "one short line per event instead of JSON")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					err := printStream(ctx, o.client(), pos[0], client.WatchOptions{AfterSeq: *after, Poll: *poll}, *brief, stdout)
					if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
						return nil // interrupted
					}
					return err
				}
			}},
		&command{name: "exec cancel", args: "ID", min: 1, max: 1, client: true, summary: "cancel an execution",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					if err := o.client().Cancel(ctx, pos[0]); err != nil {
						return err
					}
					_, err := fmt.Fprintln(stdout, "cancelled", pos[0])
					return err
				}
			}},

		&command{name: "agent ls", client: true, max: 0, summary: "list agents",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				asJSON := fs.Bool("json", false, "print the answer as JSON instead of a table")
				return func(ctx context.Context, _ []string, stdout, _ io.Writer) error {
					as, err := o.client().Agents(ctx)
					if err != nil || *asJSON {
						return printAnswer(stdout, wire.AgentList{Agents: as}, err)
					}
					rows := make([][]string, 0, len(as))
					for _, a := range as {
						rows = append(rows, []string{a.ID, orDash(a.Bundle), a.WebhookURL, when(a.UpdatedAt)})
					}
					return table(stdout, []string{"ID", "BUNDLE", "WEBHOOK", "UPDATED"}, rows)
				}
			}},
		&command{name: "agent get", args: "ID", min: 1, max: 1, client: true, summary: "print one agent (never its secret)",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					a, err := o.client().Agent(ctx, pos[0])
					return printAnswer(stdout, a, err)
				}
			}},
		&command{name: "agent put", args: "ID", min: 1, max: 1, client: true, summary: "register or update an agent",
			help: "--bundle binds the agent to a bundle of its tenant, which must exist; --bundle ''\nunbinds it; an omitted --bundle keeps the binding. Without --webhook-url the agent\nis gate-only: driven by sessions (docs/gate.md), never dispatched.",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				hook := fs.String("webhook-url", "", "webhook URL")
				secret := fs.String("secret", os.Getenv("WICKET_AGENT_SECRET"), "HMAC secret (WICKET_AGENT_SECRET)")
				bundle := fs.String("bundle", "", "bundle to bind ('' unbinds; omitted keeps the binding)")
				signing := fs.String("signing", "", "signature scheme: v1 or body (omitted: v1 for a new agent, unchanged for an existing one)")
				interrupted := fs.String("on-interrupted", "", "an at_most_once step found in flight: indeterminate (fail it) or approval (ask an operator); omitted keeps it")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
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
			}},
		&command{name: "agent policy", args: "ID RULES.yaml", min: 2, max: 2, client: true, summary: "store native YAML rules as the agent's own bundle and bind it",
			help: "RULES.yaml (- for stdin) holds native rules (default_action, rules); they become\nthe bundle agent-<id> and the agent is bound to it (POST /v0/policies/{id}).\nRules that do not load are refused whole (400) and the running ones stay.",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					rules, err := readInput(pos[1])
					if err != nil {
						return err
					}
					p, err := o.client().SetPolicy(ctx, pos[0], string(rules))
					return printAnswer(stdout, p, err)
				}
			}},
		&command{name: "agent rm", args: "ID", min: 1, max: 1, client: true, summary: "remove an agent (its executions stay readable)",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					if err := o.client().DeleteAgent(ctx, pos[0]); err != nil {
						return err
					}
					_, err := fmt.Fprintln(stdout, "deleted", pos[0])
					return err
				}
			}},

		&command{name: "approval ls", client: true, max: 0, summary: "list approvals, newest first",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				status := fs.String("status", "", "pending, granted, denied, expired or happened")
				asJSON := fs.Bool("json", false, "print the answer as JSON instead of a table")
				return func(ctx context.Context, _ []string, stdout, _ io.Writer) error {
					as, err := o.client().Approvals(ctx, *status)
					if err != nil || *asJSON {
						return printAnswer(stdout, wire.ApprovalList{Approvals: as}, err)
					}
					rows := make([][]string, 0, len(as))
					for _, a := range as {
						by := a.DecidedBy
						if by == "" {
							by = strings.Join(a.Approvers, ",")
							if by != "" {
								by = "(" + by + ")"
							}
						}
						rows = append(rows, []string{a.ID, a.Status, a.ExecutionID, a.AgentID, a.Kind + " " + a.Target, orDash(by), when(a.ExpiresAt)})
					}
					return table(stdout, []string{"ID", "STATUS", "EXECUTION", "AGENT", "STEP", "BY", "EXPIRES"}, rows)
				}
			}},
		&command{name: "approval get", args: "ID", min: 1, max: 1, client: true, summary: "print one approval",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					a, err := o.client().Approval(ctx, pos[0])
					return printAnswer(stdout, a, err)
				}
			}},
		resolveCommand("grant"),
		resolveCommand("deny"),
		resolveCommand("retry"),
		resolveCommand("happened"),

		&command{name: "tenant ls", client: true, max: 0, summary: "list tenants",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				return func(ctx context.Context, _ []string, stdout, _ io.Writer) error {
					ts, err := o.client().Tenants(ctx)
					return printAnswer(stdout, wire.TenantList{Tenants: ts}, err)
				}
			}},
		&command{name: "tenant create", args: "ID", min: 1, max: 1, client: true, summary: "create a tenant",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				guards := fs.String("guards", "", "comma-separated guard bundles (they must exist in the tenant already: use tenant guards)")
				retention := fs.String("retention", "", "how long its terminal executions are kept (e.g. 720h; 0s forever; default: the kernel's --retention)")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					req := wire.TenantRequest{ID: pos[0], Retention: *retention}
					if *guards != "" {
						req.Guards = strings.Split(*guards, ",")
					}
					t, err := o.client().CreateTenant(ctx, req)
					return printAnswer(stdout, t, err)
				}
			}},
		&command{name: "tenant guards", args: "TENANT", min: 1, max: 1, client: true, summary: "set a tenant's guard bundles",
			help: "--set names admin-owned bundles of the tenant, run before every agent's bundle;\n--set \"\" removes every guard.",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				set := fs.String("set", "", "comma-separated guard bundles: admin-owned bundles of the tenant (\"\" removes them)")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					if !flagSet(fs, "set") {
						return usagef("tenant guards: --set is required (--set \"\" removes every guard)")
					}
					var guards []string
					if *set != "" {
						guards = strings.Split(*set, ",")
					}
					t, err := o.client().SetTenantGuards(ctx, pos[0], guards)
					return printAnswer(stdout, t, err)
				}
			}},
		&command{name: "tenant key create", args: "TENANT", min: 1, max: 1, client: true, summary: "issue an API key (its secret is shown once)",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				role := fs.String("role", wire.RoleClient, "client, approver, tenant-admin or admin (admin: an admin key, in the default tenant)")
				principal := fs.String("principal", "", "who holds the key")
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					k, err := o.client().CreateKey(ctx, pos[0], wire.KeyRequest{Role: *role, Principal: *principal})
					return printAnswer(stdout, k, err)
				}
			}},
		&command{name: "tenant key ls", args: "TENANT", min: 1, max: 1, client: true, summary: "list a tenant's keys (never their secrets)",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					ks, err := o.client().Keys(ctx, pos[0])
					return printAnswer(stdout, wire.KeyList{Keys: ks}, err)
				}
			}},
		&command{name: "tenant key rm", args: "TENANT KEY_ID", min: 2, max: 2, client: true, summary: "revoke a key",
			setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
				return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
					if err := o.client().DeleteKey(ctx, pos[0], pos[1]); err != nil {
						return err
					}
					_, err := fmt.Fprintln(stdout, "revoked", pos[1])
					return err
				}
			}},
	)
}

// resolveSummaries are what the approval verbs do.
var resolveSummaries = map[string]string{
	"grant":    "grant a pending approval",
	"deny":     "deny a pending approval",
	"retry":    "answer an interrupted_side_effect approval: run the step again",
	"happened": "answer an interrupted_side_effect approval: it happened, with --result",
}

// resolveCommand is "approval grant", "deny", "retry" or "happened".
func resolveCommand(verb string) *command {
	return &command{name: "approval " + verb, args: "ID", min: 1, max: 1, client: true, summary: resolveSummaries[verb],
		setup: func(fs *flag.FlagSet, o *clientOpts) runFunc {
			by := fs.String("by", "", "admin keys only: the person the decision is made for (otherwise the key's principal decides)")
			rationale := fs.String("rationale", "", "why")
			hash := fs.String("request-hash", "", "the request hash the approver saw (refused if the step's differs)")
			var result *string
			if verb == "happened" {
				result = fs.String("result", "", "the effect's result, as JSON (recorded as the step's result; required)")
			}
			return func(ctx context.Context, pos []string, stdout, _ io.Writer) error {
				req := wire.ResolveApprovalRequest{DecidedBy: *by, Rationale: *rationale, RequestHash: *hash}
				if result != nil {
					if !json.Valid([]byte(*result)) {
						return usagef("approval happened needs --result with the effect's result as JSON (e.g. '\"sent\"' or '{\"id\": 7}')")
					}
					req.Result = json.RawMessage(*result)
				}
				c := o.client()
				resolve := map[string]func(context.Context, string, wire.ResolveApprovalRequest) (*wire.Approval, error){
					"grant": c.Grant, "deny": c.Deny, "retry": c.Retry, "happened": c.Happened}[verb]
				a, err := resolve(ctx, pos[0], req)
				return printAnswer(stdout, a, err)
			}
		}}
}
