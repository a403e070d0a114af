package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/canon"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/server/wire"
)

// submitVia submits a step for r's attempt to the replica at url, with
// the step id the agent claims (none when empty), and returns the status
// and the decision or the error code.
func submitVia(url string, r *testkit.Run, args any, claimed string) (int, kernel.StepDecision, string) {
	body, _ := json.Marshal(map[string]any{"kind": "tool_call", "target": "race", "args": args})
	req, _ := http.NewRequest("POST", url+"/v0/executions/"+r.ExecutionID+"/steps", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.HeaderAgentID, "racer")
	req.Header.Set(wire.HeaderDispatchID, r.Lease.DispatchID)
	req.Header.Set(wire.HeaderDispatchAttempt, strconv.Itoa(r.Lease.Attempt))
	if claimed != "" {
		req.Header.Set(wire.HeaderStepID, claimed)
	}
	wire.SignRequest(req, []byte(secret), body, time.Now())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, kernel.StepDecision{}, err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var d kernel.StepDecision
	var e struct{ Code string }
	_ = json.Unmarshal(data, &d)
	_ = json.Unmarshal(data, &e)
	return resp.StatusCode, d, e.Code
}

// TestReplicasRaceOnOneStep: three replicas on one database, and requests
// about one thing sent to all of them at once.
//
//   - The same call submitted nine times at once under one lease, three
//     times through each replica: nine occurrences, each recorded and
//     answered once (docs/identity.md: repeats in one attempt are new
//     occurrences).
//   - The same call sent nine times with the step id of its first
//     occurrence (Rebuno-Step-Id): one proceeds, the eight others are 409
//     step_id_divergence and record nothing.
//   - An approval granted and denied six times at once through the three
//     replicas: one decision wins (200), the others are 409, the log holds
//     one decision and the execution follows it.
func TestReplicasRaceOnOneStep(t *testing.T) {
	cfg := fast()
	cfg.LeaseTimeout, cfg.DispatchTimeout = 20*time.Second, 2*time.Second // no lease runs out here
	envs := replicas(t, 3, testkit.Options{Config: cfg, Engines: []plugins.Engine{rules.New()}})
	files := map[string]string{"bundle.yaml": "name: gates\nrevision: \"1\"\nengine: rules\n",
		"rules.yaml": "default_action: allow\nrules:\n  - id: gate\n    priority: 1\n    when: {target: deploy}\n    then: {decision: require_approval}\n"}
	if _, err := envs[0].Admin("PUT", "/v0/bundles/gates", map[string]any{"files": files}, nil); err != nil {
		t.Fatal(err)
	}
	const rounds, each = 3, 9
	type answer struct {
		status int
		d      kernel.StepDecision
		code   string
	}
	var mu sync.Mutex
	var plain, claimed [][]answer
	agent := testkit.NewAgent("racer", secret, envs[0].URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		var in struct{ Gate bool }
		_ = json.Unmarshal(r.Input, &in)
		if in.Gate {
			_, err := r.Step(ctx, "tool_call", "deploy", nil, testkit.StepOpts{}, func() (any, error) { return "deployed", nil })
			return "gated", err
		}
		at := func(round int, args any, claim string) []answer {
			out := make([]answer, each)
			var wg sync.WaitGroup
			for i := range each {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st, d, code := submitVia(envs[i%len(envs)].URL, r, args, claim)
					out[i] = answer{st, d, code}
				}()
			}
			wg.Wait()
			return out
		}
		for round := range rounds {
			p := at(round, map[string]int{"plain": round}, "")
			_, h, _ := canon.ArgsHash(fmt.Appendf(nil, `{"claimed":%d}`, round))
			c := at(round, map[string]int{"claimed": round}, canon.StepID(r.ExecutionID, "tool_call", "race", h, 0))
			mu.Lock()
			plain, claimed = append(plain, p), append(claimed, c)
			mu.Unlock()
		}
		return "ok", nil
	})
	defer agent.Close()
	envs[1].RegisterAgent(agent, "gates")
	eventually(t, 10*time.Second, "every replica has the bundle", func() (bool, string) {
		for _, env := range envs {
			res, err := env.Kernel.EvalPolicy(context.Background(), kernel.EvalRequest{Tenant: "default", AgentID: "racer", Kind: "tool_call", Target: "deploy"})
			if err != nil || res.Action != "require_approval" {
				return false, fmt.Sprint(err)
			}
		}
		return true, ""
	})

	id := envs[2].CreateExecution("racer", nil)
	if x := envs[0].WaitTerminal(id, 60*time.Second); x.Status != kernel.ExecCompleted {
		t.Fatalf("execution: %s (%s)", x.Status, x.Error)
	}
	evs := mustCheckLog(t, envs[1], id)
	for round := range rounds {
		occ := map[int]string{}
		for _, a := range plain[round] {
			if a.status != 200 || a.d.Decision != kernel.DecisionProceed {
				t.Errorf("round %d: a repeat answered %d %s %s, want proceed", round, a.status, a.d.Decision, a.code)
				continue
			}
			if prev, dup := occ[a.d.Occurrence]; dup {
				t.Errorf("round %d: occurrence %d answered twice (%s, %s)", round, a.d.Occurrence, prev, a.d.StepID)
			}
			occ[a.d.Occurrence] = a.d.StepID
		}
		for o := range each {
			if _, ok := occ[o]; !ok {
				t.Errorf("round %d: occurrence %d never answered (%v)", round, o, occ)
			}
		}
		proceeded := 0
		for _, a := range claimed[round] {
			switch {
			case a.status == 200 && a.d.Decision == kernel.DecisionProceed && a.d.Occurrence == 0:
				proceeded++
			case a.status == 409 && a.code == kernel.CodeStepIDDivergence:
			default:
				t.Errorf("round %d: a claimed repeat answered %d %s %s", round, a.status, a.d.Decision, a.code)
			}
		}
		if proceeded != 1 {
			t.Errorf("round %d: %d of the claimed repeats proceeded, want 1", round, proceeded)
		}
	}
	if got, want := countTarget(evs, kernel.EvStepProposed, "race"), rounds*(each+1); got != want {
		t.Errorf("%d steps proposed, want %d", got, want)
	}

	// Grant and deny at once through every replica.
	for round := range 3 {
		gated := envs[round].CreateExecution("racer", map[string]bool{"gate": true})
		var ap kernel.Approval
		eventually(t, 20*time.Second, "the approval is requested", func() (bool, string) {
			var list struct{ Approvals []kernel.Approval }
			if _, err := envs[1].Admin("GET", "/v0/approvals?status=pending", nil, &list); err != nil {
				return false, err.Error()
			}
			for _, p := range list.Approvals {
				if p.ExecutionID == gated {
					ap = p
					return true, ""
				}
			}
			return false, ""
		})
		verbs := []string{"grant", "deny", "grant", "deny", "grant", "deny"}
		status := make([]int, len(verbs))
		var wg sync.WaitGroup
		for i, verb := range verbs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status[i], _ = envs[i%len(envs)].Admin("POST", "/v0/approvals/"+ap.ID+"/"+verb, map[string]any{"rationale": fmt.Sprint("reviewer ", i)}, nil)
			}()
		}
		wg.Wait()
		winner := ""
		for i, st := range status {
			switch st {
			case 200:
				if winner != "" {
					t.Errorf("approval %s: both %s and %s answered 200", ap.ID, winner, verbs[i])
				}
				winner = verbs[i]
			case 409:
			default:
				t.Errorf("approval %s: %s answered %d", ap.ID, verbs[i], st)
			}
		}
		want := map[string]kernel.ExecStatus{"grant": kernel.ExecCompleted, "deny": kernel.ExecFailed}[winner]
		if x := envs[2].WaitTerminal(gated, 30*time.Second); x.Status != want {
			t.Errorf("approval %s: %s won, the execution is %s", ap.ID, winner, x.Status)
		}
		evs := mustCheckLog(t, envs[0], gated)
		decisions := 0
		for _, ev := range evs {
			if ev.Type == kernel.EvApprovalGranted || ev.Type == kernel.EvApprovalDenied {
				decisions++
			}
		}
		if decisions != 1 {
			t.Errorf("approval %s: %d decisions in the log, want 1", ap.ID, decisions)
		}
	}
	if errs := agent.Errors(); len(errs) > 0 {
		t.Errorf("agent errors: %v", errs)
	}
}
