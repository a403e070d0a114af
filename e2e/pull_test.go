package e2e

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
)

// TestPullFromBundleServer runs a real `wicket serve` whose manifest names a
// bundle server on loopback: the bundle is activated, polled with
// If-None-Match (304), a new revision is activated, a broken download keeps
// it, and every activation is a log line with revision and digest.
func TestPullFromBundleServer(t *testing.T) {
	var mu sync.Mutex
	body, etag := opaDirArchive(t, opaAuthzDir), `"v1"`
	notModified := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("If-None-Match") == etag {
			notModified++
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", etag)
		_, _ = w.Write(body)
	}))
	defer srv.Close()

	dir := t.TempDir()
	man := "bundles:\n  - name: authz\n    source: {url: \"" + srv.URL + "/authz.tar.gz\", min_delay: 20ms, max_delay: 50ms}\n"
	if err := os.WriteFile(filepath.Join(dir, "wicket.yaml"), []byte(man), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, filepath.Join(dir, "data"), freeAddr(t), "--config", filepath.Join(dir, "wicket.yaml"), "--log-level", "info")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()

	revision := func() string {
		var b struct {
			Revision string `json:"revision"`
		}
		if code, err := testkit.Bearer(p.url, testkit.AdminKey, "GET", "/v0/bundles/authz", nil, &b); err != nil && code != 404 {
			t.Fatal(err)
		}
		return b.Revision
	}
	waitUntil(t, func() bool { return revision() == "2026-12-01.1" })
	waitUntil(t, func() bool { mu.Lock(); defer mu.Unlock(); return notModified >= 2 })

	// A new revision: the policy's .manifest revision changes.
	src := filepath.Join(dir, "v2")
	if err := os.CopyFS(src, os.DirFS(opaAuthzDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, ".manifest"), []byte(`{"revision": "v2", "roots": ["wicket", "lib", "agents", "tools"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	body, etag = opaDirArchive(t, src), `"v2"`
	mu.Unlock()
	waitUntil(t, func() bool { return revision() == "v2" })

	// A broken download: v2 stays.
	mu.Lock()
	body, etag = []byte("not a bundle"), `"v3"`
	mu.Unlock()
	waitUntil(t, func() bool { return strings.Contains(p.stderrString(), "bundle download failed") })
	if got := revision(); got != "v2" {
		t.Errorf("after a bad download the revision is %q, want v2", got)
	}
	logs := p.stderrString()
	for _, want := range []string{"bundle activated", "revision=2026-12-01.1", "revision=v2", "sha256="} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
