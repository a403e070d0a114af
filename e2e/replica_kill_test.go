package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
	"github.com/wicket-run/wicket/store/postgres"
	"github.com/wicket-run/wicket/store/postgres/pgtest"
)

// ackLedger is what the agent was told: the steps whose completion the
// kernel acknowledged, and how often each effect ran.
type ackLedger struct {
	mu    sync.Mutex
	acked map[string]json.RawMessage // execution/step id → result
	ran   map[string]int             // execution/step id → runs of the effect
	after []string                   // effects that ran again after their completion was acknowledged
	hooks []kernel.Lease             // every (dispatch, attempt) a webhook delivered
}

// TestReplicaKilled: three `wicket serve` processes on one PostgreSQL
// database behind one balancer; agents run many executions through it; one
// replica is SIGKILLed mid-run. Every step whose completion was
// acknowledged is recorded with its result, none is recorded twice, no
// acknowledged effect runs again, every execution completes, no dispatch
// attempt is claimed or delivered twice, and approvals granted through one
// replica resume executions whose approval was requested under a dispatch
// another replica claimed.
func TestReplicaKilled(t *testing.T) {
	_, dsn := pgtest.Schema(t)
	procs := make([]*process, 3)
	urls := make([]string, 3)
	for i := range procs {
		procs[i] = startServe(t, t.TempDir(), freeAddr(t), "--store", dsn, "--replica", fmt.Sprintf("r%d", i),
			"--lease-timeout", "2s", "--dispatch-timeout", "500ms")
		urls[i] = procs[i].url
		p := procs[i]
		defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	}
	lb := newBalancer(t, urls...)
	admin := func(replica int, method, path string, body, out any) error {
		_, err := testkit.Bearer(urls[replica], testkit.AdminKey, method, path, body, out)
		return err
	}

	const steps = 12
	led := &ackLedger{acked: map[string]json.RawMessage{}, ran: map[string]int{}}
	agent := testkit.NewAgent("worker", secret, lb.URL(), func(ctx context.Context, r *testkit.Run) (any, error) {
		led.mu.Lock()
		led.hooks = append(led.hooks, r.Lease)
		led.mu.Unlock()
		var in struct{ Gate bool }
		_ = json.Unmarshal(r.Input, &in)
		for i := range steps {
			target := "work"
			if in.Gate && i == steps/2 {
				target = "deploy" // requires an approval
			}
			res, err := r.Step(ctx, "tool_call", target, map[string]int{"i": i}, testkit.StepOpts{Idempotency: "safe_to_retry"}, func() (any, error) {
				key := r.ExecutionID + "/" + r.Decisions[len(r.Decisions)-1].StepID
				led.mu.Lock()
				defer led.mu.Unlock()
				led.ran[key]++
				if _, done := led.acked[key]; done {
					led.after = append(led.after, key)
				}
				time.Sleep(3 * time.Millisecond)
				return i * i, nil
			})
			var ae *testkit.APIError
			switch {
			case err == nil:
			case errors.As(err, &ae) && ae.Status >= 500:
				// The replica died under the request (or the database
				// refused it): this attempt ends, the lease runs out, and
				// the dispatch comes again through a live replica.
				return nil, testkit.ErrAbandon
			default:
				return nil, err
			}
			d := r.Decisions[len(r.Decisions)-1]
			if d.Decision == kernel.DecisionProceed {
				led.mu.Lock()
				led.acked[r.ExecutionID+"/"+d.StepID] = res
				led.mu.Unlock()
			}
		}
		return "finished", nil
	})
	agent.HeartbeatEvery = 300 * time.Millisecond
	defer agent.Close()
	files := map[string]string{"bundle.yaml": "name: gates\nrevision: \"1\"\nengine: rules\n",
		"rules.yaml": "default_action: allow\nrules:\n  - id: gate\n    priority: 1\n    when: {target: deploy}\n    then: {decision: require_approval}\n"}
	if err := admin(0, "PUT", "/v0/bundles/gates", map[string]any{"files": files}, nil); err != nil {
		t.Fatal(err)
	}
	if err := admin(1, "POST", "/v0/agents", map[string]any{"id": "worker", "webhook_url": agent.WebhookURL(), "secret": secret, "policy": "gates"}, nil); err != nil {
		t.Fatal(err)
	}
	// Every replica decides with the bundle before the executions start.
	for i := range urls {
		eventually(t, 15*time.Second, fmt.Sprintf("replica %d loads the bundle", i), func() (bool, string) {
			var res wire.PolicyEvalResponse
			err := admin(i, "POST", "/v0/policy/eval", map[string]any{"agent_id": "worker", "step": map[string]any{"kind": "tool_call", "target": "deploy"}}, &res)
			return err == nil && res.Action == "require_approval", fmt.Sprintf("%+v %v", res, err)
		})
	}

	const n, gated = 24, 6
	ids := make([]string, n)
	for i := range ids {
		var x kernel.Execution
		if _, err := testkit.Bearer(lb.URL(), testkit.AdminKey, "POST", "/v0/executions", map[string]any{"agent_id": "worker", "input": map[string]bool{"gate": i < gated}}, &x); err != nil {
			t.Fatal(err)
		}
		ids[i] = x.ID
	}
	// Kill replica 1 once a quarter of the steps are acknowledged.
	eventually(t, 60*time.Second, "a quarter of the steps acknowledged", func() (bool, string) {
		led.mu.Lock()
		defer led.mu.Unlock()
		return len(led.acked) >= n*steps/4, fmt.Sprint(len(led.acked))
	})
	if err := procs[1].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = procs[1].cmd.Wait()
	alive := []int{0, 2}

	// Grant each pending approval through a live replica other than the
	// one that claimed the dispatch under which it was requested.
	granted := map[string]bool{}
	eventually(t, 90*time.Second, "every gated execution's approval granted", func() (bool, string) {
		var list struct{ Approvals []kernel.Approval }
		if err := admin(0, "GET", "/v0/approvals?status=pending", nil, &list); err != nil {
			return false, err.Error()
		}
		for _, ap := range list.Approvals {
			owner := claimerBefore(t, urls[0], ap.ExecutionID, kernel.EvStepAwaitingApproval)
			via := alive[0]
			if owner == "r0" {
				via = alive[1]
			}
			if err := admin(via, "POST", "/v0/approvals/"+ap.ID+"/grant", map[string]any{"by": "alice"}, nil); err != nil {
				return false, err.Error()
			}
			if fmt.Sprintf("r%d", via) == owner {
				t.Errorf("approval %s granted through its own replica %s", ap.ID, owner)
			}
			granted[ap.ExecutionID] = true
		}
		return len(granted) == gated, fmt.Sprintf("%d granted", len(granted))
	})

	for _, id := range ids {
		var x kernel.Execution
		eventually(t, 120*time.Second, "execution "+id+" completes", func() (bool, string) {
			if _, err := testkit.Bearer(urls[alive[0]], testkit.AdminKey, "GET", "/v0/executions/"+id, nil, &x); err != nil {
				return false, err.Error()
			}
			return x.Status.Terminal(), string(x.Status)
		})
		if x.Status != kernel.ExecCompleted {
			t.Errorf("execution %s: %s (%s)", id, x.Status, x.Error)
		}
		evs, err := testkit.AllEvents(urls[alive[1]], testkit.AdminKey, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := testkit.CheckLog(evs); err != nil {
			t.Errorf("execution %s: %v", id, err)
		}
		checkClaims(t, id, evs)
	}

	// Every acknowledged step is recorded, with its result.
	led.mu.Lock()
	defer led.mu.Unlock()
	for key, res := range led.acked {
		exec, step, _ := strings.Cut(key, "/")
		var s kernel.Step
		if _, err := testkit.Bearer(urls[alive[0]], testkit.AdminKey, "GET", "/v0/executions/"+exec+"/steps/"+step, nil, &s); err != nil {
			t.Errorf("acknowledged step %s: %v", key, err)
			continue
		}
		if s.Status != kernel.StepSucceeded || string(s.Result) != string(res) {
			t.Errorf("acknowledged step %s: %s %s, want succeeded %s", key, s.Status, s.Result, res)
		}
	}
	if len(led.after) > 0 {
		t.Errorf("effects ran again after their completion was acknowledged: %v", led.after)
	}
	// No attempt was delivered twice.
	slices.SortFunc(led.hooks, func(a, b kernel.Lease) int {
		if a.DispatchID != b.DispatchID {
			if a.DispatchID < b.DispatchID {
				return -1
			}
			return 1
		}
		return a.Attempt - b.Attempt
	})
	for i := 1; i < len(led.hooks); i++ {
		if led.hooks[i] == led.hooks[i-1] {
			t.Errorf("dispatch %s attempt %d delivered twice", led.hooks[i].DispatchID, led.hooks[i].Attempt)
		}
	}
	// The database passes its checker: no step has two outcomes, every log
	// runs from 1 to LastSeq.
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Check(context.Background()); err != nil {
		t.Error(err)
	}
	t.Logf("%d steps acknowledged, %d webhooks, requests per replica: %d %d %d",
		len(led.acked), len(led.hooks), lb.served[0].Load(), lb.served[1].Load(), lb.served[2].Load())
}

// claimerBefore returns the replica that claimed the dispatch attempt in
// force when the first event of type typ was written.
func claimerBefore(t *testing.T, url, id string, typ kernel.EventType) string {
	t.Helper()
	evs, err := testkit.AllEvents(url, testkit.AdminKey, id)
	if err != nil {
		t.Fatal(err)
	}
	owner := ""
	for _, ev := range evs {
		if ev.Type == kernel.EvDispatchClaimed {
			var p struct {
				Replica string `json:"replica"`
			}
			_ = json.Unmarshal(ev.Payload, &p)
			owner = p.Replica
		}
		if ev.Type == typ {
			return owner
		}
	}
	return owner
}
