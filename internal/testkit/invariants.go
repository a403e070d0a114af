package testkit

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/wicket-run/wicket/kernel"
)

// CheckLog verifies the event-log invariants of docs/durability.md for one execution:
// seq starts at 1 and is contiguous; execution.created is first; a terminal
// execution event, if any, is last and unique; every step.* event names
// step_id, kind and target; every step has at most one terminal event and
// nothing of it follows that event; no step succeeds or fails without
// having been told to execute first.
func CheckLog(evs []kernel.Event) error {
	if len(evs) == 0 {
		return fmt.Errorf("empty log")
	}
	if evs[0].Type != kernel.EvExecutionCreated {
		return fmt.Errorf("first event is %s, want execution.created", evs[0].Type)
	}
	terminalSteps := map[string]kernel.EventType{}
	executing := map[string]bool{}
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			return fmt.Errorf("event %d has seq %d: log is not contiguous from 1", i, ev.Seq)
		}
		switch ev.Type {
		case kernel.EvExecutionCompleted, kernel.EvExecutionFailed, kernel.EvExecutionCancelled:
			if i != len(evs)-1 {
				return fmt.Errorf("terminal %s at seq %d is followed by %s", ev.Type, ev.Seq, evs[i+1].Type)
			}
		}
		if !strings.HasPrefix(string(ev.Type), "step.") {
			continue
		}
		var p struct {
			StepID string `json:"step_id"`
			Kind   string `json:"kind"`
			Target string `json:"target"`
		}
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			return fmt.Errorf("seq %d %s: payload: %v", ev.Seq, ev.Type, err)
		}
		if p.StepID == "" || p.Kind == "" || p.Target == "" {
			return fmt.Errorf("seq %d %s does not name step_id, kind and target: %s", ev.Seq, ev.Type, ev.Payload)
		}
		if prev, done := terminalSteps[p.StepID]; done {
			return fmt.Errorf("seq %d %s for step %s after its terminal %s", ev.Seq, ev.Type, p.StepID, prev)
		}
		switch ev.Type {
		case kernel.EvStepExecuting:
			executing[p.StepID] = true
		case kernel.EvStepSucceeded:
			if !executing[p.StepID] {
				return fmt.Errorf("seq %d: step %s succeeded without step.executing", ev.Seq, p.StepID)
			}
			terminalSteps[p.StepID] = ev.Type
		case kernel.EvStepFailed, kernel.EvStepCancelled:
			terminalSteps[p.StepID] = ev.Type
		}
	}
	return nil
}

// Types lists the event types of a log, in order.
func Types(evs []kernel.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = string(e.Type)
	}
	return out
}

// Count returns how many events of typ the log holds.
func Count(evs []kernel.Event, typ kernel.EventType) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ {
			n++
		}
	}
	return n
}
