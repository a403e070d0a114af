package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
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

// browser is an HTTP client with a cookie jar that does not follow
// redirects (the tests read them).
type browser struct {
	t    testing.TB
	base string
	c    *http.Client
}

func newBrowser(t testing.TB, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (b *browser) do(method, path string, form url.Values, header map[string]string) (*http.Response, string) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

func (b *browser) signIn(key string) *http.Response {
	b.t.Helper()
	resp, _ := b.do("POST", "/ui/session", url.Values{"key": {key}}, nil)
	return resp
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (b *browser) csrf(path string) string {
	b.t.Helper()
	_, page := b.do("GET", path, nil, nil)
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		b.t.Fatalf("no CSRF token on %s:\n%s", path, page)
	}
	return m[1]
}

func start(t *testing.T) *testkit.Env {
	return testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rules.New()}, UI: console.Handler(console.Options{})})
}

func key(t *testing.T, env *testkit.Env, tenant, role, principal string) wire.CreatedKey {
	t.Helper()
	var k wire.CreatedKey
	if _, err := env.Admin("POST", "/v0/tenants/"+tenant+"/keys", map[string]any{"role": role, "principal": principal}, &k); err != nil {
		t.Fatal(err)
	}
	return k
}

// TestSignIn: a wrong key is refused with the form again; a good one gets
// an HttpOnly, SameSite=Strict cookie scoped to /ui/ and lands on its page;
// signing out (with the token) ends the session.
func TestSignIn(t *testing.T) {
	env := start(t)
	b := newBrowser(t, env.URL)
	if resp, page := b.do("GET", "/ui/approvals", nil, nil); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/signin") {
		t.Fatalf("without a session: %d %s %s", resp.StatusCode, resp.Header.Get("Location"), page)
	}
	if resp := b.signIn("not-a-key"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong key: %d", resp.StatusCode)
	}
	if resp := b.signIn(""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no key: %d", resp.StatusCode)
	}
	ap := key(t, env, "default", kernel.RoleApprover, "alice")
	resp := b.signIn(ap.Key)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign in: %d", resp.StatusCode)
	}
	var ck *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == console.CookieName {
			ck = c
		}
	}
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/ui/" || len(ck.Value) < 40 || strings.Contains(ck.Value, ap.Key) {
		t.Fatalf("session cookie: %+v", ck)
	}
	if resp, _ := b.do("GET", "/ui/", nil, nil); resp.Header.Get("Location") != "/ui/approvals" {
		t.Fatalf("an approver lands on %q", resp.Header.Get("Location"))
	}
	resp, page := b.do("GET", "/ui/approvals", nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "alice") {
		t.Fatalf("approvals: %d\n%s", resp.StatusCode, page)
	}
	for h, want := range map[string]string{"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"} {
		if got := resp.Header.Get(h); got != want {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("CSP %q", csp)
	}

	// Sign-out without the token is refused; with it, the session ends.
	if resp, _ := b.do("POST", "/ui/signout", url.Values{}, nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("sign-out without the token: %d", resp.StatusCode)
	}
	tok := b.csrf("/ui/approvals")
	if resp, _ := b.do("POST", "/ui/signout", url.Values{"csrf": {tok}}, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", resp.StatusCode)
	}
	b2 := newBrowser(t, env.URL)
	u, _ := url.Parse(env.URL + "/ui/")
	b2.c.Jar.SetCookies(u, []*http.Cookie{{Name: console.CookieName, Value: ck.Value, Path: "/ui/"}})
	if resp, _ := b2.do("GET", "/ui/approvals", nil, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the signed-out cookie still works: %d", resp.StatusCode)
	}
}

// TestMutationsNeedTheToken: every console POST needs the session's CSRF
// token and a same-origin Origin; refused ones change nothing.
func TestMutationsNeedTheToken(t *testing.T) {
	env := start(t)
	b := newBrowser(t, env.URL)
	if resp := b.signIn(testkit.AdminKey); resp.StatusCode != http.StatusSeeOther {
		t.Fatal(resp.StatusCode)
	}
	tok := b.csrf("/ui/tenants")
	other := newBrowser(t, env.URL)
	other.signIn(testkit.AdminKey)
	otherTok := other.csrf("/ui/tenants")
	for _, c := range []struct {
		name   string
		form   url.Values
		header map[string]string
	}{
		{"no token", url.Values{"id": {"t1"}}, nil},
		{"empty token", url.Values{"id": {"t1"}, "csrf": {""}}, nil},
		{"another session's token", url.Values{"id": {"t1"}, "csrf": {otherTok}}, nil},
		{"token, another origin", url.Values{"id": {"t1"}, "csrf": {tok}}, map[string]string{"Origin": "http://evil.example"}},
		{"token, null origin", url.Values{"id": {"t1"}, "csrf": {tok}}, map[string]string{"Origin": "null"}},
	} {
		if resp, _ := b.do("POST", "/ui/tenants", c.form, c.header); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", c.name, resp.StatusCode)
		}
	}
	var tl wire.TenantList
	if _, err := env.Admin("GET", "/v0/tenants", nil, &tl); err != nil {
		t.Fatal(err)
	}
	for _, x := range tl.Tenants {
		if x.ID == "t1" {
			t.Fatal("a refused POST created the tenant")
		}
	}
	u, _ := url.Parse(env.URL)
	if resp, _ := b.do("POST", "/ui/tenants", url.Values{"id": {"t1"}, "csrf": {tok}}, map[string]string{"Origin": u.Scheme + "://" + u.Host}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("with the token: %d", resp.StatusCode)
	}
	// A new key is shown once, on the answer to the POST, never cached.
	resp, page := b.do("POST", "/ui/keys?tenant=t1", url.Values{"role": {"approver"}, "principal": {"bob"}, "csrf": {tok}}, nil)
	m := regexp.MustCompile(`id="new-key-secret" class="secret">([^<]+)<`).FindStringSubmatch(page)
	if resp.StatusCode != http.StatusCreated || m == nil || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("create key: %d %q\n%s", resp.StatusCode, resp.Header.Get("Cache-Control"), page)
	}
	var who wire.Whoami
	if _, err := env.As(m[1], "GET", "/v0/whoami", nil, &who); err != nil || who.Principal != "bob" || who.Tenant != "t1" || who.Role != "approver" {
		t.Fatalf("the key shown: %+v %v", who, err)
	}
	if _, page := b.do("GET", "/ui/keys?tenant=t1", nil, nil); strings.Contains(page, m[1]) {
		t.Fatal("the keys page shows the secret again")
	}
}

// TestPagesFollowTheKey: a page shows what the key may read through the
// API and offers what it may do; a revoked key's session ends.
func TestPagesFollowTheKey(t *testing.T) {
	env := start(t)
	cl := key(t, env, "default", kernel.RoleClient, "carol")
	ta := key(t, env, "default", kernel.RoleTenantAdmin, "ops")
	b := newBrowser(t, env.URL)
	b.signIn(cl.Key)
	if resp, _ := b.do("GET", "/ui/", nil, nil); resp.Header.Get("Location") != "/ui/executions" {
		t.Fatalf("a client lands on %q", resp.Header.Get("Location"))
	}
	for _, p := range []string{"/ui/approvals", "/ui/bundles", "/ui/tenants", "/ui/keys"} {
		if resp, _ := b.do("GET", p, nil, nil); resp.StatusCode != http.StatusForbidden {
			t.Errorf("client on %s: %d, want 403", p, resp.StatusCode)
		}
	}
	_, page := b.do("GET", "/ui/executions", nil, nil)
	for _, hidden := range []string{`href="/ui/approvals"`, `href="/ui/bundles"`, `href="/ui/keys"`} {
		if strings.Contains(page, hidden) {
			t.Errorf("a client's navigation has %s", hidden)
		}
	}
	// ?tenant= is the admin's: another key naming it is refused.
	if resp, _ := b.do("GET", "/ui/executions?tenant=acme", nil, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("client naming another tenant: %d", resp.StatusCode)
	}

	t2 := newBrowser(t, env.URL)
	t2.signIn(ta.Key)
	_, page = t2.do("GET", "/ui/keys", nil, nil)
	if !strings.Contains(page, cl.KeyID) || strings.Contains(page, `href="/ui/tenants"`) || strings.Contains(page, "<option>admin</option>") {
		t.Errorf("tenant-admin's keys page:\n%s", page)
	}
	// Revoking carol's key through the console ends her session.
	tok := t2.csrf("/ui/keys")
	if resp, _ := t2.do("POST", "/ui/keys/"+cl.KeyID+"/revoke", url.Values{"csrf": {tok}}, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	resp, _ := b.do("GET", "/ui/executions", nil, nil)
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/signin") {
		t.Fatalf("revoked key's session: %d %q", resp.StatusCode, loc)
	}
	if resp, _ := b.do("GET", "/ui/executions", nil, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the session came back: %d", resp.StatusCode)
	}
}

// TestSessionLimits: sessions end after their lifetime, when idle, and the
// oldest go past MaxSessions.
func TestSessionLimits(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	env := testkit.Start(t, testkit.Options{UI: console.Handler(console.Options{Now: clock, SessionTTL: time.Hour, IdleTimeout: 10 * time.Minute, MaxSessions: 2})})
	ok := func(b *browser) bool {
		resp, _ := b.do("GET", "/ui/executions", nil, nil)
		return resp.StatusCode == http.StatusOK
	}
	a, b, c := newBrowser(t, env.URL), newBrowser(t, env.URL), newBrowser(t, env.URL)
	a.signIn(testkit.AdminKey)
	now = now.Add(time.Minute)
	b.signIn(testkit.AdminKey)
	now = now.Add(time.Minute)
	c.signIn(testkit.AdminKey) // a, least recently used, goes
	if ok(a) || !ok(b) || !ok(c) {
		t.Fatal("MaxSessions: the least recently used session should have ended")
	}
	now = now.Add(9 * time.Minute)
	if !ok(b) {
		t.Fatal("a session used within the idle timeout ended")
	}
	now = now.Add(11 * time.Minute)
	if ok(c) {
		t.Fatal("an idle session lives on")
	}
	for range 5 {
		now = now.Add(9 * time.Minute)
		ok(b)
	}
	now = now.Add(9 * time.Minute)
	if ok(b) {
		t.Fatal("a session lives past its lifetime")
	}
}

// TestArgumentsAreEscaped: whatever an agent puts in a step's arguments is
// shown as text, never as markup.
func TestArgumentsAreEscaped(t *testing.T) {
	env := start(t)
	policy := "default_action: allow\nrules:\n  - id: gate\n    priority: 1\n    when: {target: x}\n    then: {decision: require_approval}\n"
	a := testkit.NewAgent("bot", "bot-secret-0123456789", env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		_, err := r.Step(ctx, "tool_call", "x", map[string]any{"<img src=x onerror=alert(1)>": "</div><script>alert(2)</script>" + strings.Repeat("y", 300)}, testkit.StepOpts{}, func() (any, error) { return nil, nil })
		return nil, err
	})
	defer a.Close()
	env.RegisterAgent(a, "")
	if _, err := env.Admin("POST", "/v0/policies/bot", map[string]any{"bundle": policy}, nil); err != nil {
		t.Fatal(err)
	}
	id := env.CreateExecution("bot", nil)
	deadline := time.Now().Add(10 * time.Second)
	b := newBrowser(t, env.URL)
	b.signIn(testkit.AdminKey)
	for {
		_, page := b.do("GET", "/ui/approvals", nil, nil)
		if strings.Contains(page, id) {
			if strings.Contains(page, "<script>alert") || strings.Contains(page, "<img src=x") {
				t.Fatalf("markup from the arguments reached the page:\n%s", page)
			}
			if !strings.Contains(page, "&lt;/div&gt;&lt;script&gt;alert(2)&lt;/script&gt;") || !strings.Contains(page, `<details class="fold">`) {
				t.Fatalf("the arguments are not shown escaped and folded:\n%s", page)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no approval shown")
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, page := b.do("GET", "/ui/executions/"+id, nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "require_approval") || !strings.Contains(page, "gate") {
		t.Fatalf("execution page: %d, without the step's decision and rule:\n%s", resp.StatusCode, page)
	}
	if strings.Contains(page, "<script>alert") {
		t.Fatalf("markup reached the execution page")
	}
}

// TestAdminDecidesOnBehalf: an admin who is not among an approval's
// approvers is asked, before the form is sent, to name one of them (the
// API refuses the decision otherwise); on an approval any approver may
// decide, the field stays optional. Granting on behalf of the named
// approver goes through.
func TestAdminDecidesOnBehalf(t *testing.T) {
	env := start(t)
	policy := "default_action: allow\nrules:\n" +
		"  - id: named\n    priority: 1\n    when: {target: named}\n    then: {decision: require_approval, approval_config: {approvers: [alice, bob]}}\n" +
		"  - id: anyone\n    priority: 1\n    when: {target: anyone}\n    then: {decision: require_approval}\n"
	a := testkit.NewAgent("bot", "bot-secret-0123456789", env.URL, func(ctx context.Context, r *testkit.Run) (any, error) {
		var in struct{ Target string }
		if err := json.Unmarshal(r.Input, &in); err != nil {
			return nil, err
		}
		_, err := r.Step(ctx, "tool_call", in.Target, map[string]any{}, testkit.StepOpts{}, func() (any, error) { return "done", nil })
		return nil, err
	})
	defer a.Close()
	env.RegisterAgent(a, "")
	if _, err := env.Admin("POST", "/v0/policies/bot", map[string]any{"bundle": policy}, nil); err != nil {
		t.Fatal(err)
	}
	blocked := func(s kernel.ExecStatus) bool { return s == kernel.ExecBlocked }
	named := env.CreateExecution("bot", map[string]any{"target": "named"})
	env.WaitStatus(named, 30*time.Second, blocked)
	anyone := env.CreateExecution("bot", map[string]any{"target": "anyone"})
	env.WaitStatus(anyone, 30*time.Second, blocked)

	b := newBrowser(t, env.URL)
	b.signIn(testkit.AdminKey)
	_, page := b.do("GET", "/ui/approvals", nil, nil)
	article := func(execID string) string {
		i := strings.Index(page, execID)
		if i < 0 {
			t.Fatalf("execution %s not on the page:\n%s", execID, page)
		}
		start := strings.LastIndex(page[:i], "<article")
		end := strings.Index(page[i:], "</article>")
		return page[start : i+end]
	}
	n := article(named)
	if !regexp.MustCompile(`name="on_behalf_of" value="" required list="a-[^"]+"`).MatchString(n) ||
		!strings.Contains(n, `<option value="alice">`) || !strings.Contains(n, `<option value="bob">`) {
		t.Errorf("an approval for alice and bob asks the admin for no approver:\n%s", n)
	}
	if o := article(anyone); !strings.Contains(o, `name="on_behalf_of"`) || strings.Contains(o, "required") {
		t.Errorf("an approval for anyone:\n%s", o)
	}

	var list struct{ Approvals []wire.Approval }
	if _, err := env.Admin("GET", "/v0/approvals?status=pending", nil, &list); err != nil {
		t.Fatal(err)
	}
	for _, ap := range list.Approvals {
		if ap.ExecutionID != named {
			continue
		}
		tok := b.csrf("/ui/approvals")
		resp, _ := b.do("POST", "/ui/approvals/"+ap.ID+"/grant", url.Values{"csrf": {tok}, "request_hash": {ap.RequestHash}, "on_behalf_of": {"alice"}}, nil)
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("grant on behalf of alice: %d", resp.StatusCode)
		}
	}
	env.WaitTerminal(named, 30*time.Second)
}

// TestSessionsPerTenant: one tenant's keys hold at most
// MaxSessionsPerTenant sessions: signing in past it ends that tenant's
// least recently used session, not another tenant's. Before, the sessions
// were one pool whose least recently used went first, so any key (a
// client's, of any tenant) signing in MaxSessions times signed every
// other tenant's users out.
func TestSessionsPerTenant(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	env := testkit.Start(t, testkit.Options{UI: console.Handler(console.Options{Now: clock, MaxSessions: 4, MaxSessionsPerTenant: 2})})
	if _, err := env.Admin("POST", "/v0/tenants", map[string]any{"id": "acme"}, nil); err != nil {
		t.Fatal(err)
	}
	var k wire.CreatedKey
	if _, err := env.Admin("POST", "/v0/tenants/acme/keys", map[string]any{"role": "client", "principal": "flood"}, &k); err != nil {
		t.Fatal(err)
	}
	ok := func(b *browser) bool {
		resp, _ := b.do("GET", "/ui/executions", nil, nil)
		return resp.StatusCode == http.StatusOK
	}
	admin := newBrowser(t, env.URL)
	admin.signIn(testkit.AdminKey)
	var flood []*browser
	for range 6 {
		now = now.Add(time.Minute)
		b := newBrowser(t, env.URL)
		b.signIn(k.Key)
		flood = append(flood, b)
	}
	if !ok(admin) {
		t.Fatal("another tenant's sign-ins ended the admin's session")
	}
	for i, b := range flood {
		if want := i >= 4; ok(b) != want {
			t.Errorf("acme's session %d live: %v, want %v (the tenant's two most recent)", i, !want, want)
		}
	}
}
