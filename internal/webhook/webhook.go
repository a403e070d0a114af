// Package webhook delivers dispatches to agents: a signed POST of
// {execution_id, dispatch_id, dispatch_attempt} to the agent's webhook_url.
// It implements kernel.Deliverer; the retry policy stays in the kernel.
//
// Every connection goes through a netguard.Guard: a webhook URL is a
// tenant's input, and must not reach cloud metadata, link-local peers or
// the kernel itself, neither when it is registered (ValidateWebhookURL) nor
// when it is dialled (the dialer's Control hook checks the resolved IP, so
// a name rebound to a forbidden address after registration is refused).
// Redirects are not followed: a 3xx is not an acknowledgement.
package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/wicket-run/wicket/internal/netguard"
	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// Sender posts webhooks over HTTP.
type Sender struct {
	client *http.Client
	guard  *netguard.Guard
}

var (
	_ kernel.Deliverer        = (*Sender)(nil)
	_ kernel.WebhookValidator = (*Sender)(nil)
)

// Option configures a Sender.
type Option func(*Sender)

// WithGuard makes the Sender check addresses with g instead of the default
// policy (netguard.New(netguard.Options{})).
func WithGuard(g *netguard.Guard) Option {
	return func(s *Sender) {
		if g != nil {
			s.guard = g
		}
	}
}

// New returns a Sender with a connection pool sized for many agents.
// Timeouts come from the context the kernel passes to Deliver.
func New(opts ...Option) *Sender {
	s := &Sender{}
	for _, o := range opts {
		o(s)
	}
	if s.guard == nil {
		s.guard = netguard.New(netguard.Options{})
	}
	tr := &http.Transport{
		Proxy:               nil, // webhooks go straight to the agent
		DialContext:         s.guard.Dialer(net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	s.client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // a redirect is not an acknowledgement
	}}
	return s
}

// validateTimeout bounds the DNS lookup of a registration-time check.
const validateTimeout = 2 * time.Second

// ValidateWebhookURL refuses a URL that leads to a forbidden address: a
// literal IP is checked as is, a host name is resolved (within 2 s) and
// each of its addresses is checked. A name that does not resolve is
// accepted: where it leads is checked again at every dial.
func (s *Sender) ValidateWebhookURL(ctx context.Context, rawURL string) error {
	ctx, cancel := context.WithTimeout(ctx, validateTimeout)
	defer cancel()
	err := s.guard.CheckURL(ctx, rawURL)
	if errors.Is(err, netguard.ErrForbidden) {
		return err
	}
	return nil
}

// Deliver sends one webhook and returns nil when the agent answered 2xx,
// or a *kernel.DeliveryError. The webhook is signed under the agent's
// scheme: Wicket-Signature (v1, binding POST, the webhook URL's path and
// query, the dispatch headers and the body; the default) or, for agents
// registered with signing: body, Rebuno-Signature over the body.
func (s *Sender) Deliver(ctx context.Context, d kernel.Delivery) error {
	body, err := json.Marshal(wire.WebhookPayload{ExecutionID: d.ExecutionID, DispatchID: d.DispatchID, DispatchAttempt: d.Attempt,
		LLMGatewayToken: d.LLMGatewayToken})
	if err != nil {
		return fmt.Errorf("webhook: encode: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return &kernel.DeliveryError{Class: kernel.DeliveryInvalidURL, Err: fmt.Errorf("webhook: request for %s: %w", redactURL(d.WebhookURL), scrubURL(err, d.WebhookURL))}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.HeaderAgentID, d.AgentID)
	req.Header.Set(wire.HeaderDispatchID, d.DispatchID)
	req.Header.Set(wire.HeaderDispatchAttempt, strconv.Itoa(d.Attempt))
	if d.Signing == kernel.SigningBody {
		req.Header.Set(wire.HeaderSignature, wire.Sign([]byte(d.Secret), body))
	} else {
		// v1 (the default): the target is the webhook URL's path and query.
		wire.SignRequest(req, []byte(d.Secret), body, time.Now())
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return &kernel.DeliveryError{Class: Classify(err), Err: fmt.Errorf("webhook: post %s: %w", redactURL(d.WebhookURL), scrubURL(err, d.WebhookURL))}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &kernel.DeliveryError{Class: kernel.DeliveryHTTPStatus, Status: resp.StatusCode,
			Err: fmt.Errorf("webhook: %s answered %s", redactURL(d.WebhookURL), resp.Status)}
	}
	return nil
}

// redactURL is a webhook URL as a delivery error shows it, for the
// kernel's log: without the password of its user info and without its
// query and fragment (which often carry a token), "?…" marking a query.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a URL that does not parse)"
	}
	query := u.RawQuery != "" || u.ForceQuery
	u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = "", false, "", ""
	s := u.Redacted()
	if query {
		s += "?…"
	}
	return s
}

// scrubURL replaces the URL net/http and net/url put in their errors
// (*url.Error: the query, and for a parse error the password too) with
// redactURL's.
func scrubURL(err error, raw string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = redactURL(raw)
	}
	return err
}

// Classify returns the kernel.Delivery* class of an error of an HTTP
// request: what a tenant may learn of a failed delivery.
func Classify(err error) string {
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var recErr tls.RecordHeaderError
	var alert tls.AlertError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalidCert x509.CertificateInvalidError
	switch {
	case errors.Is(err, netguard.ErrForbidden):
		return kernel.DeliveryForbiddenAddress
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return kernel.DeliveryTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return kernel.DeliveryConnectRefused
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return kernel.DeliveryUnreachable
	case errors.As(err, &dnsErr):
		return kernel.DeliveryDNS
	case errors.As(err, &certErr), errors.As(err, &recErr), errors.As(err, &alert),
		errors.As(err, &unknownAuth), errors.As(err, &hostErr), errors.As(err, &invalidCert):
		return kernel.DeliveryTLS
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return kernel.DeliveryConnection
	}
	return kernel.DeliveryOther
}

// isTimeout reports a net.Error timeout anywhere in err's chain.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Close releases idle connections.
func (s *Sender) Close() { s.client.CloseIdleConnections() }
