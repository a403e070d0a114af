package bbolt

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestOpenSteps: ending an execution cancels its open steps, and used to
// decode every step to find them, arguments and results included: an
// execution of 150 steps of 1 MB held the store's one writer (every
// tenant's) for 100 ms to be cancelled. OpenSteps reads each status from
// the record's head and decodes the open steps only; the kernel's write
// transactions offer it, and it answers what ListSteps filtered would.
func TestOpenSteps(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{{"with the log", Options{WAL: true}}, {"without", Options{}}} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, tc.opts, true)
			e := &kernel.Execution{ID: "01a235ca-ea3c-7000-88d4-000000000001", Tenant: "t", AgentID: "a", Status: kernel.ExecRunning,
				CreatedAt: time.Unix(1, 0).UTC(), UpdatedAt: time.Unix(1, 0).UTC(), LastSeq: 1}
			statuses := []kernel.StepStatus{kernel.StepSucceeded, kernel.StepExecuting, kernel.StepFailed, kernel.StepAwaitingApproval,
				kernel.StepCancelled, kernel.StepInterrupted, kernel.StepSucceeded}
			pad := strings.Repeat("x", 10000)
			err := s.Update(context.Background(), func(tx kernel.Tx) error {
				if err := tx.PutExecution(e); err != nil {
					return err
				}
				if err := tx.AppendEvent("t", kernel.Event{ExecutionID: e.ID, Seq: 1, Type: kernel.EvExecutionCreated, Time: e.CreatedAt, Payload: json.RawMessage(`{"agent_id":"a"}`)}); err != nil {
					return err
				}
				for i, st := range statuses {
					step := &kernel.Step{ID: fmt.Sprintf("s%d", i), ExecutionID: e.ID, Tenant: "t", Kind: "tool_call", Target: "t",
						Args: json.RawMessage(`"` + pad + `"`), Result: json.RawMessage(`"` + pad + `"`), ArgsHash: strings.Repeat("a", 64),
						Status: st, Seq: uint64(10 - i), CreatedAt: e.CreatedAt}
					if err := tx.PutStep(step); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			err = s.Update(context.Background(), func(tx kernel.Tx) error {
				l, ok := tx.(kernel.OpenStepsLister)
				if !ok {
					t.Fatalf("a write transaction (%T) does not offer OpenSteps", tx)
				}
				open, err := l.OpenSteps("t", e.ID)
				if err != nil {
					return err
				}
				all, err := tx.ListSteps("t", e.ID)
				if err != nil {
					return err
				}
				var want, got []string
				for _, st := range all {
					if !st.Status.Terminal() {
						want = append(want, st.ID)
					}
				}
				for _, st := range open {
					got = append(got, st.ID)
					if string(st.Args) != `"`+pad+`"` {
						t.Errorf("open step %s lost its arguments", st.ID)
					}
				}
				if strings.Join(got, ",") != strings.Join(want, ",") || len(got) != 3 {
					t.Errorf("OpenSteps = %v, want %v (ListSteps' open ones, in seq order)", got, want)
				}
				other, err := l.OpenSteps("t", "01a235ca-ea3c-7000-88d4-000000000002")
				if err != nil || len(other) != 0 {
					t.Errorf("OpenSteps of another execution: %v, %v", other, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
