package bundle

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	opabundle "github.com/open-policy-agent/opa/v1/bundle"
)

// Options tune the loaders. The zero value is what [LoadDir], [LoadTarGz]
// and [LoadFiles] use.
type Options struct {
	// Name names a bundle whose bundle.yaml gives no name, or that has no
	// bundle.yaml (an OPA bundle as `opa build` writes it). The server
	// passes the name of the URL; the CLI the directory or archive name.
	Name string
	// Keys verify .signatures.json with OPA's bundle verification. When
	// there is at least one key, a bundle must be signed by one of them and
	// every file's digest must match the signed one; otherwise it is
	// refused with an error naming the file ([ErrSignature]). With no keys a
	// signature is not checked and [Bundle.Signature] says so.
	Keys []Key
}

// validate is the one validator every loader ends in. It reports every
// problem it can find in one pass ([Join]): those of bundle.yaml, of the
// engine's files and of every test file; only a bundle whose manifest and
// OPA layout read cleanly has its engine's files checked.
func validate(files map[string][]byte, o Options) (*Bundle, error) {
	vc, err := verificationConfig(o.Keys)
	if err != nil {
		return nil, &Error{File: SignaturesFile, Err: fmt.Errorf("verification keys: %w", err)}
	}
	var errs []error
	var m Manifest
	manifestOK := true
	if src, ok := files[ManifestFile]; ok {
		if m, err = ParseManifest(src); err != nil {
			errs = append(errs, err)
			manifestOK = false
		}
	}
	if _, ok := files["patch.json"]; ok {
		errs = append(errs, &Error{File: "patch.json", Err: errors.New("delta bundles are not supported: send the whole bundle")})
	}
	if _, err := parseTestFiles(files); err != nil {
		errs = append(errs, err)
	}
	b := &Bundle{Manifest: m, Files: files}
	if ob, rerr := opaRead(files, vc); rerr != nil {
		errs = append(errs, rerr)
	} else if manifestOK {
		errs = append(errs, checkEngine(b, ob, o))
	}
	if err := Join(errs...); err != nil {
		return nil, err
	}
	switch _, signed := files[SignaturesFile]; {
	case vc != nil:
		b.Signature = Signature{State: SignatureVerified, Files: len(files) - 1}
	case signed:
		b.Signature = Signature{State: SignatureUnverified}
	default:
		b.Signature = Signature{State: SignatureNone}
	}
	b.Digest = Digest(files)
	return b, nil
}

// checkEngine completes b from OPA's reading of the files and checks that
// the engine's files are there.
func checkEngine(b *Bundle, ob *opabundle.Bundle, o Options) error {
	if err := applyOPA(b, ob); err != nil {
		return err
	}
	if err := complete(b, o); err != nil {
		return err
	}
	m, files := b.Manifest, b.Files
	switch m.Engine {
	case EngineRules:
		if _, ok := files[RulesFile]; !ok {
			return &Error{File: RulesFile, Err: classed(ErrMissingFile, "missing: the rules engine needs it")}
		}
		a, line, err := rulesDefaultAction(files[RulesFile])
		if errors.As(err, new(yamlSyntaxError)) {
			return &Error{File: RulesFile, Err: err}
		}
		if err != nil {
			return &Error{File: RulesFile, Line: line, Field: "default_action", Err: err}
		}
		if a != "" && m.DefaultAction != "" && a != m.DefaultAction {
			return &Error{File: RulesFile, Line: line, Field: "default_action",
				Err: fmt.Errorf("%q contradicts bundle.yaml default_action %q; set it in one place", a, m.DefaultAction)}
		}
	case EngineRego:
		if !hasRego(files) {
			return &Error{File: "*.rego", Err: classed(ErrMissingFile, "missing: the rego engine needs at least one .rego file")}
		}
	case EngineWasm:
		w, ok := files[WasmFile]
		if !ok {
			return &Error{File: WasmFile, Err: classed(ErrMissingFile, "missing: the wasm engine needs it")}
		}
		if !bytes.HasPrefix(w, []byte("\x00asm")) {
			return &Error{File: WasmFile, Err: errors.New("not a WebAssembly binary (bad magic number)")}
		}
	}
	return nil
}

// hasRego reports whether files hold a .rego file outside tests/.
func hasRego(files map[string][]byte) bool {
	for p := range files {
		if strings.HasSuffix(p, ".rego") && !strings.HasPrefix(p, TestsDir) {
			return true
		}
	}
	return false
}

// complete fills what bundle.yaml left out from the name given, OPA's
// manifest and the files, and checks that the two manifests agree.
func complete(b *Bundle, o Options) error {
	m := &b.Manifest
	mf := func(field string, err error) error { return &Error{File: ManifestFile, Field: field, Err: err} }
	if m.Name == "" {
		if o.Name == "" {
			if _, ok := b.Files[ManifestFile]; ok {
				return mf("name", errors.New("required (or name the bundle when loading it)"))
			}
			return &Error{File: ManifestFile, Err: classed(ErrMissingFile, "the bundle has no bundle.yaml and was given no name")}
		}
		if !ValidName(o.Name) {
			return mf("name", fmt.Errorf("%q does not match ^[a-z0-9][a-z0-9_.-]{0,62}$", o.Name))
		}
		m.Name = o.Name
	}
	if rev := b.OPA.Revision; rev != "" {
		switch {
		case m.Revision == "":
			if err := checkText(rev, 128); err != nil {
				return &Error{File: OPAManifestFile, Field: "revision", Err: err}
			}
			m.Revision = rev
		case m.Revision != rev:
			return mf("revision", fmt.Errorf("%q contradicts .manifest revision %q; set it in one place", m.Revision, rev))
		}
	}
	_, hasWasm := b.Files[WasmFile]
	if m.Engine == "" {
		_, hasRules := b.Files[RulesFile]
		switch {
		case hasWasm:
			m.Engine = EngineWasm
			if m.ABI == "" {
				m.ABI = ABIOPA // opa build -t wasm
			}
		case hasRego(b.Files):
			m.Engine = EngineRego
		case hasRules:
			m.Engine = EngineRules
		default:
			_, hasManifest := b.Files[ManifestFile]
			_, hasOPAManifest := b.Files[OPAManifestFile]
			if !hasManifest && !hasOPAManifest {
				// Nothing here says it is a bundle: do not blame a
				// bundle.yaml that is not there.
				return &Error{Err: classed(ErrMissingFile, "not a bundle: no bundle.yaml or .manifest, and no rules.yaml, .rego file or policy.wasm")}
			}
			return mf("engine", classed(ErrMissingFile, "cannot tell the engine: the bundle has no rules.yaml, .rego file or policy.wasm"))
		}
	}
	if m.Engine != EngineWasm {
		switch {
		case m.ABI != "":
			return mf("abi", fmt.Errorf("only wasm bundles have an ABI (engine is %s)", m.Engine))
		case m.Sandbox.MemoryPages != 0:
			return mf("sandbox.memory_pages", fmt.Errorf("only wasm bundles have a memory cap (engine is %s)", m.Engine))
		case len(m.Sandbox.Grants) > 0:
			return mf("sandbox.grants", fmt.Errorf("only wasm bundles take grants (engine is %s)", m.Engine))
		}
	}
	if m.Engine == EngineWasm && m.ABI == "" && len(b.OPA.WasmEntrypoints) > 0 {
		m.ABI = ABIOPA // .manifest maps entrypoints to policy.wasm: OPA-compiled
	}
	if m.Entrypoint != "" {
		if m.Engine == EngineRules {
			return mf("entrypoint", errors.New("not used by the rules engine; remove it"))
		}
		return nil
	}
	switch {
	case m.Engine == EngineWasm && m.ABI == ABIOPA:
		switch eps := b.OPA.WasmEntrypoints; {
		case len(eps) == 1:
			m.Entrypoint = eps[0]
		case slices.Contains(eps, "wicket/decision"):
			m.Entrypoint = "wicket/decision"
		case len(eps) > 1:
			return mf("entrypoint", fmt.Errorf(".manifest maps %d entrypoints to policy.wasm (%s): name the one to evaluate with entrypoint: in bundle.yaml, or build with one -e", len(eps), strings.Join(eps, ", ")))
		}
	case m.Engine == EngineRego:
		switch eps := b.OPA.Entrypoints; {
		case len(eps) == 1:
			m.Entrypoint = eps[0]
		case slices.Contains(eps, "data.wicket.decision"):
			m.Entrypoint = "data.wicket.decision"
		case len(eps) > 1:
			return mf("entrypoint", fmt.Errorf("%d rules are annotated entrypoint: true (%s): name the one to evaluate with entrypoint: in bundle.yaml", len(eps), strings.Join(eps, ", ")))
		}
	}
	return nil
}

// isDataFile reports whether p is a data file OPA merges into data.
func isDataFile(p string) bool {
	switch path.Base(p) {
	case DataFile, YAMLDataFile, "data.yml":
		return true
	}
	return false
}
