package bundle

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	opabundle "github.com/open-policy-agent/opa/v1/bundle"
)

// ecKeys returns a fresh P-256 key pair as PEM (private, public).
func ecKeys(t *testing.T) (string, string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: priv})),
		string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
}

func signedFiles(t *testing.T, priv string) map[string][]byte {
	t.Helper()
	files := readDirFiles(t, authzDir)
	files["bundle.yaml"] = []byte("default_action: deny\n")
	sig, err := Sign(files, SigningKey{Key: priv, Algorithm: "ES256", KeyID: "ci"})
	if err != nil {
		t.Fatal(err)
	}
	files[SignaturesFile] = sig
	return files
}

func TestSignatures(t *testing.T) {
	priv, pub := ecKeys(t)
	_, otherPub := ecKeys(t)
	keys := []Key{{ID: "ci", Algorithm: "ES256", Key: pub}}
	opts := Options{Name: "authz", Keys: keys}

	t.Run("signed loads, verified", func(t *testing.T) {
		b, err := opts.LoadFiles(signedFiles(t, priv))
		if err != nil {
			t.Fatal(err)
		}
		if b.Signature.State != SignatureVerified || b.Signature.Files != len(b.Files)-1 {
			t.Errorf("signature = %+v", b.Signature)
		}
	})
	t.Run("no keys: unverified", func(t *testing.T) {
		b, err := Options{Name: "authz"}.LoadFiles(signedFiles(t, priv))
		if err != nil || b.Signature.State != SignatureUnverified {
			t.Fatalf("%v, %+v", err, b)
		}
	})
	t.Run("as a tarball", func(t *testing.T) {
		b, err := opts.LoadTarGz(bytes.NewReader(slashTarGz(t, signedFiles(t, priv))))
		if err != nil || b.Signature.State != SignatureVerified {
			t.Fatalf("%v", err)
		}
	})
	t.Run("reformatted JSON data still verifies (OPA hashes the value)", func(t *testing.T) {
		files := signedFiles(t, priv)
		files["agents/data.json"] = []byte(`{"writer":{"tools":["fs.write"]},"researcher":{"tools":["fs.read","shell.exec","http.get"]}}`)
		if _, err := opts.LoadFiles(files); err != nil {
			t.Fatal(err)
		}
	})
	refusals := []struct {
		name   string
		change func(map[string][]byte)
		opts   Options
		file   string
		want   string
	}{
		{"tampered policy", func(f map[string][]byte) {
			f["wicket/policy.rego"] = bytes.Replace(f["wicket/policy.rego"], []byte(`"deny", "rule_id": "dangerous"`), []byte(`"allow", "rule_id": "dangerous"`), 1)
		}, opts, "wicket/policy.rego", "digest differs"},
		{"tampered data", func(f map[string][]byte) {
			f["tools/data.yaml"] = []byte("guarded: []\n")
		}, opts, "tools/data.yaml", "digest differs"},
		{"tampered bundle.yaml", func(f map[string][]byte) { f["bundle.yaml"] = []byte("default_action: allow\n") }, opts, "bundle.yaml", "digest differs"},
		{"tampered .manifest", func(f map[string][]byte) { f[".manifest"] = []byte(`{"revision": "evil"}`) }, opts, ".manifest", "digest differs"},
		{"file added", func(f map[string][]byte) { f["extra/data.json"] = []byte(`{}`) }, opts, "extra/data.json", "not covered"},
		{"file removed", func(f map[string][]byte) { delete(f, "lib/lib.rego") }, opts, SignaturesFile, "not found"},
		{"unsigned", func(f map[string][]byte) { delete(f, SignaturesFile) }, opts, SignaturesFile, "not signed"},
		{"other key", func(map[string][]byte) {}, Options{Name: "authz", Keys: []Key{{ID: "ci", Algorithm: "ES256", Key: otherPub}}}, SignaturesFile, "verify"},
		{"unknown key id", func(map[string][]byte) {}, Options{Name: "authz", Keys: []Key{{ID: "prod", Algorithm: "ES256", Key: pub}}}, SignaturesFile, "ID ci not found"},
		{"garbage signature", func(f map[string][]byte) { f[SignaturesFile] = []byte(`{"signatures": ["a.b.c"]}`) }, opts, SignaturesFile, ""},
		{"two signatures", func(f map[string][]byte) {
			f[SignaturesFile] = []byte(`{"signatures": ["a.b.c", "d.e.f"]}`)
		}, opts, SignaturesFile, "multiple"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			files := signedFiles(t, priv)
			tt.change(files)
			_, err := tt.opts.LoadFiles(files)
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, ErrSignature) {
				t.Fatalf("err = %v, want an ErrSignature *Error", err)
			}
			if e.File != tt.file || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %q (file %q), want file %q and %q", err, e.File, tt.file, tt.want)
			}
		})
	}
	t.Run("signed by OPA's own writer", func(t *testing.T) {
		ob, err := opabundle.NewCustomReader(opabundle.NewDirectoryLoader(authzDir)).Read()
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.GenerateSignature(opabundle.NewSigningConfig(priv, "ES256", ""), "ci", true); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := opabundle.NewWriter(&buf).UseModulePath(true).Write(ob); err != nil {
			t.Fatal(err)
		}
		b, err := opts.LoadTarGz(bytes.NewReader(buf.Bytes()))
		if err != nil || b.Signature.State != SignatureVerified {
			t.Fatalf("%v", err)
		}
		sameJSON(t, b.Data, wantAuthzData)
	})
	t.Run("verified by OPA's own reader", func(t *testing.T) {
		files := signedFiles(t, priv)
		vc := opabundle.NewVerificationConfig(map[string]*opabundle.KeyConfig{"ci": {Key: pub, Algorithm: "ES256"}}, "", "", nil)
		_, err := opabundle.NewCustomReader(opabundle.NewTarballLoader(bytes.NewReader(slashTarGz(t, files)))).WithBundleVerificationConfig(vc).Read()
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("HMAC", func(t *testing.T) {
		files := readDirFiles(t, authzDir)
		sig, err := Sign(files, SigningKey{Key: "a-long-shared-secret-0123456789", Algorithm: "HS256"})
		if err != nil {
			t.Fatal(err)
		}
		files[SignaturesFile] = sig
		if _, err := (Options{Name: "a", Keys: []Key{{Algorithm: "HS256", Key: "a-long-shared-secret-0123456789"}}}).LoadFiles(files); err != nil {
			t.Fatal(err)
		}
		if _, err := (Options{Name: "a", Keys: []Key{{Algorithm: "HS256", Key: "another-secret-0123456789"}}}).LoadFiles(files); !errors.Is(err, ErrSignature) {
			t.Fatalf("wrong secret: %v", err)
		}
	})
	t.Run("Signed", func(t *testing.T) {
		b, err := LoadDir(authzDir + "/..") // any unsigned bundle will do
		if err == nil {
			t.Fatalf("testdata is not a bundle: %+v", b.Manifest)
		}
		u, err := Options{Name: "authz"}.LoadDir(authzDir)
		if err != nil {
			t.Fatal(err)
		}
		s, err := u.Signed(SigningKey{Key: priv, Algorithm: "ES256", KeyID: "ci"})
		if err != nil {
			t.Fatal(err)
		}
		if s.Digest == u.Digest || len(s.Files) != len(u.Files)+1 {
			t.Errorf("signed copy: digest %s, %d files", s.Digest, len(s.Files))
		}
		ar, err := s.TarGz()
		if err != nil {
			t.Fatal(err)
		}
		v, err := opts.LoadTarGz(bytes.NewReader(ar))
		if err != nil || v.Digest != s.Digest {
			t.Fatalf("%v", err)
		}
	})
}

func TestValidateKeys(t *testing.T) {
	_, pub := ecKeys(t)
	for name, keys := range map[string][]Key{
		"duplicate id":    {{ID: "a", Algorithm: "ES256", Key: pub}, {ID: "a", Algorithm: "ES256", Key: pub}},
		"bad algorithm":   {{Algorithm: "none", Key: pub}},
		"empty key":       {{Algorithm: "ES256"}},
		"not PEM for RSA": {{Algorithm: "RS256", Key: "/etc/passwd"}},
		"bad id":          {{ID: "a b", Algorithm: "ES256", Key: pub}},
	} {
		if err := ValidateKeys(keys); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := ValidateKeys([]Key{{Algorithm: "ES256", Key: pub}}); err != nil {
		t.Error(err)
	}
}

// TestSignatureAlgorithmMismatch: a token whose header names another
// algorithm than the key it names (alg none; HS256 keyed with the public
// key's PEM, the algorithm-confusion attack) is refused, and the refusal
// says so rather than only that the signature did not verify.
func TestSignatureAlgorithmMismatch(t *testing.T) {
	priv, pub := ecKeys(t)
	opts := Options{Name: "authz", Keys: []Key{{ID: "ci", Algorithm: "ES256", Key: pub}}}
	forge := func(header string, sign func(in []byte) []byte) map[string][]byte {
		files := signedFiles(t, priv)
		var doc struct{ Signatures []string }
		if err := json.Unmarshal(files[SignaturesFile], &doc); err != nil {
			t.Fatal(err)
		}
		payload := strings.Split(doc.Signatures[0], ".")[1]
		h := base64.RawURLEncoding.EncodeToString([]byte(header))
		tok := h + "." + payload + "." + base64.RawURLEncoding.EncodeToString(sign([]byte(h+"."+payload)))
		files[SignaturesFile], _ = json.Marshal(map[string][]string{"signatures": {tok}})
		return files
	}
	for name, tc := range map[string]struct {
		files map[string][]byte
		want  string
	}{
		"alg none": {forge(`{"alg":"none","kid":"ci"}`, func([]byte) []byte { return nil }),
			`.signatures.json: the signature says alg "none", but key "ci" verifies ES256 signatures`},
		"HS256 keyed with the PEM": {forge(`{"alg":"HS256","kid":"ci"}`, func(in []byte) []byte {
			m := hmac.New(sha256.New, []byte(pub))
			m.Write(in)
			return m.Sum(nil)
		}), `.signatures.json: the signature says alg "HS256", but key "ci" verifies ES256 signatures`},
	} {
		_, err := opts.LoadFiles(tc.files)
		if err == nil || !errors.Is(err, ErrSignature) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	// A token signed by another key with the right algorithm is only "does
	// not verify".
	otherPriv, _ := ecKeys(t)
	if _, err := opts.LoadFiles(signedFiles(t, otherPriv)); err == nil || !strings.Contains(err.Error(), "failed to verify JWT signature") {
		t.Errorf("other key: %v", err)
	}
}
