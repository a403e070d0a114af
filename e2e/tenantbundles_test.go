package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/testkit"
)

// TestTenantBundleCeilings: against a real `wicket serve`, a tenant-admin
// cannot store more bundles, or more bytes of bundles, than the kernel's
// per-tenant ceilings (every bundle is kept in the shared store and
// compiled in the shared process: without them one tenant's uploads fill
// the disk and memory every tenant depends on). A refusal is a 400 naming
// the ceiling and its flag and stores nothing; replacing a bundle counts
// it once; deleting one makes room; the admin is never refused; another
// tenant's room is its own; the account survives a restart.
func TestTenantBundleCeilings(t *testing.T) {
	dir := t.TempDir()
	addr := freeAddr(t)
	flags := []string{"--max-tenant-bundles", "3", "--max-tenant-bundle-bytes", "2MiB"}
	p := startServe(t, dir, addr, flags...)
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	keys := tenantAdmins(t, p.url, "acme", "other")
	rules := func(i int) map[string]any {
		return map[string]any{"engine": "rules", "files": map[string]string{"rules.yaml": fmt.Sprintf("default_action: allow\n# %d\n", i)}}
	}
	// padded is a rules bundle carrying n incompressible bytes.
	padded := func(n int) map[string]any {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return map[string]any{"engine": "rules", "files": map[string]string{"rules.yaml": "default_action: allow\n"},
			"files_base64": map[string]string{"docs/blob.bin": base64.StdEncoding.EncodeToString(b)}}
	}
	put := func(base, key, path string, body any) (int, string) {
		st, err := testkit.Bearer(base, key, "PUT", path, body, nil)
		if err != nil {
			return st, err.Error()
		}
		return st, ""
	}
	names := func(base, key string) []string {
		var l struct {
			Bundles []struct {
				Name string `json:"name"`
			} `json:"bundles"`
		}
		if _, err := testkit.Bearer(base, key, "GET", "/v0/bundles", nil, &l); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, b := range l.Bundles {
			out = append(out, b.Name)
		}
		return out
	}

	for i := range 3 {
		if st, msg := put(p.url, keys["acme"], fmt.Sprintf("/v0/bundles/b%d", i), rules(i)); st != http.StatusOK {
			t.Fatalf("bundle %d of 3: %d %s", i, st, msg)
		}
	}
	st, msg := put(p.url, keys["acme"], "/v0/bundles/b3", rules(3))
	if st != http.StatusBadRequest || !strings.Contains(msg, "--max-tenant-bundles") {
		t.Fatalf("a fourth bundle: %d %q, want 400 naming --max-tenant-bundles", st, msg)
	}
	if _, err := testkit.Bearer(p.url, keys["acme"], "POST", "/v0/agents", map[string]any{"id": "bot", "secret": "bot-secret-0123456789abcdef"}, nil); err != nil {
		t.Fatal(err)
	}
	if st, err := testkit.Bearer(p.url, keys["acme"], "POST", "/v0/policies/bot", map[string]any{"bundle": "default_action: deny\n"}, nil); st != http.StatusBadRequest || !strings.Contains(fmt.Sprint(err), "--max-tenant-bundles") {
		t.Fatalf("an agent's policy as a fourth bundle: %d %v", st, err)
	}
	if got := names(p.url, keys["acme"]); len(got) != 3 {
		t.Fatalf("acme holds %v after the refusals, want b0 b1 b2", got)
	}
	// A new revision of a held bundle counts once.
	if st, msg := put(p.url, keys["acme"], "/v0/bundles/b0", rules(10)); st != http.StatusOK {
		t.Fatalf("replacing b0: %d %s", st, msg)
	}
	// Another tenant has its own room; the admin is never refused.
	if st, msg := put(p.url, keys["other"], "/v0/bundles/b3", rules(3)); st != http.StatusOK {
		t.Fatalf("other tenant's bundle: %d %s", st, msg)
	}
	// Every rate limit a step matches is a counter written with the step,
	// on the writer every tenant shares: a manifest declares at most 100.
	var rl strings.Builder
	rl.WriteString("name: limited\nengine: rules\ndefault_action: allow\nrate_limits:\n")
	for i := range 101 {
		fmt.Fprintf(&rl, "  - {id: r%d, max_calls: 1000000, window: 1h, per: tenant}\n", i)
	}
	if st, msg := put(p.url, keys["other"], "/v0/bundles/limited", map[string]any{"engine": "rules",
		"files": map[string]string{"bundle.yaml": rl.String(), "rules.yaml": "default_action: allow\n"}}); st != http.StatusBadRequest || !strings.Contains(msg, "rate_limits") {
		t.Fatalf("101 rate limits: %d %q, want 400 naming rate_limits", st, msg)
	}
	if st, msg := put(p.url, testkit.AdminKey, "/v0/bundles/guard?tenant=acme", rules(4)); st != http.StatusOK {
		t.Fatalf("the admin's bundle in acme: %d %s", st, msg)
	}
	// Deleting makes room (the admin's bundle counts: two must go).
	for _, n := range []string{"b1", "b2"} {
		if st, err := testkit.Bearer(p.url, keys["acme"], "DELETE", "/v0/bundles/"+n, nil, nil); err != nil || st != http.StatusNoContent && st != http.StatusOK {
			t.Fatalf("delete %s: %d %v", n, st, err)
		}
	}
	// Bytes: 1.5 MiB fits under 2 MiB with the small ones, a second does not.
	if st, msg := put(p.url, keys["acme"], "/v0/bundles/big1", padded(1536<<10)); st != http.StatusOK {
		t.Fatalf("a 1.5 MiB bundle: %d %s", st, msg)
	}
	if st, msg := put(p.url, keys["acme"], "/v0/bundles/b0", padded(1536<<10)); st != http.StatusBadRequest || !strings.Contains(msg, "--max-tenant-bundle-bytes") {
		t.Fatalf("a second 1.5 MiB bundle: %d %q, want 400 naming --max-tenant-bundle-bytes", st, msg)
	}

	// The account is rebuilt at boot.
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p = startServe(t, dir, addr, flags...)
	if st, msg := put(p.url, keys["acme"], "/v0/bundles/b5", rules(5)); st != http.StatusBadRequest || !strings.Contains(msg, "--max-tenant-bundles") {
		t.Fatalf("after a restart, a fourth bundle: %d %q", st, msg)
	}
	if got := names(p.url, keys["acme"]); len(got) != 3 {
		t.Fatalf("acme holds %v after the restart, want b0 big1 guard", got)
	}
	if st, err := testkit.Bearer(p.url, "", "GET", "/v0/health", nil, nil); err != nil || st != http.StatusOK {
		t.Fatalf("health: %d %v", st, err)
	}
}

// TestTenantAgentAndKeyCeilings: against a real `wicket serve`, a tenant
// has at most --max-tenant-agents agents and --max-tenant-keys keys: the
// kernel caches agents in memory and lists both whole, so a tenant-admin
// registering without end grew every replica's memory and answers. One
// more is a 400 naming the flag, and nothing is stored; re-registering an
// agent is not one more; deleting makes room; another tenant has its own.
func TestTenantAgentAndKeyCeilings(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t), "--max-tenant-agents", "3", "--max-tenant-keys", "3")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	keys := tenantAdmins(t, p.url, "acme", "other")
	agent := func(tenant, id string) (int, error) {
		return testkit.Bearer(p.url, keys[tenant], "POST", "/v0/agents", map[string]any{"id": id, "secret": "agent-secret-0123456789"}, nil)
	}
	for i := range 3 {
		if st, err := agent("acme", fmt.Sprintf("a%d", i)); err != nil {
			t.Fatalf("agent %d of 3: %d %v", i, st, err)
		}
	}
	if st, err := agent("acme", "a3"); st != http.StatusBadRequest || !strings.Contains(fmt.Sprint(err), "--max-tenant-agents") {
		t.Fatalf("a fourth agent: %d %v, want 400 naming --max-tenant-agents", st, err)
	}
	if st, err := agent("acme", "a0"); err != nil {
		t.Fatalf("re-registering a0: %d %v", st, err)
	}
	if st, err := agent("other", "a3"); err != nil {
		t.Fatalf("another tenant's agent: %d %v", st, err)
	}
	if _, err := testkit.Bearer(p.url, keys["acme"], "DELETE", "/v0/agents/a1", nil, nil); err != nil {
		t.Fatal(err)
	}
	if st, err := agent("acme", "a3"); err != nil {
		t.Fatalf("an agent after a deletion: %d %v", st, err)
	}
	var l struct {
		Agents []json.RawMessage `json:"agents"`
	}
	if _, err := testkit.Bearer(p.url, keys["acme"], "GET", "/v0/agents", nil, &l); err != nil || len(l.Agents) != 3 {
		t.Fatalf("acme lists %d agents, %v; want 3", len(l.Agents), err)
	}

	// acme holds its tenant-admin key; two more, then the ceiling.
	key := func(tenant string) (int, string, error) {
		var k struct {
			KeyID string `json:"key_id"`
		}
		st, err := testkit.Bearer(p.url, keys[tenant], "POST", "/v0/tenants/"+tenant+"/keys", map[string]any{"role": "client", "principal": "ci"}, &k)
		return st, k.KeyID, err
	}
	var last string
	for i := range 2 {
		st, id, err := key("acme")
		if err != nil {
			t.Fatalf("key %d: %d %v", i+2, st, err)
		}
		last = id
	}
	if st, _, err := key("acme"); st != http.StatusBadRequest || !strings.Contains(fmt.Sprint(err), "--max-tenant-keys") {
		t.Fatalf("a fourth key: %d %v, want 400 naming --max-tenant-keys", st, err)
	}
	if st, _, err := key("other"); err != nil {
		t.Fatalf("another tenant's key: %d %v", st, err)
	}
	if _, err := testkit.Bearer(p.url, keys["acme"], "DELETE", "/v0/tenants/acme/keys/"+last, nil, nil); err != nil {
		t.Fatal(err)
	}
	if st, _, err := key("acme"); err != nil {
		t.Fatalf("a key after a revocation: %d %v", st, err)
	}
}

// tenantAdmins creates the tenants on the kernel at url and returns a
// tenant-admin key of each, by tenant.
func tenantAdmins(t *testing.T, url string, tenants ...string) map[string]string {
	t.Helper()
	keys := map[string]string{}
	for _, tenant := range tenants {
		if _, err := testkit.Bearer(url, testkit.AdminKey, "POST", "/v0/tenants", map[string]any{"id": tenant}, nil); err != nil {
			t.Fatal(err)
		}
		var k struct {
			Key string `json:"key"`
		}
		if _, err := testkit.Bearer(url, testkit.AdminKey, "POST", "/v0/tenants/"+tenant+"/keys", map[string]any{"role": "tenant-admin", "principal": tenant + "-ops"}, &k); err != nil {
			t.Fatal(err)
		}
		keys[tenant] = k.Key
	}
	return keys
}

// TestTenantBundleBytesUnpacked: --max-tenant-bundle-bytes counts what a
// bundle unpacks to, not only its archive. The kernel keeps every live
// bundle's files in memory (and sends them to the tenant's Rego worker),
// so a tenant-admin storing archives of a few KiB that unpack to 3 MiB of
// zeros each held 3 MiB of the kernel's memory per 3 KiB of its account:
// at the defaults (1000 bundles, 256 MiB of archives, 32 MiB per bundle)
// about 32 GB. Against a real `wicket serve`, the bundle that would take
// the tenant past the ceiling unpacked is a 400 naming the flag and the
// unpacked size, and nothing is stored.
func TestTenantBundleBytesUnpacked(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t), "--max-tenant-bundle-bytes", "8MiB")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	keys := tenantAdmins(t, p.url, "acme")
	zeros := strings.Repeat("\x00", 3<<20)
	put := func(name string) (int, []byte, error) {
		ar := filesArchive(t, map[string]string{"bundle.yaml": "name: " + name + "\nengine: rules\n",
			"rules.yaml": "default_action: allow\n", "docs/zeros.bin": zeros})
		st, err := testkit.BearerWithHeaders(p.url, keys["acme"], "PUT", "/v0/bundles/"+name,
			map[string]string{"Content-Type": "application/gzip"}, ar, nil)
		return st, ar, err
	}
	for _, name := range []string{"z0", "z1"} {
		if st, ar, err := put(name); err != nil {
			t.Fatalf("%s (an archive of %d bytes, 3 MiB unpacked): %d %v", name, len(ar), st, err)
		}
	}
	st, ar, err := put("z2")
	if st != http.StatusBadRequest || !strings.Contains(fmt.Sprint(err), "--max-tenant-bundle-bytes") || !strings.Contains(fmt.Sprint(err), "unpacked") {
		t.Fatalf("a third bundle of 3 MiB unpacked (an archive of %d bytes) under an 8 MiB ceiling: %d %v, want 400 naming --max-tenant-bundle-bytes and the unpacked size", len(ar), st, err)
	}
	var l struct {
		Bundles []struct {
			Name string `json:"name"`
		} `json:"bundles"`
	}
	if _, err := testkit.Bearer(p.url, keys["acme"], "GET", "/v0/bundles", nil, &l); err != nil || len(l.Bundles) != 2 {
		t.Fatalf("acme lists %+v, %v; want z0 z1", l.Bundles, err)
	}
}

// TestYAMLBombRefused: the YAML files a bundle holds (bundle.yaml,
// rules.yaml, data.yaml, tests/*.yaml) are parsed by the kernel itself at
// upload and at every boot, and YAML costs about 100 times its size and
// 4 µs a node to parse: a rules.yaml of 8 MiB of "1," (an archive of 8 KiB)
// took 32 s and 900 MB of the kernel's memory, and the 32 MiB a bundle may
// hold over 2 minutes and 3 GB. Against a real `wicket serve`, a tenant-admin's
// upload of 4 MiB of YAML (in tests/, which only a test run reads) is
// refused at once with a 400 naming the file and the ceiling, and the
// kernel's memory does not grow by the parse.
func TestYAMLBombRefused(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t))
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	keys := tenantAdmins(t, p.url, "acme")
	flow := "cases:\n  - name: bomb\n    args: [" + strings.Repeat("1,", 2<<20) + "1]\n"
	ar := rawArchive(t, map[string]string{"bundle.yaml": "name: bomb\nengine: rules\n",
		"rules.yaml": "default_action: allow\n", "tests/bomb.yaml": flow})
	before := statusBytes(p.cmd.Process.Pid, "VmHWM")
	t0 := time.Now()
	st, err := testkit.BearerWithHeaders(p.url, keys["acme"], "PUT", "/v0/bundles/bomb",
		map[string]string{"Content-Type": "application/gzip"}, ar, nil)
	took := time.Since(t0)
	after := statusBytes(p.cmd.Process.Pid, "VmHWM")
	t.Logf("an archive of %d bytes holding 4 MiB of YAML: %d in %s; kernel peak RSS %d → %d MiB", len(ar), st, took.Round(time.Millisecond), before>>20, after>>20)
	if st != http.StatusBadRequest || !strings.Contains(fmt.Sprint(err), "tests/bomb.yaml") || !strings.Contains(fmt.Sprint(err), "YAML") {
		t.Fatalf("upload: %d %v, want 400 naming tests/bomb.yaml and the YAML ceiling", st, err)
	}
	if grew := after - before; grew > 100<<20 {
		t.Errorf("the kernel's peak RSS grew by %d MiB refusing it", grew>>20)
	}
}

// rawArchive packs files as a .tar.gz without validating them (a hostile
// client's archive, which bundle.LoadFiles would take as long to refuse as
// the kernel).
func rawArchive(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, content := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(content))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(content)); err != nil {
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
