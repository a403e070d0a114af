package pull_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
	"github.com/wicket-run/wicket/plugins/pull"
	"github.com/wicket-run/wicket/plugins/rego"
)

// bundleServer is a bundle server on loopback speaking OPA's protocol: the
// archive's ETag, 304 on a matching If-None-Match.
type bundleServer struct {
	mu      sync.Mutex
	body    []byte
	etag    string
	status  int // non-zero: answer this instead
	gets    int
	matched int // 304s answered
	srv     *httptest.Server
}

func newBundleServer(t *testing.T) *bundleServer {
	bs := &bundleServer{}
	bs.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bs.mu.Lock()
		defer bs.mu.Unlock()
		bs.gets++
		if bs.status != 0 {
			http.Error(w, "down", bs.status)
			return
		}
		if inm := r.Header.Get("If-None-Match"); inm != "" && inm == bs.etag {
			bs.matched++
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", bs.etag)
		w.Header().Set("Content-Type", "application/gzip")
		_, _ = w.Write(bs.body)
	}))
	t.Cleanup(bs.srv.Close)
	return bs
}

func (bs *bundleServer) serve(body []byte, etag string, status int) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	bs.body, bs.etag, bs.status = body, etag, status
}

func (bs *bundleServer) counts() (int, int) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.gets, bs.matched
}

// revision returns an archive of an OPA-layout bundle at revision rev that
// answers target with verdict.
func revision(t *testing.T, rev, verdict string) []byte {
	t.Helper()
	b, err := bundle.Options{Name: "authz"}.LoadFiles(map[string][]byte{
		".manifest":        []byte(fmt.Sprintf(`{"revision": %q, "roots": ["wicket", "cfg"]}`, rev)),
		"cfg/data.json":    []byte(fmt.Sprintf(`{"verdict": %q}`, verdict)),
		"wicket/pol.rego":  []byte("package wicket\n\ndecision := {\"decision\": data.cfg.verdict, \"rule_id\": \"cfg\"}\n"),
		"wicket/lib.rego":  []byte("package wicket.lib\n\nx := 1\n"),
		"cfg/unused.json":  []byte(`{}`),
		"cfg/other/x.yaml": []byte("a: 1\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ar, err := b.TarGz()
	if err != nil {
		t.Fatal(err)
	}
	return ar
}

func live(t *testing.T, env *testkit.Env) string {
	t.Helper()
	ref, ok := env.Host.Live("default", "authz")
	if !ok {
		return ""
	}
	return ref.Revision
}

// TestPullProtocol: a new revision is activated; a 304 changes nothing; a
// bad download (not a bundle, a server error, a bundle that does not
// compile) keeps the old revision; the next good one is activated.
func TestPullProtocol(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rego.New()}})
	bs := newBundleServer(t)
	p := pull.New(pull.KernelActivator(env.Kernel), pull.Options{})
	defer p.Close()
	ctx := context.Background()
	src := pull.Source{Tenant: "default", Name: "authz", URL: bs.srv.URL + "/bundles/authz.tar.gz", MinDelay: time.Hour, MaxDelay: time.Hour}

	bs.serve(revision(t, "1", "allow"), `"r1"`, 0)
	if err := p.Start(src); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { st, _ := p.Status("default", "authz"); return st.Activations == 1 })
	if got := live(t, env); got != "1" {
		t.Fatalf("live revision %q, want 1", got)
	}

	if err := p.PollOnce(ctx, "default", "authz"); err != nil {
		t.Fatal(err)
	}
	if _, matched := bs.counts(); matched != 1 {
		t.Errorf("the poll did not send If-None-Match: %d 304s", matched)
	}
	st, _ := p.Status("default", "authz")
	if st.NotModified != 1 || st.Activations != 1 || st.ETag != `"r1"` || live(t, env) != "1" {
		t.Errorf("after a 304: %+v, live %s", st, live(t, env))
	}

	bs.serve(revision(t, "2", "deny"), `"r2"`, 0)
	if err := p.PollOnce(ctx, "default", "authz"); err != nil {
		t.Fatal(err)
	}
	if got := live(t, env); got != "2" {
		t.Fatalf("live revision %q, want 2", got)
	}

	bad := map[string]func(){
		"not a bundle": func() { bs.serve([]byte("<html>maintenance</html>"), `"r3"`, 0) },
		"server error": func() { bs.serve(nil, "", http.StatusServiceUnavailable) },
		"does not compile": func() {
			ar := tarGz(t, map[string]string{".manifest": `{"revision": "3"}`, "wicket/p.rego": "package wicket\n\ndecision := {\"decision\": \"allow\"} if undefined_fn(1)\n"})
			bs.serve(ar, `"r3c"`, 0)
		},
		"outside its roots": func() {
			bs.serve(tarGz(t, map[string]string{".manifest": `{"revision": "3", "roots": ["wicket"]}`, "wicket/p.rego": "package wicket\n\ndecision := {\"decision\": \"allow\"}\n", "other/data.json": "{}"}), `"r3r"`, 0)
		},
	}
	failures := 0
	for name, set := range bad {
		set()
		err := p.PollOnce(ctx, "default", "authz")
		failures++
		if err == nil {
			t.Errorf("%s: no error", name)
		}
		if got := live(t, env); got != "2" {
			t.Errorf("%s: live revision %q, want 2 kept", name, got)
		}
		st, _ := p.Status("default", "authz")
		if st.Failures != failures || st.LastError == "" || st.Revision != "2" || st.ETag != `"r2"` {
			t.Errorf("%s: status %+v", name, st)
		}
	}

	bs.serve(revision(t, "4", "allow"), `"r4"`, 0)
	if err := p.PollOnce(ctx, "default", "authz"); err != nil {
		t.Fatal(err)
	}
	st, _ = p.Status("default", "authz")
	if live(t, env) != "4" || st.Failures != 0 || st.Activations != 3 {
		t.Errorf("after recovery: %+v, live %s", st, live(t, env))
	}
}

// TestPullVerifiesBeforeActivation: with verification keys, an unsigned
// download is refused and the signed revision stays live.
func TestPullVerifiesBeforeActivation(t *testing.T) {
	secret := "pull-secret-0123456789"
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rego.New()}, BundleKeys: []bundle.Key{{Algorithm: "HS256", Key: secret}}})
	bs := newBundleServer(t)
	p := pull.New(pull.KernelActivator(env.Kernel), pull.Options{})
	defer p.Close()
	b, err := bundle.Options{Name: "authz"}.LoadTarGz(strings.NewReader(string(revision(t, "1", "allow"))))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Signed(bundle.SigningKey{Key: secret, Algorithm: "HS256"})
	if err != nil {
		t.Fatal(err)
	}
	signed, _ := sb.TarGz()
	bs.serve(signed, `"s1"`, 0)
	if err := p.Start(pull.Source{Tenant: "default", Name: "authz", URL: bs.srv.URL, MinDelay: time.Hour, MaxDelay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return live(t, env) == "1" })
	bs.serve(revision(t, "2", "allow"), `"u2"`, 0)
	err = p.PollOnce(context.Background(), "default", "authz")
	if err == nil || !strings.Contains(err.Error(), ".signatures.json") {
		t.Fatalf("unsigned download: %v", err)
	}
	if got := live(t, env); got != "1" {
		t.Errorf("live revision %q, want the signed 1", got)
	}
}

// TestPullPolls: the loop polls by itself, picks up a new revision, and
// backs off after failures.
func TestPullPolls(t *testing.T) {
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rego.New()}})
	bs := newBundleServer(t)
	p := pull.New(pull.KernelActivator(env.Kernel), pull.Options{Backoff: 5 * time.Millisecond})
	defer p.Close()
	bs.serve(revision(t, "1", "allow"), `"r1"`, 0)
	if err := p.Start(pull.Source{Tenant: "default", Name: "authz", URL: bs.srv.URL, MinDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, m := bs.counts(); return m >= 2 }) // polled again, 304s
	bs.serve(revision(t, "2", "deny"), `"r2"`, 0)
	waitFor(t, func() bool { return live(t, env) == "2" })
	bs.serve(nil, "", http.StatusInternalServerError)
	waitFor(t, func() bool { st, _ := p.Status("default", "authz"); return st.Failures >= 3 })
	if live(t, env) != "2" {
		t.Errorf("failures changed the live revision")
	}
	p.Stop("default", "authz")
	g1, _ := bs.counts()
	if _, ok := p.Status("default", "authz"); ok {
		t.Errorf("status after Stop")
	}
	// No poll after Stop: Stop waited for the loop to end.
	if g2, _ := bs.counts(); g2 != g1 {
		t.Errorf("%d requests after Stop", g2-g1)
	}
}

func TestSourceValidate(t *testing.T) {
	for _, s := range []pull.Source{
		{URL: "ftp://x/b.tar.gz"},
		{URL: "http:///nohost"},
		{URL: "https://user:pw@example.com/b"},
		{URL: "https://example.com/b", MinDelay: 2 * time.Second, MaxDelay: time.Second},
		{URL: "://bad"},
	} {
		if err := s.Validate(); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
	if err := (pull.Source{URL: "https://example.com/b.tar.gz"}).Validate(); err != nil {
		t.Error(err)
	}
}

// TestGuardedClient: link-local and metadata addresses are refused when
// dialled, also behind a redirect from an allowed server; nothing is sent.
func TestGuardedClient(t *testing.T) {
	redirect := httptest.NewServer(http.RedirectHandler("http://169.254.169.254/latest/meta-data/", http.StatusFound))
	defer redirect.Close()
	c := pull.GuardedClient(nil)
	for _, u := range []string{"http://169.254.169.254/", "http://[fe80::1]:80/", "http://0.0.0.0:80/", redirect.URL} {
		resp, err := c.Get(u)
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: fetched", u)
			continue
		}
		if !strings.Contains(err.Error(), "refusing") {
			t.Errorf("%s: %v, want a refusal", u, err)
		}
	}
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rego.New()}})
	p := pull.New(pull.KernelActivator(env.Kernel), pull.Options{})
	defer p.Close()
	if err := p.Start(pull.Source{Tenant: "default", Name: "authz", URL: redirect.URL, MinDelay: time.Hour, MaxDelay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	err := p.PollOnce(context.Background(), "default", "authz")
	if err == nil || !strings.Contains(err.Error(), "link-local") {
		t.Fatalf("redirect to metadata: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// tarGz packs files with OPA's "/" entry names.
func tarGz(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for p, c := range files {
		if err := tw.WriteHeader(&tar.Header{Name: "/" + p, Mode: 0o644, Size: int64(len(c)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// logBuffer is an io.Writer the puller's logger may write to from its
// goroutines while the test reads it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestPullLogsHideTheQuery: a source URL's query may carry a token (a
// signed URL of an object store, say), so no log line of the puller may
// show it: not an activation, not a server's error answer, not a failed
// connection (whose error net/http words with the whole URL). They used to
// log url= with the query, and the connection error in err=.
func TestPullLogsHideTheQuery(t *testing.T) {
	const token = "query-token-secret"
	env := testkit.Start(t, testkit.Options{Engines: []plugins.Engine{rego.New()}})
	bs := newBundleServer(t)
	var logs logBuffer
	p := pull.New(pull.KernelActivator(env.Kernel), pull.Options{Backoff: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	defer p.Close()
	bs.serve(revision(t, "1", "allow"), `"r1"`, 0)
	fast := func(name, url string) pull.Source {
		return pull.Source{Tenant: "default", Name: name, URL: url + "/authz.tar.gz?token=" + token, MinDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond}
	}
	if err := p.Start(fast("authz", bs.srv.URL)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, m := bs.counts(); return m >= 1 }) // activated, then a 304
	bs.serve(nil, "", http.StatusForbidden)
	waitFor(t, func() bool { st, _ := p.Status("default", "authz"); return st.Failures >= 1 })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	if err := p.Start(fast("gone", closed)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { st, _ := p.Status("default", "gone"); return st.Failures >= 1 })
	out := logs.String()
	for _, want := range []string{"bundle activated", "403", "connection refused", bs.srv.URL + "/authz.tar.gz"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, token) {
		t.Errorf("the log shows the query's token:\n%s", out)
	}
}
