package examples_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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
	"github.com/wicket-run/wicket/server/llmgw"
	"github.com/wicket-run/wicket/server/wire"
)

// Each test builds one example, runs it as a real process against a real
// kernel (testkit: bbolt in a temp dir, HTTP on loopback, the rules
// engine), and drives an execution through it with the client SDK, as a
// user would with the CLI.

// timeout bounds each wait; machines running the tests are slow and noisy.
const timeout = 30 * time.Second

// example is a running example process and the kernel it talks to.
type example struct {
	t      *testing.T
	admin  *client.Client
	id     string
	addr   string
	log    string
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // of cmd.Wait, once exited is closed
}

// run builds examples/<name>, starts a kernel, and starts the example
// against it with agent id <name> on a free loopback port.
func run(t *testing.T, name string) *example {
	t.Helper()
	return runWith(t, name, func(kernelURL, addr string) []string {
		return []string{"--kernel", kernelURL, "--listen", addr, "--admin-key", testkit.AdminKey, "--id", name}
	})
}

// runWith is run with the example's command line built by args.
func runWith(t *testing.T, name string, args func(kernelURL, addr string) []string) *example {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, name)
	if out, err := exec.Command("go", "build", "-o", bin, "./"+name).CombinedOutput(); err != nil {
		t.Fatalf("go build ./%s: %v\n%s", name, err, out)
	}
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}})
	e := &example{t: t, admin: client.New(env.URL, client.WithAPIKey(testkit.AdminKey)), id: name,
		addr: freeAddr(t), log: filepath.Join(dir, name+".log"), exited: make(chan struct{})}

	// The process writes straight into a file: what it logged before an
	// effect is visible as soon as the effect is.
	out, err := os.Create(e.log)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	e.cmd = exec.Command(bin, args(env.URL, e.addr)...)
	e.cmd.Stdout, e.cmd.Stderr = out, out
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { e.err = e.cmd.Wait(); close(e.exited) }()
	t.Cleanup(e.stop) // runs before the kernel's cleanup: the agent goes first
	return e
}

// stop asks the example to shut down (SIGTERM), kills it if it does not,
// and prints its output if the test failed.
func (e *example) stop() {
	select {
	case <-e.exited:
		e.t.Errorf("%s exited early: %v", e.id, e.err)
	default:
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.exited:
			if e.err != nil {
				e.t.Errorf("%s did not exit cleanly on SIGTERM: %v", e.id, e.err)
			}
		case <-time.After(15 * time.Second):
			e.t.Errorf("%s did not exit within 15s of SIGTERM; killing it", e.id)
			_ = e.cmd.Process.Kill()
			<-e.exited
		}
	}
	if e.t.Failed() {
		e.t.Logf("output of %s:\n%s", e.id, e.output())
	}
}

// output returns what the example has written to stdout and stderr.
func (e *example) output() string {
	b, err := os.ReadFile(e.log)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return string(b)
}

// count returns how many lines of the output contain s.
func (e *example) count(s string) int {
	n := 0
	for _, l := range strings.Split(e.output(), "\n") {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// registered waits until the example has registered itself with its
// webhook URL (and, with bound, bound itself to a policy bundle).
func (e *example) registered(bound bool) {
	e.t.Helper()
	want := "http://" + e.addr + "/webhook"
	deadline := time.Now().Add(timeout)
	for {
		a, err := e.admin.Agent(context.Background(), e.id)
		if err == nil && a.WebhookURL == want && (!bound || a.Bundle != "") {
			return
		}
		select {
		case <-e.exited:
			e.t.Fatalf("%s exited before registering: %v", e.id, e.err)
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s not registered after %v (last answer %+v, %v)", e.id, timeout, a, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// create starts an execution of the example with input.
func (e *example) create(input string) *client.Execution {
	e.t.Helper()
	x, err := e.admin.CreateExecution(context.Background(), client.CreateExecutionRequest{AgentID: e.id, Input: json.RawMessage(input)}, "")
	if err != nil {
		e.t.Fatalf("create: %v", err)
	}
	return x
}

// wait waits until the execution is finished and checks that it completed.
func (e *example) wait(id string) *client.Execution {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	x, err := e.admin.Wait(ctx, id)
	if err != nil {
		e.t.Fatalf("wait for %s: %v", id, err)
	}
	if x.Status != "completed" {
		e.t.Fatalf("execution %s is %s: error %s, reason %q", id, x.Status, x.Error, x.Reason)
	}
	return x
}

// status polls the execution until its status is want.
func (e *example) status(id, want string) *client.Execution {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		x, err := e.admin.GetExecution(context.Background(), id)
		if err != nil {
			e.t.Fatal(err)
		}
		if x.Status == want {
			return x
		}
		if client.IsTerminalStatus(x.Status) || time.Now().After(deadline) {
			e.t.Fatalf("execution %s is %s, want %s (error %s, reason %q)", id, x.Status, want, x.Error, x.Reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// register registers an agent served by a process started by the test
// (its webhook at http://addr/webhook) and binds it to the rules policy.
func register(t *testing.T, admin *client.Client, id, addr, secret, policy string) {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: id, WebhookURL: "http://" + addr + "/webhook", Secret: secret}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetPolicy(ctx, id, policy); err != nil {
		t.Fatal(err)
	}
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestEchoAgent runs the agent written against the protocol by hand, once
// per signing scheme, registered with the matching "signing".
func TestEchoAgent(t *testing.T) {
	t.Parallel()
	for _, scheme := range []string{wire.SigningV1, wire.SigningBody} {
		t.Run(scheme, func(t *testing.T) {
			const secret = "echo-secret-0123456789"
			e := runWith(t, "echo-agent", func(kernelURL, addr string) []string {
				return []string{"--kernel", kernelURL, "--listen", addr, "--id", "echo-agent", "--secret", secret, "--signing", scheme}
			})
			a, err := e.admin.PutAgent(context.Background(), client.AgentRequest{ID: "echo-agent", WebhookURL: "http://" + e.addr + "/webhook",
				Secret: secret, Signing: scheme})
			if err != nil || a.Signing != scheme {
				t.Fatalf("register: %+v %v", a, err)
			}
			x := e.wait(e.create(`{"message":"hello"}`).ID)
			var out struct {
				Echo map[string]string `json:"echo"`
			}
			if err := json.Unmarshal(x.Output, &out); err != nil || out.Echo["message"] != "hello" {
				t.Fatalf("output %s: %v", x.Output, err)
			}
			// A step policy denies fails the execution at once, instead of
			// leaving it running to be delivered again at every lease.
			if _, err := e.admin.SetPolicy(context.Background(), "echo-agent", "default_action: deny\nrules: []\n"); err != nil {
				t.Fatal(err)
			}
			f := e.status(e.create(`{"message":"no"}`).ID, "failed")
			if !strings.Contains(string(f.Error), "step denied: ") {
				t.Fatalf("the denied execution's error: %s", f.Error)
			}
		})
	}
}

func TestHello(t *testing.T) {
	t.Parallel()
	e := run(t, "hello")
	e.registered(false)
	x := e.wait(e.create(`{"name":"Ada"}`).ID)

	var out struct {
		Greeting string    `json:"greeting"`
		At       time.Time `json:"at"`
	}
	if err := json.Unmarshal(x.Output, &out); err != nil {
		t.Fatalf("output %s: %v", x.Output, err)
	}
	if !strings.HasPrefix(out.Greeting, "Hello, Ada!") || out.At.IsZero() {
		t.Fatalf("output %s", x.Output)
	}
	if want := "It is " + out.At.Format("15:04") + " UTC."; !strings.HasSuffix(out.Greeting, want) {
		t.Fatalf("greeting %q does not end with the recorded time (%q)", out.Greeting, want)
	}
	if n := e.count("tool greet:"); n != 1 {
		t.Fatalf("the greet body ran %d times, want 1", n)
	}
}

func TestApproval(t *testing.T) {
	t.Parallel()
	e := run(t, "approval")
	e.registered(true)
	ctx := context.Background()
	id := e.create(`{"order_id":"A-1001","reason":"arrived broken"}`).ID

	// The refund waits for a human.
	x := e.status(id, "blocked")
	approvals, err := e.admin.Approvals(ctx, "pending")
	if err != nil {
		t.Fatal(err)
	}
	var mine []client.Approval
	for _, a := range approvals {
		if a.ExecutionID == id {
			mine = append(mine, a)
		}
	}
	if len(mine) != 1 || mine[0].Target != "payments.refund" || mine[0].ID != x.BlockedOn || mine[0].Message == "" {
		t.Fatalf("pending approvals of %s (blocked on %q): %+v", id, x.BlockedOn, mine)
	}
	if n := e.count("tool payments.refund:"); n != 0 {
		t.Fatalf("the refund ran before the approval (%d times)", n)
	}
	if _, err := e.admin.Grant(ctx, mine[0].ID, client.ResolveApprovalRequest{DecidedBy: "alice", Rationale: "test"}); err != nil {
		t.Fatal(err)
	}

	// The execution resumes: the lookup replays, the refund runs once.
	x = e.wait(id)
	var out struct {
		RefundID    string `json:"refund_id"`
		OrderID     string `json:"order_id"`
		AmountCents int64  `json:"amount_cents"`
	}
	if err := json.Unmarshal(x.Output, &out); err != nil || out.OrderID != "A-1001" || out.RefundID == "" || out.AmountCents <= 0 {
		t.Fatalf("output %s (%v)", x.Output, err)
	}
	if n := e.count("tool orders.lookup:"); n != 1 {
		t.Fatalf("the lookup body ran %d times, want 1 (replayed after the approval)", n)
	}
	if n := e.count("tool payments.refund:"); n != 1 {
		t.Fatalf("the refund body ran %d times, want 1", n)
	}
	if n := e.count("handler: execution"); n < 2 {
		t.Fatalf("the handler ran %d times, want 2 (before and after the approval)", n)
	}

	evs, err := e.admin.AllEvents(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, ev := range evs {
		seen[ev.Type]++
	}
	for _, typ := range []string{"approval.requested", "approval.granted", "execution.blocked", "execution.completed"} {
		if seen[typ] != 1 {
			t.Errorf("%d %s events, want 1", seen[typ], typ)
		}
	}
	if last := evs[len(evs)-1].Type; last != client.EventExecutionCompleted {
		t.Errorf("last event %s", last)
	}
}

func TestLLM(t *testing.T) {
	t.Parallel()
	e := run(t, "llm")
	e.registered(false)
	ctx := context.Background()
	const prompt = "Tell me about durable execution"
	id := e.create(`{"prompt":"` + prompt + `"}`).ID

	// Watch the execution as `wicket exec watch` does, to count the live
	// deltas of the streamed call. They are ephemeral: a watcher that
	// connects late misses them, so they are only logged.
	var deltas int
	watched := make(chan error, 1)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	go func() {
		watched <- e.admin.Watch(wctx, id, 0, func(it client.StreamItem) error {
			if it.Delta != nil {
				deltas++
			}
			return nil
		})
	}()

	x := e.wait(id)
	var out struct {
		Reply    string `json:"reply"`
		Streamed string `json:"streamed"`
	}
	if err := json.Unmarshal(x.Output, &out); err != nil {
		t.Fatalf("output %s: %v", x.Output, err)
	}
	// The fake numbers its completions; the number is the provider's own.
	reply := regexp.MustCompile("^" + strings.Replace(regexp.QuoteMeta(fakellm.Reply(prompt, 999)), "999", `\d+`, 1) + "$")
	if !reply.MatchString(out.Reply) || !reply.MatchString(out.Streamed) {
		t.Fatalf("output %s does not carry the fake's replies (%s)", x.Output, reply)
	}

	steps, err := e.admin.Steps(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var streamed, plain int
	for _, s := range steps {
		if s.Kind != agent.KindLLMCall {
			continue
		}
		var rec agent.LLMResponse
		if s.Status != "succeeded" || s.Target != "fake-1" || s.Usage == nil || json.Unmarshal(s.Result, &rec) != nil || rec.Status != 200 {
			t.Fatalf("llm_call step %+v", s)
		}
		if rec.Stream {
			streamed++
		} else {
			plain++
		}
	}
	if plain != 1 || streamed != 1 {
		t.Fatalf("%d plain and %d streamed llm_call steps, want 1 and 1: %+v", plain, streamed, steps)
	}
	if err := <-watched; err != nil {
		t.Fatalf("watch: %v", err)
	}
	t.Logf("the watcher saw %d step deltas", deltas)
	if x.Totals.LLMCalls != 2 {
		t.Errorf("execution totals %+v, want 2 llm calls", x.Totals)
	}
}

// TestGatewayPython runs examples/gateway-python (standard library only)
// against a kernel serving the LLM gateway in front of the fake provider:
// its two calls are llm_call steps, answered through the gateway; a
// model its policy denies comes back to it as the rebuno_refusal marker;
// and a model that needs an approval parks the execution (the agent's
// raise_for_refusal reads "blocked" and ends its dispatch) until a human
// grants it, after which the execution is delivered again, the recorded
// call replays and the next one proceeds.
func TestGatewayPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed: the Python gateway example is not run (apt-get install -y python3; .ci/run installs it)")
	}
	prov := &fakellm.Provider{APIKey: "sk-python-example-provider-key"}
	base, stop, err := fakellm.Listen("127.0.0.1:0", prov)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}, LLM: &llmgw.Config{Providers: []llmgw.Provider{
		{Name: "fake", Dialect: llmgw.DialectOpenAI, BaseURL: base + "/v1", APIKey: prov.APIKey,
			Models: []llmgw.Model{{Name: "gpt-py", Input: 1, Output: 2}, {Name: "gpt-denied"}, {Name: "gpt-gated"}}},
	}}})
	admin := client.New(env.URL, client.WithAPIKey(testkit.AdminKey))
	ctx := context.Background()
	const secret = "python-agent-secret-0123456789"
	policy := "default_action: allow\nrules:\n  - id: no\n    priority: 1\n    when: {target: gpt-denied}\n    then: {decision: deny, reason: not this one}\n" +
		"  - id: gate\n    priority: 2\n    when: {target: gpt-gated}\n    then: {decision: require_approval}\n"
	for _, model := range []string{"gpt-py", "gpt-denied", "gpt-gated"} {
		addr := freeAddr(t)
		id := "py-" + strings.TrimPrefix(model, "gpt-")
		register(t, admin, id, addr, secret, policy)
		logf := filepath.Join(t.TempDir(), id+".log")
		out, err := os.Create(logf)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(py, "gateway-python/agent.py", "--kernel", env.URL, "--listen", addr, "--id", id, "--secret", secret, "--model", model)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); out.Close() })
		deadline := time.Now().Add(timeout)
		for {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(logf)
				t.Fatalf("the Python agent did not listen on %s:\n%s", addr, b)
			}
			time.Sleep(20 * time.Millisecond)
		}
		x, err := admin.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: id, Input: json.RawMessage(`{"prompt":"hello from python"}`)}, "")
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, timeout)
		granted := make(chan int, 1)
		if model == "gpt-gated" {
			// Each gated call parks the execution (the agent's
			// raise_for_refusal sees "blocked" and ends its dispatch);
			// a human grants it and the execution is delivered again.
			go func() {
				n := 0
				defer func() { granted <- n }()
				for wctx.Err() == nil {
					aps, err := admin.Approvals(wctx, "pending")
					if err == nil {
						for _, ap := range aps {
							if ap.ExecutionID == x.ID {
								if _, err := admin.Grant(wctx, ap.ID, wire.ResolveApprovalRequest{RequestHash: ap.RequestHash}); err == nil {
									n++
								}
							}
						}
					}
					if cur, err := admin.GetExecution(wctx, x.ID); err == nil && client.IsTerminalStatus(cur.Status) {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
		done, err := admin.Wait(wctx, x.ID)
		cancel()
		if err != nil {
			b, _ := os.ReadFile(logf)
			t.Fatalf("wait: %v\n%s", err, b)
		}
		steps, err := admin.Steps(ctx, x.ID)
		if err != nil {
			t.Fatal(err)
		}
		switch model {
		case "gpt-py":
			var o struct{ Reply, Streamed string }
			if done.Status != "completed" || json.Unmarshal(done.Output, &o) != nil ||
				!strings.Contains(o.Reply, `"hello from python"`) || !strings.Contains(o.Streamed, `"hello from python"`) {
				t.Fatalf("execution %s: %s %s", done.Status, done.Output, done.Error)
			}
			if len(steps) != 2 || steps[0].Kind != "llm_call" || steps[0].Target != "gpt-py" || steps[1].Status != "succeeded" ||
				done.Totals.Tokens == 0 || done.Totals.CostUSD == 0 || prov.Calls() != 2 {
				t.Fatalf("steps %+v, totals %+v, provider calls %d", steps, done.Totals, prov.Calls())
			}
		case "gpt-denied":
			if done.Status != "failed" || !strings.Contains(string(done.Error), `"decision":"denied"`) || len(steps) != 1 || prov.Calls() != 2 {
				t.Fatalf("execution %s %s; steps %+v; provider calls %d", done.Status, done.Error, steps, prov.Calls())
			}
		case "gpt-gated":
			// Two approvals (the plain and the streamed call), three
			// deliveries; the last one replays the plain call (the
			// provider is called once per call), and nothing failed.
			var o struct {
				Reply, Streamed string
				Replayed        bool
			}
			if n := <-granted; n != 2 || done.Status != "completed" || json.Unmarshal(done.Output, &o) != nil ||
				!strings.Contains(o.Reply, `"hello from python"`) || !strings.Contains(o.Streamed, `"hello from python"`) {
				t.Fatalf("gated: %d grants; execution %s %s %s", n, done.Status, done.Output, done.Error)
			}
			if len(steps) != 2 || steps[0].Status != "succeeded" || steps[1].Status != "succeeded" || prov.Calls() != 4 {
				t.Fatalf("gated: steps %+v, provider calls %d", steps, prov.Calls())
			}
			// The agent's log: two refusals as "blocked", then a
			// delivery whose plain call was a replay.
			b, _ := os.ReadFile(logf)
			if strings.Count(string(b), "refused: blocked") != 2 || !strings.Contains(string(b), "replayed=True,False") {
				t.Fatalf("gated: the agent's log:\n%s", b)
			}
		}
	}
}

// TestAgentPython runs examples/agent-python, an agent written in Python
// from docs/ alone: its step identity agrees with the kernel's test vectors;
// under a real kernel it computes every step id itself (the kernel checks
// each one), is denied a destructive tool, fails a step whose effect
// failed, unwinds on an approval and, delivered again once it is granted,
// replays what ran. Killed (SIGKILL) inside an at_most_once effect while its
// heartbeats hold the lease, it is delivered again when the lease expires:
// everything recorded replays, nothing runs twice, and the step that was in
// flight comes back failed indeterminate.
func TestAgentPython(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed: the Python agent example is not run (apt-get install -y python3; .ci/run installs it)")
	}
	if out, err := exec.Command(py, "agent-python/agent.py", "--check-vectors", "../kernel/canon/testdata/vectors.json").CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "all agree") {
		t.Fatalf("the Python step identity against kernel/canon's vectors: %v\n%s", err, out)
	}

	const lease = 2 * time.Second
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()},
		Config: kernel.Config{LeaseTimeout: lease, DispatchTimeout: time.Second}})
	admin := client.New(env.URL, client.WithAPIKey(testkit.AdminKey))
	ctx := context.Background()
	const id, secret = "py-research", "python-research-secret-0123456789"
	addr := freeAddr(t)
	register(t, admin, id, addr, secret, "default_action: allow\nrules:\n"+
		"  - id: keep-drafts\n    priority: 1\n    when: {target: delete_drafts}\n    then: {decision: deny, reason: drafts are kept}\n"+
		"  - id: publish-review\n    priority: 2\n    when: {target: publish}\n    then: {decision: require_approval, reason: a human reads it first}\n")

	// Both lives of the agent write to one log.
	logf := filepath.Join(t.TempDir(), id+".log")
	out, err := os.Create(logf)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	logged := func(s string) int {
		b, _ := os.ReadFile(logf)
		return strings.Count(string(b), s)
	}
	start := func(slow string) *exec.Cmd {
		cmd := exec.Command(py, "agent-python/agent.py", "--kernel", env.URL, "--listen", addr, "--id", id, "--secret", secret, "--slow", slow)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for !cond() {
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(logf)
				t.Fatalf("%s: not after %v; the agent's log:\n%s", what, timeout, b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	first := start("publish")
	until("the agent listens", func() bool { return logged("listening on") == 1 })
	x, err := admin.CreateExecution(ctx, client.CreateExecutionRequest{AgentID: id, Input: json.RawMessage(`{"topic":"wicket"}`)}, "")
	if err != nil {
		t.Fatal(err)
	}

	// The publish waits for a human; the agent unwound.
	var pending []client.Approval
	until("the publish approval", func() bool {
		aps, err := admin.Approvals(ctx, "pending")
		pending = pending[:0]
		for _, a := range aps {
			if a.ExecutionID == x.ID {
				pending = append(pending, a)
			}
		}
		return err == nil && len(pending) == 1 && logged("unwound: blocked") == 1
	})
	if pending[0].Target != "publish" {
		t.Fatalf("pending %+v", pending)
	}
	if _, err := admin.Grant(ctx, pending[0].ID, wire.ResolveApprovalRequest{RequestHash: pending[0].RequestHash}); err != nil {
		t.Fatal(err)
	}

	// Delivered again, it replays up to the publish, which now runs (slowly).
	// Its heartbeats hold the lease past the lease timeout.
	until("the publish effect", func() bool { return logged("effect publish") == 1 })
	held, err := admin.GetExecution(ctx, x.ID)
	if err != nil || held.Dispatch == nil || held.Dispatch.LeaseUntil == nil {
		t.Fatalf("execution %+v: %v", held, err)
	}
	renewedBy := held.Dispatch.LeaseUntil.Add(lease)
	until("a lease renewed by heartbeats", func() bool {
		cur, err := admin.GetExecution(ctx, x.ID)
		if err != nil || cur.Dispatch == nil || cur.Dispatch.ID != held.Dispatch.ID || cur.Dispatch.Attempt != held.Dispatch.Attempt {
			t.Fatalf("the lease moved while the agent heartbeats: %+v, was %+v (%v)", cur.Dispatch, held.Dispatch, err)
		}
		return cur.Dispatch.LeaseUntil != nil && cur.Dispatch.LeaseUntil.After(renewedBy)
	})

	// Killed inside the effect; a new process takes the next attempt.
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	start("")
	wctx, cancel := context.WithTimeout(ctx, timeout)
	done, err := admin.Wait(wctx, x.ID)
	cancel()
	if err != nil || done.Status != "completed" {
		b, _ := os.ReadFile(logf)
		t.Fatalf("execution %+v: %v\n%s", done, err, b)
	}
	var o struct {
		At           string          `json:"at"`
		Summary      string          `json:"summary"`
		DeleteDrafts string          `json:"delete_drafts"`
		Fetch        map[string]any  `json:"fetch"`
		Published    json.RawMessage `json:"published"`
	}
	if err := json.Unmarshal(done.Output, &o); err != nil || o.At == "" || o.Summary != "2 papers on wicket" ||
		o.DeleteDrafts != "denied: drafts are kept" || o.Fetch["code"] != "ConnectionError" ||
		!strings.Contains(string(o.Published), `"code":"indeterminate"`) {
		t.Fatalf("output %s (%v)", done.Output, err)
	}
	for effect, want := range map[string]int{"search": 1, "fetch": 1, "summarize": 1, "publish": 1, "delete_drafts": 0} {
		if n := logged("effect " + effect + " "); n != want {
			b, _ := os.ReadFile(logf)
			t.Errorf("the %s effect ran %d times, want %d; the agent's log:\n%s", effect, n, want, b)
		}
	}
	if n := logged("step tool_call search #0"); n != 3 {
		t.Errorf("search submitted %d times, want 3 (one per delivery)", n)
	}
}
