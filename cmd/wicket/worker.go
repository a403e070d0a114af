package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/worker"
)

// workerCommand is the name of the hidden command serve starts its Rego
// workers with (one process per tenant, see plugins/worker).
const workerCommand = "policy-worker"

// policyWorker serves the worker protocol on stdin/stdout with the Rego
// engine; it is started by serve, never by hand.
func policyWorker(stdin io.Reader, stdout io.Writer) error {
	return worker.Serve(stdin, stdout, func(l bundle.Limits) plugins.Engine { return rego.New(rego.WithLimits(l)) })
}

// regoEngine returns the Rego engine serve uses: workers (the default), or
// the in-process engine with --rego-isolation none.
func regoEngine(o *limitOptions, limits bundle.Limits, log *slog.Logger) (plugins.Engine, func(), error) {
	switch o.regoIsolation {
	case "none":
		return rego.New(rego.WithLimits(limits)), func() {}, nil
	case "process":
	default:
		return nil, nil, usageError{fmt.Sprintf("serve: --rego-isolation %q: want process or none", o.regoIsolation)}
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("serve: find the wicket executable for the Rego workers: %w", err)
	}
	w := worker.New(worker.Config{Name: bundle.EngineRego, Command: []string{exe, workerCommand}, Limits: limits, Memory: int64(o.regoMemory), Logger: log})
	return w, func() { _ = w.Close() }, nil
}
