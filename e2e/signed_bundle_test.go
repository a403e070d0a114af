package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"maps"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
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

	wrongKid := build(filepath.Join(dir, "kid.tar.gz"), "--signing-key", priv, "--signing-alg", "ES256", "--signing-key-id", "someone-else")

	// Re-pack the signed bundle's files, changed by edit (an archive as an
	// attacker writes it: .signatures.json kept or forged).
	repack := func(edit func(files map[string][]byte)) []byte {
		b, err := bundle.Options{Name: "opa-authz"}.LoadTarGz(bytes.NewReader(signed))
		if err != nil {
			t.Fatal(err)
		}
		files := map[string][]byte{}
		for p, c := range b.Files {
			files[p] = c
		}
		edit(files)
		return tarGz(t, files)
	}
	// forge replaces the signature's JWT header (and so its algorithm) and
	// signs header.payload with sign, keeping the signed payload.
	forge := func(header string, sign func(signingInput []byte) []byte) []byte {
		return repack(func(files map[string][]byte) {
			var sigs struct{ Signatures []string }
			if err := json.Unmarshal(files[".signatures.json"], &sigs); err != nil || len(sigs.Signatures) != 1 {
				t.Fatalf(".signatures.json: %v %s", err, files[".signatures.json"])
			}
			parts := strings.Split(sigs.Signatures[0], ".")
			h := base64.RawURLEncoding.EncodeToString([]byte(header))
			tok := h + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(sign([]byte(h+"."+parts[1])))
			files[".signatures.json"], _ = json.Marshal(map[string][]string{"signatures": {tok}})
		})
	}
	pubPEM, err := os.ReadFile(pub)
	if err != nil {
		t.Fatal(err)
	}
	algNone := forge(`{"alg":"none","kid":"ci","typ":"JWT"}`, func([]byte) []byte { return nil })
	// Algorithm confusion: HS256 keyed with the verification key's PEM.
	hs256 := forge(`{"alg":"HS256","kid":"ci","typ":"JWT"}`, func(in []byte) []byte {
		m := hmac.New(sha256.New, pubPEM)
		m.Write(in)
		return m.Sum(nil)
	})
	added := repack(func(files map[string][]byte) { files["wicket/extra.rego"] = []byte("package wicket.extra\n\nx := 1\n") })
	removed := repack(func(files map[string][]byte) { delete(files, "wicket/policy.rego") })

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
		"unsigned":       {unsigned, ".signatures.json: missing"},
		"tampered":       {tampered, "wicket/policy.rego: digest differs"},
		"other key":      {byOther, ".signatures.json: failed to verify"},
		"unknown kid":    {wrongKid, ".signatures.json: verification key corresponding to ID someone-else not found"},
		"alg none":       {algNone, `.signatures.json: the signature says alg "none", but key "ci" verifies ES256`},
		"HS256 with PEM": {hs256, `.signatures.json: the signature says alg "HS256", but key "ci" verifies ES256`},
		"file added":     {added, "wicket/extra.rego: not covered by .signatures.json"},
		"file removed":   {removed, ".signatures.json: file(s) [wicket/policy.rego] specified in bundle signatures but not found"},
	} {
		code, body := putRaw(t, p.url, "/v0/bundles/opa-authz", tc.archive)
		if code != 400 || body.Code != "validation" || !strings.Contains(body.Message, tc.want) {
			t.Errorf("%s: %d %+v, want 400 with %q", name, code, body, tc.want)
		}
		// One problem: no details.problems (a list is for several, each
		// naming its file), not the problem split into its class and text.
		if len(body.Details.Problems) != 0 {
			t.Errorf("%s: details.problems %q for a single problem", name, body.Details.Problems)
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

// refusal is the body of an API error.
type refusal struct {
	Code    string
	Message string
	Details struct{ Problems []string }
}

// putRaw uploads archive as an admin and returns the status and the error
// body (empty on success).
func putRaw(t *testing.T, base, path string, archive []byte) (int, refusal) {
	t.Helper()
	req, err := http.NewRequest("PUT", base+path, bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testkit.AdminKey)
	req.Header.Set("Content-Type", "application/gzip")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body refusal
	if res.StatusCode != http.StatusOK {
		if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
			t.Fatalf("%s: %d: %v", path, res.StatusCode, err)
		}
	}
	return res.StatusCode, body
}

// tarGz packs files (slash paths) into a .tar.gz, in path order.
func tarGz(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(files[name]); err != nil {
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
