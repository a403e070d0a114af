package client

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

var urlBases = []string{"http://127.0.0.1:8080", "https://kernel.example", "http://h:80/prefix", "http://[::1]:9/p-x/",
	"http://h/a%20b", "http://h?x=1", "http://u@h", "http://h:", "ftp://h", "http://h/a b"}

var urlTargets = []string{"/v0/executions", "/v0/executions/ex-1/steps", "/v0/executions/a%2Fb/steps", "/v0/x?tenant=t1",
	"/v0/x?a=1&b=%20", "/v0/x?", "/v0/x?a#b", "/v0/é", "/v0/a b", "/v0/x?q=a b", "/v0/x?tenant=t%2B", "", "v0", "//h2/x", "/v0/x;y"}

func checkURL(t *testing.T, base, target string) {
	t.Helper()
	c := New(base)
	got, gotTarget, err := c.requestURL(target)
	want, werr := url.Parse(c.base + target)
	if (err != nil) != (werr != nil) {
		t.Fatalf("%q + %q: error %v, url.Parse %v", base, target, err, werr)
	}
	if err != nil {
		return
	}
	g, w := *got, *want
	g.User, w.User = nil, nil
	if g != w || got.User.String() != want.User.String() || gotTarget != want.RequestURI() {
		t.Fatalf("%q + %q:\n got  %#v %q\n want %#v %q", base, target, got, gotTarget, want, want.RequestURI())
	}
}

// TestRequestURLMatchesParse: the URL built without parsing is the one
// url.Parse makes of the whole, and so is the signed target.
func TestRequestURLMatchesParse(t *testing.T) {
	for _, b := range urlBases {
		for _, p := range urlTargets {
			checkURL(t, b, p)
		}
	}
	if parseBase("http://127.0.0.1:8080") == nil {
		t.Fatal("a plain base was declined")
	}
}

func FuzzRequestURL(f *testing.F) {
	for _, b := range urlBases {
		for _, p := range urlTargets {
			f.Add(b, p)
		}
	}
	f.Fuzz(func(t *testing.T, base, target string) { checkURL(t, base, target) })
}

// TestSignerMatchesWire: the pooled signer gives wire.SignV1's and
// wire.Sign's values, again and again (the HMAC is reset between uses).
func TestSignerMatchesWire(t *testing.T) {
	secret := []byte("signer-secret-0123456789")
	s := newSigner(secret)
	now := time.Unix(1796000000, 0)
	bodies := [][]byte{nil, {}, []byte(`{"n":1}`), bytes.Repeat([]byte("x"), maxPooledMessage+10), []byte(`{"n":2}`)}
	for i := 0; i < 3; i++ {
		for _, b := range bodies {
			for _, m := range []wire.SignedRequest{{Method: "POST", Target: "/v0/executions/e/steps", DispatchID: "d1", DispatchAttempt: "2"},
				{Method: "GET", Target: "/v0/executions/e?tenant=x"}} {
				m.Body = b
				if got, want := s.signV1(now, m.Method, m.Target, m.DispatchID, m.DispatchAttempt, b), wire.SignV1(secret, now, m); got != want {
					t.Fatalf("v1: got %s want %s", got, want)
				}
			}
			if got, want := s.signBody(b), wire.Sign(secret, b); got != want {
				t.Fatalf("body: got %s want %s", got, want)
			}
		}
	}
}

// TestNewRequestSignsWhatItSends: a request built by newRequest verifies
// under wire.VerifyV1 as the kernel checks it, with the lease headers the
// caller gave, and carries the headers it always did.
func TestNewRequestSignsWhatItSends(t *testing.T) {
	secret := []byte("signer-secret-0123456789")
	for _, base := range []string{"http://127.0.0.1:1", "http://h:1/pre", "http://h:1/a%2Fb"} {
		c := New(base, WithAgent("a1", secret), WithTenant("t 1"))
		hdr := http.Header{"rebuno-dispatch-id": {"d1"}, wire.HeaderDispatchAttempt: {"3"}, "X-Multi": {"a", "b"}, "X-Gone": nil}
		body := wire.StepSubmitRequest{Kind: "tool_call", Target: "search", Args: []byte(`{"n":1}`)}
		req, err := c.newRequest(context.Background(), http.MethodPost, "/v0/executions/e%2F1/steps", hdr, body)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := req.GetBody()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(raw)
		if buf.String() != `{"kind":"tool_call","target":"search","args":{"n":1}}` || req.ContentLength != int64(buf.Len()) {
			t.Fatalf("body %s (%d)", buf.String(), req.ContentLength)
		}
		m := wire.SignedRequest{Method: req.Method, Target: req.URL.RequestURI(), DispatchID: req.Header.Get(wire.HeaderDispatchID),
			DispatchAttempt: req.Header.Get(wire.HeaderDispatchAttempt), Body: buf.Bytes()}
		if m.DispatchID != "d1" || m.DispatchAttempt != "3" {
			t.Fatalf("lease headers %v", req.Header)
		}
		if err := wire.VerifyV1(secret, req.Header.Get(wire.HeaderWicketSignature), m, time.Now(), 0); err != nil {
			t.Fatalf("%s: %v", base, err)
		}
		if got := req.Header.Values("X-Multi"); len(got) != 2 || got[1] != "b" {
			t.Fatalf("X-Multi %v", got)
		}
		if _, ok := req.Header["X-Gone"]; ok {
			t.Fatal("a header given without values was sent")
		}
		for k, v := range map[string]string{"User-Agent": DefaultUserAgent, "Accept": "application/json", "Content-Type": "application/json", wire.HeaderAgentID: "a1"} {
			if req.Header.Get(k) != v {
				t.Fatalf("%s: %q", k, req.Header.Get(k))
			}
		}
		if req.Host != req.URL.Host || req.URL.Query().Get("tenant") != "t 1" {
			t.Fatalf("host %q url %s", req.Host, req.URL)
		}
	}
}
