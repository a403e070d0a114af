package e2e

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/internal/testkit"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// TestSignedBundles runs a real `wicket serve --bundle-verification-key`:
// a bundle signed with `wicket policy build --signing-key` loads; an
// unsigned one, a tampered one and one signed by another key are refused
// with a 400 naming the file; the running revision stays.
func TestSignedBundles(t *testing.T) {
	dir := t.TempDir()
	pemKeys := func(name string) (string, string) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		priv, _ := x509.MarshalPKCS8PrivateKey(k)
		pub, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
		privFile, pubFile := filepath.Join(dir, name+".key"), filepath.Join(dir, name+".pub")
		if err := os.WriteFile(privFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: priv}), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
			t.Fatal(err)
		}
		return privFile, pubFile
	}
	priv, pub := pemKeys("ci")
	otherPriv, _ := pemKeys("other")

	build := func(out string, extra ...string) []byte {
		args := append([]string{"policy", "build", opaAuthzDir, "-o", out}, extra...)
		if o, err := osexec.Command(wicketBinary(t), args...).CombinedOutput(); err != nil {
			t.Fatalf("policy build: %v\n%s", err, o)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	signed := build(filepath.Join(dir, "signed.tar.gz"), "--signing-key", priv, "--signing-alg", "ES256", "--signing-key-id", "ci")
	unsigned := build(filepath.Join(dir, "unsigned.tar.gz"))
	byOther := build(filepath.Join(dir, "other.tar.gz"), "--signing-key", otherPriv, "--signing-alg", "ES256", "--signing-key-id", "ci")

	// Tamper: flip the dangerous-command deny to allow inside the signed archive.
	b, err := bundle.Options{Name: "opa-authz"}.LoadTarGz(bytes.NewReader(signed))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for p, c := range b.Files {
		files[p] = c
	}
	files["wicket/policy.rego"] = bytes.Replace(files["wicket/policy.rego"], []byte(`{"decision": "deny", "rule_id": "dangerous"`), []byte(`{"decision": "allow", "rule_id": "dangerous"`), 1)
	tb, err := bundle.Options{Name: "opa-authz"}.LoadFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	tampered, err := tb.TarGz()
	if err != nil {
		t.Fatal(err)
	}

	p := startServe(t, filepath.Join(dir, "data"), freeAddr(t), "--bundle-verification-key", pub, "--bundle-verification-alg", "ES256", "--bundle-verification-key-id", "ci")
	defer func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() }()
	put := func(archive []byte) (int, error) {
		var rec map[string]any
		return testkit.BearerWithHeaders(p.url, testkit.AdminKey, "PUT", "/v0/bundles/opa-authz", map[string]string{"Content-Type": "application/gzip"}, archive, &rec)
	}
	if code, err := put(signed); err != nil || code != 200 {
		t.Fatalf("signed bundle: %d %v", code, err)
	}
	for name, tc := range map[string]struct {
		archive []byte
		want    string
	}{
		"unsigned":  {unsigned, ".signatures.json: missing"},
		"tampered":  {tampered, "wicket/policy.rego: digest differs"},
		"other key": {byOther, ".signatures.json: failed to verify"},
	} {
		code, err := put(tc.archive)
		if code != 400 || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %d %v, want 400 with %q", name, code, err, tc.want)
		}
	}
	var got struct {
		Digest string `json:"sha256"`
	}
	if _, err := testkit.Bearer(p.url, testkit.AdminKey, "GET", "/v0/bundles/opa-authz", nil, &got); err != nil {
		t.Fatal(err)
	}
	sb, _ := bundle.Options{Name: "opa-authz"}.LoadTarGz(bytes.NewReader(signed))
	if got.Digest != sb.Digest {
		t.Errorf("live digest %s, want the signed bundle's %s", got.Digest, sb.Digest)
	}
}
