package e2e

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/internal/webhook"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// eventTime returns the time of the first event of type typ.
func eventTime(t *testing.T, evs []kernel.Event, typ string) time.Time {
	t.Helper()
	for _, ev := range evs {
		if string(ev.Type) == typ {
			return ev.Time
		}
	}
	t.Fatalf("no %s in %v", typ, testkit.Types(evs))
	return time.Time{}
}

// A dispatch queued due now is claimed in the transaction that queues it
// while a delivery slot is free (its webhook leaves on commit); when every
// slot is busy, the dispatcher claims it later, and nothing is lost either
// way. Events of one transaction share its time.
func TestDispatchClaimedInTheQueueingCommit(t *testing.T) {
	cfg := kernel.Config{DeliveryConcurrency: 1, LeaseTimeout: 5 * time.Second, DispatchTimeout: 2 * time.Second, ReapInterval: 20 * time.Millisecond}
	env := testkit.Start(t, testkit.Options{Config: cfg})
	agent := testkit.NewAgent("claimer", secret, env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		return "done", nil
	})
	agent.SlowAck = 300 * time.Millisecond // holds the only delivery slot
	defer agent.Close()
	env.RegisterAgent(agent, "")

	first := env.CreateExecution("claimer", 1)
	second := env.CreateExecution("claimer", 2) // the slot is busy with the first
	for _, id := range []string{first, second} {
		if x := env.WaitTerminal(id, 20*time.Second); x.Status != kernel.ExecCompleted {
			t.Fatalf("%s: %s", id, x.Status)
		}
	}
	evs := mustCheckLog(t, env, first)
	created := eventTime(t, evs, string(kernel.EvExecutionCreated))
	if claimed := eventTime(t, evs, string(kernel.EvDispatchClaimed)); !claimed.Equal(created) {
		t.Fatalf("first: claimed at %s, created at %s: want one transaction", claimed, created)
	}
	evs = mustCheckLog(t, env, second)
	if claimed, created := eventTime(t, evs, string(kernel.EvDispatchClaimed)), eventTime(t, evs, string(kernel.EvExecutionCreated)); !claimed.After(created) {
		t.Fatalf("second: claimed at %s, created at %s: want the dispatcher's later claim", claimed, created)
	}
	deadline := time.Now().Add(5 * time.Second)
	for env.Kernel.DeliveriesInFlight() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d delivery slots still held", env.Kernel.DeliveriesInFlight())
		}
		time.Sleep(5 * time.Millisecond)
	}
	resp, err := http.Get(env.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "\nwicket_deliveries_in_flight 0\n") {
		t.Fatalf("metrics do not show the free slots:\n%s", body)
	}
}

// A kernel that has not been started claims nothing: executions created
// before Start are claimed by its dispatcher once it runs.
func TestNoClaimBeforeStart(t *testing.T) {
	dir := t.TempDir()
	st, err := bbolt.Open(filepath.Join(dir, "wicket.db"), bbolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k, err := kernel.New(st, webhook.New(), nil, nil, kernel.Config{ReapInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	agent := testkit.NewAgent("early", secret, "http://127.0.0.1:1", nil)
	defer agent.Close()
	if _, err := k.PutAgent(ctx, kernel.Agent{Tenant: kernel.DefaultTenant, ID: "early", WebhookURL: agent.WebhookURL(), Secret: string(agent.Secret)}); err != nil {
		t.Fatal(err)
	}
	x, _, err := k.CreateExecution(ctx, kernel.CreateExecution{AgentID: "early"})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := k.Events(ctx, kernel.DefaultTenant, x.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if testkit.Count(evs, kernel.EvDispatchClaimed) != 0 || k.DeliveriesInFlight() != 0 {
		t.Fatalf("claimed before Start: %v", testkit.Types(evs))
	}
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer k.Close(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for agent.Webhooks.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the dispatcher never delivered the execution created before Start")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
