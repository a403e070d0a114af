package pull

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// Control is a net.Dialer Control hook that refuses an address by
// returning an error (e.g. a network guard's).
type Control func(network, address string, c syscall.RawConn) error

// GuardedClient returns an HTTP client for bundle downloads whose every
// connection, redirects included, is checked by control after DNS
// resolution. With a nil control, [DenyLinkLocal] is used. At most 5
// redirects are followed, to http or https only.
func GuardedClient(control Control) *http.Client {
	if control == nil {
		control = DenyLinkLocal
	}
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: control}
	tr := &http.Transport{
		Proxy:                 nil, // a proxy would dial on our behalf, past the guard
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("more than 5 redirects")
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to %s: want http or https", req.URL.Scheme)
			}
			return nil
		},
	}
}

// DenyLinkLocal refuses link-local (169.254.0.0/16 and fe80::/10, where
// cloud metadata services answer), unspecified, multicast and broadcast
// addresses. Loopback and private addresses are allowed: bundle servers
// commonly run beside the kernel.
func DenyLinkLocal(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("refusing %s: %w", address, err)
	}
	a := ap.Addr().Unmap()
	switch {
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return fmt.Errorf("refusing %s: link-local address (cloud metadata services live there)", address)
	case a.IsUnspecified(), a.IsMulticast(), a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("refusing %s: not a unicast address", address)
	case a == netip.MustParseAddr("fd00:ec2::254"):
		return fmt.Errorf("refusing %s: cloud metadata endpoint", address)
	}
	return nil
}

// CheckResolved returns an Options.CheckURL that resolves a URL's host and
// refuses it when control refuses any of its addresses, so a bad address
// is a 400 when the source is set rather than a failure at every poll.
// The dial-time check still applies: DNS may answer differently later.
func CheckResolved(control Control) func(ctx context.Context, rawURL string) error {
	if control == nil {
		control = DenyLinkLocal
	}
	return func(ctx context.Context, rawURL string) error {
		u, err := url.Parse(rawURL)
		if err != nil {
			return err
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", u.Hostname())
		if err != nil {
			return fmt.Errorf("source url: %w", err)
		}
		for _, a := range addrs {
			if err := control("tcp", net.JoinHostPort(a.Unmap().String(), port), nil); err != nil {
				return fmt.Errorf("source url: %w", err)
			}
		}
		return nil
	}
}
