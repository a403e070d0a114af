package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// TestKeyRevokedOnAnotherReplica: an observer's event stream is open on
// replica B; its key is revoked through replica A. The stream on B ends as
// soon as B hears of the revocation, before any event written after it:
// an observer whose key is revoked sees no more of the agent's traffic.
// Before the fix B went on streaming until its next heartbeat (15 s).
func TestKeyRevokedOnAnotherReplica(t *testing.T) {
	cfg := fast()
	cfg.LeaseTimeout, cfg.DispatchTimeout = 10*time.Second, 2*time.Second // no lease runs out here
	envs := replicas(t, 2, testkit.Options{Config: cfg})
	a, b := envs[0], envs[1]
	release := make(chan struct{})
	agent := testkit.NewAgent("watched", secret, a.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		for i := range 3 {
			if _, err := r.Step(ctx, "tool_call", "search", map[string]int{"i": i}, testkit.StepOpts{}, func() (any, error) { return i, nil }); err != nil {
				return nil, err
			}
		}
		return "done", nil
	})
	defer agent.Close()
	a.RegisterAgent(agent, "")
	var key wire.CreatedKey
	if _, err := a.Admin("POST", "/v0/tenants/default/keys", wire.KeyRequest{Role: "approver", Principal: "watcher"}, &key); err != nil {
		t.Fatal(err)
	}
	id := a.CreateExecution("watched", nil)
	// The agent holds the dispatch until released: the log stands still.
	eventually(t, 10*time.Second, "the agent holds the dispatch", func() (bool, string) { return agent.Running() == 1, "" })

	seen := make(chan uint64, 1024)
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		done <- client.New(b.URL, client.WithAPIKey(key.Key)).Watch(ctx, id, 0, func(it client.StreamItem) error {
			if it.Event != nil {
				seen <- it.Event.Seq
			}
			return nil
		})
	}()
	select {
	case <-seen:
	case err := <-done:
		t.Fatalf("the stream on B ended before its first event: %v", err)
	}
	if _, err := a.Admin("DELETE", "/v0/tenants/default/keys/"+key.KeyID, nil, nil); err != nil {
		t.Fatal(err)
	}
	var x kernel.Execution
	if _, err := a.Admin("GET", "/v0/executions/"+id, nil, &x); err != nil {
		t.Fatal(err)
	}
	revokedAt := x.LastSeq
	close(release)
	if x := a.WaitTerminal(id, 30*time.Second); x.Status != kernel.ExecCompleted {
		t.Fatalf("execution: %s", x.Status)
	}
	err := <-done
	close(seen)
	for seq := range seen {
		if seq > revokedAt {
			t.Errorf("event %d, written after the key was revoked (at %d), streamed to its holder on the other replica", seq, revokedAt)
		}
	}
	if err == nil {
		t.Error("the stream of the revoked key ran to the execution's end")
	}
}
