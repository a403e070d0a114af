package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/internal/wasmwarm"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/rego"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/plugins/wasm"
	"github.com/wicket-run/wicket/server/wire"
)

// decisionRules is the test policy in the native format: one target per
// decision the kernel can give.
const decisionRules = `default_action: deny
rules:
  - id: read
    priority: 1
    when: {target: read}
    then: {decision: allow}
  - id: no-delete
    priority: 2
    when: {target: delete}
    then: {decision: deny, reason: deletes are denied}
  - id: limited
    priority: 3
    when: {target: limited}
    then:
      decision: allow
      rate_limit: {max_calls: 2, window: 1h, per: execution}
  - id: deploy
    priority: 4
    when: {target: deploy}
    then:
      decision: require_approval
      reason: deploys need a human
      approval_config: {approvers: [alice], timeout: 10m, message: "deploy?"}
  - id: deploy-fast
    priority: 5
    when: {target: deploy-fast}
    then:
      decision: require_approval
      approval_config: {timeout: 300ms}
  - id: nuke
    priority: 6
    when: {target: nuke}
    then: {decision: abort, reason: never}
`

// decisionRego is the same policy in Rego.
const decisionRego = `package wicket

decision := {"decision": "allow", "rule_id": "read"} if input.step.target == "read"

decision := {"decision": "deny", "rule_id": "no-delete", "reason": "deletes are denied"} if input.step.target == "delete"

decision := {"decision": "allow", "rule_id": "limited", "rate_limit": {"max_calls": 2, "window": "1h", "per": "execution"}} if input.step.target == "limited"

decision := {"decision": "require_approval", "rule_id": "deploy", "reason": "deploys need a human",
	"approval": {"approvers": ["alice"], "timeout": "10m", "message": "deploy?"}} if input.step.target == "deploy"

decision := {"decision": "require_approval", "rule_id": "deploy-fast", "approval": {"timeout": "300ms"}} if input.step.target == "deploy-fast"

decision := {"decision": "abort", "rule_id": "nuke", "reason": "never"} if input.step.target == "nuke"
`

// engineCase is one engine's form of the test policy.
type engineCase struct {
	engine string
	files  map[string]string
	eng    func() plugins.Engine
	// archive, when set, is uploaded as a .tar.gz instead of the JSON form.
	archive func(t testing.TB) []byte
}

var (
	wasmMu    sync.Mutex
	wasmBuilt = map[string][]byte{}
	wasmDir   string
	wasmCache string
)

// buildWasm builds the Go SDK policy in testdata/<name> once per test binary.
func buildWasm(t testing.TB, name string) []byte {
	t.Helper()
	wasmMu.Lock()
	defer wasmMu.Unlock()
	if b, ok := wasmBuilt[name]; ok {
		return b
	}
	if wasmDir == "" {
		dir, err := os.MkdirTemp("", "wicket-e2e-wasm-")
		if err != nil {
			t.Fatal(err)
		}
		wasmDir, wasmCache = dir, filepath.Join(dir, "cache")
	}
	out := filepath.Join(wasmDir, name+".wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, ".")
	cmd.Dir = filepath.Join("testdata", name)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if raceEnabled {
		// Under -race wazero compiles a Go module in minutes on a loaded
		// machine: let a normal build fill the engines' disk cache.
		if err := wasmwarm.Warm(wasmCache, out); err != nil {
			t.Logf("%v (continuing without)", err)
		}
	}
	wasmBuilt[name] = b
	return b
}

// wasmArchive packs a wasm bundle as a .tar.gz.
func wasmArchive(t testing.TB, manifest string, module []byte) []byte {
	t.Helper()
	b, err := bundle.LoadFiles(map[string][]byte{"bundle.yaml": []byte(manifest), "policy.wasm": module})
	if err != nil {
		t.Fatal(err)
	}
	ar, err := b.TarGz()
	if err != nil {
		t.Fatal(err)
	}
	return ar
}

func policyEngines() []engineCase {
	return []engineCase{
		{engine: "wasm", eng: func() plugins.Engine {
			return wasm.New(wasm.Config{CacheDir: wasmCache, Builtins: rego.NewHostBuiltins()})
		},
			archive: func(t testing.TB) []byte {
				return wasmArchive(t, "name: decisions\nrevision: \"1\"\nengine: wasm\nabi: wicket\ndefault_action: deny\n", buildWasm(t, "decisions-wasm"))
			}},
		{engine: "rules", files: map[string]string{"bundle.yaml": "name: decisions\nrevision: \"1\"\nengine: rules\n", "rules.yaml": decisionRules}, eng: func() plugins.Engine { return rules.New() }},
		{engine: "rego", files: map[string]string{"bundle.yaml": "name: decisions\nrevision: \"1\"\nengine: rego\nentrypoint: data.wicket.decision\ndefault_action: deny\n", "policy.rego": decisionRego}, eng: func() plugins.Engine { return rego.New() }},
	}
}

// scriptAgent runs the targets in order; denied and rate_limited decisions
// are recorded and the script goes on, blocked ends the attempt.
type scriptAgent struct {
	mu        sync.Mutex
	decisions map[string][]string // execution id -> "target=decision" per submission
}

func (s *scriptAgent) handler(targets ...string) testkit.Handler {
	return func(ctx context.Context, r *testkit.Run) (any, error) {
		for _, tg := range targets {
			_, err := r.Step(ctx, "tool_call", tg, map[string]string{"x": "y"}, testkit.StepOpts{}, func() (any, error) { return tg + "-ok", nil })
			dec := kernel.DecisionProceed
			var de *testkit.DecisionError
			switch {
			case err == nil:
				if d := r.Decisions[len(r.Decisions)-1]; d.Decision == kernel.DecisionReplay {
					dec = kernel.DecisionReplay
				}
			case errors.As(err, &de):
				dec = de.Decision.Decision
			default:
				return nil, err
			}
			s.mu.Lock()
			s.decisions[r.ExecutionID] = append(s.decisions[r.ExecutionID], tg+"="+string(dec))
			s.mu.Unlock()
			if dec == kernel.DecisionBlocked || dec == kernel.DecisionExecutionTerminal {
				return nil, err
			}
		}
		return "done", nil
	}
}

// waitGot waits until the agent recorded n decisions for id.
func (s *scriptAgent) waitGot(t *testing.T, id string, n int) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		have := len(s.decisions[id])
		s.mu.Unlock()
		if have >= n || time.Now().After(deadline) {
			return s.got(id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *scriptAgent) got(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.decisions[id], " ")
}

func pendingApproval(t *testing.T, env *testkit.Env, execID string) kernel.Approval {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var list struct {
			Approvals []kernel.Approval `json:"approvals"`
		}
		if _, err := env.Admin("GET", "/v0/approvals?status=pending", nil, &list); err != nil {
			t.Fatal(err)
		}
		for _, a := range list.Approvals {
			if a.ExecutionID == execID {
				return a
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no pending approval for %s", execID)
	return kernel.Approval{}
}

// TestPolicyDecisionsPerEngine drives every decision through a real agent
// for each engine: proceed, denied, rate_limited, blocked then grant →
// resume → proceed, blocked then deny → denied, expiry, and abort. The rate
// limit's window is an hour: fixed windows are aligned to the clock, and a
// minute's boundary crossed between the calls and their re-delivery would
// reset the count.
func TestPolicyDecisionsPerEngine(t *testing.T) {
	for _, ec := range policyEngines() {
		t.Run(ec.engine, func(t *testing.T) {
			cfg := fast()
			cfg.LeaseTimeout = 5 * time.Second
			cfg.DispatchTimeout = time.Second
			var archive []byte
			if ec.archive != nil {
				archive = ec.archive(t)
			}
			env := testkit.Start(t, testkit.Options{Config: cfg, Engines: []plugins.Engine{ec.eng()}})
			var rec kernel.BundleRecord
			var err error
			if archive != nil {
				_, err = testkit.BearerWithHeaders(env.URL, testkit.AdminKey, "PUT", "/v0/bundles/decisions", map[string]string{"Content-Type": "application/gzip"}, archive, &rec)
			} else {
				_, err = env.Admin("PUT", "/v0/bundles/decisions", map[string]any{"engine": ec.engine, "files": ec.files}, &rec)
			}
			if err != nil {
				t.Fatalf("upload bundle: %v", err)
			}
			if rec.Engine != ec.engine || len(rec.Digest) != 64 {
				t.Fatalf("bundle record %+v", rec)
			}
			sa := &scriptAgent{decisions: map[string][]string{}}
			mk := func(id string, targets ...string) *testkit.Agent {
				a := testkit.NewAgent(id, secret, env.URL, sa.handler(targets...))
				env.RegisterAgent(a, "decisions")
				t.Cleanup(a.Close)
				return a
			}

			// 1. proceed, denied, rate_limited, blocked → grant → proceed.
			mk("grant", "read", "delete", "limited", "limited", "limited", "deploy")
			id := env.CreateExecution("grant", nil)
			ap := pendingApproval(t, env, id)
			if x := env.Execution(id); x.Status != kernel.ExecBlocked {
				t.Fatalf("status %s, want blocked", x.Status)
			}
			if got := sa.waitGot(t, id, 6); got != "read=proceed delete=denied limited=proceed limited=proceed limited=rate_limited deploy=blocked" {
				t.Fatalf("first attempt: %s", got)
			}
			if st, _ := env.Admin("POST", "/v0/approvals/"+ap.ID+"/grant", map[string]any{"decided_by": "mallory"}, nil); st != 403 {
				t.Errorf("grant by a non-approver: %d, want 403", st)
			}
			if st, _ := env.Admin("POST", "/v0/approvals/"+ap.ID+"/grant", map[string]any{"decided_by": "alice", "request_hash": strings.Repeat("0", 64)}, nil); st != 409 {
				t.Errorf("grant with a wrong request_hash: %d, want 409", st)
			}
			if _, err := env.Admin("POST", "/v0/approvals/"+ap.ID+"/grant", map[string]any{"decided_by": "alice", "rationale": "ship it", "request_hash": ap.RequestHash}, nil); err != nil {
				t.Fatalf("grant: %v", err)
			}
			x := env.WaitTerminal(id, 10*time.Second)
			if x.Status != kernel.ExecCompleted {
				t.Fatalf("after grant: %s %s", x.Status, x.Error)
			}
			want := "read=proceed delete=denied limited=proceed limited=proceed limited=rate_limited deploy=blocked " +
				"read=replay delete=denied limited=replay limited=replay limited=rate_limited deploy=proceed"
			if got := sa.got(id); got != want {
				t.Errorf("decisions\n got %s\nwant %s", got, want)
			}
			evs := mustCheckLog(t, env, id)
			for _, typ := range []kernel.EventType{kernel.EvStepDenied, kernel.EvStepRateLimited, kernel.EvStepAwaitingApproval, kernel.EvApprovalRequested,
				kernel.EvExecutionBlocked, kernel.EvApprovalGranted, kernel.EvExecutionResumed} {
				if testkit.Count(evs, typ) == 0 {
					t.Errorf("no %s in %v", typ, testkit.Types(evs))
				}
			}
			checkDecisionEvents(t, evs, ec.engine, rec.Digest)

			// 2. blocked → deny → the step is denied on resume.
			mk("refuse", "deploy", "read")
			id2 := env.CreateExecution("refuse", nil)
			ap2 := pendingApproval(t, env, id2)
			if _, err := env.Admin("POST", "/v0/approvals/"+ap2.ID+"/deny", map[string]any{"decided_by": "alice", "rationale": "not today"}, nil); err != nil {
				t.Fatalf("deny: %v", err)
			}
			if x := env.WaitTerminal(id2, 10*time.Second); x.Status != kernel.ExecCompleted {
				t.Fatalf("after deny: %s", x.Status)
			}
			if got := sa.got(id2); got != "deploy=blocked deploy=denied read=proceed" {
				t.Errorf("deny path: %s", got)
			}
			mustCheckLog(t, env, id2)

			// 3. an approval nobody answers expires: the execution fails approval_expired.
			mk("expire", "deploy-fast")
			id3 := env.CreateExecution("expire", nil)
			x3 := env.WaitTerminal(id3, 10*time.Second)
			if x3.Status != kernel.ExecFailed || x3.Reason != "approval_expired" {
				t.Errorf("expiry: %s %s", x3.Status, x3.Reason)
			}
			evs3 := mustCheckLog(t, env, id3)
			if testkit.Count(evs3, kernel.EvApprovalExpired) != 1 {
				t.Errorf("expiry log %v", testkit.Types(evs3))
			}

			// 4. abort fails the execution policy_abort.
			mk("aborter", "read", "nuke", "read")
			id4 := env.CreateExecution("aborter", nil)
			x4 := env.WaitTerminal(id4, 10*time.Second)
			if x4.Status != kernel.ExecFailed || x4.Reason != "policy_abort" {
				t.Errorf("abort: %s %s", x4.Status, x4.Reason)
			}
			if got := sa.waitGot(t, id4, 2); got != "read=proceed nuke=execution_terminal" {
				t.Errorf("abort path: %s", got)
			}
			mustCheckLog(t, env, id4)

			// The dry run answers the same without recording anything.
			var ev wire.PolicyEvalResponse
			if _, err := env.Admin("POST", "/v0/policy/eval", map[string]any{"agent_id": "grant", "step": map[string]any{"kind": "tool_call", "target": "delete"}}, &ev); err != nil {
				t.Fatal(err)
			}
			if ev.Action != "deny" || ev.RuleID != "no-delete" || ev.Bundle.Engine != ec.engine {
				t.Errorf("dry run: %+v", ev)
			}
		})
	}
}

// checkDecisionEvents: decision events name bundle, revision, digest, engine, rule and time.
func checkDecisionEvents(t *testing.T, evs []kernel.Event, engine, digest string) {
	t.Helper()
	n := 0
	for _, ev := range evs {
		if ev.Type != kernel.EvStepAllowed && ev.Type != kernel.EvStepDenied && ev.Type != kernel.EvStepRateLimited && ev.Type != kernel.EvStepAwaitingApproval {
			continue
		}
		n++
		s := string(ev.Payload)
		for _, want := range []string{`"name":"decisions"`, `"revision":"1"`, `"sha256":"` + digest + `"`, `"engine":"` + engine + `"`, `"rule_id":"`, `"eval_ns":`} {
			if !strings.Contains(s, want) {
				t.Errorf("%s payload lacks %s: %s", ev.Type, want, s)
				break
			}
		}
	}
	if n == 0 {
		t.Error("no decision events")
	}
}

// TestBadBundleKeepsRunningRevision: a bundle that fails to load is refused
// whole and the running revision keeps deciding.
func TestBadBundleKeepsRunningRevision(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast(), Engines: []plugins.Engine{rules.New(), rego.New()}})
	good := map[string]any{"engine": "rules", "files": map[string]string{"bundle.yaml": "name: b\nrevision: \"1\"\nengine: rules\n", "rules.yaml": decisionRules}}
	if _, err := env.Admin("PUT", "/v0/bundles/b", good, nil); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]map[string]string{
		"empty predicate": {"bundle.yaml": "name: b\nrevision: \"2\"\nengine: rules\n", "rules.yaml": "rules:\n  - id: x\n    priority: 1\n    when: {arguments: {cmd: {}}}\n    then: {decision: allow}\n"},
		"rego syntax":     {"bundle.yaml": "name: b\nrevision: \"2\"\nengine: rego\n", "policy.rego": "package wicket\ndecision := {\n"},
		"unknown engine":  {"bundle.yaml": "name: b\nrevision: \"2\"\nengine: lua\n", "policy.lua": "return 1"},
	} {
		st, err := env.Admin("PUT", "/v0/bundles/b", map[string]any{"files": bad}, nil)
		if st != 400 {
			t.Errorf("%s: %d %v, want 400", name, st, err)
		}
	}
	ref, ok := env.Host.Live("default", "b")
	if !ok || ref.Revision != "1" {
		t.Fatalf("live revision after refused uploads: %+v %v", ref, ok)
	}
	var rec kernel.BundleRecord
	if _, err := env.Admin("GET", "/v0/bundles/b", nil, &rec); err != nil || rec.Revision != "1" {
		t.Errorf("stored revision: %+v %v", rec, err)
	}
}

// TestUploadReportsEveryProblem: an upload of a bundle with three problems
// in rules.yaml (a duplicate rule id among them) is refused with all three
// in the message and in details.problems, each with file:line, rule and
// field, as `wicket policy build` reports them.
func TestUploadReportsEveryProblem(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Config: fast(), Engines: []plugins.Engine{rules.New()}})
	files := map[string]string{
		"bundle.yaml": "name: three\nengine: rules\n",
		"rules.yaml": `rules:
  - {id: a, then: {decision: allow}}
  - {id: a, then: {decision: allow}}
  - {id: b, then: {decision: maybe}}
  - {id: c, when: {arguments: {cmd: {regex: "("}}}, then: {decision: deny}}
`,
	}
	raw, err := json.Marshal(map[string]any{"files": files})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest("PUT", env.URL+"/v0/bundles/three", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testkit.AdminKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body struct {
		Code    string
		Message string
		Details struct{ Problems []string }
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`rules.yaml:3: rule "a": id: duplicate id (also rules[0])`,
		`rules.yaml:4: rule "b": then.decision: unknown decision "maybe"`,
		`rules.yaml:5: rule "c": when.arguments.cmd: regex: error parsing regexp`,
	}
	if res.StatusCode != http.StatusBadRequest || body.Code != "validation" || len(body.Details.Problems) != len(want) {
		t.Fatalf("%d %+v", res.StatusCode, body)
	}
	for i, w := range want {
		if !strings.HasPrefix(body.Details.Problems[i], w) || !strings.Contains(body.Message, w) {
			t.Errorf("problem %d: %q (message %q), want %q", i, body.Details.Problems[i], body.Message, w)
		}
	}
}
