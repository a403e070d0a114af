package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"mime"
	"net/http"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// manifestFile is the bundle manifest's path inside a bundle; opaManifestFile
// OPA's.
const (
	manifestFile    = "bundle.yaml"
	opaManifestFile = ".manifest"
)

var engineName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// putBundle stores a bundle and makes it live. An admin key stores an
// admin-owned bundle (it may then be a guard); a tenant-admin key stores the
// tenant's own and may not replace an admin-owned one (403). The body is a .tar.gz
// (Content-Type application/gzip, application/x-gzip or
// application/octet-stream) or the JSON form wire.BundleFilesRequest.
// The kernel's loader validates it whole; a refused bundle changes nothing.
func (s *Server) putBundle(c *call) (int, any, error) {
	name := c.vars("name")
	if !kernel.ValidID(name) {
		return 0, nil, errorf(kernel.CodeValidation, "bundle name %q is invalid: "+kernel.IDRule, name)
	}
	ct := c.r.Header.Get("Content-Type")
	if ct == "" {
		return 0, nil, errorf(kernel.CodeValidation, "Content-Type is required: application/gzip for a .tar.gz, or application/json for {engine, files}")
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return 0, nil, errorf(kernel.CodeValidation, "Content-Type %q is malformed: %v", ct, err)
	}
	var src kernel.BundleSource
	switch mt {
	case "application/gzip", "application/x-gzip", "application/octet-stream":
		if len(c.body) < 2 || c.body[0] != 0x1f || c.body[1] != 0x8b {
			return 0, nil, errorf(kernel.CodeValidation, "the body is not a gzip archive (want a bundle .tar.gz)")
		}
		src.Archive = c.body
	case "application/json":
		src.Files, err = bundleFiles(name, c.body)
		if err != nil {
			return 0, nil, err
		}
	default:
		return 0, nil, errorf(kernel.CodeValidation, "Content-Type %q is not supported: send application/gzip (a .tar.gz) or application/json ({engine, files})", mt)
	}
	rec, err := s.k.PutBundle(c.ctx, c.tenant, name, src, c.p.bundleOwner())
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, bundleView(rec), nil
}

// bundleFiles turns the JSON form into a file map. Text files come from
// "files", binary ones from "files_base64". The engine must match
// bundle.yaml's; without a bundle.yaml a minimal one is made from the name
// and the engine, with a revision derived from the content.
func bundleFiles(name string, body []byte) (map[string][]byte, error) {
	var req wire.BundleFilesRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	files := make(map[string][]byte, len(req.Files)+len(req.FilesBase64)+1)
	for p, content := range req.Files {
		if err := checkBundlePath(p); err != nil {
			return nil, err
		}
		files[p] = []byte(content)
	}
	for p, b64 := range req.FilesBase64 {
		if err := checkBundlePath(p); err != nil {
			return nil, err
		}
		if _, dup := files[p]; dup {
			return nil, errorf(kernel.CodeValidation, "file %q is in both files and files_base64", p)
		}
		b, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, errorf(kernel.CodeValidation, "files_base64[%q] is not valid base64: %v", p, err)
		}
		files[p] = b
	}
	if len(files) == 0 {
		return nil, errorf(kernel.CodeValidation, "files is empty: a bundle needs at least its policy file")
	}
	if m, ok := files[manifestFile]; ok {
		if req.Engine != "" {
			declared, found := manifestEngine(m)
			switch {
			case !found:
				return nil, errorf(kernel.CodeValidation, "engine is %q but %s has no top-level \"engine:\" line to check it against", req.Engine, manifestFile)
			case declared != req.Engine:
				return nil, errorf(kernel.CodeValidation, "engine is %q but %s declares engine %q", req.Engine, manifestFile, declared)
			}
		}
		return files, nil
	}
	if req.Engine == "" {
		// An OPA bundle: the loader infers the engine from the files and
		// names the bundle after the URL.
		return files, nil
	}
	if !engineName.MatchString(req.Engine) {
		return nil, errorf(kernel.CodeValidation, "engine %q is invalid", req.Engine)
	}
	m := "name: " + strconv.Quote(name) + "\nengine: " + req.Engine + "\n"
	if _, ok := files[opaManifestFile]; !ok { // else .manifest's revision
		m += "revision: " + strconv.Quote(contentRevision(files)) + "\n"
	}
	files[manifestFile] = []byte(m)
	return files, nil
}

// contentRevision names the revision of a bundle sent without a manifest:
// the first 12 hex digits of a sha256 over its files (paths in order, each
// path and content length-prefixed), so that different content never shares
// a revision and the same content keeps one.
func contentRevision(files map[string][]byte) string {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	h := sha256.New()
	for _, p := range paths {
		fmt.Fprintf(h, "%d:%s%d:", len(p), p, len(files[p]))
		h.Write(files[p])
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// checkBundlePath refuses paths that are not plain relative paths.
func checkBundlePath(p string) error {
	if p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, "\\") || path.Clean(p) != p || p == "." ||
		p == ".." || strings.HasPrefix(p, "../") {
		return errorf(kernel.CodeValidation, "file path %q is invalid: want a clean relative path such as rules.yaml or tests/basic.yaml", p)
	}
	return nil
}

// manifestEngine finds the value of a top-level "engine:" line. It is a
// consistency check only; the loader parses the manifest for real.
func manifestEngine(y []byte) (string, bool) {
	for _, line := range bytes.Split(y, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("engine:"))
		if !ok {
			continue
		}
		v := string(bytes.TrimSpace(rest))
		if i := strings.Index(v, " #"); i >= 0 {
			v = strings.TrimSpace(v[:i])
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		return v, v != ""
	}
	return "", false
}

func (s *Server) listBundles(c *call) (int, any, error) {
	bs, err := s.k.ListBundles(c.ctx, c.tenant)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.BundleList{Bundles: mapSlice(bs, bundleView)}, nil
}

// getBundle answers a bundle's metadata, or with ?archive=1 its .tar.gz.
func (s *Server) getBundle(c *call) (int, any, error) {
	b, err := s.k.GetBundle(c.ctx, c.tenant, c.vars("name"))
	if err != nil {
		return 0, nil, err
	}
	switch c.r.URL.Query().Get("archive") {
	case "", "0", "false":
		return http.StatusOK, bundleView(b), nil
	case "1", "true":
	default:
		return 0, nil, errorf(kernel.CodeValidation, "archive must be 1 or 0")
	}
	h := c.w.Header()
	h.Set("Content-Type", "application/gzip")
	h.Set("Content-Length", strconv.Itoa(len(b.Archive)))
	h.Set("Content-Disposition", `attachment; filename="`+b.Name+`.tar.gz"`)
	h.Set("ETag", `"`+b.Digest+`"`)
	c.w.WriteHeader(http.StatusOK)
	_, _ = c.w.Write(b.Archive)
	return 0, nil, nil
}

func (s *Server) deleteBundle(c *call) (int, any, error) {
	if err := s.k.DeleteBundle(c.ctx, c.tenant, c.vars("name"), c.p.bundleOwner()); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// putBundleSource points a bundle at a bundle server: the first download
// must load (it becomes the live revision), then the kernel polls it.
// Admins may; tenant-admins when their tenant allows bundle sources.
func (s *Server) putBundleSource(c *call) (int, any, error) {
	if err := s.mayPullBundles(c); err != nil {
		return 0, nil, err
	}
	var req wire.BundleSource
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	if req.URL == "" {
		return 0, nil, errorf(kernel.CodeValidation, "url is required")
	}
	rec, err := s.k.SetBundleSource(c.ctx, c.tenant, c.vars("name"), &kernel.BundlePull{URL: req.URL, MinDelay: req.MinDelay, MaxDelay: req.MaxDelay}, c.p.bundleOwner())
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, bundleView(rec), nil
}

// deleteBundleSource stops pulling a bundle; its live revision stays.
func (s *Server) deleteBundleSource(c *call) (int, any, error) {
	if err := s.mayPullBundles(c); err != nil {
		return 0, nil, err
	}
	rec, err := s.k.SetBundleSource(c.ctx, c.tenant, c.vars("name"), nil, c.p.bundleOwner())
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, bundleView(rec), nil
}

// mayPullBundles: bundle server URLs make the kernel fetch from the
// network, so beyond admins only tenants an admin allowed may set them.
func (s *Server) mayPullBundles(c *call) error {
	if c.p.Kind == PrincipalAdmin {
		return nil
	}
	ok, err := s.k.TenantAllowsBundleSources(c.ctx, c.tenant)
	if err != nil {
		return err
	}
	if !ok {
		return errorf(kernel.CodeForbidden, "tenant %s may not pull bundles from bundle servers: an admin can allow it (allow_bundle_sources)", c.tenant)
	}
	return nil
}
