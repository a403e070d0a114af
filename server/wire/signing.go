package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Signing schemes: the "signing" field of an agent's registration.
const (
	// SigningV1 is the default for new agents: HeaderWicketSignature, a
	// timestamped HMAC that binds the method, the request target, the
	// lease and the body (SignV1).
	SigningV1 = "v1"
	// SigningBody is the Rebuno scheme, kept for SDKs written to it:
	// HeaderSignature, an HMAC of the body alone (Sign). Its signatures do
	// not expire and do not name the request they belong to.
	SigningBody = "body"
)

// HeaderWicketSignature carries a v1 signature: "t=<unix seconds>,v1=<hex>".
const HeaderWicketSignature = "Wicket-Signature"

// DefaultSignatureTolerance is how far a v1 timestamp may be from the
// verifier's clock, either way.
const DefaultSignatureTolerance = 300 * time.Second

// maxV1Values bounds the v1= values a header may carry (more than one lets
// a signer send signatures under an old and a new secret during rotation).
const maxV1Values = 4

// Errors of VerifyV1, each wrapped with detail. A verifier answers all of
// them 401.
var (
	// ErrSignatureMissing: no signature header.
	ErrSignatureMissing = errors.New("signature missing")
	// ErrSignatureMalformed: the header is not "t=<unix seconds>,v1=<64 hex digits>".
	ErrSignatureMalformed = errors.New("signature malformed")
	// ErrSignatureExpired: the timestamp is outside the tolerance (a stale
	// or replayed request, or a clock that is off).
	ErrSignatureExpired = errors.New("signature timestamp outside the tolerance")
	// ErrSignatureMismatch: no v1 value is the HMAC of this request.
	ErrSignatureMismatch = errors.New("signature does not match the request")
)

// SignedRequest is what a v1 signature covers.
type SignedRequest struct {
	// Method is the HTTP method, e.g. "POST".
	Method string
	// Target is the request target exactly as sent: the path and, if any,
	// "?" and the query ("/v0/executions/x/steps"). For a webhook it is the
	// path and query of the agent's webhook URL.
	Target string
	// DispatchID and DispatchAttempt are the values of HeaderDispatchID and
	// HeaderDispatchAttempt as sent ("" when absent).
	DispatchID      string
	DispatchAttempt string
	// Body is the raw body (nil for none).
	Body []byte
}

// Message returns the bytes a v1 signature at unix time t is the HMAC of:
//
//	"v1\n" + t + "\n" + Method + "\n" + Target + "\n" + DispatchID + "\n" +
//	DispatchAttempt + "\n" + Body
func (m SignedRequest) Message(t int64) []byte {
	b := make([]byte, 0, 3+20+len(m.Method)+len(m.Target)+len(m.DispatchID)+len(m.DispatchAttempt)+5+len(m.Body))
	return append(m.appendPrefix(b, t), m.Body...)
}

// appendPrefix appends the message at t up to the body to b.
func (m SignedRequest) appendPrefix(b []byte, t int64) []byte {
	b = append(b, "v1\n"...)
	b = strconv.AppendInt(b, t, 10)
	b = append(b, '\n')
	b = append(b, m.Method...)
	b = append(b, '\n')
	b = append(b, m.Target...)
	b = append(b, '\n')
	b = append(b, m.DispatchID...)
	b = append(b, '\n')
	b = append(b, m.DispatchAttempt...)
	return append(b, '\n')
}

func (m SignedRequest) mac(secret []byte, t int64) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(m.Message(t))
	return h.Sum(nil)
}

// SignV1 returns the HeaderWicketSignature value of m signed at time t:
// "t=<unix seconds>,v1=<lowercase hex HMAC-SHA256(secret, m.Message(t))>".
func SignV1(secret []byte, t time.Time, m SignedRequest) string {
	ts := t.Unix()
	return "t=" + strconv.FormatInt(ts, 10) + ",v1=" + hex.EncodeToString(m.mac(secret, ts))
}

// VerifyV1 checks a HeaderWicketSignature value against m: the timestamp
// must be within tolerance of now (zero tolerance: DefaultSignatureTolerance)
// and one v1 value must be the HMAC of m under secret, compared in constant
// time (hmac.Equal). Unknown keys in the header are ignored, so that later
// schemes can be sent alongside. It returns nil or an error matching one of
// the ErrSignature* values.
func VerifyV1(secret []byte, header string, m SignedRequest, now time.Time, tolerance time.Duration) error {
	return (&Verifier{secret: secret}).Verify(header, m, now, tolerance)
}

// A Verifier checks v1 signatures under one secret, as VerifyV1 does. It
// keeps the MACs keyed with the secret for reuse, so that a check does not
// key a new one (two SHA-256 blocks and their allocations); it is safe for
// concurrent use.
type Verifier struct {
	secret []byte
	macs   sync.Pool // of *keyedMAC
}

// NewVerifier returns a Verifier for secret (kept, not copied).
func NewVerifier(secret []byte) *Verifier { return &Verifier{secret: secret} }

// keyedMAC is an HMAC-SHA256 keyed with a Verifier's secret, with room
// for what one check writes and sums.
type keyedMAC struct {
	h      hash.Hash
	prefix []byte // the message up to the body
	sum    [sha256.Size]byte
}

// Verify is VerifyV1 under v's secret.
func (v *Verifier) Verify(header string, m SignedRequest, now time.Time, tolerance time.Duration) error {
	if header == "" {
		return ErrSignatureMissing
	}
	if len(v.secret) == 0 {
		return ErrSignatureMismatch
	}
	if tolerance <= 0 {
		tolerance = DefaultSignatureTolerance
	}
	var sigs [maxV1Values][sha256.Size]byte
	ts, n, err := parseV1Into(header, &sigs)
	if err != nil {
		return err
	}
	if err := checkSkew(ts, now, tolerance); err != nil {
		return err
	}
	k, _ := v.macs.Get().(*keyedMAC)
	if k == nil {
		k = &keyedMAC{h: hmac.New(sha256.New, v.secret)}
	} else {
		k.h.Reset()
	}
	k.prefix = m.appendPrefix(k.prefix[:0], ts)
	k.h.Write(k.prefix)
	k.h.Write(m.Body)
	want := k.h.Sum(k.sum[:0])
	ok := false
	for i := range n {
		ok = hmac.Equal(sigs[i][:], want) || ok // every value is compared: no early exit
	}
	if cap(k.prefix) <= maxPooledPrefix {
		v.macs.Put(k)
	}
	if !ok {
		return ErrSignatureMismatch
	}
	return nil
}

// CheckV1 makes the checks of Verify that need no secret: header is a
// well-formed v1 value whose timestamp is within tolerance of now. A
// verifier runs it before it looks up whose secret to use, so that what it
// answers a malformed or stale signature does not depend on whether the
// request names anything that exists.
func CheckV1(header string, now time.Time, tolerance time.Duration) error {
	if header == "" {
		return ErrSignatureMissing
	}
	if tolerance <= 0 {
		tolerance = DefaultSignatureTolerance
	}
	var sigs [maxV1Values][sha256.Size]byte
	ts, _, err := parseV1Into(header, &sigs)
	if err != nil {
		return err
	}
	return checkSkew(ts, now, tolerance)
}

// checkSkew refuses a timestamp more than tolerance from now.
func checkSkew(ts int64, now time.Time, tolerance time.Duration) error {
	skew := now.Sub(time.Unix(ts, 0))
	if skew > tolerance || skew < -tolerance {
		return &sigError{ErrSignatureExpired, "t=" + strconv.FormatInt(ts, 10) + " is " + skew.Round(time.Second).String() +
			" from the verifier's clock (tolerance " + tolerance.String() + ")"}
	}
	return nil
}

// maxPooledPrefix bounds the message prefix a pooled MAC keeps room for.
const maxPooledPrefix = 4 << 10

// parseV1 splits "t=<ts>,v1=<hex>[,v1=<hex>...]" (other keys ignored).
func parseV1(header string) (int64, [][]byte, error) {
	var sigs [maxV1Values][sha256.Size]byte
	ts, n, err := parseV1Into(header, &sigs)
	if err != nil {
		return 0, nil, err
	}
	out := make([][]byte, n)
	for i := range out {
		out[i] = sigs[i][:]
	}
	return ts, out, nil
}

// parseV1Into is parseV1 into sigs, without allocating for a header it
// accepts: it returns the timestamp and how many values it decoded.
func parseV1Into(header string, sigs *[maxV1Values][sha256.Size]byte) (ts int64, n int, err error) {
	seenT := false
	rest := header
	for more := true; more; {
		var part string
		part, rest, more = strings.Cut(rest, ",")
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return 0, 0, &sigError{ErrSignatureMalformed, "element " + strconv.Quote(part) + " is not key=value"}
		}
		switch k {
		case "t":
			t, err := strconv.ParseInt(v, 10, 64)
			if err != nil || seenT || t < 0 || len(v) > 12 || !plainDecimal(v) {
				return 0, 0, &sigError{ErrSignatureMalformed, "t must be one decimal unix time in seconds"}
			}
			ts, seenT = t, true
		case "v1":
			if len(v) != 2*sha256.Size || n == maxV1Values {
				return 0, 0, &sigError{ErrSignatureMalformed, "v1 must be 64 hex digits (at most " + strconv.Itoa(maxV1Values) + " values)"}
			}
			if !decodeHex(sigs[n][:], v) {
				return 0, 0, &sigError{ErrSignatureMalformed, "v1 must be 64 hex digits"}
			}
			n++
		}
	}
	if !seenT || n == 0 {
		return 0, 0, &sigError{ErrSignatureMalformed, `want "t=<unix seconds>,v1=<hex>"`}
	}
	return ts, n, nil
}

// plainDecimal reports whether s is spelled as the message spells a
// timestamp: decimal digits only, no sign, no leading zero (but "0").
func plainDecimal(s string) bool {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// decodeHex decodes the hex digits of s (either case, as encoding/hex
// reads them) into dst, len(dst) == len(s)/2; it reports false for any
// other character.
func decodeHex(dst []byte, s string) bool {
	for i := range dst {
		hi, ok1 := hexDigit(s[2*i])
		lo, ok2 := hexDigit(s[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// sigError is a signature error with detail; errors.Is matches its kind.
type sigError struct {
	kind   error
	detail string
}

func (e *sigError) Error() string { return e.kind.Error() + ": " + e.detail }
func (e *sigError) Unwrap() error { return e.kind }

// RequestTarget returns the target of an incoming request as the client
// sent it: r.RequestURI (for the rare absolute-form request line, its path
// and query).
func RequestTarget(r *http.Request) string {
	if strings.HasPrefix(r.RequestURI, "/") || r.RequestURI == "*" {
		return r.RequestURI
	}
	if r.URL != nil {
		return r.URL.RequestURI()
	}
	return r.RequestURI
}

// SignedRequestOf returns what a v1 signature of the incoming request r
// with raw body must cover.
func SignedRequestOf(r *http.Request, body []byte) SignedRequest {
	return SignedRequest{Method: r.Method, Target: RequestTarget(r), DispatchID: r.Header.Get(HeaderDispatchID),
		DispatchAttempt: r.Header.Get(HeaderDispatchAttempt), Body: body}
}

// SignRequest sets HeaderWicketSignature on an outgoing request whose body
// is body, at time now. Set the dispatch headers first: they are signed.
// The target is req.URL.RequestURI(), which is what net/http sends.
func SignRequest(req *http.Request, secret, body []byte, now time.Time) {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	m := SignedRequest{Method: method, Target: req.URL.RequestURI(), DispatchID: req.Header.Get(HeaderDispatchID),
		DispatchAttempt: req.Header.Get(HeaderDispatchAttempt), Body: body}
	req.Header.Set(HeaderWicketSignature, SignV1(secret, now, m))
}
