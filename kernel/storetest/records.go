package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// testNotFound: lookups on an empty store, in a View and in an Update.
func testNotFound(t *testing.T, s kernel.Store) {
	id := execID(1)
	lookups := []struct {
		name string
		fn   func(tx kernel.ReadTx) error
	}{
		{"Execution", func(tx kernel.ReadTx) error { _, err := tx.Execution("t", id); return err }},
		{"ExecutionTenant", func(tx kernel.ReadTx) error { _, err := tx.ExecutionTenant(id); return err }},
		{"ExecutionByIdempotencyKey", func(tx kernel.ReadTx) error { _, err := tx.ExecutionByIdempotencyKey("t", "k"); return err }},
		{"Step", func(tx kernel.ReadTx) error { _, err := tx.Step("t", id, "s1"); return err }},
		{"Agent", func(tx kernel.ReadTx) error { _, err := tx.Agent("t", "a"); return err }},
		{"Approval", func(tx kernel.ReadTx) error { _, err := tx.Approval("t", "ap"); return err }},
		{"Bundle", func(tx kernel.ReadTx) error { _, err := tx.Bundle("t", "b"); return err }},
		{"Tenant", func(tx kernel.ReadTx) error { _, err := tx.Tenant("t"); return err }},
		{"APIKeyByHash", func(tx kernel.ReadTx) error { _, err := tx.APIKeyByHash("abc"); return err }},
	}
	empties := []struct {
		name string
		fn   func(tx kernel.ReadTx) (int, error)
	}{
		{"ListExecutions", func(tx kernel.ReadTx) (int, error) {
			l, err := tx.ListExecutions("t", kernel.ExecutionFilter{})
			return len(l), err
		}},
		{"ListSteps", func(tx kernel.ReadTx) (int, error) { l, err := tx.ListSteps("t", id); return len(l), err }},
		{"Events", func(tx kernel.ReadTx) (int, error) { l, err := tx.Events("t", id, 0, 0); return len(l), err }},
		{"ListAgents", func(tx kernel.ReadTx) (int, error) { l, err := tx.ListAgents("t"); return len(l), err }},
		{"DueDispatches", func(tx kernel.ReadTx) (int, error) { l, err := tx.DueDispatches(at(time.Hour), 0); return len(l), err }},
		{"ExpiredLeases", func(tx kernel.ReadTx) (int, error) { l, err := tx.ExpiredLeases(at(time.Hour), 0); return len(l), err }},
		{"ListApprovals", func(tx kernel.ReadTx) (int, error) { l, err := tx.ListApprovals("t", ""); return len(l), err }},
		{"ExpiredApprovals", func(tx kernel.ReadTx) (int, error) {
			l, err := tx.ExpiredApprovals(at(time.Hour), 0)
			return len(l), err
		}},
		{"ListBundles", func(tx kernel.ReadTx) (int, error) { l, err := tx.ListBundles(""); return len(l), err }},
		{"ListTenants", func(tx kernel.ReadTx) (int, error) { l, err := tx.ListTenants(); return len(l), err }},
		{"ListAPIKeys", func(tx kernel.ReadTx) (int, error) { l, err := tx.ListAPIKeys("t"); return len(l), err }},
		{"Counter", func(tx kernel.ReadTx) (int, error) {
			v, err := tx.Counter("t", "c")
			if v != nil {
				return 1, err
			}
			return 0, err
		}},
		{"Occurrence", func(tx kernel.ReadTx) (int, error) {
			o, err := tx.Occurrence("t", id, "k")
			if o != (kernel.Occurrence{}) {
				return 1, err
			}
			return 0, err
		}},
		{"NextDue", func(tx kernel.ReadTx) (int, error) {
			_, ok, err := tx.NextDue()
			if ok {
				return 1, err
			}
			return 0, err
		}},
	}
	check := func(t *testing.T, tx kernel.ReadTx) {
		for _, l := range lookups {
			wantNotFound(t, l.name, l.fn(tx))
		}
		for _, e := range empties {
			n, err := e.fn(tx)
			if err != nil || n != 0 {
				t.Errorf("%s on an empty store: %d results, error %v; want none, nil", e.name, n, err)
			}
		}
	}
	t.Run("View", func(t *testing.T) {
		view(t, s, func(tx kernel.ReadTx) error { check(t, tx); return nil })
	})
	t.Run("Update", func(t *testing.T) {
		update(t, s, func(tx kernel.Tx) error { check(t, tx); return nil })
	})
	t.Run("Delete", func(t *testing.T) {
		update(t, s, func(tx kernel.Tx) error {
			wantNotFound(t, "DeleteAgent", tx.DeleteAgent("t", "a"))
			wantNotFound(t, "DeleteBundle", tx.DeleteBundle("t", "b"))
			wantNotFound(t, "DeleteAPIKey", tx.DeleteAPIKey("t", "k"))
			return nil
		})
	})
}

// fullExecution has every field set.
func fullExecution(tenant, id string) *kernel.Execution {
	e := newExecution(tenant, id)
	deadline := at(time.Hour)
	e.AgentVersion = "v3"
	e.Status = kernel.ExecRunning
	e.Input = json.RawMessage(`{"q":"<b>hello</b> & more","n":[1,2.50,3e10]}`)
	e.Output = json.RawMessage(`{"answer":42}`)
	e.Error = json.RawMessage(`{"code":"x"}`)
	e.Reason = "because"
	e.Labels = map[string]string{"team": "search", "env": "prod"}
	e.Limits = kernel.Limits{MaxSteps: 10, MaxLLMCalls: 5, MaxTotalTokens: 1000, MaxCostUSD: 1.25, MaxDuration: "1h"}
	e.Totals.Steps = 3
	e.Totals.LLMCalls = 1
	e.Totals.Tokens = 120
	e.Totals.CostUSD = 0.0125
	e.Deadline = &deadline
	e.IdempotencyKey = "idem-1"
	e.UpdatedAt = at(time.Second)
	e.Lease = kernel.Lease{DispatchID: "d-1", Attempt: 2}
	e.Dispatch = kernel.DispatchState{ID: "d-1", Attempt: 2, State: kernel.DispatchAcked, LeaseUntil: at(90 * time.Second), Failures: 1}
	e.BlockedOn = "ap-1"
	e.Holder = &kernel.Holder{KeyID: "key_7", Principal: "ide-bot"}
	return e
}

func testExecutionRoundTrip(t *testing.T, s kernel.Store) {
	e := fullExecution("t", execID(1))
	e.LastSeq = 1
	update(t, s, func(tx kernel.Tx) error {
		if err := create(tx, e); err != nil {
			return fmt.Errorf("create: %w", err)
		}
		got, err := tx.Execution("t", e.ID)
		if err != nil {
			return fmt.Errorf("tx.Execution in the writing tx: %w", err)
		}
		sameJSON(t, "Execution in the writing tx", got, e)
		return nil
	})
	view(t, s, func(tx kernel.ReadTx) error {
		got, err := tx.Execution("t", e.ID)
		if err != nil {
			return fmt.Errorf("tx.Execution: %w", err)
		}
		sameJSON(t, "Execution", got, e)
		owner, err := tx.ExecutionTenant(e.ID)
		if err != nil {
			return fmt.Errorf("ExecutionTenant: %w", err)
		}
		if owner != "t" {
			t.Errorf("ExecutionTenant = %q, want t", owner)
		}
		return nil
	})
	// Overwrite.
	e2 := *e
	e2.Status = kernel.ExecCompleted
	e2.Output = json.RawMessage(`{"answer":43}`)
	e2.Dispatch = kernel.DispatchState{ID: "d-1", Attempt: 2}
	update(t, s, func(tx kernel.Tx) error {
		c := e2
		return tx.PutExecution(&c)
	})
	view(t, s, func(tx kernel.ReadTx) error {
		got, err := tx.Execution("t", e.ID)
		if err != nil {
			return fmt.Errorf("tx.Execution after overwrite: %w", err)
		}
		sameJSON(t, "Execution after overwrite", got, &e2)
		// Records returned are copies: changing one changes nothing stored.
		got.Status = kernel.ExecFailed
		again, err := tx.Execution("t", e.ID)
		if err != nil {
			return fmt.Errorf("tx.Execution again: %w", err)
		}
		if again.Status != kernel.ExecCompleted {
			t.Errorf("changing a returned record changed the store: status %q", again.Status)
		}
		return nil
	})
}

func testExecutionOwnership(t *testing.T, s kernel.Store) {
	e := newExecution("t", execID(1))
	mustCreate(t, s, e)
	update(t, s, func(tx kernel.Tx) error {
		other := newExecution("u", e.ID)
		other.LastSeq = 1
		wantConflict(t, "PutExecution of t's id in tenant u", tx.PutExecution(other))
		return nil
	})
	view(t, s, func(tx kernel.ReadTx) error {
		owner, err := tx.ExecutionTenant(e.ID)
		if err != nil {
			return fmt.Errorf("ExecutionTenant: %w", err)
		}
		if owner != "t" {
			t.Errorf("ExecutionTenant = %q, want t", owner)
		}
		_, err = tx.Execution("u", e.ID)
		wantNotFound(t, "Execution in tenant u", err)
		return nil
	})
}

func testIdempotencyKey(t *testing.T, s kernel.Store) {
	a := newExecution("t", execID(1))
	a.IdempotencyKey = "k1"
	b := newExecution("u", execID(2))
	b.IdempotencyKey = "k1" // same key, other tenant: independent
	c := newExecution("t", execID(3))
	mustCreate(t, s, a, b, c)
	lookup := func(tx kernel.ReadTx, tenant, k, want string) {
		t.Helper()
		got, err := tx.ExecutionByIdempotencyKey(tenant, k)
		if err != nil || got != want {
			t.Errorf("ExecutionByIdempotencyKey(%s, %s) = %s, %v; want %s", tenant, k, got, err, want)
		}
	}
	view(t, s, func(tx kernel.ReadTx) error {
		lookup(tx, "t", "k1", a.ID)
		lookup(tx, "u", "k1", b.ID)
		_, err := tx.ExecutionByIdempotencyKey("t", "k2")
		wantNotFound(t, "unknown key", err)
		return nil
	})
	update(t, s, func(tx kernel.Tx) error {
		// Rewriting a keeps its key.
		if err := mutate(tx, "t", a.ID, func(e *kernel.Execution) { e.Status = kernel.ExecRunning }); err != nil {
			return fmt.Errorf("mutate a: %w", err)
		}
		// Another execution of t may not take k1.
		wantConflict(t, "second execution with key k1", mutate(tx, "t", c.ID, func(e *kernel.Execution) { e.IdempotencyKey = "k1" }))
		return nil
	})
	view(t, s, func(tx kernel.ReadTx) error {
		lookup(tx, "t", "k1", a.ID)
		got, err := tx.Execution("t", c.ID)
		if err != nil {
			return fmt.Errorf("tx.Execution c: %w", err)
		}
		if got.IdempotencyKey != "" {
			t.Errorf("refused PutExecution changed c: key %q", got.IdempotencyKey)
		}
		return nil
	})
}

func testListExecutions(t *testing.T, s kernel.Store) {
	const n = 25
	agentOf := func(i int) string { return fmt.Sprintf("a%d", i%2) }
	inputOf := func(id string) json.RawMessage { return json.RawMessage(`{"id":"` + id + `"}`) }
	statusOf := func(i int) kernel.ExecStatus {
		if i%3 == 0 {
			return kernel.ExecCompleted
		}
		return kernel.ExecRunning
	}
	update(t, s, func(tx kernel.Tx) error {
		for i := 1; i <= n; i++ {
			e := newExecution("t", execID(i))
			e.AgentID, e.Status = agentOf(i), statusOf(i)
			e.Input = inputOf(e.ID)
			if err := create(tx, e); err != nil {
				return fmt.Errorf("create: %w", err)
			}
		}
		// Neighbouring tenants whose names share a prefix with t.
		for i, tenant := range []string{"t2", "tt", "s"} {
			if err := create(tx, newExecution(tenant, execID(100+i))); err != nil {
				return fmt.Errorf("create: %w", err)
			}
		}
		return nil
	})
	// want lists the ids of t (newest first) that pass the filter.
	want := func(f kernel.ExecutionFilter) []string {
		var out []string
		for i := n; i >= 1; i-- {
			id := execID(i)
			if f.Before != "" && id >= f.Before {
				continue
			}
			if (f.AgentID != "" && agentOf(i) != f.AgentID) || (f.Status != "" && statusOf(i) != f.Status) {
				continue
			}
			if f.Limit > 0 && len(out) == f.Limit {
				break
			}
			out = append(out, id)
		}
		return out
	}
	cases := []struct {
		name string
		f    kernel.ExecutionFilter
	}{
		{"all", kernel.ExecutionFilter{}},
		{"limit", kernel.ExecutionFilter{Limit: 10}},
		{"agent", kernel.ExecutionFilter{AgentID: "a1"}},
		{"status", kernel.ExecutionFilter{Status: kernel.ExecCompleted}},
		{"agent and status", kernel.ExecutionFilter{AgentID: "a0", Status: kernel.ExecCompleted}},
		{"agent with limit", kernel.ExecutionFilter{AgentID: "a0", Limit: 2}},
		{"before", kernel.ExecutionFilter{Before: execID(10), Limit: 3}},
		{"before an id not stored", kernel.ExecutionFilter{Before: execID(10) + "x", Limit: 3}},
		{"before the first", kernel.ExecutionFilter{Before: execID(1)}},
		{"before everything", kernel.ExecutionFilter{Before: "0"}},
		{"before beyond the last", kernel.ExecutionFilter{Before: "z", Limit: 2}},
		{"before with filter", kernel.ExecutionFilter{Before: execID(20), Status: kernel.ExecCompleted}},
		{"no match", kernel.ExecutionFilter{AgentID: "nobody"}},
	}
	view(t, s, func(tx kernel.ReadTx) error {
		for _, c := range cases {
			got, err := tx.ListExecutions("t", c.f)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			sameStrings(t, c.name, ids(got), want(c.f))
			// Each listed execution comes with its own input, whatever
			// the filter skipped on the way.
			for _, e := range got {
				if string(e.Input) != string(inputOf(e.ID)) {
					t.Errorf("%s: execution %s has input %s, want %s", c.name, e.ID, e.Input, inputOf(e.ID))
				}
			}
		}
		got, err := tx.ListExecutions("t2", kernel.ExecutionFilter{})
		if err != nil {
			return fmt.Errorf("tenant t2: %w", err)
		}
		sameStrings(t, "tenant t2", ids(got), []string{execID(100)})
		return nil
	})
	// Keyset paging visits every execution once, newest first.
	for _, pageSize := range []int{1, 7, 10, 25, 30} {
		var all []string
		f := kernel.ExecutionFilter{Limit: pageSize}
		for pages := 0; ; pages++ {
			if pages > n+1 {
				t.Fatalf("page size %d: paging does not end", pageSize)
			}
			var page []*kernel.Execution
			view(t, s, func(tx kernel.ReadTx) error {
				var err error
				page, err = tx.ListExecutions("t", f)
				return err
			})
			if len(page) == 0 {
				break
			}
			all = append(all, ids(page)...)
			f.Before = page[len(page)-1].ID
		}
		sameStrings(t, fmt.Sprintf("paging by %d", pageSize), all, want(kernel.ExecutionFilter{}))
	}
}

func testSteps(t *testing.T, s kernel.Store) {
	e := newExecution("t", execID(1))
	mustCreate(t, s, e)
	mk := func(id string, seq uint64) *kernel.Step {
		return &kernel.Step{
			ID: id, ExecutionID: e.ID, Tenant: "t", Kind: "tool_call", Target: "web.search",
			Args: json.RawMessage(`{"q":"` + id + `"}`), ArgsHash: strings.Repeat("a", 64), Idempotency: kernel.SafeToRetry,
			Effect: "read_only", Status: kernel.StepExecuting, Lease: kernel.Lease{DispatchID: "d", Attempt: 1},
			Seq: seq, CreatedAt: at(time.Duration(seq) * time.Second), OnInterrupted: kernel.OnInterruptedApproval,
		}
	}
	// Inserted out of Seq order, and ids not in Seq order either.
	steps := []*kernel.Step{mk("s-c", 2), mk("s-a", 9), mk("s-b", 5)}
	update(t, s, func(tx kernel.Tx) error {
		for _, st := range steps {
			if err := tx.PutStep(st); err != nil {
				return fmt.Errorf("PutStep: %w", err)
			}
		}
		return nil
	})
	done := *steps[1]
	completed := at(time.Minute)
	done.Status = kernel.StepSucceeded
	done.Result = json.RawMessage(`{"hits":["a","b"]}`)
	done.Usage = &kernel.Usage{InputTokens: 10, OutputTokens: 20, TotalTokens: 30, CostUSD: 0.001}
	done.Verdict = &kernel.StepVerdict{Action: "allow", RuleID: "r1", EvalTime: 1500}
	done.Verdict.Bundle.Name = "research"
	done.CompletedAt = &completed
	update(t, s, func(tx kernel.Tx) error { c := done; return tx.PutStep(&c) })
	view(t, s, func(tx kernel.ReadTx) error {
		got, err := tx.Step("t", e.ID, "s-a")
		if err != nil {
			return fmt.Errorf("tx.Step: %w", err)
		}
		sameJSON(t, "Step after overwrite", got, &done)
		list, err := tx.ListSteps("t", e.ID)
		if err != nil {
			return fmt.Errorf("ListSteps: %w", err)
		}
		var order []string
		for _, st := range list {
			order = append(order, st.ID)
		}
		sameStrings(t, "ListSteps order (by Seq)", order, []string{"s-c", "s-b", "s-a"})
		_, err = tx.Step("t", execID(2), "s-a")
		wantNotFound(t, "Step of another execution", err)
		other, err := tx.ListSteps("t", execID(2))
		if err != nil {
			return fmt.Errorf("ListSteps of another execution: %w", err)
		}
		if len(other) != 0 {
			t.Errorf("ListSteps of another execution: %d steps", len(other))
		}
		return nil
	})
}

// testStepsPage: a page of steps is chosen by Seq, at most limit long,
// cut once its records take maxBytes (never empty), and says whether more
// follow; following the pages yields every step once, in Seq order.
func testStepsPage(t *testing.T, s kernel.Store) {
	e := newExecution("t", execID(1))
	mustCreate(t, s, e)
	big := strings.Repeat("x", 4000)
	var want []string
	update(t, s, func(tx kernel.Tx) error {
		// Ids in the reverse of Seq order, inserted in neither.
		for _, i := range []int{3, 0, 4, 1, 2, 6, 5} {
			id := fmt.Sprintf("s-%d", 9-i)
			st := &kernel.Step{ID: id, ExecutionID: e.ID, Tenant: "t", Kind: "tool_call", Target: "t",
				Args: json.RawMessage(`{"pad":"` + big + `"}`), ArgsHash: strings.Repeat("a", 64), Idempotency: kernel.SafeToRetry,
				Status: kernel.StepExecuting, Lease: kernel.Lease{DispatchID: "d", Attempt: 1}, Seq: uint64(2 + 3*i), CreatedAt: at(time.Second)}
			if err := tx.PutStep(st); err != nil {
				return fmt.Errorf("PutStep: %w", err)
			}
		}
		return nil
	})
	for i := range 7 {
		want = append(want, fmt.Sprintf("s-%d", 9-i))
	}
	ids := func(l []*kernel.Step) []string {
		var out []string
		for _, st := range l {
			out = append(out, st.ID)
		}
		return out
	}
	view(t, s, func(tx kernel.ReadTx) error {
		all, more, err := tx.StepsPage("t", e.ID, 0, 0, 0)
		if err != nil {
			return fmt.Errorf("StepsPage, no bounds: %w", err)
		}
		sameStrings(t, "StepsPage, no bounds", ids(all), want)
		if more {
			t.Error("StepsPage, no bounds: more")
		}
		page, more, err := tx.StepsPage("t", e.ID, 0, 3, 0)
		if err != nil {
			return err
		}
		sameStrings(t, "StepsPage limit 3", ids(page), want[:3])
		if !more {
			t.Error("StepsPage limit 3: not more")
		}
		page, more, err = tx.StepsPage("t", e.ID, page[2].Seq, 3, 0)
		if err != nil {
			return err
		}
		sameStrings(t, "StepsPage after the first page", ids(page), want[3:6])
		if !more {
			t.Error("StepsPage, second page: not more")
		}
		page, more, err = tx.StepsPage("t", e.ID, page[2].Seq, 3, 0)
		if err != nil {
			return err
		}
		sameStrings(t, "StepsPage, last page", ids(page), want[6:])
		if more {
			t.Error("StepsPage, last page: more")
		}
		// A byte budget smaller than one record still gives one; two
		// records' worth gives two.
		page, more, err = tx.StepsPage("t", e.ID, 0, 100, 10)
		if err != nil {
			return err
		}
		sameStrings(t, "StepsPage under a tiny byte budget", ids(page), want[:1])
		if !more {
			t.Error("StepsPage under a tiny byte budget: not more")
		}
		page, _, err = tx.StepsPage("t", e.ID, 0, 100, 6000)
		if err != nil {
			return err
		}
		sameStrings(t, "StepsPage under a budget of about two records", ids(page), want[:2])
		page, more, err = tx.StepsPage("t", execID(2), 0, 10, 0)
		if err != nil || len(page) != 0 || more {
			t.Errorf("StepsPage of another execution: %d steps, more %v, %v", len(page), more, err)
		}
		return nil
	})
}

func testOccurrence(t *testing.T, s kernel.Store) {
	id := execID(1)
	o1 := kernel.Occurrence{Lease: kernel.Lease{DispatchID: "d", Attempt: 1}, Count: 3}
	o2 := kernel.Occurrence{Lease: kernel.Lease{DispatchID: "d", Attempt: 2}, Count: 1}
	update(t, s, func(tx kernel.Tx) error {
		if err := tx.PutOccurrence("t", id, "tool_call|web.search|abc", o1); err != nil {
			return fmt.Errorf("PutOccurrence: %w", err)
		}
		if err := tx.PutOccurrence("t", id, "llm_call|gpt|def", o2); err != nil {
			return fmt.Errorf("PutOccurrence: %w", err)
		}
		return nil
	})
	update(t, s, func(tx kernel.Tx) error {
		o, err := tx.Occurrence("t", id, "tool_call|web.search|abc")
		if err != nil {
			return fmt.Errorf("tx.Occurrence: %w", err)
		}
		if o != o1 {
			t.Errorf("Occurrence = %+v, want %+v", o, o1)
		}
		o.Count++
		return tx.PutOccurrence("t", id, "tool_call|web.search|abc", o)
	})
	view(t, s, func(tx kernel.ReadTx) error {
		o, err := tx.Occurrence("t", id, "tool_call|web.search|abc")
		if err != nil {
			return fmt.Errorf("tx.Occurrence: %w", err)
		}
		if o.Count != 4 {
			t.Errorf("Occurrence count = %d, want 4", o.Count)
		}
		o, err = tx.Occurrence("t", id, "llm_call|gpt|def")
		if err != nil {
			return fmt.Errorf("tx.Occurrence: %w", err)
		}
		if o != o2 {
			t.Errorf("Occurrence = %+v, want %+v", o, o2)
		}
		o, err = tx.Occurrence("t", execID(2), "llm_call|gpt|def")
		if err != nil {
			return fmt.Errorf("tx.Occurrence of another execution: %w", err)
		}
		if o != (kernel.Occurrence{}) {
			t.Errorf("Occurrence of another execution = %+v, want zero", o)
		}
		return nil
	})
}

// testStepsBesideEvents: steps, occurrence counters and events of one
// execution are independent records, whatever a store keeps together: a
// counter stored under a step's id (the kernel keys the counter of a call
// by its first step's id) and the step change independently, a step put
// again with another Seq is found once, with the new one, and no step is
// listed as an event.
func testStepsBesideEvents(t *testing.T, s kernel.Store) {
	e := newExecution("t", execID(1))
	mustCreate(t, s, e)
	mk := func(id string, seq uint64, st kernel.StepStatus) *kernel.Step {
		return &kernel.Step{ID: id, ExecutionID: e.ID, Tenant: "t", Kind: "tool_call", Target: "x",
			Args: json.RawMessage(`{}`), ArgsHash: strings.Repeat("b", 64), Idempotency: kernel.SafeToRetry,
			Status: st, Seq: seq, CreatedAt: at(time.Second)}
	}
	o1 := kernel.Occurrence{Lease: kernel.Lease{DispatchID: "d", Attempt: 1}, Count: 1}
	update(t, s, func(tx kernel.Tx) error {
		if err := appendEvents(tx, "t", e.ID, "s-x", kernel.EvStepProposed, kernel.EvStepAllowed, kernel.EvStepExecuting); err != nil {
			return err
		}
		for _, err := range []error{
			tx.PutStep(mk("s-x", 2, kernel.StepExecuting)),
			tx.PutOccurrence("t", e.ID, "s-x", o1),
			tx.PutStep(mk("s-y", 3, kernel.StepExecuting)),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
	update(t, s, func(tx kernel.Tx) error {
		for _, err := range []error{
			tx.PutStep(mk("s-x", 2, kernel.StepSucceeded)),
			tx.PutOccurrence("t", e.ID, "s-y", kernel.Occurrence{Count: 7}),
			tx.PutStep(mk("s-y", 4, kernel.StepFailed)), // another Seq
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
	view(t, s, func(tx kernel.ReadTx) error {
		if o, err := tx.Occurrence("t", e.ID, "s-x"); err != nil || o != o1 {
			t.Errorf("counter s-x after its step changed: %+v %v, want %+v", o, err, o1)
		}
		if o, err := tx.Occurrence("t", e.ID, "s-y"); err != nil || o.Count != 7 {
			t.Errorf("counter s-y: %+v %v, want count 7", o, err)
		}
		if st, err := tx.Step("t", e.ID, "s-x"); err != nil || st.Status != kernel.StepSucceeded || st.Seq != 2 {
			t.Errorf("step s-x: %+v %v, want succeeded at seq 2", st, err)
		}
		if st, err := tx.Step("t", e.ID, "s-y"); err != nil || st.Status != kernel.StepFailed || st.Seq != 4 {
			t.Errorf("step s-y: %+v %v, want failed at seq 4", st, err)
		}
		list, err := tx.ListSteps("t", e.ID)
		if err != nil {
			return fmt.Errorf("ListSteps: %w", err)
		}
		var ids []string
		for _, st := range list {
			ids = append(ids, fmt.Sprintf("%s@%d", st.ID, st.Seq))
		}
		sameStrings(t, "ListSteps", ids, []string{"s-x@2", "s-y@4"})
		evs, err := tx.Events("t", e.ID, 0, 0)
		if err != nil {
			return fmt.Errorf("events: %w", err)
		}
		if len(evs) != 4 || evs[3].Seq != 4 {
			t.Errorf("Events: %d events, want 4 (seq 1..4)", len(evs))
		}
		if evs, err := tx.Events("t", e.ID, 1, 2); err != nil || len(evs) != 2 || evs[0].Seq != 2 || evs[1].Seq != 3 {
			t.Errorf("Events after 1, limit 2: %+v %v, want seq 2 and 3", evs, err)
		}
		return nil
	})
	update(t, s, func(tx kernel.Tx) error {
		_, done, err := tx.DeleteExecution("t", e.ID, 0)
		if err == nil && !done {
			t.Error("DeleteExecution without a limit left the execution")
		}
		return err
	})
	view(t, s, func(tx kernel.ReadTx) error {
		for _, id := range []string{"s-x", "s-y"} {
			_, err := tx.Step("t", e.ID, id)
			wantNotFound(t, "a deleted execution's step", err)
			if o, err := tx.Occurrence("t", e.ID, id); err != nil || o != (kernel.Occurrence{}) {
				t.Errorf("a deleted execution's counter %s: %+v %v", id, o, err)
			}
		}
		return nil
	})
}

func testEvents(t *testing.T, s kernel.Store) {
	const n = 300 // past 255, so that seq order is not byte order of a decimal
	e := newExecution("t", execID(1))
	update(t, s, func(tx kernel.Tx) error {
		if err := create(tx, e); err != nil {
			return fmt.Errorf("create: %w", err)
		}
		types := make([]kernel.EventType, n-1)
		for i := range types {
			types[i] = kernel.EvDispatchQueued
		}
		return appendEvents(tx, "t", e.ID, "", types...)
	})
	cases := []struct {
		after      uint64
		limit      int
		first, len int
	}{
		{0, 0, 1, n},
		{0, -1, 1, n},
		{0, 1, 1, 1},
		{250, 10, 251, 10},
		{255, 3, 256, 3},
		{295, 100, 296, 5},
		{n, 10, 0, 0},
		{n + 5, 0, 0, 0},
	}
	view(t, s, func(tx kernel.ReadTx) error {
		for _, c := range cases {
			evs, err := tx.Events("t", e.ID, c.after, c.limit)
			if err != nil {
				return fmt.Errorf("tx.Events: %w", err)
			}
			if len(evs) != c.len {
				t.Errorf("Events(after %d, limit %d): %d events, want %d", c.after, c.limit, len(evs), c.len)
				continue
			}
			for i, ev := range evs {
				if want := uint64(c.first + i); ev.Seq != want || ev.ExecutionID != e.ID {
					t.Errorf("Events(after %d, limit %d)[%d] = %s seq %d, want %s seq %d", c.after, c.limit, i, ev.ExecutionID, ev.Seq, e.ID, want)
					break
				}
			}
		}
		evs, err := tx.Events("t", e.ID, 0, 2)
		if err != nil {
			return fmt.Errorf("tx.Events: %w", err)
		}
		sameJSON(t, "first events", evs, []kernel.Event{
			{ExecutionID: e.ID, Seq: 1, Type: kernel.EvExecutionCreated, Time: t0, Payload: json.RawMessage(`{"agent_id":"agent-1"}`)},
			{ExecutionID: e.ID, Seq: 2, Type: kernel.EvDispatchQueued, Time: at(2 * time.Millisecond), Payload: json.RawMessage(`{}`)},
		})
		return nil
	})
}

func testEventConflict(t *testing.T, s kernel.Store) {
	e := newExecution("t", execID(1))
	mustCreate(t, s, e)
	update(t, s, func(tx kernel.Tx) error { return appendEvents(tx, "t", e.ID, "", kernel.EvDispatchQueued) })

	// A conflict returned by fn rolls back the whole transaction.
	err := s.Update(t.Context(), func(tx kernel.Tx) error {
		if err := appendEvents(tx, "t", e.ID, "", kernel.EvDispatchClaimed); err != nil { // seq 3
			return err
		}
		return tx.AppendEvent("t", kernel.Event{ExecutionID: e.ID, Seq: 2, Type: kernel.EvExecutionFailed, Time: t0, Payload: json.RawMessage(`{}`)})
	})
	wantConflict(t, "AppendEvent over seq 2", err)

	// A conflict fn ignores still leaves the recorded event alone.
	update(t, s, func(tx kernel.Tx) error {
		err := tx.AppendEvent("t", kernel.Event{ExecutionID: e.ID, Seq: 1, Type: kernel.EvExecutionFailed, Time: t0, Payload: json.RawMessage(`{}`)})
		wantConflict(t, "AppendEvent over seq 1", err)
		return nil
	})
	view(t, s, func(tx kernel.ReadTx) error {
		evs, err := tx.Events("t", e.ID, 0, 0)
		if err != nil {
			return fmt.Errorf("tx.Events: %w", err)
		}
		var types []string
		for _, ev := range evs {
			types = append(types, string(ev.Type))
		}
		sameStrings(t, "events after refused appends", types, []string{string(kernel.EvExecutionCreated), string(kernel.EvDispatchQueued)})
		got, err := tx.Execution("t", e.ID)
		if err != nil {
			return fmt.Errorf("tx.Execution: %w", err)
		}
		if got.LastSeq != 2 {
			t.Errorf("LastSeq = %d, want 2 (the failed transaction was not rolled back)", got.LastSeq)
		}
		return nil
	})
}

func testAgents(t *testing.T, s kernel.Store) {
	mk := func(id, url string) *kernel.Agent {
		return &kernel.Agent{ID: id, Tenant: "t", WebhookURL: url, Secret: "s3cret-" + id, Bundle: "b", Signing: kernel.SigningV1, CreatedAt: t0, UpdatedAt: t0}
	}
	update(t, s, func(tx kernel.Tx) error {
		for _, id := range []string{"b", "a", "c"} {
			if err := tx.PutAgent(mk(id, "http://127.0.0.1:5001/"+id)); err != nil {
				return fmt.Errorf("PutAgent: %w", err)
			}
		}
		return nil
	})
	moved := mk("b", "http://127.0.0.1:5002/b")
	moved.UpdatedAt = at(time.Second)
	moved.Signing = kernel.SigningBody
	moved.OnInterrupted = kernel.OnInterruptedApproval
	update(t, s, func(tx kernel.Tx) error {
		if err := tx.PutAgent(moved); err != nil {
			return fmt.Errorf("PutAgent: %w", err)
		}
		return tx.DeleteAgent("t", "c")
	})
	view(t, s, func(tx kernel.ReadTx) error {
		got, err := tx.Agent("t", "b")
		if err != nil {
			return fmt.Errorf("tx.Agent: %w", err)
		}
		sameJSON(t, "Agent (with secret)", got, moved)
		_, err = tx.Agent("t", "c")
		wantNotFound(t, "deleted agent", err)
		list, err := tx.ListAgents("t")
		if err != nil {
			return fmt.Errorf("ListAgents: %w", err)
		}
		sameJSON(t, "ListAgents", list, []*kernel.Agent{mk("a", "http://127.0.0.1:5001/a"), moved})
		for _, c := range []struct {
			tenant string
			want   int
		}{{"t", 2}, {"t2", 0}, {"", 0}} {
			if n, err := tx.CountAgents(c.tenant); err != nil || n != c.want {
				t.Errorf("CountAgents(%q) = %d, %v; want %d", c.tenant, n, err, c.want)
			}
		}
		return nil
	})
	// A write transaction counts its own writes.
	update(t, s, func(tx kernel.Tx) error {
		a := mk("d", "http://127.0.0.1:5001/d")
		a.Tenant = "t2"
		if err := tx.PutAgent(a); err != nil {
			return err
		}
		if n, err := tx.CountAgents("t2"); err != nil || n != 1 {
			t.Errorf("CountAgents in the transaction that put one: %d, %v", n, err)
		}
		return nil
	})
}

func approval(tenant, id string, created time.Duration, status kernel.ApprovalStatus, expires time.Duration) *kernel.Approval {
	return &kernel.Approval{
		ID: id, Tenant: tenant, ExecutionID: execID(1), AgentID: "agent-1", StepID: "step-" + id,
		Kind: "tool_call", Target: "db.drop", Args: json.RawMessage(`{"table":"users"}`),
		RequestHash: strings.Repeat("f", 64), Status: status, Approvers: []string{"alice"},
		Message: "drop?", Reason: "destructive", RuleID: "r9", ExpiresAt: at(expires), CreatedAt: at(created),
	}
}

func testApprovals(t *testing.T, s kernel.Store) {
	a1 := approval("t", "ap-1", 0, kernel.ApprovalPending, time.Hour)
	a2 := approval("t", "ap-2", time.Second, kernel.ApprovalGranted, time.Hour)
	decided := at(time.Minute)
	a2.DecidedBy, a2.Rationale, a2.DecidedAt = "alice", "ok", &decided
	a2.DecidedByKey, a2.DecidedByPrincipal = "key_1", "admin"
	a2.Type, a2.Status, a2.Result = kernel.ApprovalInterrupted, kernel.ApprovalHappened, json.RawMessage(`{"sent":true}`)
	a3 := approval("t", "ap-0", 2*time.Second, kernel.ApprovalPending, time.Hour) // newest, smallest id
	update(t, s, func(tx kernel.Tx) error {
		for _, a := range []*kernel.Approval{a1, a2, a3} {
			if err := tx.PutApproval(a); err != nil {
				return fmt.Errorf("PutApproval: %w", err)
			}
		}
		return nil
	})
	view(t, s, func(tx kernel.ReadTx) error {
		got, err := tx.Approval("t", "ap-2")
		if err != nil {
			return fmt.Errorf("tx.Approval: %w", err)
		}
		sameJSON(t, "Approval", got, a2)
		cases := []struct {
			status kernel.ApprovalStatus
			want   []*kernel.Approval
		}{
			{"", []*kernel.Approval{a3, a2, a1}},
			{kernel.ApprovalPending, []*kernel.Approval{a3, a1}},
			{kernel.ApprovalHappened, []*kernel.Approval{a2}},
			{kernel.ApprovalGranted, nil},
			{kernel.ApprovalDenied, nil},
		}
		for _, c := range cases {
			list, err := tx.ListApprovals("t", c.status)
			if err != nil {
				return fmt.Errorf("ListApprovals: %w", err)
			}
			if len(list) == 0 && len(c.want) == 0 {
				continue
			}
			sameJSON(t, fmt.Sprintf("ListApprovals(%q)", c.status), list, c.want)
		}
		return nil
	})
}

func testBundles(t *testing.T, s kernel.Store) {
	// The owner round-trips (a new revision may change it).
	mk := func(tenant, name, rev string) *kernel.BundleRecord {
		owner := kernel.BundleOwnerTenant
		if rev == "2" {
			owner = kernel.BundleOwnerAdmin
		}
		return &kernel.BundleRecord{
			Tenant: tenant, Name: name, Revision: rev, Digest: strings.Repeat("0", 64), Engine: "rego", Owner: owner,
			Archive: []byte{0x1f, 0x8b, 0, 1, 2, 255, 0, byte(len(name))}, UpdatedAt: t0,
		}
	}
	update(t, s, func(tx kernel.Tx) error {
		for _, b := range []*kernel.BundleRecord{mk("t", "zeta", "1"), mk("t", "alpha", "1"), mk("u", "alpha", "7"), mk("t", "gone", "1")} {
			if err := tx.PutBundle(b); err != nil {
				return fmt.Errorf("PutBundle: %w", err)
			}
		}
		z2 := mk("t", "zeta", "2")
		z2.Source = &kernel.BundlePull{URL: "https://bundles.example/zeta.tar.gz", MinDelay: "60s", MaxDelay: "2m"}
		if err := tx.PutBundle(z2); err != nil {
			return fmt.Errorf("PutBundle new revision: %w", err)
		}
		return tx.DeleteBundle("t", "gone")
	})
	view(t, s, func(tx kernel.ReadTx) error {
		got, err := tx.Bundle("t", "zeta")
		if err != nil {
			return fmt.Errorf("tx.Bundle: %w", err)
		}
		z2 := mk("t", "zeta", "2")
		z2.Source = &kernel.BundlePull{URL: "https://bundles.example/zeta.tar.gz", MinDelay: "60s", MaxDelay: "2m"}
		sameJSON(t, "Bundle (with its source)", got, z2)
		_, err = tx.Bundle("t", "gone")
		wantNotFound(t, "deleted bundle", err)
		list, err := tx.ListBundles("t")
		if err != nil {
			return fmt.Errorf("ListBundles: %w", err)
		}
		sameJSON(t, "ListBundles(t)", list, []*kernel.BundleRecord{mk("t", "alpha", "1"), z2})
		all, err := tx.ListBundles("")
		if err != nil {
			return fmt.Errorf("ListBundles(\"\"): %w", err)
		}
		var names []string
		for _, b := range all {
			names = append(names, b.Tenant+"/"+b.Name)
		}
		slices.Sort(names)
		sameStrings(t, "ListBundles(\"\")", names, []string{"t/alpha", "t/zeta", "u/alpha"})
		return nil
	})
}

func testCounters(t *testing.T, s kernel.Store) {
	update(t, s, func(tx kernel.Tx) error {
		v := []byte("state-1")
		if err := tx.PutCounter("t", "rl|agent|x", v); err != nil {
			return fmt.Errorf("PutCounter: %w", err)
		}
		v[0] = 'X' // the store must have copied it
		if err := tx.PutCounter("t", "rl|agent|y", []byte{0, 1, 2, 0}); err != nil {
			return fmt.Errorf("PutCounter: %w", err)
		}
		return nil
	})
	view(t, s, func(tx kernel.ReadTx) error {
		got, err := tx.Counter("t", "rl|agent|x")
		if err != nil {
			return fmt.Errorf("tx.Counter: %w", err)
		}
		if string(got) != "state-1" {
			t.Errorf("Counter = %q, want state-1", got)
		}
		got[0] = 'Y' // and returned a copy
		again, err := tx.Counter("t", "rl|agent|x")
		if err != nil {
			return fmt.Errorf("tx.Counter: %w", err)
		}
		if string(again) != "state-1" {
			t.Errorf("changing a returned counter changed the store: %q", again)
		}
		bin, err := tx.Counter("t", "rl|agent|y")
		if err != nil {
			return fmt.Errorf("tx.Counter: %w", err)
		}
		if string(bin) != "\x00\x01\x02\x00" {
			t.Errorf("binary counter = %q", bin)
		}
		return nil
	})
	update(t, s, func(tx kernel.Tx) error { return tx.PutCounter("t", "rl|agent|x", []byte("state-2")) })
	view(t, s, func(tx kernel.ReadTx) error {
		got, err := tx.Counter("t", "rl|agent|x")
		if err != nil {
			return fmt.Errorf("tx.Counter: %w", err)
		}
		if string(got) != "state-2" {
			t.Errorf("Counter after overwrite = %q, want state-2", got)
		}
		return nil
	})
}

func testTenantsAndKeys(t *testing.T, s kernel.Store) {
	acme := &kernel.Tenant{ID: "acme", Guards: []string{"no-destructive"}, CreatedAt: t0, AllowBundleSources: true,
		BundleKeys: []kernel.BundleKey{{ID: "ci", Algorithm: "ES256", Key: "-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----\n", Scope: "write"}}}
	beta := &kernel.Tenant{ID: "beta", CreatedAt: t0}
	key := func(tenant, id, hash string) *kernel.APIKey {
		return &kernel.APIKey{ID: id, Tenant: tenant, Role: kernel.RoleClient, Principal: "ci", Hash: hash, CreatedAt: t0}
	}
	k1, k2, k3 := key("acme", "k1", "h1"), key("acme", "k2", "h2"), key("beta", "k3", "h3")
	update(t, s, func(tx kernel.Tx) error {
		if err := tx.PutTenant(beta); err != nil {
			return fmt.Errorf("PutTenant: %w", err)
		}
		if err := tx.PutTenant(acme); err != nil {
			return fmt.Errorf("PutTenant: %w", err)
		}
		for _, k := range []*kernel.APIKey{k1, k2, k3} {
			if err := tx.PutAPIKey(k); err != nil {
				return fmt.Errorf("PutAPIKey: %w", err)
			}
		}
		wantConflict(t, "PutAPIKey with another key's hash", tx.PutAPIKey(key("beta", "k4", "h1")))
		return nil
	})
	rotated := key("acme", "k1", "h9")
	update(t, s, func(tx kernel.Tx) error {
		if err := tx.PutAPIKey(rotated); err != nil {
			return fmt.Errorf("PutAPIKey (rotate): %w", err)
		}
		return tx.DeleteAPIKey("acme", "k2")
	})
	view(t, s, func(tx kernel.ReadTx) error {
		got, err := tx.Tenant("acme")
		if err != nil {
			return fmt.Errorf("tx.Tenant: %w", err)
		}
		sameJSON(t, "Tenant", got, acme)
		list, err := tx.ListTenants()
		if err != nil {
			return fmt.Errorf("ListTenants: %w", err)
		}
		sameJSON(t, "ListTenants", list, []*kernel.Tenant{acme, beta})

		for _, c := range []struct {
			hash string
			want *kernel.APIKey
		}{{"h9", rotated}, {"h3", k3}, {"h1", nil}, {"h2", nil}} {
			got, err := tx.APIKeyByHash(c.hash)
			if c.want == nil {
				wantNotFound(t, "APIKeyByHash "+c.hash, err)
				continue
			}
			if err != nil {
				return fmt.Errorf("APIKeyByHash %s: %w", c.hash, err)
			}
			sameJSON(t, "APIKeyByHash "+c.hash, got, c.want)
		}
		keys, err := tx.ListAPIKeys("acme")
		if err != nil {
			return fmt.Errorf("ListAPIKeys: %w", err)
		}
		sameJSON(t, "ListAPIKeys(acme)", keys, []*kernel.APIKey{rotated})
		if n, err := tx.CountAPIKeys("acme"); err != nil || n != len(keys) {
			t.Errorf("CountAPIKeys(acme) = %d, %v; want %d", n, err, len(keys))
		}
		if n, err := tx.CountAPIKeys("nobody"); err != nil || n != 0 {
			t.Errorf("CountAPIKeys(nobody) = %d, %v; want 0", n, err)
		}
		return nil
	})
}

// testTenantIsolation: everything written for tenant t is invisible
// through tenants whose names are near t's.
func testTenantIsolation(t *testing.T, s kernel.Store) {
	e := newExecution("t", execID(1))
	e.IdempotencyKey = "idem"
	e.Dispatch = kernel.DispatchState{ID: "d", State: kernel.DispatchQueued, DueAt: t0}
	update(t, s, func(tx kernel.Tx) error {
		if err := create(tx, e); err != nil {
			return fmt.Errorf("create: %w", err)
		}
		if err := appendEvents(tx, "t", e.ID, "s1", kernel.EvStepProposed); err != nil {
			return fmt.Errorf("events: %w", err)
		}
		if err := tx.PutStep(&kernel.Step{ID: "s1", ExecutionID: e.ID, Tenant: "t", Kind: "local", Target: "x", Args: json.RawMessage(`{}`), Status: kernel.StepExecuting, Seq: 2, CreatedAt: t0}); err != nil {
			return fmt.Errorf("PutStep: %w", err)
		}
		if err := tx.PutOccurrence("t", e.ID, "k", kernel.Occurrence{Count: 1}); err != nil {
			return fmt.Errorf("PutOccurrence: %w", err)
		}
		if err := tx.PutAgent(&kernel.Agent{ID: "ag", Tenant: "t", WebhookURL: "http://t", Secret: "t-secret", CreatedAt: t0, UpdatedAt: t0}); err != nil {
			return fmt.Errorf("PutAgent: %w", err)
		}
		if err := tx.PutApproval(approval("t", "ap", 0, kernel.ApprovalPending, time.Hour)); err != nil {
			return fmt.Errorf("PutApproval: %w", err)
		}
		if err := tx.PutBundle(&kernel.BundleRecord{Tenant: "t", Name: "bu", Revision: "1", Engine: "rules", UpdatedAt: t0}); err != nil {
			return fmt.Errorf("PutBundle: %w", err)
		}
		if err := tx.PutCounter("t", "c", []byte("1")); err != nil {
			return fmt.Errorf("PutCounter: %w", err)
		}
		if err := tx.PutAPIKey(&kernel.APIKey{ID: "key", Tenant: "t", Role: kernel.RoleClient, Hash: "hash", CreatedAt: t0}); err != nil {
			return fmt.Errorf("PutAPIKey: %w", err)
		}
		// The same agent id in a neighbouring tenant is a different agent.
		return tx.PutAgent(&kernel.Agent{ID: "ag", Tenant: "tt", WebhookURL: "http://tt", Secret: "tt-secret", CreatedAt: t0, UpdatedAt: t0})
	})
	hidden := []struct {
		name string
		fn   func(tx kernel.ReadTx, tenant string) (visible bool, err error)
	}{
		{"Execution", func(tx kernel.ReadTx, tn string) (bool, error) { return found(tx.Execution(tn, e.ID)) }},
		{"ExecutionByIdempotencyKey", func(tx kernel.ReadTx, tn string) (bool, error) {
			return found(tx.ExecutionByIdempotencyKey(tn, "idem"))
		}},
		{"ListExecutions", func(tx kernel.ReadTx, tn string) (bool, error) {
			return nonEmpty(tx.ListExecutions(tn, kernel.ExecutionFilter{}))
		}},
		{"Step", func(tx kernel.ReadTx, tn string) (bool, error) { return found(tx.Step(tn, e.ID, "s1")) }},
		{"ListSteps", func(tx kernel.ReadTx, tn string) (bool, error) { return nonEmpty(tx.ListSteps(tn, e.ID)) }},
		{"Occurrence", func(tx kernel.ReadTx, tn string) (bool, error) {
			o, err := tx.Occurrence(tn, e.ID, "k")
			return o.Count != 0, err
		}},
		{"Events", func(tx kernel.ReadTx, tn string) (bool, error) { return nonEmpty(tx.Events(tn, e.ID, 0, 0)) }},
		{"Agent", func(tx kernel.ReadTx, tn string) (bool, error) {
			a, err := tx.Agent(tn, "ag")
			if err == nil && a.Secret == "t-secret" {
				return true, nil
			}
			return false, nil
		}},
		{"ListAgents", func(tx kernel.ReadTx, tn string) (bool, error) {
			l, err := tx.ListAgents(tn)
			for _, a := range l {
				if a.Tenant == "t" {
					return true, err
				}
			}
			return false, err
		}},
		{"Approval", func(tx kernel.ReadTx, tn string) (bool, error) { return found(tx.Approval(tn, "ap")) }},
		{"ListApprovals", func(tx kernel.ReadTx, tn string) (bool, error) { return nonEmpty(tx.ListApprovals(tn, "")) }},
		{"Bundle", func(tx kernel.ReadTx, tn string) (bool, error) { return found(tx.Bundle(tn, "bu")) }},
		{"ListBundles", func(tx kernel.ReadTx, tn string) (bool, error) { return nonEmpty(tx.ListBundles(tn)) }},
		{"Counter", func(tx kernel.ReadTx, tn string) (bool, error) {
			v, err := tx.Counter(tn, "c")
			return v != nil, err
		}},
		{"ListAPIKeys", func(tx kernel.ReadTx, tn string) (bool, error) { return nonEmpty(tx.ListAPIKeys(tn)) }},
	}
	view(t, s, func(tx kernel.ReadTx) error {
		for _, h := range hidden {
			if visible, err := h.fn(tx, "t"); !visible || err != nil {
				t.Errorf("%s: tenant t does not see its own record (err %v)", h.name, err)
			}
			for _, other := range []string{"tt", "t2", "u", "T"} {
				visible, err := h.fn(tx, other)
				if visible {
					t.Errorf("%s: tenant %s sees tenant t's record", h.name, other)
				}
				if err != nil && !errors.Is(err, kernel.ErrNotFound) {
					t.Errorf("%s as tenant %s: %v", h.name, other, err)
				}
			}
		}
		a, err := tx.Agent("tt", "ag")
		if err != nil {
			return fmt.Errorf("tx.Agent tt/ag: %w", err)
		}
		if a.Secret != "tt-secret" {
			t.Errorf("tenant tt's agent ag has secret %q", a.Secret)
		}
		// The global lookups name the owner.
		owner, err := tx.ExecutionTenant(e.ID)
		if err != nil {
			return fmt.Errorf("ExecutionTenant: %w", err)
		}
		k, err := tx.APIKeyByHash("hash")
		if err != nil {
			return fmt.Errorf("APIKeyByHash: %w", err)
		}
		due, err := tx.DueDispatches(t0, 0)
		if err != nil {
			return fmt.Errorf("DueDispatches: %w", err)
		}
		exp, err := tx.ExpiredApprovals(at(time.Hour), 0)
		if err != nil {
			return fmt.Errorf("ExpiredApprovals: %w", err)
		}
		if owner != "t" || k.Tenant != "t" || len(due) != 1 || due[0].Tenant != "t" || len(exp) != 1 || exp[0].Tenant != "t" {
			t.Errorf("global lookups lost the tenant: owner %q, key %q, due %v, expired %v", owner, k.Tenant, due, exp)
		}
		return nil
	})
}

// found turns a lookup into (visible, error), treating ErrNotFound as invisible.
func found[T any](_ T, err error) (bool, error) {
	if err == nil {
		return true, nil
	}
	if errors.Is(err, kernel.ErrNotFound) {
		return false, nil
	}
	return false, err
}

// nonEmpty turns a listing into (visible, error).
func nonEmpty[T any](l []T, err error) (bool, error) { return len(l) > 0, err }
