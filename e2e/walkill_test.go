package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/sdk/agent"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// TestKillAtRandomInstants runs a real `wicket serve` on one data
// directory through several lives, each ended by a SIGKILL at a random
// instant: under load (sessions of the Go SDK submitting and completing
// steps as fast as they can), during the start (the recovery of the
// previous life's log included), during a graceful stop (SIGTERM, then
// SIGKILL a moment later: the file's sync and the log's removal), or
// after the next life's kernel was started and waits for the dying one's
// lock (a supervisor's overlapping restart). Some lives run with
// --no-wal, so a log left by a killed life is applied by a kernel without
// one, and the next life's log starts over a file written with bbolt's
// own fsyncs. After every restart, every step any life was
// answered proceed for is recorded (executing or done), every step whose
// completion was answered is succeeded with the result sent, no execution
// has a step nobody submitted (one per session at most: a submission the
// kill cut off after its commit), a step's result is one that was sent,
// and no event is recorded twice (each step has at most one event of each
// type, and testkit.CheckLog holds). The last life stops cleanly: the log
// is gone and `wicket store check` passes.
//
// WICKET_KILL_SEED replays a run's draw of kill instants (the seed is
// logged); WICKET_KILL_LIVES sets the number of lives (default 8).
func TestKillAtRandomInstants(t *testing.T) {
	rng, lives := killDraw(t, 0)
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }

	dir, addr := t.TempDir(), freeAddr(t)
	ctx := context.Background()
	admin := client.New("http://"+addr, client.WithAPIKey(testkit.AdminKey))
	l := &ledger{proceeded: map[string]map[string]string{}, completed: map[string]bool{}, perLife: map[int]int{}}

	var running *process
	t.Cleanup(func() {
		if running != nil {
			_ = running.cmd.Process.Kill()
			_ = running.cmd.Wait()
		}
	})
	// Each life's end, and whether it runs without a log. The kill
	// instants are random; the order makes sure each kind comes, and
	// after the one it needs: a start killed while it applies a log, a
	// log applied by a kernel without one, an overlapping restart whose
	// kernel waits for the lock of a dying one with a log, and without.
	type lifeKind struct {
		how   string
		noWAL bool
	}
	schedule := []lifeKind{{"load", false}, {"start", false}, {"restart", false}, {"load", true},
		{"restart", false}, {"stop", false}, {"load", true}}
	kind := func(life int) lifeKind {
		if life == lives-1 {
			return lifeKind{"clean stop", false}
		}
		if life < len(schedule) {
			return schedule[life]
		}
		return schedule[1+(life-1)%(len(schedule)-1)]
	}
	spawn := func(life int) (*process, string) {
		var extra []string
		if kind(life).noWAL {
			extra = append(extra, "--no-wal")
		}
		return spawnServe(t, dir, addr, extra...)
	}
	var next *process // the next life's, started before this one died
	var nextReady string
	lastBoot, completions := time.Duration(0), 0
	for life := range lives {
		how, noWAL := kind(life).how, kind(life).noWAL
		p, ready := next, nextReady
		if p == nil {
			p, ready = spawn(life)
		}
		next = nil
		running = p
		if how == "start" {
			// A random instant of the start, whose recovery applies the
			// log the last life left: nothing is answered in this life.
			time.Sleep(between(0, lastBoot))
			p.kill(t, false)
			t.Logf("life %d (no-wal %v): killed during its start", life, noWAL)
			continue
		}
		p.awaitReady(t, ready)
		lastBoot = p.boot
		l.verify(t, ctx, admin, p)
		if life == 0 {
			if _, err := admin.PutAgent(ctx, wire.AgentRequest{ID: "killed", Secret: "killed-secret-0123456789"}); err != nil {
				t.Fatal(err)
			}
		}

		stop, done := make(chan struct{}), make(chan struct{})
		var wg sync.WaitGroup
		const sessions = 6
		counts := make([]int, sessions)
		for w := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				counts[w] = l.load(p.url, life, w, stop)
			}()
		}
		go func() { wg.Wait(); close(done) }()
		// The kill comes at a random instant once the load runs: after
		// the life's first completion was answered.
		deadline := time.Now().Add(60 * time.Second)
		for l.answered(life) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("life %d: no completion answered; kernel log:\n%s", life, p.stderrString())
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(between(0, 400*time.Millisecond))
		switch how {
		case "load":
			p.kill(t, false)
		case "restart":
			// A supervisor restarts the kernel while the old process is
			// still being killed: the new one finds the file locked (no
			// log to apply yet) and waits for the lock, which the old
			// one gives up by dying, its log left.
			next, nextReady = spawn(life + 1)
			next.waitOpening(t, filepath.Join(dir, "wicket.db"))
			p.kill(t, false)
		case "stop", "clean stop":
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if how == "stop" {
				time.Sleep(between(0, 30*time.Millisecond))
				p.kill(t, true)
			} else {
				close(stop)
				p.exited(t)
			}
		}
		if how != "clean stop" {
			// A session's completion may outlive its kernel (the SDK
			// tries it again, within the lease, and the next life may
			// answer it); its loop stops after that.
			close(stop)
		}
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("the sessions did not end after the kernel did")
		}
		n := 0
		for _, c := range counts {
			n += c
		}
		completions += n
		t.Logf("life %d (no-wal %v): ended at %s, ready after %s; %d completions answered", life, noWAL, how, p.boot.Round(time.Millisecond), n)
		if e := l.failure(); e != nil {
			t.Fatalf("life %d: %v", life, e)
		}
	}
	running = nil

	// The last life stopped cleanly: one file, which checks out.
	if _, err := os.Stat(filepath.Join(dir, "wicket.db-wal")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the log after a clean stop: %v", err)
	}
	if out, err := exec.Command(wicketBinary(t), "store", "check", "--data", dir).CombinedOutput(); err != nil {
		t.Fatalf("store check after the last life: %v\n%s", err, out)
	}
	p := startServe(t, dir, addr)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	l.verify(t, ctx, admin, p)
	t.Logf("%d executions, %d completions answered, all there after the kills", len(l.proceeded), completions)
}

// ledger is what the sessions were answered.
type ledger struct {
	mu sync.Mutex
	// proceeded maps execution → step answered proceed → the result its
	// completion sends.
	proceeded map[string]map[string]string
	// completed holds the steps (execution/step) whose completion was
	// answered.
	completed map[string]bool
	perLife   map[int]int // completions answered, by life
	err       error       // the first unexpected answer
}

// answered returns how many completions were answered in life.
func (l *ledger) answered(life int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.perLife[life]
}

func (l *ledger) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// load runs one session until the kernel goes (or stop is closed) and
// returns how many completions were answered.
func (l *ledger) load(url string, life, w int, stop <-chan struct{}) int {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := agent.Begin(ctx, agent.SessionConfig{KernelURL: url, APIKey: testkit.AdminKey, HeartbeatInterval: 250 * time.Millisecond, Logger: quiet},
		client.SessionRequest{AgentID: "killed", Input: json.RawMessage(fmt.Sprintf(`{"life":%d,"session":%d}`, life, w))})
	if err != nil {
		return 0 // the kernel went first
	}
	defer s.Close()
	x := s.Execution()
	l.mu.Lock()
	l.proceeded[x.ID] = map[string]string{}
	l.mu.Unlock()
	n := 0
	for i := 0; ; i++ {
		select {
		case <-stop:
			return n
		default:
		}
		d, err := x.Submit(ctx, wire.StepSubmitRequest{Kind: "tool_call", Target: "work", Idempotency: "safe_to_retry",
			Args: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		if err != nil {
			return n
		}
		res := fmt.Sprintf(`{"life":%d,"session":%d,"i":%d}`, life, w, i)
		l.mu.Lock()
		if d.Decision != wire.DecisionProceed {
			if l.err == nil {
				l.err = fmt.Errorf("step %d of %s: %s (%s), want proceed", i, x.ID, d.Decision, d.Reason)
			}
			l.mu.Unlock()
			return n
		}
		l.proceeded[x.ID][d.StepID] = res
		l.mu.Unlock()
		if err := x.Complete(ctx, d.StepID, json.RawMessage(res), nil); err != nil {
			return n
		}
		l.mu.Lock()
		l.completed[x.ID+"/"+d.StepID] = true
		l.perLife[life]++
		l.mu.Unlock()
		n++
	}
}

// verify checks that the kernel p has every step the ledger holds, as
// answered, and nothing twice.
func (l *ledger) verify(t *testing.T, ctx context.Context, admin *client.Client, p *process) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for x, answered := range l.proceeded {
		steps, err := admin.Steps(ctx, x)
		if err != nil {
			t.Fatalf("execution %s, which a session began, after the restart: %v\n%s", x, err, p.stderrString())
		}
		recorded := map[string]wire.Step{}
		for _, s := range steps {
			if _, dup := recorded[s.ID]; dup {
				t.Errorf("%s: step %s listed twice", x, s.ID)
			}
			recorded[s.ID] = s
		}
		for id, res := range answered {
			s, ok := recorded[id]
			switch {
			case !ok:
				t.Errorf("%s: step %s was answered proceed and is gone", x, id)
			case l.completed[x+"/"+id] && (s.Status != "succeeded" || !sameJSON(s.Result, res)):
				t.Errorf("%s: step %s was answered complete (%s); now %s %s", x, id, res, s.Status, s.Result)
			case s.Status == "succeeded" && !sameJSON(s.Result, res):
				t.Errorf("%s: step %s succeeded with %s; the result sent was %s", x, id, s.Result, res)
			}
		}
		// A session submits one step at a time: the kill can cut off
		// the answer of one submission, after its commit.
		if extra := len(recorded) - len(answered); extra < 0 || extra > 1 {
			t.Errorf("%s: %d steps recorded, %d answered proceed", x, len(recorded), len(answered))
		}
		for _, s := range recorded {
			if _, ok := answered[s.ID]; !ok && s.Status == "succeeded" {
				t.Errorf("%s: step %s, never answered proceed, succeeded: %s", x, s.ID, s.Result)
			}
		}
		evs, err := testkit.AllEvents(p.url, testkit.AdminKey, x)
		if err != nil {
			t.Fatal(err)
		}
		if err := testkit.CheckLog(evs); err != nil {
			t.Errorf("%s: %v\n%v", x, err, testkit.Types(evs))
		}
		seen := map[string]bool{}
		for _, ev := range evs {
			var pl struct {
				StepID string `json:"step_id"`
			}
			if !strings.HasPrefix(string(ev.Type), "step.") || json.Unmarshal(ev.Payload, &pl) != nil {
				continue
			}
			k := pl.StepID + " " + string(ev.Type)
			if seen[k] {
				t.Errorf("%s: seq %d: a second %s of step %s", x, ev.Seq, ev.Type, pl.StepID)
			}
			seen[k] = true
		}
		if t.Failed() {
			t.Fatalf("%s: events %v\nkernel log:\n%s", x, testkit.Types(evs), p.stderrString())
		}
	}
}

// sameJSON reports whether a and b are the same JSON value (the kernel
// stores a result canonicalised: its keys sorted).
func sameJSON(a json.RawMessage, b string) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

// kill SIGKILLs p and waits for it. It must die of the kill (or, when
// stopping is set, of the SIGTERM sent before it: a clean exit), not
// earlier of its own accord.
func (p *process) kill(t *testing.T, stopping bool) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() && ws.Signal() == syscall.SIGKILL || stopping && ws.Exited() && ws.ExitStatus() == 0 {
		return
	}
	t.Fatalf("the kernel ended %v before the kill; its log:\n%s", p.cmd.ProcessState, p.stderrString())
}

// waitOpening waits until p has its store file open for writing: bbolt's
// Open, past the look at the log, waiting for the lock. (Without /proc it
// returns at once.)
func (p *process) waitOpening(t *testing.T, path string) {
	t.Helper()
	fds := fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ents, err := os.ReadDir(fds)
		if err != nil {
			return // no /proc: the kill may come before the new Open
		}
		for _, e := range ents {
			if target, err := os.Readlink(filepath.Join(fds, e.Name())); err != nil || target != path {
				continue
			}
			info, err := os.ReadFile(filepath.Join(fds, "..", "fdinfo", e.Name()))
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(info), "\n") {
				if v, ok := strings.CutPrefix(line, "flags:"); ok {
					if flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64); err == nil && flags&uint64(os.O_RDWR|os.O_WRONLY) == uint64(os.O_RDWR) {
						return
					}
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new kernel never opened %s; its log:\n%s", path, p.stderrString())
		}
		time.Sleep(time.Millisecond)
	}
}

// exited waits for p, stopped by SIGTERM, to exit cleanly.
func (p *process) exited(t *testing.T) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- p.cmd.Wait() }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("clean stop: %v; log:\n%s", err, p.stderrString())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the kernel did not stop after SIGTERM; log:\n%s", p.stderrString())
	}
}

// killDraw is a kill test's random draw and number of lives:
// WICKET_KILL_SEED replays a run's draw (the seed is logged; stream keeps
// each test's draws its own), WICKET_KILL_LIVES sets the lives (default 8).
func killDraw(t *testing.T, stream uint64) (rng *rand.Rand, lives int) {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("WICKET_KILL_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("WICKET_KILL_SEED: %v", err)
		}
	}
	lives = 8
	if s := os.Getenv("WICKET_KILL_LIVES"); s != "" {
		var err error
		if lives, err = strconv.Atoi(s); err != nil || lives < 2 {
			t.Fatalf("WICKET_KILL_LIVES=%q: want a number, 2 at least", s)
		}
	}
	t.Logf("WICKET_KILL_SEED=%d WICKET_KILL_LIVES=%d", seed, lives)
	return rand.New(rand.NewPCG(seed, stream)), lives
}
