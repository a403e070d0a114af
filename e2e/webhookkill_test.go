package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
)

// TestKillWebhookExecutionsAtRandomInstants runs a real `wicket serve`
// on one data directory through several lives, each ended by a SIGKILL,
// under the load TestKillAtRandomInstants lacks: executions created with
// an Idempotency-Key and delivered to a webhook agent, which submits and
// completes their steps and completes them, one step of every fourth
// waiting on an approval that an operator grants. A life ends at a
// random instant under load; the instant one chosen answer (a creation,
// a step's proceed or replay, an execution's completion, a grant) was
// read, by the goroutine that read it; while a backup is streamed;
// during the start; after the next life's kernel waits for the lock; or
// in a graceful stop. Some lives run with --no-wal, some commit every
// batch to the file. After every restart: an Idempotency-Key answered
// returns its execution (200); every completion answered (step or
// execution) is there with the result sent, every grant answered is
// granted; the re-delivered executions' steps answered earlier replay
// their result (a step answered proceed again after its completion was
// answered fails the test); every execution's log holds (testkit.
// CheckLog) with no step event twice. The last life stops cleanly, and
// `wicket store check` passes.
//
// WICKET_KILL_SEED replays a run's draw; WICKET_KILL_LIVES sets the
// number of lives (default 8).
func TestKillWebhookExecutionsAtRandomInstants(t *testing.T) {
	rng, lives := killDraw(t, 2)
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }

	dir, addr := t.TempDir(), freeAddr(t)
	h := newHookLedger()
	hook := testkit.NewAgent("hook", "hook-secret-0123456789abcdef", "http://"+addr, h.run)
	hook.HeartbeatEvery = 200 * time.Millisecond
	defer hook.Close()
	var running *process
	t.Cleanup(func() {
		if running != nil {
			_ = running.cmd.Process.Kill()
			_ = running.cmd.Wait()
		}
	})
	schedule := []string{"ack", "load", "backup", "restart", "start", "ack", "stop"}
	kind := func(life int) string {
		if life == lives-1 {
			return "clean stop"
		}
		return schedule[life%len(schedule)]
	}
	flags := func(life int) []string {
		switch life % 4 {
		case 1:
			return []string{"--no-wal"}
		case 2:
			return []string{"--commit-interval", "-1ns"}
		}
		return nil
	}
	var next *process
	var nextReady string
	lastBoot := time.Duration(0)
	for life := range lives {
		how := kind(life)
		p, ready := next, nextReady
		if p == nil {
			p, ready = spawnServe(t, dir, addr, flags(life)...)
		}
		next, running = nil, p
		if how == "start" {
			time.Sleep(between(0, lastBoot))
			p.kill(t, false)
			t.Logf("life %d %v: killed during its start", life, flags(life))
			continue
		}
		p.awaitReady(t, ready)
		lastBoot = p.boot
		h.verify(t, p)
		if life == 0 {
			if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/agents", map[string]any{"id": "hook", "secret": "hook-secret-0123456789abcdef", "webhook_url": hook.WebhookURL()}, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/policies/hook", map[string]any{"bundle": "default_action: allow\nrules:\n  - id: gate\n    priority: 1\n    when: {target: gated}\n    then: {decision: require_approval}\n"}, nil); err != nil {
				t.Fatal(err)
			}
		}

		var killOnce sync.Once
		killNow := func() { killOnce.Do(func() { _ = p.cmd.Process.Signal(syscall.SIGKILL) }) }
		h.armKill(-1, nil)
		if how == "ack" {
			h.armKill(1+rng.Int64N(60), killNow)
		}
		before := h.answers.Load()
		stop, done := make(chan struct{}), make(chan struct{})
		var wg sync.WaitGroup
		for c := range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); h.create(p.url, life, c, stop) }()
		}
		wg.Add(1)
		go func() { defer wg.Done(); h.approve(p.url, stop) }()
		go func() { wg.Wait(); close(done) }()
		// Every end but "ack" comes once the load runs: after the life's
		// first answer.
		deadline := time.Now().Add(60 * time.Second)
		for how != "ack" && h.answers.Load() == before {
			if time.Now().After(deadline) {
				t.Fatalf("life %d: nothing answered; kernel log:\n%s", life, p.stderrString())
			}
			time.Sleep(time.Millisecond)
		}
		switch how {
		case "ack":
			select {
			case <-done: // the chosen answer came, and the kill with it
			case <-time.After(60 * time.Second):
				t.Fatalf("life %d: the chosen answer never came; kernel log:\n%s", life, p.stderrString())
			}
			p.kill(t, false)
		case "load":
			time.Sleep(between(0, 500*time.Millisecond))
			p.kill(t, false)
		case "backup":
			// Killed while a backup is streamed.
			req, err := http.NewRequest("GET", p.url+"/v0/store/backup", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+testkit.AdminKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("backup: %v", err)
			}
			_, _ = io.ReadFull(resp.Body, make([]byte, 1+rng.IntN(64<<10)))
			p.kill(t, false)
			resp.Body.Close()
		case "restart":
			time.Sleep(between(0, 300*time.Millisecond))
			next, nextReady = spawnServe(t, dir, addr, flags(life+1)...)
			next.waitOpening(t, filepath.Join(dir, "wicket.db"))
			p.kill(t, false)
		case "stop":
			time.Sleep(between(0, 300*time.Millisecond))
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			time.Sleep(between(0, 30*time.Millisecond))
			p.kill(t, true)
		case "clean stop":
			time.Sleep(between(0, 300*time.Millisecond))
			close(stop)
			<-done
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			p.exited(t)
		}
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("the load did not end after the kernel did")
		}
		t.Logf("life %d %v: ended at %s, ready after %s; %d answers", life, flags(life), how, p.boot.Round(time.Millisecond), h.answers.Load()-before)
	}
	running = nil

	if _, err := os.Stat(filepath.Join(dir, "wicket.db-wal")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the log after a clean stop: %v", err)
	}
	if out, err := exec.Command(wicketBinary(t), "store", "check", "--data", dir).CombinedOutput(); err != nil {
		t.Fatalf("store check after the last life: %v\n%s", err, out)
	}
	p := startServe(t, dir, addr)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	h.verify(t, p)
	h.mu.Lock()
	t.Logf("%d executions created, %d completed, %d step completions, %d replays compared, %d grants: all there after the kills",
		len(h.created), len(h.done), len(h.stepRes), h.replays, len(h.granted))
	h.mu.Unlock()
}

// hookLedger is what the webhook agent, the creators and the approver
// were answered.
type hookLedger struct {
	mu       sync.Mutex
	created  map[string]string         // Idempotency-Key → execution
	inputs   map[string]map[string]any // Idempotency-Key → input sent
	stepRes  map[string]string         // execution/step → result whose completion was answered
	replayed map[string]string         // execution/step → result its first replay answered
	done     map[string]string         // execution → output whose completion was answered
	granted  map[string]string         // approval → execution
	replays  int                       // replays compared with an earlier answer
	errs     []string                  // unexpected answers

	answers atomic.Int64
	killAt  atomic.Int64
	kill    atomic.Pointer[func()]
}

func newHookLedger() *hookLedger {
	return &hookLedger{created: map[string]string{}, inputs: map[string]map[string]any{}, stepRes: map[string]string{},
		replayed: map[string]string{}, done: map[string]string{}, granted: map[string]string{}}
}

// armKill makes the n-th answer from now call kill (n < 0: none).
func (h *hookLedger) armKill(n int64, kill func()) {
	h.kill.Store(&kill)
	if n < 0 {
		h.killAt.Store(-1)
		return
	}
	h.killAt.Store(h.answers.Load() + n)
}

// answered counts an answer; the chosen one kills the kernel before the
// goroutine that read it sends anything else.
func (h *hookLedger) answered() {
	if h.answers.Add(1) == h.killAt.Load() {
		if k := h.kill.Load(); k != nil && *k != nil {
			(*k)()
		}
	}
}

func (h *hookLedger) unexpected(f string, a ...any) {
	h.mu.Lock()
	h.errs = append(h.errs, fmt.Sprintf(f, a...))
	h.mu.Unlock()
}

// run is the agent's handler: the execution's steps, then its
// completion. Whatever goes wrong (the kernel is killed) abandons the
// attempt: the lease runs out and the execution is delivered again,
// where the steps recorded replay.
func (h *hookLedger) run(ctx context.Context, r *testkit.Run) (any, error) {
	var in struct {
		Gated bool `json:"gated"`
		Steps int  `json:"steps"`
	}
	if err := json.Unmarshal(r.Input, &in); err != nil {
		h.unexpected("%s: input %s: %v", r.ExecutionID, r.Input, err)
		return nil, testkit.ErrAbandon
	}
	attempt := rand.Int64() // in every result: a result of another attempt is told apart
	for i := range in.Steps {
		target := "work"
		if in.Gated && i == 1 {
			target = "gated"
		}
		res, err := r.Step(ctx, "tool_call", target, map[string]any{"i": i}, testkit.StepOpts{Idempotency: "safe_to_retry"},
			func() (any, error) { return map[string]any{"x": r.ExecutionID, "i": i, "attempt": attempt}, nil })
		if err != nil {
			return nil, testkit.ErrAbandon // blocked on the approval, or the kernel went
		}
		d := r.Decisions[len(r.Decisions)-1]
		k := r.ExecutionID + "/" + d.StepID
		h.mu.Lock()
		switch d.Decision {
		case kernel.DecisionProceed:
			if old, ok := h.stepRes[k]; ok {
				h.errs = append(h.errs, fmt.Sprintf("%s: answered proceed after its completion (%s) was answered", k, old))
			}
			h.stepRes[k] = string(res)
		case kernel.DecisionReplay:
			want, ok := h.stepRes[k]
			if !ok {
				want, ok = h.replayed[k]
			}
			switch {
			case !ok:
				h.replayed[k] = string(res)
			case !sameJSON(res, want):
				h.errs = append(h.errs, fmt.Sprintf("%s: replay answered %s; earlier %s", k, res, want))
			default:
				h.replays++
			}
		}
		h.mu.Unlock()
		h.answered()
	}
	out := map[string]any{"done": r.ExecutionID}
	if err := r.Client().Do(ctx, "POST", "/v0/executions/"+r.ExecutionID+"/complete", &r.Lease, map[string]any{"output": out}, nil); err != nil {
		return nil, testkit.ErrAbandon
	}
	raw, _ := json.Marshal(out)
	h.mu.Lock()
	h.done[r.ExecutionID] = string(raw)
	h.mu.Unlock()
	h.answered()
	return nil, testkit.ErrAbandon // completed above
}

// create creates executions until stop or until the kernel goes.
func (h *hookLedger) create(url string, life, c int, stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		key := fmt.Sprintf("k-%d-%d-%d", life, c, i)
		in := map[string]any{"gated": i%4 == 0, "steps": 2 + i%4}
		var x kernel.Execution
		_, err := testkit.BearerWithHeaders(url, testkit.AdminKey, "POST", "/v0/executions", map[string]string{"Idempotency-Key": key},
			map[string]any{"agent_id": "hook", "input": in}, &x)
		if err != nil {
			var ae *testkit.APIError
			if errors.As(err, &ae) {
				h.unexpected("create %s: %v", key, err)
			}
			return
		}
		h.mu.Lock()
		h.created[key], h.inputs[key] = x.ID, in
		h.mu.Unlock()
		h.answered()
		time.Sleep(20 * time.Millisecond) // a pace the verification keeps up with
	}
}

// approve grants the pending approvals until stop or until the kernel
// goes.
func (h *hookLedger) approve(url string, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		var page struct {
			Approvals []kernel.Approval `json:"approvals"`
		}
		if _, err := testkit.Bearer(url, testkit.AdminKey, "GET", "/v0/approvals?status=pending", nil, &page); err != nil {
			return
		}
		for _, a := range page.Approvals {
			if _, err := testkit.Bearer(url, testkit.AdminKey, "POST", "/v0/approvals/"+a.ID+"/grant", map[string]any{}, nil); err != nil {
				var ae *testkit.APIError
				if !errors.As(err, &ae) {
					return // the kernel went
				}
				if ae.Status != http.StatusConflict {
					h.unexpected("grant %s: %v", a.ID, err)
				}
				continue
			}
			h.mu.Lock()
			h.granted[a.ID] = a.ExecutionID
			h.mu.Unlock()
			h.answered()
		}
		if len(page.Approvals) == 0 {
			time.Sleep(5 * time.Millisecond) // nothing pending: look again shortly
		}
	}
}

// verify checks that the kernel p has everything the ledger was
// answered, and nothing twice.
func (h *hookLedger) verify(t *testing.T, p *process) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	fatal := func(f string, a ...any) {
		t.Helper()
		t.Fatalf(f+"\nkernel log:\n%s", append(a, p.stderrString())...)
	}
	if len(h.errs) > 0 {
		fatal("unexpected answers: %s", strings.Join(h.errs, "\n"))
	}
	for key, id := range h.created {
		var x kernel.Execution
		st, err := testkit.BearerWithHeaders(p.url, testkit.AdminKey, "POST", "/v0/executions", map[string]string{"Idempotency-Key": key},
			map[string]any{"agent_id": "hook", "input": h.inputs[key]}, &x)
		if err != nil || st != http.StatusOK || x.ID != id {
			fatal("Idempotency-Key %s was answered %s; now %d %q %v", key, id, st, x.ID, err)
		}
	}
	for id, out := range h.done {
		var x kernel.Execution
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "GET", "/v0/executions/"+id, nil, &x); err != nil {
			fatal("%s: %v", id, err)
		}
		if x.Status != kernel.ExecCompleted || !sameJSON(x.Output, out) {
			fatal("%s: its completion with %s was answered; now %s %s", id, out, x.Status, x.Output)
		}
	}
	for k, res := range h.stepRes {
		x, id, _ := strings.Cut(k, "/")
		var s kernel.Step
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "GET", "/v0/executions/"+x+"/steps/"+id, nil, &s); err != nil {
			fatal("step %s: %v", k, err)
		}
		if s.Status != kernel.StepSucceeded || !sameJSON(s.Result, res) {
			fatal("step %s: its completion with %s was answered; now %s %s", k, res, s.Status, s.Result)
		}
	}
	for a, x := range h.granted {
		var got kernel.Approval
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "GET", "/v0/approvals/"+a, nil, &got); err != nil {
			fatal("approval %s of %s: %v", a, x, err)
		}
		if got.Status != kernel.ApprovalGranted {
			fatal("approval %s of %s: its grant was answered; now %s", a, x, got.Status)
		}
	}
	for _, x := range h.created {
		evs, err := testkit.AllEvents(p.url, testkit.AdminKey, x)
		if err != nil {
			fatal("%s: %v", x, err)
		}
		if err := testkit.CheckLog(evs); err != nil {
			fatal("%s: %v\n%v", x, err, testkit.Types(evs))
		}
		// A step is proposed, decided and executing again each time it
		// is let through (after its approval); its other events, once.
		seen := map[string]bool{}
		for _, ev := range evs {
			var pl struct {
				StepID string `json:"step_id"`
			}
			switch ev.Type {
			case "step.proposed", "step.decided", "step.executing", "step.delta":
				continue
			}
			if !strings.HasPrefix(string(ev.Type), "step.") || json.Unmarshal(ev.Payload, &pl) != nil {
				continue
			}
			k := pl.StepID + " " + string(ev.Type)
			if seen[k] {
				fatal("%s: seq %d: a second %s of step %s\n%v", x, ev.Seq, ev.Type, pl.StepID, testkit.Types(evs))
			}
			seen[k] = true
		}
	}
}
