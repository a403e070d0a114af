package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

var (
	builtMu sync.Mutex
	built   = map[string]string{}
)

// testBinary builds ./testdata/<name> once per test binary.
func testBinary(t *testing.T, name string) string {
	t.Helper()
	builtMu.Lock()
	defer builtMu.Unlock()
	if p, ok := built[name]; ok {
		return p
	}
	dir, err := os.MkdirTemp("", "wicket-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if out, err := exec.Command("go", "build", "-o", p, "./testdata/"+name).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", name, err, out)
	}
	built[name] = p
	return p
}

const triageRules = `default_action: allow
rules:
  - id: no-purge
    priority: 1
    when: {target: purge}
    then: {decision: deny, reason: purging is not allowed}
`

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.FieldsFunc(string(b), func(c rune) bool { return c == '\n' })
}

func countPrefix(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

func waitLine(t *testing.T, path, prefix string, out fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for countPrefix(readLines(t, path), prefix) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q; output:\n%s", prefix, readLines(t, path), out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A Go program's own loop holds a session (no webhook). It is SIGKILLed
// mid-run; while its lease is live another attach gets 409
// execution_leased, and neither another key of the tenant nor a key of
// another tenant can drive the session with the lease's headers. A new
// process attaches once the lease lapses: the recorded steps replay (no
// tool body runs twice, the recorded time comes back) and it completes.
func TestSessionHolderKilledAndAttached(t *testing.T) {
	cfg := kernel.Config{LeaseTimeout: 3 * time.Second, ReapInterval: 20 * time.Millisecond}
	env := testkit.Start(t, testkit.Options{Config: cfg, Engines: []plugins.Engine{rules.New()}})
	admin := client.New(env.URL, client.WithAPIKey(testkit.AdminKey))
	ctx := context.Background()
	if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "triage", Secret: "triage-secret-0123456789"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetPolicy(ctx, "triage", triageRules); err != nil {
		t.Fatal(err)
	}
	key := func(tenant, role, who string) string {
		k, err := admin.CreateKey(ctx, tenant, wire.KeyRequest{Role: role, Principal: who})
		if err != nil {
			t.Fatal(err)
		}
		return k.Key
	}
	if _, err := admin.CreateTenant(ctx, wire.TenantRequest{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	holderKey, otherKey, acmeKey := key("default", "client", "triage-bot"), key("default", "client", "ci"), key("acme", "client", "acme-bot")

	dir := t.TempDir()
	journal, idFile := filepath.Join(dir, "journal"), filepath.Join(dir, "id")
	bin := testBinary(t, "sessionloop")
	start := func(life int, extra ...string) (*exec.Cmd, *syncBuffer) {
		args := append([]string{"--kernel", env.URL, "--key", holderKey, "--journal", journal, "--life", strconv.Itoa(life)}, extra...)
		cmd := exec.Command(bin, args...)
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, out
	}

	cmd, out := start(1, "--agent", "triage", "--id-file", idFile)
	waitLine(t, journal, "hang", out)
	raw, err := os.ReadFile(idFile)
	if err != nil {
		t.Fatal(err)
	}
	id := string(raw)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	x, err := admin.GetExecution(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if x.Status != "running" || x.Lease == nil || x.Dispatch == nil || x.Dispatch.LeaseUntil == nil {
		t.Fatalf("the killed holder's session: %+v", x)
	}
	// While the dead holder's lease is live: 409 naming until when.
	_, err = client.New(env.URL, client.WithAPIKey(holderKey)).AttachSession(ctx, id)
	var ae *client.APIError
	if !client.IsCode(err, wire.CodeExecutionLeased) || !errors.As(err, &ae) || ae.Details["lease_until"] == nil {
		t.Fatalf("attach while leased: %v", err)
	}
	// Nobody else drives it, even with the lease's headers.
	lease := map[string]string{wire.HeaderDispatchID: x.Lease.DispatchID, wire.HeaderDispatchAttempt: strconv.Itoa(x.Lease.Attempt)}
	for k, want := range map[string]int{otherKey: http.StatusForbidden, acmeKey: http.StatusNotFound} {
		st, err := testkit.BearerWithHeaders(env.URL, k, "POST", "/v0/executions/"+id+"/steps", lease,
			map[string]any{"kind": "tool_call", "target": "label", "args": "x"}, nil)
		if st != want {
			t.Fatalf("another key drives the session: %d %v, want %d", st, err, want)
		}
	}

	cmd, out = start(2, "--execution", id)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("life 2: %v\n%s", err, out)
	}
	lines := readLines(t, journal)
	if countPrefix(lines, "search ") != 1 || countPrefix(lines, "label open bugs #1") != 1 || countPrefix(lines, "label open bugs #2") != 1 ||
		countPrefix(lines, "purge") != 0 || countPrefix(lines, "completed completed") != 1 || countPrefix(lines, "attach refused") == 0 {
		t.Fatalf("journal %q", lines)
	}
	var nows []string
	for _, l := range lines {
		if strings.HasPrefix(l, "life ") {
			nows = append(nows, strings.Fields(l)[3])
		}
	}
	if len(nows) != 2 || nows[0] != nows[1] {
		t.Fatalf("the recorded time did not replay: %q", nows)
	}
	x, err = admin.GetExecution(ctx, id)
	if err != nil || x.Status != "completed" {
		t.Fatalf("execution %+v %v", x, err)
	}
	evs := env.Events(id)
	if err := testkit.CheckLog(evs); err != nil {
		t.Fatal(err)
	}
	if testkit.Count(evs, kernel.EvSessionAttached) != 2 || testkit.Count(evs, kernel.EvSessionDetached) != 1 ||
		testkit.Count(evs, kernel.EvDispatchQueued) != 0 || testkit.Count(evs, kernel.EvStepDenied) != 2 {
		t.Fatalf("events %v", testkit.Types(evs))
	}
	if p := eventPayload(t, evs, kernel.EvSessionDetached); p["reason"] != "lease_expired" {
		t.Fatalf("session.detached %v", p)
	}
}
