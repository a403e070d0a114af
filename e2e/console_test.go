package e2e

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/rules"
	"github.com/wicket-run/wicket/server/console"
	"github.com/wicket-run/wicket/server/wire"
)

// updateScreenshots rewrites the console's screenshots in docs/console/
// (go test ./e2e -run TestConsole -update-screenshots).
var updateScreenshots = flag.Bool("update-screenshots", false, "rewrite docs/console/*.png from TestConsole")

// chromium finds Debian's chromium (or another Chromium-based browser), or
// skips the test: the one skip the console's browser tests allow.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("the console's browser tests need Chromium: install Debian's package chromium (apt-get install chromium; .ci/run does)")
	return ""
}

// consolePolicy gates deploys on alice.
const consolePolicy = `default_action: allow
rules:
  - id: prod-deploy
    priority: 1
    when: {target: deploy}
    then:
      decision: require_approval
      approval_config: {approvers: [alice], timeout: 30m, message: "Deploy billing to production?"}
`

// TestConsole drives the console in headless Chromium against a real kernel
// and a real agent: an approver signs in, sees the pending approval's
// arguments and grants it; the execution's page, open in another tab,
// shows the step proceed and the execution complete without a reload; the
// approval records the approver. A client key sees no approval, a key of
// another tenant sees nothing of this one, a POST without the CSRF token
// is refused (from another site and from the console's own origin), and a
// revoked key's session ends.
func TestConsole(t *testing.T) {
	browserPath := chromium(t)
	env := testkit.Start(t, testkit.Options{Config: fast(), Engines: []plugins.Engine{rules.New()},
		UI: console.Handler(console.Options{})})

	// Keys: alice decides approvals, carol runs executions, dave is an
	// approver of another tenant.
	mkKey := func(tenant, role, principal string) wire.CreatedKey {
		var k wire.CreatedKey
		if _, err := env.Admin("POST", "/v0/tenants/"+tenant+"/keys", map[string]any{"role": role, "principal": principal}, &k); err != nil {
			t.Fatalf("key %s/%s: %v", tenant, principal, err)
		}
		return k
	}
	if _, err := env.Admin("POST", "/v0/tenants", map[string]any{"id": "acme"}, nil); err != nil {
		t.Fatal(err)
	}
	alice := mkKey("default", kernel.RoleApprover, "alice")
	carol := mkKey("default", kernel.RoleClient, "carol")
	dave := mkKey("acme", kernel.RoleApprover, "dave")

	notes := "Release notes: " + strings.Repeat("faster invoices, fewer retries; ", 12)
	agent := testkit.NewAgent("deployer", "deployer-secret-0123456789", env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		args := map[string]any{"service": "billing", "version": "v2.3.1", "replicas": 3, "notes": notes}
		if _, err := r.Step(ctx, "tool_call", "deploy", args, testkit.StepOpts{Effect: "remote_mutation"}, func() (any, error) {
			return map[string]any{"rollout": "done"}, nil
		}); err != nil {
			return nil, err
		}
		return map[string]any{"deployed": "billing v2.3.1"}, nil
	})
	defer agent.Close()
	env.RegisterAgent(agent, "")
	if _, err := env.Admin("POST", "/v0/policies/deployer", map[string]any{"bundle": consolePolicy}, nil); err != nil {
		t.Fatal(err)
	}
	exec1 := env.CreateExecution("deployer", map[string]any{"ticket": "OPS-1"})
	exec2 := env.CreateExecution("deployer", map[string]any{"ticket": "OPS-2"})
	ap1, ap2 := pendingApproval(t, env, exec1).ID, pendingApproval(t, env, exec2).ID

	// One browser for the whole test; each window is a browser context of
	// its own (cookies apart) with one tab.
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browserPath), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true))...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	// person opens a browser context (its own cookies) and its first tab.
	person := func() context.Context {
		ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
		t.Cleanup(cancel)
		if err := chromedp.Do(ctx); err != nil {
			t.Fatalf("new browser context: %v", err)
		}
		return ctx
	}
	// within bounds one phase of the test (the browser outlives it).
	within := func(ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := chromedp.Do(c, steps...); err != nil {
			// Say where the browser was, for the failure's reader.
			d, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			page, _ := chromedp.Run(d, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText`))
			t.Fatalf("%s: %v\nthe page:\n%s", what, err, page)
		}
	}
	eval := func(ctx context.Context, js string) string {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		var opts []chromedp.EvaluateOption
		if strings.Contains(js, "fetch(") {
			opts = append(opts, chromedp.EvalAwaitPromise)
		}
		v, err := chromedp.Run(c, chromedp.Evaluate[string](js, opts...))
		if err != nil {
			t.Fatalf("evaluate %s: %v", js, err)
		}
		return v
	}
	text := func(ctx context.Context, sel string) string {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		v, err := chromedp.Run(c, chromedp.TextContent(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return v
	}
	signIn := func(ctx context.Context, key string) {
		t.Helper()
		within(ctx, "sign in",
			chromedp.Navigate(env.URL+"/ui/signin"),
			chromedp.SendKeys(chromedp.ID("key"), key),
			chromedp.Submit(chromedp.ID("key")),
			chromedp.WaitVisible(chromedp.ID("whoami")),
		)
	}
	shot := func(ctx context.Context, name string) {
		if !*updateScreenshots {
			return
		}
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join("..", "docs", "console", name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Alice signs in and lands on the approvals page, both pending.
	approvals := person()
	signIn(approvals, alice.Key)
	card := "#approval-" + ap1
	within(approvals, "approvals page", chromedp.WaitVisible(chromedp.CSS(card)), chromedp.WaitVisible(chromedp.CSS("#approval-"+ap2)))
	if loc := eval(approvals, "location.pathname"); loc != "/ui/approvals" {
		t.Errorf("an approver lands on %s, want /ui/approvals", loc)
	}
	args := text(approvals, card+" .args")
	for _, want := range []string{`"service": "billing"`, `"version": "v2.3.1"`, `"replicas": 3`, "(" + fmt.Sprint(len(notes)) + " characters, expand)", strings.TrimSpace(notes)} {
		if !strings.Contains(args, want) {
			t.Errorf("the approval's arguments do not show %q:\n%s", want, args)
		}
	}
	if folded := eval(approvals, `document.querySelector("`+card+` .args details.fold").open ? "open" : "folded"`); folded != "folded" {
		t.Errorf("the long argument is %s, want folded", folded)
	}
	var a1 wire.Approval
	if _, err := env.Admin("GET", "/v0/approvals/"+ap1, nil, &a1); err != nil {
		t.Fatal(err)
	}
	facts := text(approvals, card+" dl")
	for _, want := range []string{exec1, "deployer", a1.RequestHash, "alice", "Deploy billing to production?", "min left"} {
		if !strings.Contains(facts, want) {
			t.Errorf("the approval card does not show %q:\n%s", want, facts)
		}
	}
	// At a phone's width nothing overflows sideways.
	within(approvals, "phone width", chromedp.EmulateViewport(390, 844))
	if w := eval(approvals, `String(document.documentElement.scrollWidth <= window.innerWidth)`); w != "true" {
		t.Errorf("the approvals page overflows a 390 px viewport")
	}
	shot(approvals, "approvals-phone.png")
	within(approvals, "desktop width", chromedp.EmulateViewport(1280, 900))
	shot(approvals, "approvals.png")

	// The execution's page, in a second window (alice signed in there
	// too), follows the event stream.
	execTab := person()
	signIn(execTab, alice.Key)
	within(execTab, "execution page",
		chromedp.Navigate(env.URL+"/ui/executions/"+exec1),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-type="step.awaiting_approval"]`)),
		chromedp.WaitReady(chromedp.CSS(`#execution[data-connected]`)),
	)
	if st := text(execTab, "#exec-status"); st != "blocked" {
		t.Errorf("execution status shows %q before the grant, want blocked", st)
	}
	eval(execTab, `window.consoleMarker = "same page"; ""`)

	// Grant by keyboard: a rationale, then Enter on the focused Grant button.
	within(approvals, "grant",
		chromedp.SendKeys(chromedp.CSS(card+" textarea"), "ticket OPS-1 checked"),
		chromedp.Focus(chromedp.CSS(card+" button.grant")),
		chromedp.KeyEvent("\r"),
		chromedp.WaitVisible(chromedp.ID("done")),
		chromedp.WaitNotPresent(chromedp.CSS(card)),
	)
	within(execTab, "live timeline",
		chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-type="approval.granted"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-type="step.executing"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-type="step.succeeded"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li[data-type="execution.completed"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#exec-status[data-status="completed"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#steps tr[data-status="succeeded"]`)),
	)
	if m := eval(execTab, `String(window.consoleMarker)`); m != "same page" {
		t.Errorf("the execution page was reloaded (marker %q): the timeline must update live", m)
	}
	if out := text(execTab, "#output"); !strings.Contains(out, "billing v2.3.1") {
		t.Errorf("the execution's output shows %q", out)
	}
	shot(execTab, "execution.png")

	// The approval records alice, by her key; the page lists it as decided.
	if _, err := env.Admin("GET", "/v0/approvals/"+ap1, nil, &a1); err != nil {
		t.Fatal(err)
	}
	if a1.Status != "granted" || a1.DecidedBy != "alice" || a1.DecidedByKey != alice.KeyID || a1.Rationale != "ticket OPS-1 checked" {
		t.Errorf("approval: status %s, decided_by %q, key %q, rationale %q; want granted by alice with key %s",
			a1.Status, a1.DecidedBy, a1.DecidedByKey, a1.Rationale, alice.KeyID)
	}
	if by := text(approvals, `#decided tr[data-approval="`+ap1+`"] td.by`); !strings.Contains(by, "alice") || !strings.Contains(by, alice.KeyID) {
		t.Errorf("the decided row shows %q", by)
	}

	// A POST without the CSRF token is refused: from another site (a page
	// on another loopback port: same site for SameSite, so the cookie goes
	// along), and from the console's own origin.
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><form method="post" action="%s/ui/approvals/%s/grant"><input name="rationale" value="forged"></form><script>document.forms[0].submit()</script>`, env.URL, ap2)
	}))
	defer attacker.Close()
	within(approvals, "cross-site post", chromedp.Navigate(attacker.URL), chromedp.WaitVisible(chromedp.ID("error")))
	if msg := text(approvals, "#error"); !strings.Contains(msg, "403") {
		t.Errorf("cross-site POST answered %q, want 403", msg)
	}
	within(approvals, "back", chromedp.Navigate(env.URL+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("#approval-"+ap2)))
	status := eval(approvals, `fetch("/ui/approvals/`+ap2+`/grant", {method: "POST", body: new URLSearchParams({rationale: "no token"})}).then(r => String(r.status))`)
	if status != "403" {
		t.Errorf("same-origin POST without the token: %s, want 403", status)
	}
	pendingApproval(t, env, exec2) // still pending

	// carol (client) sees no approval: not in the navigation, 403 on the page.
	carolCtx := person()
	signIn(carolCtx, carol.Key)
	if loc := eval(carolCtx, "location.pathname"); loc != "/ui/executions" {
		t.Errorf("a client lands on %s, want /ui/executions", loc)
	}
	if nav := text(carolCtx, "header nav"); strings.Contains(nav, "Approvals") || !strings.Contains(nav, "Executions") {
		t.Errorf("a client's navigation: %q", nav)
	}
	within(carolCtx, "client on approvals", chromedp.Navigate(env.URL+"/ui/approvals"), chromedp.WaitVisible(chromedp.ID("error")))
	if body := text(carolCtx, "body"); strings.Contains(body, ap2) || strings.Contains(body, "billing") || !strings.Contains(body, "403") {
		t.Errorf("a client's approvals page shows:\n%s", body)
	}
	if n := eval(carolCtx, `String(document.querySelectorAll("form.decide, button.grant").length)`); n != "0" {
		t.Errorf("a client's page offers %s decision controls", n)
	}

	// dave (approver of acme) sees nothing of the default tenant.
	daveCtx := person()
	signIn(daveCtx, dave.Key)
	within(daveCtx, "other tenant's approvals", chromedp.WaitVisible(chromedp.ID("no-pending")))
	within(daveCtx, "other tenant's executions", chromedp.Navigate(env.URL+"/ui/executions"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	if body := text(daveCtx, "body"); strings.Contains(body, exec1) || strings.Contains(body, exec2) || strings.Contains(body, "deployer") {
		t.Errorf("another tenant's executions page shows this tenant's:\n%s", body)
	}
	within(daveCtx, "other tenant's execution", chromedp.Navigate(env.URL+"/ui/executions/"+exec2), chromedp.WaitVisible(chromedp.ID("error")))
	if body := text(daveCtx, "body"); !strings.Contains(body, "404") || strings.Contains(body, "deployer") {
		t.Errorf("another tenant's execution page:\n%s", body)
	}
	within(daveCtx, "other tenant's stream", chromedp.Navigate(env.URL+"/ui/approvals"), chromedp.WaitVisible(chromedp.ID("no-pending")))
	if st := eval(daveCtx, `fetch("/ui/executions/`+exec2+`/stream").then(r => String(r.status))`); st != "404" {
		t.Errorf("another tenant's event stream: %s, want 404", st)
	}

	// Revoking alice's key ends her session at its next request.
	if _, err := env.Admin("DELETE", "/v0/tenants/default/keys/"+alice.KeyID, nil, nil); err != nil {
		t.Fatal(err)
	}
	within(approvals, "after revocation", chromedp.Navigate(env.URL+"/ui/approvals"), chromedp.WaitVisible(chromedp.ID("message")))
	if loc := eval(approvals, "location.pathname"); loc != "/ui/signin" {
		t.Errorf("a revoked key's session shows %s, want /ui/signin", loc)
	}
	if msg := text(approvals, "#message"); !strings.Contains(msg, "no longer valid") {
		t.Errorf("sign-in page says %q", msg)
	}
	pendingApproval(t, env, exec2)
}
