// Package console is Wicket's web console, served by `wicket serve` under
// /ui/: approvals, executions with a live timeline, bundles, and for admins
// tenants and keys.
//
// The console has no permission model of its own. A person signs in with an
// API key, which POST /ui/session exchanges for a session cookie (HttpOnly,
// SameSite=Strict) bound to that key; every page is then made by calling the
// kernel's HTTP API in process with the key as the bearer, so a page shows
// and does exactly what the key may do through the API, and a key that is
// revoked ends its sessions at their next request. The navigation and the
// buttons offered follow GET /v0/whoami, the list of routes the key's role
// may call, taken from the API's own route table.
//
// Every asset is embedded in the binary; pages are plain HTML and CSS with a
// small script (countdowns and the live timeline, over the API's event
// stream), and nothing is loaded from another origin.
package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultSessionTTL  = 12 * time.Hour
	DefaultIdleTimeout = time.Hour
	DefaultMaxSessions = 4096
	// DefaultMaxSessionsPerTenant is MaxSessionsPerTenant's default.
	DefaultMaxSessionsPerTenant = 256
	// CookieName is the session cookie's name.
	CookieName = "wicket_console"
	// maxFormBytes bounds the body of a console POST.
	maxFormBytes = 64 << 10
)

// Options configure a Console. The zero value of a field means its default.
type Options struct {
	// SessionTTL is a session's lifetime from sign-in (default 12 h).
	SessionTTL time.Duration
	// IdleTimeout ends a session not used for this long (default 1 h).
	IdleTimeout time.Duration
	// MaxSessions bounds the sessions held in memory (default 4096); a new
	// sign-in past it ends the least recently used session.
	MaxSessions int
	// MaxSessionsPerTenant bounds the sessions of the keys of one tenant
	// (default 256, at most MaxSessions); a new sign-in past it ends that
	// tenant's least recently used session, so one tenant's keys cannot
	// sign other tenants' users out.
	MaxSessionsPerTenant int
	// SecureCookie marks the cookie Secure even on plain HTTP requests
	// (behind a proxy that terminates TLS); requests over TLS always get it.
	SecureCookie bool
	// Logger receives errors (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Console serves the console. Create it with New.
type Console struct {
	api  http.Handler
	o    Options
	log  *slog.Logger
	mux  *http.ServeMux
	sess *sessionStore
}

// New returns the console over api, the handler of the kernel's HTTP API
// (server.Config.UI calls it with the API's own handler).
func New(api http.Handler, o Options) *Console {
	if o.SessionTTL <= 0 {
		o.SessionTTL = DefaultSessionTTL
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.MaxSessionsPerTenant <= 0 {
		o.MaxSessionsPerTenant = DefaultMaxSessionsPerTenant
	}
	o.MaxSessionsPerTenant = min(o.MaxSessionsPerTenant, o.MaxSessions)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	c := &Console{api: api, o: o, log: o.Logger, sess: newSessionStore(o.MaxSessions, o.MaxSessionsPerTenant)}
	c.mux = c.routes()
	return c
}

// Handler is the constructor server.Config.UI takes.
func Handler(o Options) func(api http.Handler) http.Handler {
	return func(api http.Handler) http.Handler { return New(api, o) }
}

// ServeHTTP serves a console request, with the headers every answer gets:
// no framing, no sniffing, no referrer to other origins, and a content security policy that
// admits this origin only.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin") // no-referrer would make browsers send "Origin: null" on the console's own forms
	c.mux.ServeHTTP(w, r)
}

// routes builds the console's routes.
func (c *Console) routes() *http.ServeMux {
	m := http.NewServeMux()
	m.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", staticHandler()))
	m.HandleFunc("GET /ui/signin", c.signinPage)
	m.HandleFunc("POST /ui/session", c.signin)
	m.HandleFunc("GET /ui/{$}", c.page(c.landing))
	m.HandleFunc("POST /ui/signout", c.mutation(c.signout))
	m.HandleFunc("GET /ui/approvals", c.page(c.approvalsPage))
	m.HandleFunc("POST /ui/approvals/{id}/{answer}", c.mutation(c.decide))
	m.HandleFunc("GET /ui/executions", c.page(c.executionsPage))
	m.HandleFunc("GET /ui/executions/{id}", c.page(c.executionPage))
	m.HandleFunc("GET /ui/executions/{id}/live", c.page(c.executionLive))
	m.HandleFunc("GET /ui/executions/{id}/stream", c.page(c.executionStream))
	m.HandleFunc("POST /ui/executions/{id}/cancel", c.mutation(c.cancel))
	m.HandleFunc("GET /ui/bundles", c.page(c.bundlesPage))
	m.HandleFunc("GET /ui/tenants", c.page(c.tenantsPage))
	m.HandleFunc("POST /ui/tenants", c.mutation(c.createTenant))
	m.HandleFunc("GET /ui/keys", c.page(c.keysPage))
	m.HandleFunc("POST /ui/keys", c.mutation(c.createKey))
	m.HandleFunc("POST /ui/keys/{id}/revoke", c.mutation(c.revokeKey))
	m.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, nil, http.StatusNotFound, "No such page: "+r.URL.Path)
	})
	return m
}

// req is one signed-in request: the session, who its key is, and the tenant
// the page acts in (an admin's ?tenant=).
type req struct {
	w    http.ResponseWriter
	r    *http.Request
	s    *session
	who  whoami
	form url.Values
}

// may reports whether the key's role may call the API route ("METHOD
// /v0/path/{var}", as the API's route table spells it).
func (q *req) may(route string) bool {
	for _, r := range q.who.Routes {
		if r == route {
			return true
		}
	}
	return false
}

// page wraps a GET handler: the session and its key are checked first.
func (c *Console) page(h func(*req)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, ok := c.admit(w, r)
		if !ok {
			return
		}
		h(q)
	}
}

// mutation wraps a POST handler: the session and its key are checked from
// the headers, then the form is read (bounded), then its CSRF token.
func (c *Console) mutation(h func(*req)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !sameOrigin(r) {
			c.fail(w, r, nil, http.StatusForbidden, "Refused: this request came from another origin.")
			return
		}
		q, ok := c.admit(w, r)
		if !ok {
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, q, http.StatusBadRequest, "The form could not be read: "+err.Error())
			return
		}
		q.form = r.PostForm
		got := q.form.Get("csrf")
		if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(q.s.csrf)) != 1 {
			c.fail(w, r, q, http.StatusForbidden, "Refused: the form's CSRF token is missing or wrong. Reload the page and try again.")
			return
		}
		h(q)
	}
}

// admit finds the request's session and checks its key with the API (GET
// /v0/whoami): a revoked key ends the session here, at its next request.
func (c *Console) admit(w http.ResponseWriter, r *http.Request) (*req, bool) {
	ck, err := r.Cookie(CookieName)
	if err != nil || ck.Value == "" {
		c.toSignin(w, r, "")
		return nil, false
	}
	s := c.sess.get(ck.Value, c.o.Now(), c.o.SessionTTL, c.o.IdleTimeout)
	if s == nil {
		c.clearCookie(w, r)
		c.toSignin(w, r, "Your session has ended. Sign in again.")
		return nil, false
	}
	q := &req{w: w, r: r, s: s}
	if err := c.call(q, "GET", "/v0/whoami", nil, &q.who); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
			c.sess.drop(ck.Value)
			c.clearCookie(w, r)
			c.toSignin(w, r, "Your session has ended: its API key is no longer valid (revoked?). Sign in again.")
			return nil, false
		}
		if errors.As(err, &ae) && ae.Status == http.StatusForbidden {
			// Only ?tenant= is refused this way: drop it.
			c.fail(w, r, nil, http.StatusForbidden, ae.Message)
			return nil, false
		}
		c.fail(w, r, nil, http.StatusBadGateway, "The kernel did not answer: "+err.Error())
		return nil, false
	}
	return q, true
}

// toSignin sends the browser to the sign-in page (an event stream or a
// fragment gets 401: it cannot follow to a form).
func (c *Console) toSignin(w http.ResponseWriter, r *http.Request, msg string) {
	if strings.HasSuffix(r.URL.Path, "/stream") || strings.HasSuffix(r.URL.Path, "/live") {
		http.Error(w, "session ended", http.StatusUnauthorized)
		return
	}
	u := "/ui/signin"
	if msg != "" {
		u += "?msg=" + url.QueryEscape(msg)
	}
	http.Redirect(w, r, u, http.StatusSeeOther)
}

// sameOrigin refuses a browser's cross-origin POST: a request whose Origin
// (or, without one, Referer) names another host. Browsers send Origin on
// every POST; the CSRF token is the check that does not depend on it.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		o = r.Header.Get("Referer")
	}
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}

// signinPage shows the sign-in form.
func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "signin", nil, map[string]any{"Message": r.URL.Query().Get("msg")})
}

// signin exchanges an API key (form field "key") for a session: the key is
// checked with the API, then a session holding it is made, and its cookie
// set. The body is small and bounded; a wrong key is 401 with the form.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		c.fail(w, r, nil, http.StatusForbidden, "Refused: this request came from another origin.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if err := r.ParseForm(); err != nil {
		c.render(w, r, http.StatusBadRequest, "signin", nil, map[string]any{"Message": "The form could not be read."})
		return
	}
	key := strings.TrimSpace(r.PostForm.Get("key"))
	q := &req{w: w, r: r, s: &session{key: key}}
	if err := c.call(q, "GET", "/v0/whoami", nil, &q.who); err != nil {
		status, msg := http.StatusBadGateway, "The kernel did not answer: "+err.Error()
		var ae *apiError
		if errors.As(err, &ae) {
			status, msg = ae.Status, "Sign-in refused: "+ae.Message
		}
		c.render(w, r, status, "signin", nil, map[string]any{"Message": msg})
		return
	}
	id := c.sess.create(key, q.who.KeyTenant, c.o.Now())
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: id, Path: "/ui/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: c.secure(r), MaxAge: int(c.o.SessionTTL / time.Second)})
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

// signout ends the session.
func (c *Console) signout(q *req) {
	if ck, err := q.r.Cookie(CookieName); err == nil {
		c.sess.drop(ck.Value)
	}
	c.clearCookie(q.w, q.r)
	http.Redirect(q.w, q.r, "/ui/signin?msg="+url.QueryEscape("Signed out."), http.StatusSeeOther)
}

func (c *Console) secure(r *http.Request) bool { return r.TLS != nil || c.o.SecureCookie }

func (c *Console) clearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/ui/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: c.secure(r), MaxAge: -1})
}

// session is one signed-in browser: the API key it acts with and its CSRF
// token. Sessions live in memory: a restart signs everyone out.
type session struct {
	key     string
	tenant  string // the key's
	csrf    string
	created time.Time
	seen    time.Time
}

// sessionStore holds sessions by the sha256 of their cookie value (the
// cookie is a 256-bit random secret; a lookup does not compare it byte by
// byte).
type sessionStore struct {
	mu        sync.Mutex
	m         map[[32]byte]*session
	max       int
	perTenant int
}

func newSessionStore(max, perTenant int) *sessionStore {
	return &sessionStore{m: map[[32]byte]*session{}, max: max, perTenant: perTenant}
}

// create makes a session for key, of tenant, and returns its cookie value.
// Past the tenant's share it ends the tenant's least recently used
// session, past the whole store's the least recently used of all.
func (st *sessionStore) create(key, tenant string, now time.Time) string {
	id := randomToken()
	s := &session{key: key, tenant: tenant, csrf: randomToken(), created: now, seen: now}
	st.mu.Lock()
	defer st.mu.Unlock()
	for {
		n := 0
		for _, x := range st.m {
			if x.tenant == tenant {
				n++
			}
		}
		if n < st.perTenant {
			break
		}
		st.dropOldest(func(x *session) bool { return x.tenant == tenant })
	}
	for len(st.m) >= st.max {
		st.dropOldest(func(*session) bool { return true })
	}
	st.m[sha256.Sum256([]byte(id))] = s
	return id
}

// get returns the live session of a cookie value, or nil (ended ones are
// removed).
func (st *sessionStore) get(id string, now time.Time, ttl, idle time.Duration) *session {
	h := sha256.Sum256([]byte(id))
	st.mu.Lock()
	defer st.mu.Unlock()
	s := st.m[h]
	if s == nil {
		return nil
	}
	if now.Sub(s.created) > ttl || now.Sub(s.seen) > idle {
		delete(st.m, h)
		return nil
	}
	s.seen = now
	cp := *s
	return &cp
}

// dropOldest ends the least recently used session of those in. st.mu
// must be held.
func (st *sessionStore) dropOldest(in func(*session) bool) {
	var oldest [32]byte
	var at time.Time
	for h, x := range st.m {
		if in(x) && (at.IsZero() || x.seen.Before(at)) {
			oldest, at = h, x.seen
		}
	}
	delete(st.m, oldest)
}

func (st *sessionStore) drop(id string) {
	st.mu.Lock()
	delete(st.m, sha256.Sum256([]byte(id)))
	st.mu.Unlock()
}

// randomToken returns 256 random bits, base64url.
func randomToken() string {
	b := make([]byte, 32)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		panic("console: crypto/rand: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}
