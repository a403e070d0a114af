package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/netguard"
	"github.com/wicket-run/wicket/internal/netguard/netguardtest"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// closedURL is the base URL of a loopback port nobody listens on: one the
// OS just handed out and took back. A fixed port (1, say) is no such thing
// on a shared machine, where any root process may listen on it.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return url
}

func TestDeliver(t *testing.T) {
	for _, scheme := range []string{kernel.SigningV1, kernel.SigningBody} {
		t.Run(scheme, func(t *testing.T) { testDeliver(t, scheme) })
	}
}

func testDeliver(t *testing.T, scheme string) {
	const secret = "webhook-secret-0123456789"
	var got wire.WebhookPayload
	status := http.StatusAccepted
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		v1, bodySig := r.Header.Get(wire.HeaderWicketSignature), r.Header.Get(wire.HeaderSignature)
		ok := false
		switch scheme {
		case kernel.SigningV1:
			ok = bodySig == "" && wire.VerifyV1([]byte(secret), v1, wire.SignedRequestOf(r, body), time.Now(), 0) == nil
		case kernel.SigningBody:
			ok = v1 == "" && wire.Verify([]byte(secret), body, bodySig)
		}
		if !ok {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_ = json.Unmarshal(body, &got)
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
			return
		}
		if r.URL.Path == "/slow" {
			time.Sleep(time.Second)
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	s := New()
	defer s.Close()
	d := kernel.Delivery{AgentID: "a", WebhookURL: srv.URL + "/hook?team=x", Secret: secret, Signing: scheme, ExecutionID: "e1", DispatchID: "d1", Attempt: 3}
	ctx := context.Background()
	if err := s.Deliver(ctx, d); err != nil {
		t.Fatalf("2xx: %v", err)
	}
	if got != (wire.WebhookPayload{ExecutionID: "e1", DispatchID: "d1", DispatchAttempt: 3}) {
		t.Errorf("payload %+v", got)
	}
	other := kernel.SigningBody
	if scheme == kernel.SigningBody {
		other = kernel.SigningV1
	}
	for _, tc := range []struct {
		name string
		mod  func(*kernel.Delivery)
		st   int
		want string
	}{
		{"agent refuses", func(*kernel.Delivery) {}, 500, "500"},
		{"wrong secret is refused by the agent", func(d *kernel.Delivery) { d.Secret = "another-secret-0123456789" }, 202, "401"},
		{"the other scheme is refused by the agent", func(d *kernel.Delivery) { d.Signing = other }, 202, "401"},
		{"a redirect is not an acknowledgement", func(d *kernel.Delivery) { d.WebhookURL = srv.URL + "/redirect" }, 202, "302"},
		{"nobody listening", func(d *kernel.Delivery) { d.WebhookURL = closedURL(t) + "/hook" }, 202, "connect"},
	} {
		status = tc.st
		dd := d
		tc.mod(&dd)
		if err := s.Deliver(ctx, dd); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
	status = 202
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	d.WebhookURL = srv.URL + "/slow"
	if err := s.Deliver(tctx, d); err == nil {
		t.Error("a delivery past its deadline succeeded")
	}
}

func TestFailureClasses(t *testing.T) {
	const secret = "webhook-secret-0123456789"
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/500":
			w.WriteHeader(http.StatusInternalServerError)
		case "/redirect":
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data", http.StatusFound)
		case "/slow":
			<-release
		}
	}))
	defer srv.Close()
	defer close(release)
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler()) // its certificate is not trusted
	defer tlsSrv.Close()
	closedURL := closedURL(t) + "/hook"
	s := New()
	defer s.Close()
	for _, tc := range []struct {
		name, url string
		timeout   time.Duration
		class     string
		status    int
	}{
		{"refused", closedURL, 0, kernel.DeliveryConnectRefused, 0},
		{"status", srv.URL + "/500", 0, kernel.DeliveryHTTPStatus, 500},
		{"redirect to metadata is not followed", srv.URL + "/redirect", 0, kernel.DeliveryHTTPStatus, 302},
		{"timeout", srv.URL + "/slow", 100 * time.Millisecond, kernel.DeliveryTimeout, 0},
		{"metadata", "http://169.254.169.254/latest/meta-data", 0, kernel.DeliveryForbiddenAddress, 0},
		{"aws ipv6 metadata", "http://[fd00:ec2::254]/latest", 0, kernel.DeliveryForbiddenAddress, 0},
		{"link-local", "http://169.254.7.7:8080/hook", 0, kernel.DeliveryForbiddenAddress, 0},
		{"untrusted certificate", tlsSrv.URL + "/", 0, kernel.DeliveryTLS, 0},
		{"dns", "http://no-such-host.invalid/hook", 0, kernel.DeliveryDNS, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			err := s.Deliver(ctx, kernel.Delivery{AgentID: "a", WebhookURL: tc.url, Secret: secret, ExecutionID: "e", DispatchID: "d", Attempt: 1})
			var de *kernel.DeliveryError
			if !errors.As(err, &de) {
				t.Fatalf("%v: not a DeliveryError", err)
			}
			if de.Class != tc.class || de.Status != tc.status {
				t.Errorf("class %q status %d, want %q %d (%v)", de.Class, de.Status, tc.class, tc.status, err)
			}
		})
	}
}

func TestValidateWebhookURL(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	g := netguard.New(netguard.Options{Deny: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	g.SetSelf(ln.Addr())
	s := New(WithGuard(g))
	defer s.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ctx := context.Background()
	for url, refused := range map[string]bool{
		"http://127.0.0.1:5001/webhook":           false,
		"http://169.254.169.254/":                 true,
		"http://[fd00:ec2::254]/":                 true,
		"http://[fe80::1]:80/":                    true,
		"http://10.2.3.4/hook":                    true,
		"http://127.0.0.1:" + port + "/v0/agents": true,
		"http://localhost:" + port + "/":          true,
		"http://no-such-host.invalid/":            false, // unresolvable: the dial decides
	} {
		err := s.ValidateWebhookURL(ctx, url)
		if refused != (err != nil) {
			t.Errorf("%s: %v, want refused=%v", url, err, refused)
		}
	}
}

// TestDNSRebindingAtDial: the name resolves to the agent when the URL is
// registered and to the metadata address when the webhook is sent; the
// delivery is refused before any connection is made.
func TestDNSRebindingAtDial(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	var current atomic.Value
	current.Store(netip.MustParseAddr("127.0.0.1"))
	res := netguardtest.FakeDNS(t, func() netip.Addr { return current.Load().(netip.Addr) })
	s := New(WithGuard(netguard.New(netguard.Options{Resolver: res})))
	defer s.Close()
	url := "http://agent.example:" + port + "/hook"
	ctx := context.Background()
	if err := s.ValidateWebhookURL(ctx, url); err != nil {
		t.Fatalf("registration: %v", err)
	}
	d := kernel.Delivery{AgentID: "a", WebhookURL: url, Secret: "webhook-secret-0123456789", ExecutionID: "e", DispatchID: "d", Attempt: 1}
	if err := s.Deliver(ctx, d); err != nil {
		t.Fatalf("first delivery: %v", err)
	}
	s.Close() // no pooled connection to the old address
	current.Store(netip.MustParseAddr("169.254.169.254"))
	err := s.Deliver(ctx, d)
	var de *kernel.DeliveryError
	if !errors.As(err, &de) || de.Class != kernel.DeliveryForbiddenAddress {
		t.Fatalf("after rebinding: %v, want forbidden_address", err)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("agent saw %d webhooks, want 1", n)
	}
}

// TestDeliveryErrorsHideCredentials: a delivery error's text goes to the
// kernel's log (`webhook delivery failed`), so the password of a webhook
// URL's user info and its query (a token, often) must not be in it, whether
// the POST failed to connect, was answered non-2xx, or the URL did not parse.
// It used to print the URL as registered: "webhook: post
// http://hook:hunter2-password@…?token=…".
func TestDeliveryErrorsHideCredentials(t *testing.T) {
	const secret = "webhook-secret-0123456789"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	withCreds := func(base string) string {
		return strings.Replace(base, "http://", "http://hook:hunter2-password@", 1) + "/webhook?token=query-token-secret"
	}
	s := New()
	defer s.Close()
	for _, tc := range []struct {
		name, url, class, want string
	}{
		{"refused", withCreds(closedURL(t)), kernel.DeliveryConnectRefused, "http://hook:xxxxx@127.0.0.1:"},
		{"status", withCreds(srv.URL), kernel.DeliveryHTTPStatus, strings.TrimPrefix(srv.URL, "http://") + "/webhook?…"},
		{"unparsable", "http://hook:hunter2-password@127.0.0.1:port/webhook?token=query-token-secret", kernel.DeliveryInvalidURL, `invalid port ":port"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Deliver(context.Background(), kernel.Delivery{AgentID: "a", WebhookURL: tc.url, Secret: secret, ExecutionID: "e", DispatchID: "d", Attempt: 1})
			var de *kernel.DeliveryError
			if !errors.As(err, &de) || de.Class != tc.class {
				t.Fatalf("got %v, want a DeliveryError of class %s", err, tc.class)
			}
			msg := err.Error()
			for _, s := range []string{"hunter2-password", "query-token-secret"} {
				if strings.Contains(msg, s) {
					t.Errorf("the error shows %q: %s", s, msg)
				}
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("the error does not name the destination %q: %s", tc.want, msg)
			}
		})
	}
}
