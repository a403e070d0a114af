package storetest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// testDispatchIndexes moves executions through queued → delivering → acked
// → parked/none and checks after each transition which of them
// DueDispatches, NextDue and ExpiredLeases return, at which times, in
// which order.
func testDispatchIndexes(t *testing.T, s kernel.Store) {
	e1, e2, e3 := execID(1), execID(2), execID(3)
	tenantOf := map[string]string{e1: "t", e2: "t", e3: "u"}
	mustCreate(t, s, newExecution("t", e1), newExecution("t", e2), newExecution("u", e3))
	ref := func(id string, d time.Duration) string { return tenantOf[id] + "/" + id + "@" + d.String() }
	queued := func(d time.Duration) kernel.DispatchState {
		return kernel.DispatchState{ID: "d", State: kernel.DispatchQueued, DueAt: at(d)}
	}
	claimed := func(state kernel.DispatchStatus, d time.Duration) kernel.DispatchState {
		return kernel.DispatchState{ID: "d", Attempt: 1, State: state, DueAt: at(time.Second), LeaseUntil: at(d)}
	}
	type probe struct {
		now    time.Duration
		limit  int
		due    []string
		leases []string
	}
	far := 10 * time.Hour
	steps := []struct {
		name    string
		set     map[string]kernel.DispatchState
		nextDue time.Duration // -1: none
		probes  []probe
	}{
		{"created", nil, -1, []probe{{now: far}}},
		{"queued", map[string]kernel.DispatchState{e1: queued(10 * time.Second), e2: queued(5 * time.Second), e3: queued(7 * time.Second)},
			5 * time.Second, []probe{
				{now: 4 * time.Second},
				{now: 5 * time.Second, due: []string{ref(e2, 5*time.Second)}},
				{now: 9 * time.Second, due: []string{ref(e2, 5*time.Second), ref(e3, 7*time.Second)}},
				{now: far, due: []string{ref(e2, 5*time.Second), ref(e3, 7*time.Second), ref(e1, 10*time.Second)}},
				{now: far, limit: 2, due: []string{ref(e2, 5*time.Second), ref(e3, 7*time.Second)}},
			}},
		{"e2 claimed", map[string]kernel.DispatchState{e2: claimed(kernel.DispatchDelivering, 35*time.Second)},
			7 * time.Second, []probe{
				{now: 34 * time.Second, due: []string{ref(e3, 7*time.Second), ref(e1, 10*time.Second)}},
				{now: 35 * time.Second, due: []string{ref(e3, 7*time.Second), ref(e1, 10*time.Second)}, leases: []string{ref(e2, 35*time.Second)}},
			}},
		{"e2 acked, lease renewed", map[string]kernel.DispatchState{e2: claimed(kernel.DispatchAcked, 65*time.Second)},
			7 * time.Second, []probe{
				{now: 64 * time.Second, due: []string{ref(e3, 7*time.Second), ref(e1, 10*time.Second)}},
				{now: 65 * time.Second, due: []string{ref(e3, 7*time.Second), ref(e1, 10*time.Second)}, leases: []string{ref(e2, 65*time.Second)}},
			}},
		{"e1 claimed, e3 requeued later", map[string]kernel.DispatchState{e1: claimed(kernel.DispatchDelivering, 40*time.Second), e3: queued(30 * time.Second)},
			30 * time.Second, []probe{
				{now: 29 * time.Second},
				{now: far, due: []string{ref(e3, 30*time.Second)}, leases: []string{ref(e1, 40*time.Second), ref(e2, 65*time.Second)}},
				{now: far, limit: 1, due: []string{ref(e3, 30*time.Second)}, leases: []string{ref(e1, 40*time.Second)}},
			}},
		{"e2 parked", map[string]kernel.DispatchState{e2: {ID: "d", Attempt: 1, State: kernel.DispatchParked, LeaseUntil: at(65 * time.Second)}},
			30 * time.Second, []probe{
				{now: far, due: []string{ref(e3, 30*time.Second)}, leases: []string{ref(e1, 40*time.Second)}},
			}},
		{"e1 done, e3 claimed and acked, e2 queued again", map[string]kernel.DispatchState{
			e1: {ID: "d", Attempt: 1}, e3: claimed(kernel.DispatchAcked, 90*time.Second), e2: queued(100 * time.Second)},
			100 * time.Second, []probe{
				{now: far, due: []string{ref(e2, 100*time.Second)}, leases: []string{ref(e3, 90*time.Second)}},
			}},
		{"all done", map[string]kernel.DispatchState{e2: {ID: "d2"}, e3: {ID: "d", Attempt: 1}}, -1, []probe{{now: far}}},
	}
	for _, st := range steps {
		update(t, s, func(tx kernel.Tx) error {
			for id, d := range st.set {
				if err := mutate(tx, tenantOf[id], id, func(e *kernel.Execution) { e.Dispatch = d }); err != nil {
					return err
				}
			}
			return nil
		})
		view(t, s, func(tx kernel.ReadTx) error {
			next, ok, err := tx.NextDue()
			if err != nil {
				return fmt.Errorf("%s: NextDue: %w", st.name, err)
			}
			switch {
			case st.nextDue < 0 && ok:
				t.Errorf("%s: NextDue = %s, want none", st.name, next.Sub(t0))
			case st.nextDue >= 0 && (!ok || !next.Equal(at(st.nextDue))):
				t.Errorf("%s: NextDue = %s, %v; want %s", st.name, next.Sub(t0), ok, st.nextDue)
			}
			for _, p := range st.probes {
				due, err := tx.DueDispatches(at(p.now), p.limit)
				if err != nil {
					return fmt.Errorf("%s: DueDispatches: %w", st.name, err)
				}
				sameStrings(t, st.name+": DueDispatches(t0+"+p.now.String()+")", refs(due), p.due)
				leases, err := tx.ExpiredLeases(at(p.now), p.limit)
				if err != nil {
					return fmt.Errorf("%s: ExpiredLeases: %w", st.name, err)
				}
				sameStrings(t, st.name+": ExpiredLeases(t0+"+p.now.String()+")", refs(leases), p.leases)
			}
			return nil
		})
	}
}

// testApprovalExpiry: the expiry index follows ExpiresAt and Status.
func testApprovalExpiry(t *testing.T, s kernel.Store) {
	update(t, s, func(tx kernel.Tx) error {
		if err := tx.PutApproval(approval("t", "ap-1", 0, kernel.ApprovalPending, 10*time.Second)); err != nil {
			return fmt.Errorf("PutApproval: %w", err)
		}
		if err := tx.PutApproval(approval("u", "ap-2", 0, kernel.ApprovalPending, 5*time.Second)); err != nil {
			return fmt.Errorf("PutApproval: %w", err)
		}
		return nil
	})
	expect := func(name string, now time.Duration, limit int, want ...string) {
		t.Helper()
		view(t, s, func(tx kernel.ReadTx) error {
			got, err := tx.ExpiredApprovals(at(now), limit)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			sameStrings(t, name, approvalRefs(got), want)
			return nil
		})
	}
	expect("none yet", 4*time.Second, 0)
	expect("first", 5*time.Second, 0, "u/ap-2@5s")
	expect("both", 10*time.Second, 0, "u/ap-2@5s", "t/ap-1@10s")
	expect("limit", time.Hour, 1, "u/ap-2@5s")

	update(t, s, func(tx kernel.Tx) error {
		return tx.PutApproval(approval("u", "ap-2", 0, kernel.ApprovalPending, 20*time.Second))
	})
	expect("ap-2 extended", 10*time.Second, 0, "t/ap-1@10s")
	update(t, s, func(tx kernel.Tx) error {
		return tx.PutApproval(approval("t", "ap-1", 0, kernel.ApprovalGranted, 10*time.Second))
	})
	expect("ap-1 granted", time.Hour, 0, "u/ap-2@20s")
	update(t, s, func(tx kernel.Tx) error {
		return tx.PutApproval(approval("u", "ap-2", 0, kernel.ApprovalExpired, 20*time.Second))
	})
	expect("ap-2 expired", time.Hour, 0)
}

// testReadYourWrites: a transaction sees its own writes, indexes included.
func testReadYourWrites(t *testing.T, s kernel.Store) {
	e := newExecution("t", execID(1))
	e.IdempotencyKey = "k"
	e.Dispatch = kernel.DispatchState{ID: "d", State: kernel.DispatchQueued, DueAt: t0}
	update(t, s, func(tx kernel.Tx) error {
		if err := create(tx, e); err != nil {
			return fmt.Errorf("create: %w", err)
		}
		if err := tx.PutStep(&kernel.Step{ID: "s", ExecutionID: e.ID, Tenant: "t", Kind: "local", Target: "x", Args: json.RawMessage(`1`), Seq: 1, CreatedAt: t0}); err != nil {
			return fmt.Errorf("PutStep: %w", err)
		}
		if err := tx.PutAgent(&kernel.Agent{ID: "a", Tenant: "t", CreatedAt: t0, UpdatedAt: t0}); err != nil {
			return fmt.Errorf("PutAgent: %w", err)
		}
		if err := tx.PutApproval(approval("t", "ap", 0, kernel.ApprovalPending, 0)); err != nil {
			return fmt.Errorf("PutApproval: %w", err)
		}

		checks := []struct {
			name string
			ok   func() (bool, error)
		}{
			{"Execution", func() (bool, error) { return found(tx.Execution("t", e.ID)) }},
			{"ExecutionTenant", func() (bool, error) { return found(tx.ExecutionTenant(e.ID)) }},
			{"ExecutionByIdempotencyKey", func() (bool, error) { return found(tx.ExecutionByIdempotencyKey("t", "k")) }},
			{"ListExecutions", func() (bool, error) { return nonEmpty(tx.ListExecutions("t", kernel.ExecutionFilter{})) }},
			{"Step", func() (bool, error) { return found(tx.Step("t", e.ID, "s")) }},
			{"ListSteps", func() (bool, error) { return nonEmpty(tx.ListSteps("t", e.ID)) }},
			{"Events", func() (bool, error) { return nonEmpty(tx.Events("t", e.ID, 0, 0)) }},
			{"Agent", func() (bool, error) { return found(tx.Agent("t", "a")) }},
			{"DueDispatches", func() (bool, error) { return nonEmpty(tx.DueDispatches(t0, 0)) }},
			{"NextDue", func() (bool, error) { _, ok, err := tx.NextDue(); return ok, err }},
			{"ExpiredApprovals", func() (bool, error) { return nonEmpty(tx.ExpiredApprovals(t0, 0)) }},
		}
		for _, c := range checks {
			if ok, err := c.ok(); !ok || err != nil {
				t.Errorf("%s does not see a write of its own transaction (err %v)", c.name, err)
			}
		}
		return nil
	})
}
