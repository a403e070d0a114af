package bundle

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	opabundle "github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/util"
)

// SigningKey signs bundles the way `opa build --signing-key` does.
type SigningKey struct {
	// Key is a PEM private key (RS*, PS*, ES*) or the HMAC secret (HS*), or
	// the name of a file holding it.
	Key string
	// Algorithm is the JWT algorithm (default RS256).
	Algorithm string
	// KeyID is written as the JWT's kid; verifiers pick their key by it
	// (default "default").
	KeyID string
	// ClaimsFile optionally names a JSON file of extra claims (e.g. scope).
	ClaimsFile string
}

// Sign returns the content of .signatures.json for files: one JWT, made
// with OPA's bundle signer, listing every file (except .signatures.json
// itself) with its SHA-256 as OPA hashes it (JSON and YAML data and
// .manifest by their parsed value, other files byte for byte). Every file
// is signed, bundle.yaml and tests included, so OPA verifies the result too.
func Sign(files map[string][]byte, k SigningKey) ([]byte, error) {
	alg := k.Algorithm
	if alg == "" {
		alg = DefaultAlgorithm
	}
	if !supportedAlg(alg) {
		return nil, fmt.Errorf("sign: unsupported algorithm %q", alg)
	}
	kid := k.KeyID
	if kid == "" {
		kid = DefaultKeyID
	}
	h, err := opabundle.NewSignatureHasher(opabundle.SHA256)
	if err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		if p != SignaturesFile {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	infos := make([]opabundle.FileInfo, 0, len(paths))
	for _, p := range paths {
		var v any = files[p]
		if opabundle.IsStructuredDoc(p) {
			if err := util.Unmarshal(files[p], &v); err != nil {
				return nil, &Error{File: p, Err: fmt.Errorf("sign: %w", err)}
			}
		}
		sum, err := h.HashFile(v)
		if err != nil {
			return nil, &Error{File: p, Err: fmt.Errorf("sign: %w", err)}
		}
		infos = append(infos, opabundle.NewFile(p, hex.EncodeToString(sum), string(opabundle.SHA256)))
	}
	token, err := opabundle.GenerateSignedToken(infos, opabundle.NewSigningConfig(k.Key, alg, k.ClaimsFile), kid)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	return json.MarshalIndent(opabundle.SignaturesConfig{Signatures: []string{token}}, "", " ")
}

// Signed returns a copy of b signed with k: its files plus a new
// .signatures.json (replacing any), and the new digest.
func (b *Bundle) Signed(k SigningKey) (*Bundle, error) {
	sig, err := Sign(b.Files, k)
	if err != nil {
		return nil, err
	}
	c := *b
	c.Files = make(map[string][]byte, len(b.Files)+1)
	for p, v := range b.Files {
		c.Files[p] = v
	}
	c.Files[SignaturesFile] = sig
	c.Signature = Signature{State: SignatureUnverified}
	c.Digest = Digest(c.Files)
	return &c, nil
}
