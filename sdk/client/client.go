package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

// DefaultUserAgent is the User-Agent of requests unless WithUserAgent sets
// another.
const DefaultUserAgent = "wicket-go-client"

// errorExcerpt bounds how much of a non-JSON error body an APIError quotes.
const errorExcerpt = 512

// defaultHTTP is the HTTP client of a Client without WithHTTPClient. It has
// connect, TLS and response-header timeouts but no overall Timeout: an
// event stream lasts as long as its execution. Bound calls with their
// context instead.
var defaultHTTP = &http.Client{Transport: defaultTransport()}

func defaultTransport() http.RoundTripper {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport
	}
	t = t.Clone()
	t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = 10 * time.Second
	// Long enough for a bundle upload whose wasm module the kernel compiles
	// before answering; an event stream answers its headers at once.
	t.ResponseHeaderTimeout = 2 * time.Minute
	t.IdleConnTimeout = 90 * time.Second
	// A client talks to one kernel: keep as many idle connections to it
	// as calls were in flight (an agent's executions pause between calls
	// while their tools run), instead of closing all but a few and
	// dialling again on the next call.
	t.MaxIdleConnsPerHost = 100
	return t
}

// Client is a client of one Wicket kernel's /v0 API. Create it with New;
// it is safe for concurrent use and holds no connection state of its own
// beyond its http.Client.
type Client struct {
	base    string
	key     string
	agentID string
	secret  []byte
	signing string // wire.SigningV1 (default) or wire.SigningBody
	tenant  string
	ua      string
	hc      *http.Client

	baseURL *url.URL     // parsed base, when plain paths can be appended to it (parseBase)
	host    string       // the Host of requests under baseURL
	sign    *signer      // with WithAgent: the agent's signatures
	strs    *stringCache // strings of the step decisions lately decoded
}

// Option configures a Client in New.
type Option func(*Client)

// New returns a client of the kernel at baseURL ("http://127.0.0.1:8080";
// a trailing "/" is trimmed). Without WithAPIKey or WithAgent its requests
// carry no credentials, which only a kernel serving loopback without keys
// accepts.
func New(baseURL string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), ua: DefaultUserAgent, hc: defaultHTTP}
	for _, o := range opts {
		o(c)
	}
	c.baseURL = parseBase(c.base)
	if c.baseURL != nil {
		c.host = removeEmptyPort(c.baseURL.Host)
	}
	c.strs = new(stringCache)
	if c.agentID != "" {
		c.sign = newSigner(c.secret)
	}
	return c
}

// WithAPIKey authenticates every request with "Authorization: Bearer key":
// an admin, tenant-admin or client key. Use it or WithAgent, not both: a
// request that carries both is authenticated by the key.
func WithAPIKey(key string) Option { return func(c *Client) { c.key = key } }

// WithAgent signs every request as the agent agentID: HeaderAgentID names
// it and wire.HeaderWicketSignature carries its v1 signature (the method,
// the path and query, the lease headers and the body, timestamped; see
// wire.SignV1), unless WithSigning chooses the body scheme. Signed requests
// may call the agent routes and read the agent's own executions and steps;
// the event stream and admin routes need an API key (Watch polls instead,
// see WatchWith).
func WithAgent(agentID string, secret []byte) Option {
	return func(c *Client) {
		c.agentID = agentID
		c.secret = bytes.Clone(secret)
	}
}

// WithSigning chooses the signature scheme of WithAgent: wire.SigningV1
// (the default) or wire.SigningBody (HeaderSignature over the body alone,
// for an agent registered with "signing": "body"). It must match the
// agent's registration: the kernel refuses the other scheme with 401.
func WithSigning(scheme string) Option { return func(c *Client) { c.signing = scheme } }

// WithHTTPClient sends requests with hc instead of the package default,
// which has connect and header timeouts but no overall Timeout (event
// streams are long). A Timeout on hc also bounds Watch's streams; Watch then
// reconnects. nil keeps the default.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithTenant makes an admin key act in tenant: every client and admin
// request carries ?tenant=tenant. Other keys act in their own tenant, and
// naming another is forbidden. The tenant routes (CreateKey, Keys, ...)
// name their tenant in the path and are not affected.
func WithTenant(tenant string) Option { return func(c *Client) { c.tenant = tenant } }

// WithUserAgent sets the User-Agent header (default DefaultUserAgent).
func WithUserAgent(ua string) Option { return func(c *Client) { c.ua = ua } }

// BaseURL returns the kernel's base URL as New kept it.
func (c *Client) BaseURL() string { return c.base }

// APIError is an answer of the kernel with a non-2xx status: the status and
// the fields of the error envelope (wire.ErrorBody). When the body was not
// an envelope (a proxy's error page, say), Code is "" and Message holds the
// status text and an excerpt of the body.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Code is one of the wire.Code* values, e.g. wire.CodeNotFound.
	Code string
	// Message says what is wrong, for humans.
	Message string
	// Details carries structured context some errors add (for
	// lease_superseded: dispatch_id and dispatch_attempt).
	Details map[string]any
}

// Error returns "<status> <code>: <message>", e.g.
// "409 lease_superseded: dispatch d1 attempt 1 is not the current lease".
func (e *APIError) Error() string {
	if e.Code == "" {
		return strconv.Itoa(e.Status) + ": " + e.Message
	}
	return strconv.Itoa(e.Status) + " " + e.Code + ": " + e.Message
}

// IsCode reports whether err is, or wraps, an *APIError with the given code
// (one of the wire.Code* values).
func IsCode(err error, code string) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == code
}

// Do sends one request to the kernel and decodes its answer. It is what
// every other method calls, and the way to reach routes they do not cover.
//
// path is the request path with its query, its segments already escaped
// ("/v0/executions/" + url.PathEscape(id)). body is nil (no body), a []byte
// or json.RawMessage (sent as is), or any other value (sent as its JSON);
// a request with a body is sent as application/json unless header sets
// Content-Type. header (may be nil) adds or replaces request headers, such
// as the lease headers of agent mutations: Do copies its values into the
// request it sends, so the caller may change or reuse the map once Do
// returns. out is nil, a *[]byte or *json.RawMessage (which receive the
// raw body), or a pointer the 2xx JSON answer is decoded into; an empty
// answer (204) leaves it untouched.
//
// # Errors
//
// A non-2xx answer is an *APIError. Every error is wrapped with the method
// and path ("POST /v0/executions: 404 not_found: ..."); use errors.As or
// IsCode to inspect it, and errors.Is(err, context.Canceled) for a
// cancelled ctx.
func (c *Client) Do(ctx context.Context, method, path string, header http.Header, body, out any) error {
	if err := c.do(ctx, method, path, header, body, out); err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return nil
}

func (c *Client) do(ctx context.Context, method, path string, header http.Header, body, out any) error {
	req, err := c.newRequest(ctx, method, path, header, body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return unwrapURLError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return apiError(resp)
	}
	if out == nil {
		// Read to the end all the same, so that the connection is reused.
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return fmt.Errorf("read answer: %w", err)
		}
		return nil
	}
	switch o := out.(type) {
	case *[]byte, *json.RawMessage:
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return fmt.Errorf("read answer: %w", err)
		}
		if b, ok := o.(*[]byte); ok {
			*b = data
		} else {
			*o.(*json.RawMessage) = data
		}
		return nil
	}
	// The answer is decoded, and decoding copies what it keeps (as
	// json.Unmarshaler implementations must): read it into a pooled
	// buffer.
	buf := answerBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledAnswer {
			answerBufs.Put(buf)
		}
	}()
	data, err := readAll(resp.Body, buf)
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if d, ok := out.(*wire.StepDecision); ok {
		var stepID string // the step id sent, which the answer repeats
		if v := header[wire.HeaderStepID]; len(v) == 1 {
			stepID = v[0]
		}
		if decodeStepDecision(data, d, stepID, c.strs) {
			return nil // every step's answer, without reflection
		}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode answer (%d): %w", resp.StatusCode, err)
	}
	return nil
}

// newRequest builds an authenticated request: body encoded, signed when
// the client is an agent, the bearer key and ?tenant= added.
func (c *Client) newRequest(ctx context.Context, method, path string, header http.Header, body any) (*http.Request, error) {
	var raw []byte
	switch b := body.(type) {
	case nil:
	case []byte:
		raw = b
	case json.RawMessage:
		raw = b
	default:
		// The two bodies of every step skip reflection when they can.
		ok := false
		switch b := b.(type) {
		case wire.StepSubmitRequest:
			raw, ok = encodeStepSubmit(&b)
		case wire.StepCompleteRequest:
			raw, ok = encodeStepComplete(&b)
		}
		if !ok {
			var err error
			if raw, err = json.Marshal(b); err != nil {
				return nil, fmt.Errorf("encode body: %w", err)
			}
		}
	}
	o := new(outgoing)
	u, target, err := c.requestURL(&o.url, c.withTenant(path))
	if err != nil {
		return nil, err
	}
	nh := 2 + len(header) // User-Agent, Accept, the caller's
	if body != nil {
		nh++
	}
	if c.key != "" {
		nh++
	}
	if c.agentID != "" {
		nh += 2
	}
	var req *http.Request
	if u == &o.url && ctx != nil && fastMethod(method) && (body == nil || len(raw) > 0) {
		// The request NewRequestWithContext would make of this method,
		// URL and body, without its allocations: re-parsing the URL, the
		// body's reader apart from the URL and header values.
		if method == "" {
			method = http.MethodGet
		}
		r := http.Request{Method: method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: make(http.Header, nh), Host: c.host}
		if body != nil {
			o.body.Reset(raw)
			r.Body = io.NopCloser(&o.body)
			r.ContentLength = int64(len(raw))
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil }
		}
		req = r.WithContext(ctx)
	} else {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(raw)
		}
		// NewRequestWithContext handles the method, the context and the
		// body; the URL is the one built above.
		if req, err = http.NewRequestWithContext(ctx, method, "", rd); err != nil {
			return nil, err
		}
		req.URL = u
		req.Host = removeEmptyPort(u.Host)
	}
	h := req.Header
	hv := headerValues{vals: o.vals[:0]}
	hv.set(h, "User-Agent", c.ua)
	hv.set(h, "Accept", "application/json")
	if body != nil {
		hv.set(h, "Content-Type", "application/json")
	}
	if c.key != "" {
		hv.set(h, "Authorization", "Bearer "+c.key)
	}
	for k, vs := range header {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		switch len(vs) {
		case 0:
			delete(h, ck)
		case 1:
			hv.set(h, ck, vs[0])
		default:
			h[ck] = append([]string(nil), vs...)
		}
	}
	if c.agentID != "" { // last: the v1 signature covers the lease headers
		hv.set(h, wire.HeaderAgentID, c.agentID)
		if c.signing == wire.SigningBody {
			hv.set(h, wire.HeaderSignature, c.sign.signBody(raw))
		} else {
			if method == "" {
				method = http.MethodGet
			}
			hv.set(h, wire.HeaderWicketSignature, c.sign.signV1(time.Now(), method, target,
				h.Get(wire.HeaderDispatchID), h.Get(wire.HeaderDispatchAttempt), raw))
		}
	}
	return req, nil
}

// removeEmptyPort strips an empty port (a trailing ':') from host, as
// net/http does for a request's Host.
func removeEmptyPort(host string) string {
	if strings.LastIndex(host, ":") > strings.LastIndex(host, "]") {
		return strings.TrimSuffix(host, ":")
	}
	return host
}

// withTenant adds ?tenant= to client and admin routes when WithTenant is
// set and the path names no tenant itself.
func (c *Client) withTenant(path string) string {
	if c.tenant == "" {
		return path
	}
	p, q, _ := strings.Cut(path, "?")
	switch {
	case p == "/v0/health", p == "/v0/ready", p == "/metrics", p == "/v0/tenants", strings.HasPrefix(p, "/v0/tenants/"):
		return path
	}
	vals, err := url.ParseQuery(q)
	if err == nil && vals.Has("tenant") {
		return path
	}
	if q == "" {
		return p + "?tenant=" + url.QueryEscape(c.tenant)
	}
	return path + "&tenant=" + url.QueryEscape(c.tenant)
}

// apiError reads a non-2xx answer into an *APIError.
func apiError(resp *http.Response) *APIError {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	ae := &APIError{Status: resp.StatusCode}
	var eb wire.ErrorBody
	if json.Unmarshal(data, &eb) == nil && eb.Code != "" {
		ae.Code, ae.Message, ae.Details = eb.Code, eb.Message, eb.Details
		return ae
	}
	ae.Message = http.StatusText(resp.StatusCode)
	if ae.Message == "" {
		ae.Message = resp.Status
	}
	if ex := strings.TrimSpace(string(data)); ex != "" {
		if len(ex) > errorExcerpt {
			ex = strings.ToValidUTF8(ex[:errorExcerpt], "") + "..."
		}
		ae.Message += ": " + ex
	}
	return ae
}

// unwrapURLError drops the *url.Error of a failed request, whose text
// repeats the method and URL that the caller's wrapping already names.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err
	}
	return err
}

// seg escapes one path segment.
func seg(s string) string { return url.PathEscape(s) }
