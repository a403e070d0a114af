// Command wicket is the Wicket kernel and its command-line tools.
//
//	wicket serve [--data DIR] [--addr 127.0.0.1:8080] [--config manifest.yaml]
//	wicket policy test|eval|build|inspect ...
//	wicket version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(os.Stderr, "wicket:", err)
			os.Exit(2)
		}
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "wicket:", err)
		os.Exit(1)
	}
}

// usageError is a command-line mistake; main exits 2 for it.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

const usage = `usage: wicket <command> [flags]

commands:
  serve     run the kernel (embedded bbolt store under --data, or --store postgres://…)
  policy    test, eval, build or inspect policy bundles
  bench     measure steps/s over HTTP against an in-process kernel
  exec      ls | create | get | events | watch | cancel executions
  agent     ls | get | put | rm agents
  approval  ls | get | grant | deny | retry | happened approvals
  tenant    ls | create tenants; key create | ls | rm
  store     copy a store (embedded directory ↔ PostgreSQL), verified
  mcp-proxy an MCP server whose tool calls go through a Wicket session
  version   print the version
`

// run dispatches to a subcommand; main only calls this.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{"no command given"}
	}
	switch args[0] {
	case "serve":
		return serveCommand(ctx, args[1:], stdout, stderr)
	case "policy":
		return policyCommand(ctx, args[1:], stdout, stderr)
	case "bench":
		return benchCommand(ctx, args[1:], stdout, stderr)
	case "exec":
		return execCommand(ctx, args[1:], stdout, stderr)
	case "agent":
		return agentCommand(ctx, args[1:], stdout, stderr)
	case "approval":
		return approvalCommand(ctx, args[1:], stdout, stderr)
	case "tenant":
		return tenantCommand(ctx, args[1:], stdout, stderr)
	case "store":
		return storeCommand(ctx, args[1:], stdout, stderr)
	case "mcp-proxy":
		return mcpProxyCommand(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "wicket %s\n", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return usageError{fmt.Sprintf("unknown command %q", args[0])}
	}
}
