package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/wicket-run/wicket/sdk/client"
)

// The command line is one table of leaf commands ("exec get", "tenant key
// create"), each with the synopsis of its positional arguments, its flags
// and what it runs. Every leaf parses the same way: flags before and after
// the arguments, --help prints the synopsis and flags on stdout (exit 0),
// a bad flag or argument count is a usage error (exit 2), anything else
// that fails is exit 1.

// command is one leaf command.
type command struct {
	// name is the words that select it: "serve", "exec get".
	name string
	// args is the synopsis of its positional arguments: "ID", "BUNDLE...".
	args string
	// min and max bound the number of positional arguments (max -1: no bound).
	min, max int
	// summary is one line for the command lists.
	summary string
	// help is more text for --help (optional).
	help string
	// client commands get --url, --key and --tenant, and explain a refused
	// connection.
	client bool
	// setup defines the command's flags on fs and returns what runs it.
	setup func(fs *flag.FlagSet, o *clientOpts) runFunc
}

// runFunc runs a command with its positional arguments.
type runFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// usageError is a command-line mistake; main exits 2 for it.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// usagef builds a usageError.
func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// groupSummaries are the one-line summaries of the command groups.
var groupSummaries = map[string]string{
	"exec":       "list, create, read, watch and cancel executions",
	"agent":      "list, read, register and remove agents",
	"approval":   "list, read and answer approvals (grant, deny; retry, happened)",
	"tenant":     "list and create tenants",
	"tenant key": "create, list and revoke a tenant's API keys",
	"bundle":     "upload, download, list and remove policy bundles of a kernel",
	"policy":     "test, evaluate, build and inspect policy bundles",
	"store":      "check, compact and back up the embedded store; copy between stores",
}

// commands is every leaf command; main.go, client.go, policy.go and
// store.go fill it in init.
var commands []*command

// register adds commands to the table.
func register(cs ...*command) { commands = append(commands, cs...) }

// synopsis is "wicket NAME ARGS [flags]".
func (c *command) synopsis() string {
	s := "wicket " + c.name
	if c.args != "" {
		s += " " + c.args
	}
	return s + " [flags]"
}

// dispatch finds the command args name and runs it.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, topUsage())
		return usagef("no command given")
	}
	switch args[0] {
	case "-h", "--help", "-help":
		fmt.Fprint(stdout, topUsage())
		return nil
	case "help":
		return helpCommand(args[1:], stdout)
	case "-v", "--version", "-version":
		fmt.Fprintf(stdout, "wicket %s\n", version)
		return nil
	case workerCommand: // hidden: serve starts it for a tenant's Rego
		return policyWorker(os.Stdin, os.Stdout)
	case wasmCompileCommand: // hidden: serve starts it for each wasm compile
		return wasmCompile(os.Stdin, os.Stdout)
	}
	// The longest run of words that names a command or a group.
	prefix := ""
	for i, w := range args {
		if strings.HasPrefix(w, "-") {
			break
		}
		name := strings.TrimSpace(prefix + " " + w)
		if c := lookup(name); c != nil {
			return c.run(ctx, args[i+1:], stdout, stderr)
		}
		if !isGroup(name) {
			break
		}
		prefix = name
	}
	if prefix == "" {
		fmt.Fprint(stderr, topUsage())
		return usagef("unknown command %q", args[0])
	}
	rest := args[len(strings.Fields(prefix)):]
	if len(rest) > 0 {
		switch rest[0] {
		case "-h", "--help", "-help", "help":
			fmt.Fprint(stdout, groupUsage(prefix))
			return nil
		}
	}
	fmt.Fprint(stderr, groupUsage(prefix))
	if len(rest) == 0 {
		return usagef("%s: no subcommand given", prefix)
	}
	return usagef("%s: unknown subcommand %q", prefix, rest[0])
}

// helpCommand is "wicket help [COMMAND...]".
func helpCommand(words []string, stdout io.Writer) error {
	name := strings.Join(words, " ")
	switch {
	case name == "":
		fmt.Fprint(stdout, topUsage())
	case lookup(name) != nil:
		c := lookup(name)
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.define(fs)
		c.printHelp(stdout, fs)
	case isGroup(name):
		fmt.Fprint(stdout, groupUsage(name))
	default:
		return usagef("help: no command %q", name)
	}
	return nil
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func isGroup(name string) bool {
	for _, c := range commands {
		if strings.HasPrefix(c.name, name+" ") {
			return true
		}
	}
	return false
}

// topUsage lists the top-level commands and groups.
func topUsage() string {
	var b strings.Builder
	b.WriteString("usage: wicket <command> [arguments] [flags]\n\ncommands:\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	seen := map[string]bool{}
	var firsts []string
	for _, c := range commands {
		if first := strings.Fields(c.name)[0]; !seen[first] {
			seen[first] = true
			firsts = append(firsts, first)
		}
	}
	sort.SliceStable(firsts, func(i, j int) bool { return topRank(firsts[i]) < topRank(firsts[j]) })
	for _, first := range firsts {
		if c := lookup(first); c != nil {
			fmt.Fprintf(tw, "  %s\t%s\n", first, c.summary)
		} else {
			fmt.Fprintf(tw, "  %s\t%s\n", first, groupSummaries[first])
		}
	}
	_ = tw.Flush()
	b.WriteString("\n`wicket help COMMAND` or `wicket COMMAND --help` describes a command.\n")
	b.WriteString("Exit status: 0 done, 1 failed, 2 a usage mistake.\n")
	return b.String()
}

// topOrder is the order of the top-level command list.
var topOrder = []string{"serve", "exec", "approval", "agent", "bundle", "policy", "tenant", "store", "mcp-proxy", "bench", "version"}

func topRank(name string) int {
	for i, n := range topOrder {
		if n == name {
			return i
		}
	}
	return len(topOrder)
}

// groupUsage lists the commands of a group.
func groupUsage(group string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: wicket %s <subcommand> [arguments] [flags]\n", group)
	if s := groupSummaries[group]; s != "" {
		fmt.Fprintf(&b, "\n%s\n", s)
	}
	b.WriteString("\nsubcommands:\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	var names []string
	for _, c := range commands {
		if strings.HasPrefix(c.name, group+" ") {
			names = append(names, c.name)
		}
	}
	for _, n := range names {
		c := lookup(n)
		syn := strings.TrimPrefix(c.name, group+" ")
		if c.args != "" {
			syn += " " + c.args
		}
		fmt.Fprintf(tw, "  %s\t%s\n", syn, c.summary)
	}
	_ = tw.Flush()
	fmt.Fprintf(&b, "\n`wicket %s SUBCOMMAND --help` lists its flags.\n", group)
	return b.String()
}

// define sets the command's flags on fs and returns its run function and
// client options (nil for offline commands).
func (c *command) define(fs *flag.FlagSet) (runFunc, *clientOpts) {
	var o *clientOpts
	if c.client {
		o = clientFlags(fs)
	}
	return c.setup(fs, o), o
}

// run parses args and runs the command.
func (c *command) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("wicket "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, help is printed below
	fs.Usage = func() {}
	fn, o := c.define(fs)
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		c.printHelp(stdout, fs)
		return nil
	}
	if err != nil {
		return usagef("%s: %v\nusage: %s (--help lists the flags)", c.name, err, c.synopsis())
	}
	switch {
	case len(pos) < c.min, c.max >= 0 && len(pos) > c.max:
		want := "no arguments"
		if c.args != "" {
			want = c.args
		}
		return usagef("%s: want %s, got %d argument(s)\nusage: %s (--help lists the flags)", c.name, want, len(pos), c.synopsis())
	}
	err = fn(ctx, pos, stdout, stderr)
	if o != nil {
		err = o.explain(err)
	}
	return err
}

// parseInterleaved parses flags that come before, between and after the
// positional arguments, and returns the arguments. "--" ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// printHelp writes the synopsis, the help text and the flags.
func (c *command) printHelp(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n", c.synopsis(), c.summary)
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.help))
	}
	var lines []string
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		head := "  --" + f.Name
		if name != "" {
			head += " " + name
		}
		if !zeroDefault(f.DefValue) && !holdsSecret(f) {
			if name == "string" {
				usage += fmt.Sprintf(" (default %q)", f.DefValue)
			} else {
				usage += fmt.Sprintf(" (default %s)", f.DefValue)
			}
		}
		lines = append(lines, head+"\n        "+strings.ReplaceAll(usage, "\n", "\n        "))
	})
	if len(lines) > 0 {
		fmt.Fprintf(w, "\nflags:\n%s\n", strings.Join(lines, "\n"))
	}
}

// holdsSecret reports whether a flag's value may be a secret (a key, from
// the environment), whose default the help must not show: --key,
// --admin-key, --metrics-key and the like, and flags whose usage says
// secret. --max-tenant-keys is a number.
func holdsSecret(f *flag.Flag) bool {
	return f.Name == "key" || strings.HasSuffix(f.Name, "-key") || strings.Contains(f.Usage, "secret")
}

// zeroDefault reports whether a flag's default is its type's zero value,
// which the help leaves out (as the flag package does): a zero duration
// prints as "0s", and saying "(default 0s)" beside a usage that explains
// what 0 means would contradict it.
func zeroDefault(def string) bool {
	switch def {
	case "", "false", "0", "0s", "[]":
		return true
	}
	return false
}

// explain adds what to check to an error that means no kernel answered at
// the URL.
func (o *clientOpts) explain(err error) error {
	if err == nil {
		return nil
	}
	if u, perr := url.Parse(o.url); o.used && (perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		return usagef("--url %q is not a kernel URL: want http://HOST:PORT or https://HOST (set --url or WICKET_URL)", o.url)
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return fmt.Errorf("%w\ncannot resolve the host of %s (set --url or WICKET_URL)", err, o.url)
	}
	var op *net.OpError
	if errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &op) && op.Op == "dial") {
		return fmt.Errorf("%w\nno kernel answers at %s: is `wicket serve` running there? (set --url or WICKET_URL)", err, o.url)
	}
	var api *client.APIError
	if errors.As(err, &api) && api.Status == http.StatusUnauthorized && o.key == "" {
		return fmt.Errorf("%w\nno API key given: set --key or WICKET_API_KEY (or WICKET_ADMIN_KEY to the admin key)", err)
	}
	return err
}

// table writes rows under a header, aligned in columns.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// orDash is s, or "-" when it is empty (tables keep their columns).
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// readInput reads a file, or stdin for "-".
func readInput(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(path)
}
