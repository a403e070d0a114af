package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// cWasm is the C SDK example module (2 pages of memory, no imports).
func cWasm(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile("../policy-sdk/c/examples/deny_destructive.wasm")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// filesArchive packs bundle files as a .tar.gz.
func filesArchive(t testing.TB, files map[string]string) []byte {
	t.Helper()
	m := map[string][]byte{}
	for k, v := range files {
		m[k] = []byte(v)
	}
	b, err := bundle.LoadFiles(m)
	if err != nil {
		t.Fatal(err)
	}
	ar, err := b.TarGz()
	if err != nil {
		t.Fatal(err)
	}
	return ar
}

// uploadArchive PUTs a bundle archive into a tenant with the admin key.
func uploadArchive(base, tenant, name string, archive []byte) (int, error) {
	return testkit.BearerWithHeaders(base, testkit.AdminKey, "PUT", "/v0/bundles/"+name+"?tenant="+tenant,
		map[string]string{"Content-Type": "application/gzip"}, archive, nil)
}

// TestBundleCeilings: against a real `wicket serve`, a bundle asking for
// more than the kernel's ceilings is refused at upload with a 400 naming
// the limit and the ceiling (the attacks of the issue: an 87600h timeout,
// 4 GiB of memory per instance, bundles of 64 MiB × pool until the memory
// is gone), for wasm and Rego alike; within them bundles load, and the
// memory account is per tenant.
func TestBundleCeilings(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t), "--wasm-tenant-memory", "256MiB", "--wasm-max-pool-size", "2")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	for _, tenant := range []string{"acme", "other"} {
		if _, err := testkit.Bearer(p.url, testkit.AdminKey, "POST", "/v0/tenants", map[string]any{"id": tenant}, nil); err != nil {
			t.Fatal(err)
		}
	}
	mod := cWasm(t)
	wasmBundle := func(name, sandbox string) []byte {
		return wasmArchive(t, "name: "+name+"\nengine: wasm\nsandbox: "+sandbox+"\n", mod)
	}
	regoBundle := func(name, sandbox string) []byte {
		return filesArchive(t, map[string]string{"bundle.yaml": "name: " + name + "\nengine: rego\nsandbox: " + sandbox + "\n",
			"policy.rego": "package wicket\ndecision := {\"decision\": \"allow\"}\n"})
	}
	big := "{memory_pages: 1024, pool_size: 2}" // 128 MiB
	for _, c := range []struct {
		name, bundle, tenant string
		archive              []byte
		want                 string // empty: accepted
	}{
		{"wasm timeout", "slow", "acme", wasmBundle("slow", "{timeout: 87600h}"), "bundle.yaml: sandbox.timeout: 87600h0m0s exceeds the kernel's ceiling of 2s (serve --sandbox-max-timeout)"},
		{"rego timeout", "slow", "acme", regoBundle("slow", "{timeout: 87600h}"), "bundle.yaml: sandbox.timeout: 87600h0m0s exceeds the kernel's ceiling of 2s (serve --sandbox-max-timeout)"},
		{"4 GiB instance", "huge", "acme", wasmBundle("huge", "{memory_pages: 65536}"), "bundle.yaml: sandbox.memory_pages: 65536 exceeds the kernel's ceiling of 1024 pages (64 MiB) (serve --wasm-max-memory)"},
		{"pool", "wide", "acme", wasmBundle("wide", "{pool_size: 64}"), "bundle.yaml: sandbox.pool_size: 64 exceeds the kernel's ceiling of 2 (serve --wasm-max-pool-size)"},
		{"at the ceilings", "slow", "acme", wasmBundle("slow", "{timeout: 2s, memory_pages: 1024, pool_size: 2}"), ""},
		{"rego at the ceiling", "rego", "acme", regoBundle("rego", "{timeout: 2s}"), ""},
		{"second 128 MiB", "big2", "acme", wasmBundle("big2", big), ""},
		{"third 128 MiB", "big3", "acme", wasmBundle("big3", big), `bundle "big3" reserves 128 MiB of wasm memory (memory cap × pool size); with the tenant's other bundles (256 MiB) that exceeds the kernel's ceiling of 256 MiB per tenant (serve --wasm-tenant-memory)`},
		{"a new revision replaces", "big2", "acme", wasmBundle("big2", "{memory_pages: 1024, pool_size: 1}"), ""},
		{"another tenant", "big3", "other", wasmBundle("big3", big), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, err := uploadArchive(p.url, c.tenant, c.bundle, c.archive)
			if c.want == "" {
				if err != nil {
					t.Fatalf("upload: %d %v", st, err)
				}
				return
			}
			if st != 400 || err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("upload: %d %v\nwant 400 with %s", st, err, c.want)
			}
		})
	}
}
