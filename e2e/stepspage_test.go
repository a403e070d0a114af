package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/sdk/client"
	"github.com/wicket-run/wicket/server/wire"
)

// TestStepsArePaged: GET /v0/executions/{id}/steps answered every step of
// an execution in one body, arguments and results included: 200 steps of
// 900 KB made a 180 MB answer, 600 MB more kernel memory and another
// tenant's steps wait half a second, and nothing bounded the number of
// steps. It now answers pages: at most `limit` (1000) steps, cut once their
// records take 8 MiB, with `next_cursor` to follow; following the cursors
// yields every step once, in order, and the Go client does so by itself.
func TestStepsArePaged(t *testing.T) {
	cfg := fast()
	cfg.LeaseTimeout = time.Minute // a session's steps here may take long under -race
	env := testkit.Start(t, testkit.Options{Dir: t.TempDir(), Config: cfg})
	if _, err := env.Admin("POST", "/v0/agents", map[string]any{"id": "gate", "secret": secret}, nil); err != nil {
		t.Fatal(err)
	}
	var s wire.Session
	if _, err := env.Admin("POST", "/v0/sessions", map[string]any{"agent_id": "gate"}, &s); err != nil {
		t.Fatal(err)
	}
	id := s.Execution.ID
	lease := map[string]string{wire.HeaderDispatchID: s.DispatchID, wire.HeaderDispatchAttempt: fmt.Sprint(s.DispatchAttempt)}
	pad := strings.Repeat("x", 600<<10)
	const n = 24 // 14 MiB of arguments: more than one page's bytes
	for i := range n {
		var d wire.StepDecision
		if _, err := testkit.BearerWithHeaders(env.URL, testkit.AdminKey, "POST", "/v0/executions/"+id+"/steps", lease,
			map[string]any{"kind": "local", "target": "t", "args": map[string]any{"i": i, "pad": pad}, "result": i}, &d); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	page := func(query string) (wire.StepList, int, error) {
		var l wire.StepList
		st, err := env.Admin("GET", "/v0/executions/"+id+"/steps"+query, nil, &l)
		return l, st, err
	}
	var seen []uint64
	pages := 0
	for cursor := ""; ; pages++ {
		q := ""
		if cursor != "" {
			q = "?cursor=" + cursor
		}
		l, _, err := page(q)
		if err != nil {
			t.Fatal(err)
		}
		size := 0
		for _, st := range l.Steps {
			seen = append(seen, st.Seq)
			size += len(st.Args)
		}
		if len(l.Steps) == 0 || size > kernel.MaxStepsPageBytes+len(l.Steps[len(l.Steps)-1].Args) {
			t.Fatalf("a page of %d steps, %d bytes of arguments", len(l.Steps), size)
		}
		if cursor = l.NextCursor; cursor == "" {
			break
		}
	}
	if pages < 1 || len(seen) != n {
		t.Fatalf("%d steps in %d pages, want %d in at least 2", len(seen), pages+1, n)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Fatalf("steps out of order or repeated: %v", seen)
		}
	}
	l, _, err := page("?limit=5")
	if err != nil || len(l.Steps) != 5 || l.NextCursor == "" {
		t.Fatalf("limit=5: %d steps, next %q, %v", len(l.Steps), l.NextCursor, err)
	}
	for _, q := range []string{"?limit=0", "?limit=1001", "?cursor=abc", "?cursor=-1"} {
		if _, st, err := page(q); st != http.StatusBadRequest {
			t.Errorf("%s: %d %v, want 400", q, st, err)
		}
	}
	all, err := client.New(env.URL, client.WithAPIKey(testkit.AdminKey)).Steps(context.Background(), id)
	if err != nil || len(all) != n {
		t.Fatalf("the Go client's Steps: %d steps, %v", len(all), err)
	}
}
