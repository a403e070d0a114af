package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
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
	got, gotTarget, err := c.requestURL(new(url.URL), target)
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

// TestNewRequestAsNewRequestWithContext: the request newRequest builds
// itself for a plain URL is the one http.NewRequestWithContext makes of
// the same method, URL and body (the same fields, body and GetBody, the
// same context), and anything else goes through NewRequestWithContext
// (its errors included).
func TestNewRequestAsNewRequestWithContext(t *testing.T) {
	type ctxKey struct{}
	ctx := context.WithValue(context.Background(), ctxKey{}, 1)
	c := New("http://127.0.0.1:8080", WithAPIKey("k"))
	for _, method := range []string{"", "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"} {
		for _, body := range []any{nil, []byte(`{"a":1}`), []byte{}, json.RawMessage(`[]`), map[string]int{"n": 1}} {
			for _, path := range []string{"/v0/executions/e1/steps", "/v0/x?tenant=t1", "/v0/a%2Fb"} {
				got, err := c.newRequest(ctx, method, path, nil, body)
				if err != nil {
					t.Fatal(err)
				}
				var raw []byte
				switch b := body.(type) {
				case []byte:
					raw = b
				case json.RawMessage:
					raw = b
				case nil:
				default:
					raw, _ = json.Marshal(b)
				}
				var rd io.Reader
				if body != nil {
					rd = bytes.NewReader(raw)
				}
				want, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
				if err != nil {
					t.Fatal(err)
				}
				name := method + " " + path + " " + string(raw)
				if got.Method != want.Method || got.URL.String() != want.URL.String() || got.Proto != want.Proto ||
					got.ProtoMajor != want.ProtoMajor || got.ProtoMinor != want.ProtoMinor || got.Host != want.Host ||
					got.ContentLength != want.ContentLength || got.Context() != want.Context() || got.Close != want.Close ||
					got.TransferEncoding != nil || got.Trailer != nil || (got.GetBody == nil) != (want.GetBody == nil) ||
					(got.Body == nil) != (want.Body == nil) || reflect.TypeOf(got.Body) != reflect.TypeOf(want.Body) {
					t.Fatalf("%s:\n got  %+v\n want %+v", name, got, want)
				}
				if got.Body != nil {
					g, _ := io.ReadAll(got.Body)
					w, _ := io.ReadAll(want.Body)
					if !bytes.Equal(g, w) {
						t.Fatalf("%s: body %q, want %q", name, g, w)
					}
				}
				for i := 0; got.GetBody != nil && i < 2; i++ {
					gb, _ := got.GetBody()
					wb, _ := want.GetBody()
					g, _ := io.ReadAll(gb)
					w, _ := io.ReadAll(wb)
					if !bytes.Equal(g, w) || reflect.TypeOf(gb) != reflect.TypeOf(wb) {
						t.Fatalf("%s: GetBody %q (%T), want %q (%T)", name, g, gb, w, wb)
					}
				}
			}
		}
	}
	if _, err := c.newRequest(ctx, "BAD METHOD", "/v0/x", nil, nil); err == nil || !strings.Contains(err.Error(), "invalid method") {
		t.Fatalf("a bad method: %v", err)
	}
	//lint:ignore SA1012 the nil context is what is tested
	if _, err := c.newRequest(nil, "GET", "/v0/x", nil, nil); err == nil || !strings.Contains(err.Error(), "nil Context") {
		t.Fatalf("a nil context: %v", err)
	}
}

// TestReadAllAsIOReadAll: readAll gives io.ReadAll's bytes and errors,
// whatever the buffer it starts from and however the reader splits its
// data.
func TestReadAllAsIOReadAll(t *testing.T) {
	boom := errors.New("boom")
	for _, n := range []int{0, 1, 511, 512, 1024, 1025, 5000} {
		data := bytes.Repeat([]byte("0123456789abcdef"), n/16+1)[:n]
		readers := map[string]func() io.Reader{
			"plain":    func() io.Reader { return bytes.NewReader(data) },
			"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) },
			"data+EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(data)) },
			"half":     func() io.Reader { return iotest.HalfReader(bytes.NewReader(data)) },
			"error":    func() io.Reader { return io.MultiReader(bytes.NewReader(data), iotest.ErrReader(boom)) },
		}
		for name, r := range readers {
			for _, buf := range []*bytes.Buffer{new(bytes.Buffer), bytes.NewBuffer(make([]byte, 0, 1)), bytes.NewBufferString("left over"), bytes.NewBuffer(make([]byte, 0, 4096))} {
				cp := buf.Cap()
				want, werr := io.ReadAll(r())
				got, gerr := readAll(r(), buf)
				if !bytes.Equal(got, want) || !errors.Is(gerr, werr) || (gerr == nil) != (werr == nil) {
					t.Fatalf("%s, %d bytes, buffer of %d: got %d bytes, %v; want %d, %v", name, n, cp, len(got), gerr, len(want), werr)
				}
			}
		}
	}
}

// headerTransport answers every request with 204 and keeps the request.
type headerTransport struct{ got []*http.Request }

func (h *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	h.got = append(h.got, req)
	return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
}

// TestDoKeepsNoHeader: the request Do sends holds copies of the header's
// values, so that a caller may change or reuse its map once Do returns
// (sdk/agent hands Do pooled maps, and changes them for the next step).
func TestDoKeepsNoHeader(t *testing.T) {
	tr := &headerTransport{}
	for _, base := range []string{"http://127.0.0.1:8080", "http://h/a%20b"} { // a plain base, and one parsed
		c := New(base, WithAgent("a1", []byte("secret")), WithHTTPClient(&http.Client{Transport: tr}))
		h := http.Header{wire.HeaderDispatchID: {"d-1"}, wire.HeaderDispatchAttempt: {"1"}, wire.HeaderStepID: {"s-1"}, "X-Two": {"a", "b"}}
		if err := c.Do(context.Background(), http.MethodPost, "/v0/executions/e1/steps", h, []byte(`{}`), nil); err != nil {
			t.Fatal(err)
		}
		for _, vs := range h {
			vs[0] = "changed"
		}
		h[wire.HeaderStepID] = []string{"s-2"}
		req := tr.got[len(tr.got)-1]
		for k, want := range map[string][]string{wire.HeaderDispatchID: {"d-1"}, wire.HeaderDispatchAttempt: {"1"},
			wire.HeaderStepID: {"s-1"}, "X-Two": {"a", "b"}} {
			if got := req.Header[k]; !reflect.DeepEqual(got, want) {
				t.Errorf("%s: the request's %s is %q after the caller changed its map, want %q", base, k, got, want)
			}
		}
	}
}
