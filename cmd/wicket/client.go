package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// apiClient is the bearer-authenticated client of the exec, agent,
// approval and tenant commands.
type apiClient struct {
	base, key string
	out       io.Writer
}

// clientFlags adds --url and --key (WICKET_URL, WICKET_API_KEY) to fs.
func clientFlags(fs *flag.FlagSet) *apiClient {
	c := &apiClient{}
	fs.StringVar(&c.base, "url", envString("WICKET_URL", "http://127.0.0.1:8080"), "kernel base URL (WICKET_URL)")
	fs.StringVar(&c.key, "key", envString("WICKET_API_KEY", os.Getenv("WICKET_ADMIN_KEY")), "API key (WICKET_API_KEY, else WICKET_ADMIN_KEY)")
	return c
}

// do sends a request and pretty-prints the JSON answer (nothing for 204).
func (c *apiClient) do(ctx context.Context, method, path string, body any) error {
	return c.doHeaders(ctx, method, path, body, nil)
}

// doHeaders is do with extra request headers.
func (c *apiClient) doHeaders(ctx context.Context, method, path string, body any, hdr map[string]string) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.base, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var e struct{ Code, Message string }
		if json.Unmarshal(data, &e) == nil && e.Code != "" {
			return fmt.Errorf("%s %s: %d %s: %s", method, path, resp.StatusCode, e.Code, e.Message)
		}
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, data, "", "  "); err != nil {
		_, err = c.out.Write(data)
		return err
	}
	pretty.WriteByte('\n')
	_, err = pretty.WriteTo(c.out)
	return err
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

const execUsage = "exec ls [--agent A] [--status S] [--limit N] [--cursor C] | create AGENT [--input JSON] [--idempotency-key K] | get ID | events ID [--after N] | watch ID | cancel ID"

func execCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, rest, err := subcommand(args, execUsage)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("exec "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := clientFlags(fs)
	c.out = stdout
	switch sub {
	case "ls":
		agent := fs.String("agent", "", "agent id")
		status := fs.String("status", "", "status")
		limit := fs.String("limit", "", "page size")
		cursor := fs.String("cursor", "", "next_cursor of the previous page")
		if _, err := parseArgs(fs, rest, 0, execUsage); err != nil {
			return err
		}
		q := url.Values{}
		for k, v := range map[string]string{"agent_id": *agent, "status": *status, "limit": *limit, "cursor": *cursor} {
			if v != "" {
				q.Set(k, v)
			}
		}
		return c.do(ctx, "GET", "/v0/executions?"+q.Encode(), nil)
	case "create":
		input := fs.String("input", "null", "input JSON")
		idem := fs.String("idempotency-key", "", "Idempotency-Key")
		pos, err := parseArgs(fs, rest, 1, execUsage)
		if err != nil {
			return err
		}
		if !json.Valid([]byte(*input)) {
			return usageError{"exec create: --input is not valid JSON"}
		}
		var hdr map[string]string
		if *idem != "" {
			hdr = map[string]string{"Idempotency-Key": *idem}
		}
		return c.doHeaders(ctx, "POST", "/v0/executions", map[string]any{"agent_id": pos[0], "input": json.RawMessage(*input)}, hdr)
	case "get", "cancel", "events", "watch":
		after := fs.Int("after", 0, "events after this seq")
		pos, err := parseArgs(fs, rest, 1, execUsage)
		if err != nil {
			return err
		}
		id := url.PathEscape(pos[0])
		switch sub {
		case "get":
			return c.do(ctx, "GET", "/v0/executions/"+id, nil)
		case "cancel":
			if err := c.do(ctx, "POST", "/v0/executions/"+id+"/cancel", nil); err != nil {
				return err
			}
			fmt.Fprintln(stdout, "cancelled", pos[0])
			return nil
		case "events":
			return c.do(ctx, "GET", fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1000", id, *after), nil)
		default:
			return c.watch(ctx, "/v0/executions/"+id+"/stream")
		}
	}
	return usageError{"usage: wicket " + execUsage}
}

// watch prints an execution's events as they arrive, one line each, until
// the stream ends (after the terminal event) or ctx is done.
func (c *apiClient) watch(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", strings.TrimRight(c.base, "/")+path, nil)
	if err != nil {
		return err
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("watch: %s %s", resp.Status, bytes.TrimSpace(data))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			fmt.Fprintln(c.out, line)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}

const agentUsage = "agent ls | get ID | rm ID | put ID --webhook-url URL --secret S [--bundle B]"

func agentCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, rest, err := subcommand(args, agentUsage)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("agent "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := clientFlags(fs)
	c.out = stdout
	switch sub {
	case "ls":
		if _, err := parseArgs(fs, rest, 0, agentUsage); err != nil {
			return err
		}
		return c.do(ctx, "GET", "/v0/agents", nil)
	case "get", "rm":
		pos, err := parseArgs(fs, rest, 1, agentUsage)
		if err != nil {
			return err
		}
		if sub == "get" {
			return c.do(ctx, "GET", "/v0/agents/"+url.PathEscape(pos[0]), nil)
		}
		if err := c.do(ctx, "DELETE", "/v0/agents/"+url.PathEscape(pos[0]), nil); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "deleted", pos[0])
		return nil
	case "put":
		hook := fs.String("webhook-url", "", "webhook URL")
		secret := fs.String("secret", os.Getenv("WICKET_AGENT_SECRET"), "HMAC secret (WICKET_AGENT_SECRET)")
		bundle := fs.String("bundle", "", "bundle to bind")
		pos, err := parseArgs(fs, rest, 1, agentUsage)
		if err != nil {
			return err
		}
		body := map[string]any{"id": pos[0]}
		for k, v := range map[string]string{"webhook_url": *hook, "secret": *secret, "policy": *bundle} {
			if v != "" {
				body[k] = v
			}
		}
		return c.do(ctx, "POST", "/v0/agents", body)
	}
	return usageError{"usage: wicket " + agentUsage}
}

const approvalUsage = "approval ls [--status S] | get ID | grant ID --by NAME [--rationale R] [--request-hash H] | deny ID --by NAME [--rationale R]"

func approvalCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, rest, err := subcommand(args, approvalUsage)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("approval "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := clientFlags(fs)
	c.out = stdout
	switch sub {
	case "ls":
		status := fs.String("status", "", "pending, granted, denied or expired")
		if _, err := parseArgs(fs, rest, 0, approvalUsage); err != nil {
			return err
		}
		return c.do(ctx, "GET", "/v0/approvals?status="+url.QueryEscape(*status), nil)
	case "get":
		pos, err := parseArgs(fs, rest, 1, approvalUsage)
		if err != nil {
			return err
		}
		return c.do(ctx, "GET", "/v0/approvals/"+url.PathEscape(pos[0]), nil)
	case "grant", "deny":
		by := fs.String("by", os.Getenv("USER"), "who decides")
		rationale := fs.String("rationale", "", "why")
		hash := fs.String("request-hash", "", "the request hash the approver saw")
		pos, err := parseArgs(fs, rest, 1, approvalUsage)
		if err != nil {
			return err
		}
		body := map[string]any{"decided_by": *by, "rationale": *rationale}
		if *hash != "" {
			body["request_hash"] = *hash
		}
		return c.do(ctx, "POST", "/v0/approvals/"+url.PathEscape(pos[0])+"/"+sub, body)
	}
	return usageError{"usage: wicket " + approvalUsage}
}

const tenantUsage = "tenant ls | create ID [--guards a,b] | key create TENANT --role R --principal P | key ls TENANT | key rm TENANT KEY_ID"

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
	c := clientFlags(fs)
	c.out = stdout
	switch sub {
	case "ls":
		if _, err := parseArgs(fs, rest, 0, tenantUsage); err != nil {
			return err
		}
		return c.do(ctx, "GET", "/v0/tenants", nil)
	case "create":
		guards := fs.String("guards", "", "comma-separated guard bundles")
		pos, err := parseArgs(fs, rest, 1, tenantUsage)
		if err != nil {
			return err
		}
		body := map[string]any{"id": pos[0]}
		if *guards != "" {
			body["guards"] = strings.Split(*guards, ",")
		}
		return c.do(ctx, "POST", "/v0/tenants", body)
	case "key create":
		role := fs.String("role", "client", "client, tenant-admin or admin")
		principal := fs.String("principal", "", "who holds the key")
		pos, err := parseArgs(fs, rest, 1, tenantUsage)
		if err != nil {
			return err
		}
		return c.do(ctx, "POST", "/v0/tenants/"+url.PathEscape(pos[0])+"/keys", map[string]any{"role": *role, "principal": *principal})
	case "key ls":
		pos, err := parseArgs(fs, rest, 1, tenantUsage)
		if err != nil {
			return err
		}
		return c.do(ctx, "GET", "/v0/tenants/"+url.PathEscape(pos[0])+"/keys", nil)
	case "key rm":
		pos, err := parseArgs(fs, rest, 2, tenantUsage)
		if err != nil {
			return err
		}
		if err := c.do(ctx, "DELETE", "/v0/tenants/"+url.PathEscape(pos[0])+"/keys/"+url.PathEscape(pos[1]), nil); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "revoked", pos[1])
		return nil
	}
	return usageError{"usage: wicket " + tenantUsage}
}
