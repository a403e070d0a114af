package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// t0 is the fixtures' epoch (UTC, microsecond precision).
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.UTC)

// at returns t0 + d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// execID returns the n-th execution id. Ids are shaped like UUIDv7 and sort
// (as bytes) in n order, as creation order does for real ids.
func execID(n int) string { return fmt.Sprintf("01960000-0000-7000-8000-%012d", n) }

// update runs fn in s.Update and fails the test on error. fn may run on
// another goroutine, so it must report with t.Error, never t.Fatal, and
// return an error to stop.
func update(t testing.TB, s kernel.Store, fn func(tx kernel.Tx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

// view runs fn in s.View and fails the test on error.
func view(t testing.TB, s kernel.Store, fn func(tx kernel.ReadTx) error) {
	t.Helper()
	if err := s.View(context.Background(), fn); err != nil {
		t.Fatalf("View: %v", err)
	}
}

// newExecution returns a pending execution of agent-1 created at t0.
func newExecution(tenant, id string) *kernel.Execution {
	return &kernel.Execution{
		ID:        id,
		Tenant:    tenant,
		AgentID:   "agent-1",
		Status:    kernel.ExecPending,
		Input:     json.RawMessage(`{"q":"hello"}`),
		CreatedAt: t0,
		UpdatedAt: t0,
	}
}

// create writes e (with LastSeq 1) and its execution.created event, as the
// kernel does. It copies e, so fn can be re-run.
func create(tx kernel.Tx, e *kernel.Execution) error {
	c := *e
	c.LastSeq = 1
	if err := tx.PutExecution(&c); err != nil {
		return err
	}
	return tx.AppendEvent(c.Tenant, kernel.Event{
		ExecutionID: c.ID, Seq: 1, Type: kernel.EvExecutionCreated, Time: c.CreatedAt,
		Payload: json.RawMessage(`{"agent_id":"` + c.AgentID + `"}`),
	})
}

// mustCreate creates each execution in its own Update.
func mustCreate(t testing.TB, s kernel.Store, execs ...*kernel.Execution) {
	t.Helper()
	for _, e := range execs {
		update(t, s, func(tx kernel.Tx) error { return create(tx, e) })
	}
}

// mutate reads an execution in tx, applies fn and writes it back.
func mutate(tx kernel.Tx, tenant, id string, fn func(e *kernel.Execution)) error {
	e, err := tx.Execution(tenant, id)
	if err != nil {
		return err
	}
	fn(e)
	return tx.PutExecution(e)
}

// appendEvents appends events of the given types after the execution's
// LastSeq and advances it. Step events name stepID in their payload.
func appendEvents(tx kernel.Tx, tenant, id, stepID string, types ...kernel.EventType) error {
	e, err := tx.Execution(tenant, id)
	if err != nil {
		return err
	}
	for _, typ := range types {
		e.LastSeq++
		payload := json.RawMessage(`{}`)
		if stepID != "" {
			payload = json.RawMessage(`{"step_id":"` + stepID + `","kind":"tool_call","target":"web.search"}`)
		}
		if err := tx.AppendEvent(tenant, kernel.Event{
			ExecutionID: id, Seq: e.LastSeq, Type: typ, Time: at(time.Duration(e.LastSeq) * time.Millisecond), Payload: payload,
		}); err != nil {
			return err
		}
	}
	return tx.PutExecution(e)
}

// wantNotFound fails unless err matches kernel.ErrNotFound.
func wantNotFound(t testing.TB, what string, err error) {
	t.Helper()
	if !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("%s: got error %v, want one matching kernel.ErrNotFound", what, err)
	}
}

// wantConflict fails unless err matches kernel.ErrConflict.
func wantConflict(t testing.TB, what string, err error) {
	t.Helper()
	if !errors.Is(err, kernel.ErrConflict) {
		t.Errorf("%s: got error %v, want one matching kernel.ErrConflict", what, err)
	}
}

// sameJSON fails unless got and want marshal to the same JSON.
func sameJSON(t testing.TB, what string, got, want any) {
	t.Helper()
	g, err := json.Marshal(got)
	if err != nil {
		t.Errorf("%s: marshal got: %v", what, err)
		return
	}
	w, err := json.Marshal(want)
	if err != nil {
		t.Errorf("%s: marshal want: %v", what, err)
		return
	}
	if !bytes.Equal(g, w) {
		t.Errorf("%s:\n got  %s\n want %s", what, g, w)
	}
}

// sameStrings fails unless got equals want.
func sameStrings(t testing.TB, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %q\n want %q", what, got, want)
	}
}

// ids returns the ids of executions.
func ids(execs []*kernel.Execution) []string {
	out := make([]string, len(execs))
	for i, e := range execs {
		out[i] = e.ID
	}
	return out
}

// refs renders dispatch refs as "tenant/id@offset" (offset from t0).
func refs(rs []kernel.DispatchRef) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Tenant + "/" + r.ExecutionID + "@" + r.At.Sub(t0).String()
	}
	return out
}

// approvalRefs renders approval refs as "tenant/id@offset".
func approvalRefs(rs []kernel.ApprovalRef) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Tenant + "/" + r.ApprovalID + "@" + r.At.Sub(t0).String()
	}
	return out
}

// readInt reads a decimal counter (0 when absent).
func readInt(tx kernel.ReadTx, tenant, k string) (int, error) {
	v, err := tx.Counter(tenant, k)
	if err != nil || v == nil {
		return 0, err
	}
	return strconv.Atoi(string(v))
}

// addInt adds d to a decimal counter.
func addInt(tx kernel.Tx, tenant, k string, d int) error {
	n, err := readInt(tx, tenant, k)
	if err != nil {
		return err
	}
	return tx.PutCounter(tenant, k, []byte(strconv.Itoa(n+d)))
}
