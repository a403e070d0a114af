package client

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

// This file holds the per-request hot path of every call: the request's
// URL, its headers and its v1 signature, built without re-parsing the
// base URL, with one backing array for the header values and a keyed
// HMAC reused across requests. Each piece is checked against the general
// path it replaces (request_test.go).

// parseBase returns the parsed base URL when a request URL can be made
// by appending a plain path to it (requestURL), or nil (every request
// then parses its whole URL, as url.Parse decides).
func parseBase(base string) *url.URL {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" || u.User != nil ||
		u.RawPath != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.RawFragment != "" || !plainPath(u.Path) {
		return nil
	}
	return u
}

// plainPath reports whether p is made only of bytes that a URL path
// carries unescaped and that url.Parse leaves as they are.
func plainPath(p string) bool {
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
			return false
		}
	}
	return true
}

// plainQuery reports whether q is a query url.Parse keeps as RawQuery
// byte for byte (no fragment, no spaces or controls, ASCII).
func plainQuery(q string) bool {
	for i := 0; i < len(q); i++ {
		c := q[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.~/%=&+,:@", c) >= 0) {
			return false
		}
	}
	return true
}

// requestURL returns the URL of target (a path with an optional query)
// under the client's base: u, filled in without parsing when the base and
// target are plain, else url.Parse of the concatenation. The second
// result is the request target a v1 signature covers (u.RequestURI()).
func (c *Client) requestURL(u *url.URL, target string) (*url.URL, string, error) {
	if c.baseURL != nil {
		p, q, hasQ := strings.Cut(target, "?")
		if strings.HasPrefix(p, "/") && plainPath(p) && (!hasQ || (q != "" && plainQuery(q))) {
			*u = *c.baseURL
			u.Path = c.baseURL.Path + p
			u.RawQuery = q
			if c.baseURL.Path == "" {
				return u, target, nil
			}
			return u, c.baseURL.Path + target, nil
		}
	}
	u, err := url.Parse(c.base + target)
	if err != nil {
		return nil, "", err
	}
	return u, u.RequestURI(), nil
}

// outgoing is the memory of one request that newRequest needs besides
// the http.Request and its header map, in one allocation: the URL, the
// header values (one-element slices of one array) and the body's reader.
type outgoing struct {
	url  url.URL
	vals [8]string
	body bytes.Reader
}

// headerValues hands out one-element value slices of a header from one
// backing array, so that setting n headers costs one allocation at most,
// not n.
type headerValues struct{ vals []string }

func (hv *headerValues) set(h http.Header, key, v string) {
	if len(hv.vals) == cap(hv.vals) {
		hv.vals = make([]string, 0, 8)
	}
	hv.vals = append(hv.vals, v)
	n := len(hv.vals)
	h[key] = hv.vals[n-1 : n : n]
}

// fastMethod reports whether NewRequestWithContext takes method as it is
// (a valid method; "" means GET), so that newRequest may build the
// request itself.
func fastMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodHead:
		return true
	}
	return false
}

// answerBufs are the buffers answers are read into when they are decoded
// and then dropped (decoding copies what it keeps).
var answerBufs = sync.Pool{New: func() any { return bytes.NewBuffer(make([]byte, 0, 1024)) }}

// maxPooledAnswer bounds the buffers answerBufs keeps.
const maxPooledAnswer = 64 << 10

// readAll is io.ReadAll(r) into buf, emptied first: the same bytes and the
// same errors. The bytes are buf's, valid until buf is used again.
func readAll(r io.Reader, buf *bytes.Buffer) ([]byte, error) {
	buf.Reset()
	_, err := buf.ReadFrom(r)
	return buf.Bytes(), err
}

// signer computes v1 signatures under one secret, reusing keyed HMACs
// and their message buffers.
type signer struct {
	secret []byte
	pool   sync.Pool // of *signState
}

// signState is a keyed HMAC with its scratch space.
type signState struct {
	mac hash.Hash // hmac.New(sha256.New, secret)
	msg []byte
	sum []byte
}

// maxPooledMessage bounds the message buffer a signState keeps.
const maxPooledMessage = 64 << 10

func newSigner(secret []byte) *signer {
	s := &signer{secret: secret}
	s.pool.New = func() any {
		return &signState{mac: hmac.New(sha256.New, s.secret), sum: make([]byte, 0, sha256.Size)}
	}
	return s
}

// mac returns HMAC-SHA256(secret, msg) hex-encoded, appended to out.
func (s *signer) appendMAC(out, msg []byte, st *signState) []byte {
	st.mac.Reset()
	_, _ = st.mac.Write(msg)
	st.sum = st.mac.Sum(st.sum[:0])
	return hex.AppendEncode(out, st.sum)
}

// signV1 returns the HeaderWicketSignature value of the request at now:
// the same value as wire.SignV1(secret, now, wire.SignedRequest{method,
// target, dispatchID, attempt, body}).
func (s *signer) signV1(now time.Time, method, target, dispatchID, attempt string, body []byte) string {
	st := s.pool.Get().(*signState)
	unix := now.Unix()
	m := append(st.msg[:0], "v1\n"...)
	m = strconv.AppendInt(m, unix, 10)
	m = append(m, '\n')
	m = append(m, method...)
	m = append(m, '\n')
	m = append(m, target...)
	m = append(m, '\n')
	m = append(m, dispatchID...)
	m = append(m, '\n')
	m = append(m, attempt...)
	m = append(m, '\n')
	m = append(m, body...)
	var buf [2 + 20 + 4 + 2*sha256.Size]byte // the value, built on the stack
	out := append(buf[:0], "t="...)
	out = strconv.AppendInt(out, unix, 10)
	out = append(out, ",v1="...)
	out = s.appendMAC(out, m, st)
	s.put(st, m)
	return string(out)
}

// signBody returns the HeaderSignature value of body (wire.Sign).
func (s *signer) signBody(body []byte) string {
	st := s.pool.Get().(*signState)
	var buf [len(wire.SignaturePrefix) + 2*sha256.Size]byte
	out := append(buf[:0], wire.SignaturePrefix...)
	out = s.appendMAC(out, body, st)
	s.put(st, st.msg)
	return string(out)
}

func (s *signer) put(st *signState, msg []byte) {
	if cap(msg) <= maxPooledMessage {
		st.msg = msg[:0]
	} else {
		st.msg = nil
	}
	s.pool.Put(st)
}
