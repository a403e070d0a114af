// Command wicket is the Wicket kernel and its command-line tools.
//
//	wicket serve [--data DIR] [--addr 127.0.0.1:8080] [--config manifest.yaml]
//	wicket exec|agent|approval|tenant|bundle ...   clients of a running kernel
//	wicket policy test|eval|build|inspect ...      bundles on disk
//	wicket store check|compact|backup|copy ...     the stores
//	wicket version
//
// `wicket help` lists every command; `wicket COMMAND --help` describes one.
// Exit status: 0 done, 1 failed, 2 a usage mistake.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"
)

// version is the binary's version: set at build time with
// -ldflags "-X main.version=v1.2.3", or else read from the build info
// (see version.go).
var version string

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		// The first SIGINT or SIGTERM asks the command to stop (serve stops
		// gracefully); a second one, while it does, stops the process at
		// once. One sent twice at once is one: coreutils' timeout, for
		// one, signals the process and then its process group.
		<-sigs
		first := time.Now()
		cancel()
		for sig := range sigs {
			if time.Since(first) >= sameSignal {
				secondSignal(sig)
				os.Exit(1)
			}
		}
	}()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	signal.Stop(sigs)
	cancel()
	os.Exit(exitCode(err, os.Stderr))
}

// sameSignal is how soon after the first a signal is taken for the same
// one delivered twice, not a second one: a person's second Ctrl-C comes
// later.
const sameSignal = 300 * time.Millisecond

// onSecondSignal says why the process stops without finishing; serve
// replaces it with a line in its own log.
var onSecondSignal atomic.Pointer[func(os.Signal)]

// secondSignal reports a second SIGINT or SIGTERM before the exit.
func secondSignal(sig os.Signal) {
	if f := onSecondSignal.Load(); f != nil {
		(*f)(sig)
		return
	}
	fmt.Fprintf(os.Stderr, "wicket: second signal (%v): stopping at once\n", sig)
}

// exitCode prints err and returns the process's exit status: 0 without an
// error, 2 for a usage mistake, 1 for anything else.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "wicket:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

func init() {
	register(
		&command{name: "serve", summary: "run the kernel (embedded bbolt store under --data, or --store postgres://…)", max: 0,
			setup: func(fs *flag.FlagSet, _ *clientOpts) runFunc {
				var o serveOptions
				serveFlags(&o, fs)
				return func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
					if err := checkEnvTwins(fs, scratchServeFlags); err != nil {
						return err
					}
					return serve(ctx, &o, stdout, stderr)
				}
			}},
		&command{name: "bench", summary: "measure steps/s over HTTP against an in-process kernel", max: 0, setup: benchSetup},
		&command{name: "version", summary: "print the version", max: 0,
			setup: func(*flag.FlagSet, *clientOpts) runFunc {
				return func(_ context.Context, _ []string, stdout, _ io.Writer) error {
					_, err := fmt.Fprintf(stdout, "wicket %s\n", version)
					return err
				}
			}},
	)
}

// run dispatches to a command; main only calls this.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, args, stdout, stderr)
}
