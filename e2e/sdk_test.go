package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/fakellm"
	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

var (
	sdkAgentOnce sync.Once
	sdkAgentPath string
	sdkAgentErr  error
)

// sdkAgentBinary builds testdata/sdkagent (an agent written with sdk/agent)
// once per test binary.
func sdkAgentBinary(t *testing.T) string {
	t.Helper()
	sdkAgentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "wicket-sdkagent-")
		if err != nil {
			sdkAgentErr = err
			return
		}
		sdkAgentPath = filepath.Join(dir, "sdkagent")
		out, err := exec.Command("go", "build", "-o", sdkAgentPath, "./testdata/sdkagent").CombinedOutput()
		if err != nil {
			sdkAgentErr = fmt.Errorf("go build sdkagent: %v\n%s", err, out)
		}
	})
	if sdkAgentErr != nil {
		t.Fatal(sdkAgentErr)
	}
	return sdkAgentPath
}

const sdkSecret = "sdk-e2e-secret-0123456789"

// sdkRig is a real kernel, an admin client, and the SDK agent process that
// the test starts, kills and starts again on one address.
type sdkRig struct {
	t        *testing.T
	env      *testkit.Env
	admin    *client.Client
	addr     string
	journal  string
	provider string
	id       string
	cmd      *exec.Cmd
	out      *syncBuffer
	life     int
}

func newSDKRig(t *testing.T, id, policy string) *sdkRig {
	t.Helper()
	cfg := kernel.Config{LeaseTimeout: time.Second, DispatchTimeout: 300 * time.Millisecond, ReapInterval: 20 * time.Millisecond,
		DispatchBackoff: 50 * time.Millisecond, DispatchBackoffMax: 200 * time.Millisecond, DispatchMaxAttempts: 100}
	env := testkit.Start(t, testkit.Options{Config: cfg, Engines: []plugins.Engine{rules.New()}})
	r := &sdkRig{t: t, env: env, admin: client.New(env.URL, client.WithAPIKey(testkit.AdminKey)),
		addr: freeAddr(t), journal: filepath.Join(t.TempDir(), "journal"), id: id}
	ctx := context.Background()
	if _, err := r.admin.PutAgent(ctx, wire.AgentRequest{ID: id, WebhookURL: "http://" + r.addr + "/webhook", Secret: sdkSecret}); err != nil {
		t.Fatal(err)
	}
	if policy != "" {
		if _, err := r.admin.SetPolicy(ctx, id, policy); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(r.kill)
	return r
}

// start starts the next life of the agent process.
func (r *sdkRig) start() {
	r.t.Helper()
	r.life++
	args := []string{"--kernel", r.env.URL, "--listen", r.addr, "--id", r.id, "--secret", sdkSecret,
		"--journal", r.journal, "--life", fmt.Sprint(r.life), "--heartbeat", "200ms"}
	if r.provider != "" {
		args = append(args, "--provider", r.provider)
	}
	cmd := exec.Command(sdkAgentBinary(r.t), args...)
	r.out = &syncBuffer{}
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.cmd = cmd
}

// kill SIGKILLs the agent process and waits for it to be gone.
func (r *sdkRig) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	_ = r.cmd.Wait()
	r.cmd = nil
}

// lines returns the journal's lines.
func (r *sdkRig) lines() []string {
	b, err := os.ReadFile(r.journal)
	if err != nil && !os.IsNotExist(err) {
		r.t.Fatal(err)
	}
	return strings.FieldsFunc(string(b), func(c rune) bool { return c == '\n' })
}

// count returns how many journal lines start with prefix.
func (r *sdkRig) count(prefix string) int {
	n := 0
	for _, l := range r.lines() {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// waitJournal waits until a journal line starts with prefix.
func (r *sdkRig) waitJournal(prefix string) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for r.count(prefix) == 0 {
		if time.Now().After(deadline) {
			r.t.Fatalf("no %q in the journal %q; agent output:\n%s", prefix, r.lines(), r.out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *sdkRig) create(input any) string {
	r.t.Helper()
	raw, _ := json.Marshal(input)
	x, err := r.admin.CreateExecution(context.Background(), wire.CreateExecutionRequest{AgentID: r.id, Input: raw}, "")
	if err != nil {
		r.t.Fatal(err)
	}
	return x.ID
}

func (r *sdkRig) wait(id string, want kernel.ExecStatus) kernel.Execution {
	r.t.Helper()
	x := r.env.WaitStatus(id, 60*time.Second, func(s kernel.ExecStatus) bool { return s == want || s.Terminal() })
	if x.Status != want {
		r.t.Fatalf("execution %s is %s (%s %s), want %s; agent output:\n%s", id, x.Status, x.Reason, x.Error, want, r.out)
	}
	return x
}

func (r *sdkRig) checkLog(id string) []kernel.Event {
	r.t.Helper()
	evs := r.env.Events(id)
	if err := testkit.CheckLog(evs); err != nil {
		r.t.Fatal(err)
	}
	return evs
}

// The agent process is killed while a charge is in flight. After a restart
// the completed fetch replays (its body never runs again); the in-flight
// charge is an orphan: at_most_once surfaces as indeterminate, safe_to_retry
// runs again under the same step id.
func TestSDKAgentKilledMidRun(t *testing.T) {
	for _, mode := range []string{"amo", "safe"} {
		t.Run(mode, func(t *testing.T) {
			r := newSDKRig(t, "crash-"+mode, "")
			r.start()
			id := r.create(map[string]string{"scenario": "crash", "mode": mode})
			r.waitJournal("charge-start")
			r.kill()
			stepsBefore, err := r.admin.Steps(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			r.start()
			x := r.wait(id, kernel.ExecCompleted)

			if n := r.count("fetch "); n != 1 {
				t.Fatalf("fetch ran %d times across two agent processes, want 1: %q", n, r.lines())
			}
			var out struct{ Page, Charge string }
			if err := json.Unmarshal(x.Output, &out); err != nil {
				t.Fatal(err)
			}
			if out.Page != "contents of https://example.test/a" {
				t.Fatalf("output %s", x.Output)
			}
			steps, err := r.admin.Steps(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			var chargeID, chargeBefore string
			for _, s := range stepsBefore {
				if s.Target == "charge" {
					chargeBefore = s.ID
					if s.Status != "executing" {
						t.Fatalf("charge was %s at the kill, want executing", s.Status)
					}
				}
			}
			for _, s := range steps {
				if s.Target == "charge" {
					chargeID = s.ID
				}
			}
			if chargeID == "" || chargeID != chargeBefore {
				t.Fatalf("charge step %q after the restart, %q before: the same effect must keep its id", chargeID, chargeBefore)
			}
			switch mode {
			case "amo":
				if out.Charge != "indeterminate" || r.count("charge-start") != 1 || r.count("charge-done") != 0 {
					t.Fatalf("at_most_once orphan: output %s, journal %q", x.Output, r.lines())
				}
			case "safe":
				if out.Charge != "charged 1250" || r.count("charge-start") != 2 || r.count("charge-done") != 1 {
					t.Fatalf("safe_to_retry orphan: output %s, journal %q", x.Output, r.lines())
				}
				// Both runs of the body saw the same step id: the key a
				// payment provider would deduplicate the charge on.
				if r.count("charge-start 1250 "+chargeID) != 2 {
					t.Fatalf("journal %q: both runs should carry step id %s", r.lines(), chargeID)
				}
			}
			evs := r.checkLog(id)
			if n := testkit.Count(evs, kernel.EvDispatchClaimed); n < 2 {
				t.Fatalf("%d dispatch claims, want a re-delivery after the kill", n)
			}
		})
	}
}

const sdkApprovalRules = `default_action: allow
rules:
  - id: deploy-needs-approval
    priority: 1
    when: {target: deploy}
    then:
      decision: require_approval
      reason: production deploys need a human
      approval_config: {approvers: [alice], message: "deploy to prod?"}
`

// An approval pauses the execution; the agent process is killed while it
// waits, and after the grant a new process picks the execution up: the plan
// replays, the deploy runs once.
func TestSDKApprovalAcrossAgentRestart(t *testing.T) {
	r := newSDKRig(t, "deployer", sdkApprovalRules)
	r.start()
	id := r.create(map[string]string{"scenario": "approval"})
	x := r.wait(id, kernel.ExecBlocked)
	r.kill()
	ctx := context.Background()
	aps, err := r.admin.Approvals(ctx, "pending")
	if err != nil {
		t.Fatal(err)
	}
	if len(aps) != 1 || aps[0].ExecutionID != id || aps[0].Target != "deploy" || aps[0].ID != x.BlockedOn {
		t.Fatalf("pending approvals %+v (blocked on %s)", aps, x.BlockedOn)
	}
	if _, err := r.admin.Grant(ctx, aps[0].ID, wire.ResolveApprovalRequest{DecidedBy: "alice", RequestHash: aps[0].RequestHash}); err != nil {
		t.Fatal(err)
	}
	r.start()
	x = r.wait(id, kernel.ExecCompleted)
	var out struct {
		Plan, Deploy string
		Life         int
	}
	if err := json.Unmarshal(x.Output, &out); err != nil || out.Deploy != "deployed prod" || out.Life != 2 {
		t.Fatalf("output %s (%v)", x.Output, err)
	}
	if r.count("plan ") != 1 || r.count("deploy ") != 1 {
		t.Fatalf("journal %q: plan and deploy must each run once", r.lines())
	}
	evs := r.checkLog(id)
	for _, typ := range []kernel.EventType{kernel.EvApprovalRequested, kernel.EvApprovalGranted, kernel.EvExecutionResumed} {
		if testkit.Count(evs, typ) != 1 {
			t.Fatalf("%s appears %d times: %v", typ, testkit.Count(evs, typ), testkit.Types(evs))
		}
	}
}

// An LLM call is made once: the agent process is killed after it, and the
// new process gets the recorded answer back byte for byte without calling
// the provider again, streamed or not.
func TestSDKLLMCallReplayedAfterAgentKill(t *testing.T) {
	for _, mode := range []string{"json", "stream"} {
		t.Run(mode, func(t *testing.T) {
			prov := &fakellm.Provider{}
			ps := httptest.NewServer(prov)
			defer ps.Close()
			r := newSDKRig(t, "llm-"+mode, "")
			r.provider = ps.URL
			r.start()
			id := r.create(map[string]string{"scenario": "llm", "mode": mode})
			r.waitJournal("llm ")
			r.kill()
			r.start()
			x := r.wait(id, kernel.ExecCompleted)
			lines := r.lines()
			if len(lines) != 2 {
				t.Fatalf("journal %q, want the call in life 1 and its replay in life 2", lines)
			}
			first, second := strings.Fields(lines[0]), strings.Fields(lines[1])
			if len(first) != 2 || len(second) != 3 || first[1] != second[1] || second[2] != "true" {
				t.Fatalf("journal %q: the replay must be marked and carry the same bytes (sha256)", lines)
			}
			if prov.Calls() != 1 {
				t.Fatalf("provider called %d times, want 1", prov.Calls())
			}
			if !strings.Contains(string(x.Output), "chatcmpl-1") || strings.Contains(string(x.Output), "chatcmpl-2") {
				t.Fatalf("output %s does not carry the first completion", x.Output)
			}
			steps, err := r.admin.Steps(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if len(steps) != 1 || steps[0].Kind != "llm_call" || steps[0].Target != "fake-1" || steps[0].Status != "succeeded" {
				t.Fatalf("steps %+v", steps)
			}
			r.checkLog(id)
		})
	}
}

// workIn is the input of the survivor test's tool.
type workIn struct {
	X string
	I int
}

// The kernel (a real `wicket serve`) is SIGKILLed while SDK agents are in
// the middle of their executions. Their kernel calls fail, so the SDK ends
// each dispatch without a verdict (KernelError) instead of failing the
// execution; after the restart the leases expire, the executions are
// delivered again, every step whose completion the kernel acknowledged
// replays (its body never runs again), and all of them complete.
func TestSDKAgentSurvivesKernelKill(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	p := startServe(t, dir, addr)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()

	const steps, n = 12, 6
	// The kill lands while every execution is inside step 4: steps 0-3 are
	// acknowledged, step 4 is executing.
	const killAt = 4
	gate := newCrashGate(killAt, n)
	var killed atomic.Bool
	var mu sync.Mutex
	runs := map[string]int{}   // tool body runs by execution/step
	acked := map[string]bool{} // Call returned: the kernel acknowledged the completion
	work := agent.NewTool("work", func(ctx context.Context, in workIn) (int, error) {
		mu.Lock()
		runs[fmt.Sprint(in.X, "/", in.I)]++
		mu.Unlock()
		if in.I == killAt && !killed.Load() {
			gate.hold(ctx, in.X)
		}
		return in.I * in.I, nil
	}, agent.WithIdempotency(agent.SafeToRetry))
	var kernelErrors atomic.Int64
	a, err := agent.New(agent.Config{ID: "survivor", Secret: []byte(sdkSecret), KernelURL: p.url, HeartbeatInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: agent.Typed(func(ctx context.Context, x string) (int, error) {
			sum := 0
			for i := range steps {
				v, err := work.Call(ctx, workIn{x, i})
				if err != nil {
					if errors.As(err, new(*agent.KernelError)) {
						kernelErrors.Add(1)
					}
					return 0, err
				}
				mu.Lock()
				acked[fmt.Sprint(x, "/", i)] = true
				mu.Unlock()
				sum += v
			}
			return sum, nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	defer srv.Close()
	admin := client.New(p.url, client.WithAPIKey(testkit.AdminKey))
	ctx := context.Background()
	if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "survivor", WebhookURL: srv.URL + "/webhook", Secret: sdkSecret}); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range n {
		raw, _ := json.Marshal(fmt.Sprint("x", i))
		x, err := admin.CreateExecution(ctx, wire.CreateExecutionRequest{AgentID: "survivor", Input: raw}, "")
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = x.ID
	}
	gate.wait(t, "before the kill", p)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	killed.Store(true)
	mu.Lock()
	ackedAtKill := map[string]bool{}
	for k := range acked {
		ackedAtKill[k] = true
	}
	mu.Unlock()
	close(gate.release) // the held bodies finish; completing them hits the dead kernel
	deadline := time.Now().Add(30 * time.Second)
	for a.Running() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d dispatches still running against a dead kernel", a.Running())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(ackedAtKill) != n*killAt {
		t.Fatalf("%d steps acknowledged at the kill, want %d (steps 0-%d of each execution)", len(ackedAtKill), n*killAt, killAt-1)
	}
	if got := kernelErrors.Load(); got != n {
		t.Fatalf("%d handlers saw the dead kernel as a KernelError, want %d", got, n)
	}

	p2 := startServe(t, dir, addr)
	defer func() { _ = p2.cmd.Process.Kill(); _ = p2.cmd.Wait() }()
	want := 0
	for i := range steps {
		want += i * i
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, id := range ids {
		x, err := admin.Wait(wctx, id)
		if err != nil {
			t.Fatalf("wait %s: %v\nkernel log:\n%s", id, err, p2.stderr.String())
		}
		if x.Status != "completed" || string(x.Output) != fmt.Sprint(want) {
			t.Fatalf("%s: %s %s %s", id, x.Status, x.Output, x.Error)
		}
		evs, err := testkit.AllEvents(p2.url, testkit.AdminKey, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := testkit.CheckLog(evs); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k := range ackedAtKill {
		if runs[k] != 1 {
			t.Errorf("step %s was acknowledged before the kill but its body ran %d times", k, runs[k])
		}
	}
	for i := range n {
		// The step in flight at the kill was not acknowledged: it runs again.
		if k := fmt.Sprint("x", i, "/", killAt); runs[k] != 2 {
			t.Errorf("step %s was in flight at the kill; its body ran %d times, want 2", k, runs[k])
		}
	}
}
