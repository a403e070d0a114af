package console_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/server/console"
	"github.com/wicket-run/wicket/server/wire"
)

// BenchmarkApprovalsPage measures GET /ui/approvals over HTTP for an
// approver with 20 pending approvals: the session and key check, the API
// calls made in process, and the rendering.
//
//	go test -run '^$' -bench ApprovalsPage -benchtime 200x ./server/console
func BenchmarkApprovalsPage(b *testing.B) {
	env := testkit.Start(b, testkit.Options{Engines: []plugins.Engine{rules.New()}, UI: console.Handler(console.Options{})})
	policy := "default_action: allow\nrules:\n  - id: gate\n    priority: 1\n    when: {target: deploy}\n    then: {decision: require_approval}\n"
	a := testkit.NewAgent("bot", "bot-secret-0123456789", env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		_, err := r.Step(ctx, "tool_call", "deploy", map[string]any{"service": "billing", "notes": strings.Repeat("n", 300)}, testkit.StepOpts{}, func() (any, error) { return nil, nil })
		return nil, err
	})
	defer a.Close()
	env.RegisterAgent(a, "")
	if _, err := env.Admin("POST", "/v0/policies/bot", map[string]any{"bundle": policy}, nil); err != nil {
		b.Fatal(err)
	}
	const n = 20
	for range n {
		env.CreateExecution("bot", nil)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var list wire.ApprovalList
		if _, err := env.Admin("GET", "/v0/approvals?status=pending", nil, &list); err != nil {
			b.Fatal(err)
		}
		if len(list.Approvals) == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d pending approvals, want %d", len(list.Approvals), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var k wire.CreatedKey
	if _, err := env.Admin("POST", "/v0/tenants/default/keys", map[string]any{"role": kernel.RoleApprover, "principal": "alice"}, &k); err != nil {
		b.Fatal(err)
	}
	br := newBrowser(b, env.URL)
	br.signIn(k.Key)
	b.ResetTimer()
	for range b.N {
		resp, page := br.do("GET", "/ui/approvals", nil, nil)
		if resp.StatusCode != http.StatusOK || strings.Count(page, `class="card approval"`) != n {
			b.Fatalf("approvals page: %d", resp.StatusCode)
		}
	}
}
