package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/server/wire"
)

// TestGateCommands: a gate-only agent with on_interrupted, the answers of an
// interrupted side effect, and the usage mistakes of mcp-proxy (exit 2).
func TestGateCommands(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}})
	ctx := context.Background()
	cli := func(args ...string) (string, error) {
		t.Helper()
		out, _, err := runCmd(t, ctx, append(args, "--url", env.URL, "--key", testkit.AdminKey)...)
		return out, err
	}
	out, err := cli("agent", "put", "desk", "--secret", "desk-secret-0123456789", "--on-interrupted", "approval")
	var a wire.Agent
	if err != nil || json.Unmarshal([]byte(out), &a) != nil || !a.GateOnly || a.OnInterrupted != "approval" {
		t.Fatalf("agent put: %s %v", out, err)
	}
	if out, err := cli("agent", "put", "desk", "--on-interrupted", "never"); err == nil || !strings.Contains(err.Error(), "on_interrupted") {
		t.Fatalf("a bad on_interrupted: %s %v", out, err)
	}
	var ue usageError
	if _, err := cli("approval", "happened", "ap-1"); !errors.As(err, &ue) {
		t.Fatalf("happened without --result: %v", err)
	}
	if _, err := cli("approval", "retry", "ap-1", "--result", "1"); !errors.As(err, &ue) {
		t.Fatalf("retry with --result: %v", err)
	}
	if _, err := cli("approval", "happened", "nope", "--result", `"sent"`); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("happened on an unknown approval: %v", err)
	}
	for _, args := range [][]string{
		{"mcp-proxy", "--upstream", "files=cat"},                         // neither --agent nor --execution
		{"mcp-proxy", "--agent", "desk"},                                 // no upstream
		{"mcp-proxy", "--agent", "desk", "--upstream", "files"},          // no command
		{"mcp-proxy", "--agent", "desk", "--upstream", "f=cat", "extra"}, // an argument
	} {
		if _, err := cli(args...); !errors.As(err, &ue) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
