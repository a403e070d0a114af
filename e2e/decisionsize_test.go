package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/server/wire"
)

// TestHostileDecisionSizes: a bundle author's answer is recorded with every
// step it decides, so its text is held to sizes: a Rego policy answering a
// 900 KB reason (or rule id, approval message, a list of 150
// approvers) made every 100-byte step record 900 KB, and one page of the
// execution's events was 900 MB to build. Such an answer is an engine
// error: the step is denied (fail closed) with a short reason naming the
// field and its ceiling, and nothing large is recorded.
func TestHostileDecisionSizes(t *testing.T) {
	cfg := fast()
	cfg.LeaseTimeout = time.Minute // a session's steps here may take long under -race
	env := testkit.Start(t, testkit.Options{Dir: t.TempDir(), Config: cfg, Engines: []plugins.Engine{rego.New()}})
	big := fmt.Sprintf(`sprintf("%%0%dd", [0])`, 900000)
	for _, tc := range []struct {
		name, decision, field string
	}{
		{"reason", `{"decision": "deny", "reason": ` + big + `}`, "reason"},
		{"rule id", `{"decision": "deny", "rule_id": ` + big + `}`, "rule_id"},
		{"approval message", `{"decision": "require_approval", "approval": {"message": ` + big + `}}`, "approval.message"},
		{"approvers", `{"decision": "require_approval", "approval": {"approvers": [sprintf("a%d", [i]) | some i in numbers.range(1, 150)]}}`, "approval.approvers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "-")
			rego := "package wicket\n\ndecision := " + tc.decision + "\n"
			if _, err := env.Admin("PUT", "/v0/bundles/"+name, map[string]any{"engine": "rego", "files": map[string]string{"policy.rego": rego}}, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := env.Admin("POST", "/v0/agents", map[string]any{"id": name, "secret": secret, "policy": name}, nil); err != nil {
				t.Fatal(err)
			}
			var s wire.Session
			if _, err := env.Admin("POST", "/v0/sessions", map[string]any{"agent_id": name}, &s); err != nil {
				t.Fatal(err)
			}
			lease := map[string]string{wire.HeaderDispatchID: s.DispatchID, wire.HeaderDispatchAttempt: fmt.Sprint(s.DispatchAttempt)}
			var d wire.StepDecision
			st, err := testkit.BearerWithHeaders(env.URL, testkit.AdminKey, "POST", "/v0/executions/"+s.Execution.ID+"/steps", lease,
				map[string]any{"kind": "tool_call", "target": "t", "args": map[string]any{}}, &d)
			if err != nil || st != http.StatusOK {
				t.Fatalf("step: %d %v", st, err)
			}
			if d.Decision != wire.DecisionDenied || d.RuleID != "engine_error" || !strings.Contains(d.Reason, tc.field) || len(d.Reason) > policy.MaxReasonBytes {
				t.Fatalf("decision %s rule %s, reason of %d bytes %.200q; want denied, engine_error, naming %s", d.Decision, d.RuleID, len(d.Reason), d.Reason, tc.field)
			}
			var l struct {
				Events []json.RawMessage `json:"events"`
			}
			if _, err := env.Admin("GET", "/v0/executions/"+s.Execution.ID+"/events?limit=1000", nil, &l); err != nil {
				t.Fatal(err)
			}
			for _, e := range l.Events {
				if len(e) > 16<<10 {
					t.Fatalf("an event of %d bytes was recorded: %.300s", len(e), e)
				}
			}
		})
	}
}
