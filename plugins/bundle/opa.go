package bundle

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	opabundle "github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/loader/filter"
)

// OPA's file names inside a bundle.
const (
	// OPAManifestFile is OPA's manifest: revision, roots, rego_version,
	// file_rego_versions, wasm entrypoints and metadata (JSON).
	OPAManifestFile = ".manifest"
	// SignaturesFile holds the JWT that signs the bundle's files (OPA's
	// .signatures.json).
	SignaturesFile = ".signatures.json"
	// YAMLDataFile is data in YAML, merged like data.json.
	YAMLDataFile = "data.yaml"
)

// OPA describes what a bundle's OPA layer declared: the parts of OPA's
// .manifest Wicket honours, read with OPA's own bundle reader.
type OPA struct {
	// Revision is .manifest's revision (empty when there is none).
	Revision string `json:"revision,omitempty"`
	// Roots are the data paths the bundle owns ("" is all of data). Nil when
	// .manifest names none, which OPA reads as [""].
	Roots []string `json:"roots,omitempty"`
	// RegoVersion is .manifest's rego_version (nil when absent: Rego v1).
	RegoVersion *int `json:"rego_version,omitempty"`
	// Metadata is .manifest's metadata, as written.
	Metadata map[string]any `json:"metadata,omitempty"`
	// WasmEntrypoints are the entrypoints .manifest maps to policy.wasm.
	WasmEntrypoints []string `json:"wasm_entrypoints,omitempty"`
	// DataFiles lists the data files merged into [Bundle.Data], each under
	// the path of its directory (agents/data.json → data.agents).
	DataFiles []string `json:"data_files,omitempty"`
	// Entrypoints are the rules and packages annotated entrypoint: true.
	Entrypoints []string `json:"entrypoints,omitempty"`
}

// Signature states.
const (
	// SignatureNone: the bundle has no .signatures.json (and no keys asked for one).
	SignatureNone = "none"
	// SignatureVerified: .signatures.json was checked with a configured key
	// and every file's digest matched.
	SignatureVerified = "verified"
	// SignatureUnverified: the bundle carries .signatures.json but no
	// verification key was configured, so nothing was checked.
	SignatureUnverified = "unverified"
)

// Signature reports what was established about a bundle's signature.
type Signature struct {
	// State is none, verified or unverified.
	State string `json:"state"`
	// Files is the number of files the signature covers (verified only).
	Files int `json:"files,omitempty"`
}

// Key is a key that verifies bundle signatures, as OPA's keys configuration
// describes one: a PEM public key (or certificate) for RS*, PS* and ES*
// algorithms, or the shared secret for HS*.
type Key struct {
	// ID is the key id a signature names (its "kid" header); default "default".
	ID string `json:"id" yaml:"id"`
	// Algorithm is the JWT algorithm (default RS256).
	Algorithm string `json:"algorithm,omitempty" yaml:"algorithm,omitempty"`
	// Key is the PEM public key or HMAC secret itself (never a file name).
	Key string `json:"key" yaml:"key"`
	// Scope, when set, must equal the signature's scope claim.
	Scope string `json:"scope,omitempty" yaml:"scope,omitempty"`
}

// Default key id and algorithm (OPA's).
const (
	DefaultKeyID     = "default"
	DefaultAlgorithm = "RS256"
)

// keyIDRE bounds key ids to something printable and short.
var keyIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127}$`)

// ValidateKeys checks a key set: ids unique and well formed, a supported
// algorithm, a key that parses for that algorithm.
func ValidateKeys(keys []Key) error {
	_, err := verificationConfig(keys)
	return err
}

// verificationConfig turns keys into OPA's verification config (nil when
// there are none).
func verificationConfig(keys []Key) (*opabundle.VerificationConfig, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	m := make(map[string]*opabundle.KeyConfig, len(keys))
	for i, k := range keys {
		id, alg := k.ID, k.Algorithm
		if id == "" {
			id = DefaultKeyID
		}
		if alg == "" {
			alg = DefaultAlgorithm
		}
		if !keyIDRE.MatchString(id) {
			return nil, fmt.Errorf("keys[%d]: id %q does not match %s", i, id, keyIDRE)
		}
		if _, dup := m[id]; dup {
			return nil, fmt.Errorf("keys[%d]: duplicate id %q", i, id)
		}
		if !supportedAlg(alg) {
			return nil, fmt.Errorf("keys[%d] (%s): unsupported algorithm %q", i, id, alg)
		}
		if strings.TrimSpace(k.Key) == "" {
			return nil, fmt.Errorf("keys[%d] (%s): key is empty", i, id)
		}
		if !strings.HasPrefix(alg, "HS") && !strings.Contains(k.Key, "-----BEGIN ") {
			return nil, fmt.Errorf("keys[%d] (%s): %s needs a PEM public key", i, id, alg)
		}
		m[id] = &opabundle.KeyConfig{Key: k.Key, Algorithm: alg, Scope: k.Scope}
	}
	return opabundle.NewVerificationConfig(m, "", "", nil), nil
}

func supportedAlg(alg string) bool {
	switch alg {
	case "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "HS256", "HS384", "HS512":
		return true
	}
	return false
}

// opaRead reads files with OPA's bundle reader: .manifest, data files at any
// path merged under their directory, roots, rego versions, and, when vc is
// set, .signatures.json verified against every file.
func opaRead(files map[string][]byte, vc *opabundle.VerificationConfig) (*opabundle.Bundle, error) {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	r := opabundle.NewCustomReader(&mapLoader{files: files, paths: paths}).
		WithProcessAnnotations(true).
		WithRegoVersion(ast.RegoV1).
		WithLazyLoadingMode(false).
		WithSizeLimitBytes(MaxTotalSize)
	if vc != nil {
		r = r.WithBundleVerificationConfig(vc)
	} else {
		r = r.WithSkipBundleVerification(true)
	}
	ob, err := r.Read()
	if err != nil {
		if vc != nil && strings.Contains(err.Error(), "failed to verify JWT signature") {
			if msg := algMismatch(files[SignaturesFile], vc); msg != "" {
				return nil, &Error{File: SignaturesFile, Err: classed(ErrSignature, "%s", msg)}
			}
		}
		return nil, opaError(err, vc != nil)
	}
	return &ob, nil
}

// algMismatch explains a signature that did not verify because its JWT
// names another algorithm than the key it names is for (alg none, or HS256
// where the key is an RS256 public key: OPA verifies with the key's
// algorithm whatever the header says, so such a token never verifies); ""
// when the header and the key agree or cannot be read.
func algMismatch(sigs []byte, vc *opabundle.VerificationConfig) string {
	var doc struct {
		Signatures []string `json:"signatures"`
	}
	if json.Unmarshal(sigs, &doc) != nil || len(doc.Signatures) != 1 {
		return ""
	}
	parts := strings.Split(doc.Signatures[0], ".")
	if len(parts) != 3 {
		return ""
	}
	var hdr struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
	}
	var claims struct {
		KeyID string `json:"keyid"`
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || json.Unmarshal(raw, &hdr) != nil {
		return ""
	}
	id := hdr.Kid
	if id == "" {
		if raw, err := base64.RawURLEncoding.DecodeString(parts[1]); err == nil && json.Unmarshal(raw, &claims) == nil {
			id = claims.KeyID
		}
	}
	kc, ok := vc.PublicKeys[id]
	if !ok || strings.EqualFold(hdr.Alg, kc.Algorithm) {
		return ""
	}
	return fmt.Sprintf("the signature says alg %s, but key %s verifies %s signatures: it was not made with that key", strconv.Quote(hdr.Alg), strconv.Quote(id), kc.Algorithm)
}

// mapLoader is an OPA DirectoryLoader over files already collected (and
// bounded) by this package. Paths are given with a leading "/" as OPA's
// tarball loader gives them, so .manifest's wasm module paths match.
type mapLoader struct {
	files map[string][]byte
	paths []string
	next  int
}

func (l *mapLoader) NextFile() (*opabundle.Descriptor, error) {
	if l.next >= len(l.paths) {
		return nil, io.EOF
	}
	p := l.paths[l.next]
	l.next++
	return opabundle.NewDescriptor("/"+p, "/"+p, bytes.NewBuffer(l.files[p])), nil
}

func (l *mapLoader) WithFilter(filter.LoaderFilter) opabundle.DirectoryLoader { return l }
func (l *mapLoader) WithPathFormat(opabundle.PathFormat) opabundle.DirectoryLoader {
	return l
}
func (l *mapLoader) WithSizeLimitBytes(int64) opabundle.DirectoryLoader { return l }
func (l *mapLoader) WithFollowSymlinks(bool) opabundle.DirectoryLoader  { return l }

// ErrSignature: a bundle's signature is missing, does not verify, or a
// file's digest differs from the one signed.
var ErrSignature = errors.New("bundle signature")

var (
	digestRE      = regexp.MustCompile(`^/?(.+?): digest mismatch`)
	notIncludedRE = regexp.MustCompile(`^file /?(.+?) not included in bundle signature`)
	loadFailedRE  = regexp.MustCompile(`^bundle load failed on /?(\S+?): (.*)$`)
)

// opaError names the file an error of OPA's reader is about.
func opaError(err error, verifying bool) *Error {
	msg := err.Error()
	var ae ast.Errors
	if errors.As(err, &ae) && len(ae) > 0 {
		e := ae[0]
		f, line := "", 0
		if e.Location != nil {
			f, line = strings.TrimPrefix(e.Location.File, "/"), e.Location.Row
		}
		reason := e.Code + ": " + e.Message
		if len(ae) > 1 {
			reason += fmt.Sprintf(" (and %d more errors)", len(ae)-1)
		}
		return &Error{File: f, Line: line, Err: errors.New(reason)}
	}
	if m := digestRE.FindStringSubmatch(msg); m != nil {
		return &Error{File: m[1], Err: classed(ErrSignature, "digest differs from the one signed in %s (the file was changed after signing)", SignaturesFile)}
	}
	if m := notIncludedRE.FindStringSubmatch(msg); m != nil {
		return &Error{File: m[1], Err: classed(ErrSignature, "not covered by %s (added after signing)", SignaturesFile)}
	}
	if m := loadFailedRE.FindStringSubmatch(msg); m != nil {
		reason := m[2]
		switch {
		case strings.Contains(reason, "failed to insert data file"):
			reason = "its data collides with another data file's (a value where the other has an object, or the reverse)"
		case strings.Contains(reason, "root value must be object"):
			reason = "must be a JSON object (it is the root of data)"
		case strings.HasSuffix(m[1], ".json"):
			reason = "invalid JSON: " + reason
		case strings.HasSuffix(m[1], ".yaml"), strings.HasSuffix(m[1], ".yml"):
			reason = "invalid YAML: " + reason
		}
		return &Error{File: m[1], Err: errors.New(reason)}
	}
	switch {
	case strings.Contains(msg, "rego-version"):
		return &Error{File: OPAManifestFile, Field: "rego_version", Err: errors.New(msg)}
	case strings.Contains(msg, "missing .signatures.json"):
		return &Error{File: SignaturesFile, Err: classed(ErrSignature, "missing: this kernel verifies bundle signatures and the bundle is not signed")}
	case strings.Contains(msg, "specified in bundle signatures but not found"),
		strings.Contains(msg, "signatures"), strings.Contains(msg, "JWT"), strings.Contains(msg, "verification key"),
		strings.Contains(msg, "scope mismatch"), strings.Contains(msg, "key ID"),
		verifying && (strings.Contains(msg, "signature") || strings.Contains(msg, "base64") ||
			strings.Contains(msg, "compact") || strings.Contains(msg, "algorithm")):
		return &Error{File: SignaturesFile, Err: classed(ErrSignature, "%s", msg)}
	case strings.Contains(msg, "manifest"):
		return &Error{File: OPAManifestFile, Err: errors.New(msg)}
	}
	return &Error{File: archiveLabel, Err: errors.New(msg)}
}

// applyOPA fills b from OPA's reading of its files: merged data, the OPA
// manifest, per-file Rego versions, annotated entrypoints.
func applyOPA(b *Bundle, ob *opabundle.Bundle) error {
	om := ob.Manifest
	o := &OPA{Revision: om.Revision, RegoVersion: om.RegoVersion, Metadata: om.Metadata}
	if _, ok := b.Files[OPAManifestFile]; ok && om.Roots != nil {
		o.Roots = slices.Clone(*om.Roots)
	}
	for _, w := range om.WasmResolvers {
		if strings.TrimPrefix(w.Module, "/") == WasmFile {
			o.WasmEntrypoints = append(o.WasmEntrypoints, w.Entrypoint)
		}
	}
	for p := range b.Files {
		if isDataFile(p) {
			o.DataFiles = append(o.DataFiles, p)
		}
	}
	slices.Sort(o.DataFiles)
	if len(o.DataFiles) > 0 {
		data := ob.Data
		if data == nil {
			data = map[string]any{}
		}
		raw, err := json.Marshal(data)
		if err != nil {
			return &Error{File: o.DataFiles[0], Err: fmt.Errorf("data: %w", err)}
		}
		b.Data = raw
	}
	b.regoVersions = make(map[string]ast.RegoVersion, len(ob.Modules))
	seen := map[string]bool{}
	for _, m := range ob.Modules {
		p := strings.TrimPrefix(m.Path, "/")
		//lint:ignore SA1019 the one Rego version a module was parsed with is what the engine needs; the span API gives no such value
		b.regoVersions[p] = m.Parsed.RegoVersion()
		for _, a := range m.Parsed.Annotations {
			if !a.Entrypoint {
				continue
			}
			if ref := a.GetTargetPath(); ref != nil && !seen[ref.String()] {
				seen[ref.String()] = true
				o.Entrypoints = append(o.Entrypoints, ref.String())
			}
		}
	}
	slices.Sort(o.Entrypoints)
	b.OPA = o
	return nil
}

// RegoVersion returns the Rego version a .rego file of the bundle is
// written in: .manifest's file_rego_versions entry for it, else its
// rego_version, else Rego v1 (as OPA 1.x reads bundles).
func (b *Bundle) RegoVersion(p string) ast.RegoVersion {
	if v, ok := b.regoVersions[p]; ok && v != ast.RegoUndefined {
		return v
	}
	return ast.RegoV1
}
