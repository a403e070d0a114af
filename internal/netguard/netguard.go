// Package netguard decides which addresses the kernel may connect to on a
// tenant's behalf: agent webhooks today, bundle pulls tomorrow. A URL is a
// tenant's input, so without a guard it reaches whatever the kernel's host
// can reach: cloud metadata services, link-local peers, the kernel's own
// listener.
//
// A Guard is checked twice: when the URL is registered (CheckURL resolves
// the host and checks every address, so the mistake is a 400 at once) and
// when a connection is made (Control, set as a net.Dialer's Control hook,
// sees the IP the dialer actually connects to, after DNS). The second check
// is the one that matters: a name that resolved to a harmless address at
// registration may resolve to 169.254.169.254 at dial time (DNS rebinding).
//
//	g := netguard.New(netguard.Options{})
//	g.SetSelf(ln.Addr())
//	tr := &http.Transport{DialContext: (&net.Dialer{Control: g.Control}).DialContext}
//
// # Rules
//
// Refused by default: link-local addresses (169.254.0.0/16, fe80::/10),
// cloud metadata endpoints (see DefaultDeny), unspecified, multicast and
// broadcast addresses, and the kernel's own listen addresses (SetSelf).
// Loopback and private ranges are allowed: agents commonly run beside the
// kernel or on a private network.
//
// Options.Allow and Options.Deny add prefixes. Among every default and
// configured prefix that contains an address, the longest decides; between
// equal prefixes a configured deny beats a configured allow, which beats a
// default; no match allows. So --deny 10.0.0.0/8 with --allow 10.1.2.0/24
// admits only that /24 of the 10/8, --allow 169.254.10.5/32 admits one
// link-local agent, and --allow 169.254.0.0/16 admits link-local but not
// the metadata endpoints inside it (their /32 defaults are longer). The
// kernel's own listeners are refused whatever the prefixes say.
//
// IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) are checked as the IPv4
// address, and NAT64 addresses (64:ff9b::/96) as the IPv4 address they
// embed as well, so neither form is a way around an IPv4 rule.
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrForbidden is matched (errors.Is) by every *ForbiddenError.
var ErrForbidden = errors.New("forbidden address")

// ForbiddenError says which address was refused and why.
type ForbiddenError struct {
	// Addr is the refused address (its port is 0 when unknown).
	Addr netip.AddrPort
	// Reason names the rule, e.g. "cloud metadata endpoint".
	Reason string
}

func (e *ForbiddenError) Error() string {
	a := e.Addr.Addr().String()
	if e.Addr.Port() != 0 {
		a = e.Addr.String()
	}
	return "forbidden address " + a + ": " + e.Reason
}

// Is matches ErrForbidden.
func (e *ForbiddenError) Is(target error) bool { return target == ErrForbidden }

// rule is one prefix and what it decides.
type rule struct {
	prefix netip.Prefix
	deny   bool
	rank   int // breaks ties between equal prefixes: rankDefault < rankAllow < rankDeny
	reason string
}

const (
	rankDefault = iota
	rankAllow
	rankDeny
)

// DefaultDeny are the prefixes refused unless a longer (or equal) allow
// prefix admits them, with the reason a refusal gives. Metadata endpoints
// inside 169.254.0.0/16 (AWS, GCP, Azure, OpenStack, DigitalOcean and
// others all serve 169.254.169.254; ECS task metadata 169.254.170.2) are
// listed on their own so that allowing link-local does not allow them.
var DefaultDeny = []struct {
	Prefix netip.Prefix
	Reason string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "cloud metadata endpoint"},
	{netip.MustParsePrefix("169.254.170.2/32"), "cloud metadata endpoint (ECS task metadata)"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "cloud metadata endpoint (AWS IMDS over IPv6)"},
	{netip.MustParsePrefix("fd20:ce::254/128"), "cloud metadata endpoint (GCP over IPv6)"},
	{netip.MustParsePrefix("100.100.100.200/32"), "cloud metadata endpoint (Alibaba Cloud)"},
	{netip.MustParsePrefix("168.63.129.16/32"), "cloud platform endpoint (Azure WireServer)"},
	{netip.MustParsePrefix("192.0.0.192/32"), "cloud metadata endpoint (Oracle Cloud)"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local address"},
	{netip.MustParsePrefix("fe80::/10"), "link-local address"},
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified (\"this host\") address"},
	{netip.MustParsePrefix("::/128"), "unspecified address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast address"},
	{netip.MustParsePrefix("ff00::/8"), "multicast address"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast address"},
}

// Options configure a Guard. The zero value is the default policy.
type Options struct {
	// Allow admits addresses in these prefixes (see the package doc for
	// how they combine with Deny and the defaults).
	Allow []netip.Prefix
	// Deny refuses addresses in these prefixes.
	Deny []netip.Prefix
	// What names the flags in refusal reasons, e.g. "--webhook-deny-cidr"
	// (default "deny prefix").
	What string
	// Resolver resolves host names in CheckURL (nil: net.DefaultResolver).
	// Give a dialer the same one so both checks see the same DNS.
	Resolver *net.Resolver
}

// Guard decides which addresses may be connected to. It is safe for
// concurrent use; the zero value is not usable, create one with New.
type Guard struct {
	rules []rule
	self  atomic.Pointer[[]netip.AddrPort]

	ifMu     sync.Mutex // guards ifAddrs, ifAt
	ifAddrs  []netip.Addr
	ifAt     time.Time
	resolver *net.Resolver
}

// ifRefresh is how long the host's interface addresses are cached (they
// matter only when the kernel listens on an unspecified address).
const ifRefresh = 10 * time.Second

// New returns a Guard with the default rules plus o's prefixes.
func New(o Options) *Guard {
	what := o.What
	if what == "" {
		what = "deny prefix"
	}
	g := &Guard{resolver: o.Resolver}
	if g.resolver == nil {
		g.resolver = net.DefaultResolver
	}
	for _, d := range DefaultDeny {
		g.rules = append(g.rules, rule{prefix: d.Prefix, deny: true, rank: rankDefault, reason: d.Reason})
	}
	for _, p := range o.Deny {
		p = normPrefix(p)
		g.rules = append(g.rules, rule{prefix: p, deny: true, rank: rankDeny, reason: "denied by " + what + " " + p.String()})
	}
	for _, p := range o.Allow {
		g.rules = append(g.rules, rule{prefix: normPrefix(p), rank: rankAllow})
	}
	return g
}

// normPrefix masks p and turns an IPv4-mapped prefix into its IPv4 form.
func normPrefix(p netip.Prefix) netip.Prefix {
	a := p.Addr()
	if a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// ParsePrefixes parses CIDR prefixes ("10.0.0.0/8", "fd00::/8") or single
// addresses ("10.1.2.3", a /32 or /128); empty strings are skipped.
func ParsePrefixes(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if strings.Contains(s, "/") {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("netguard: %q is not a CIDR prefix: %w", s, err)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("netguard: %q is neither an address nor a CIDR prefix", s)
		}
		a = a.WithZone("")
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// SetSelf records the kernel's own listen addresses: connections to them
// are refused. An unspecified listen address (0.0.0.0:8080, [::]:8080)
// refuses its port on every loopback and interface address of the host.
// Addresses that are not TCP or UDP addresses with an IP are ignored.
func (g *Guard) SetSelf(addrs ...net.Addr) {
	var aps []netip.AddrPort
	for _, a := range addrs {
		var ap netip.AddrPort
		switch x := a.(type) {
		case *net.TCPAddr:
			ap = x.AddrPort()
		case *net.UDPAddr:
			ap = x.AddrPort()
		default:
			if a == nil {
				continue
			}
			var err error
			if ap, err = netip.ParseAddrPort(a.String()); err != nil {
				continue
			}
		}
		if ap.Port() == 0 || !ap.Addr().IsValid() {
			continue
		}
		aps = append(aps, netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()))
	}
	g.self.Store(&aps)
}

// Check reports whether a connection to ap is allowed: nil, or a
// *ForbiddenError.
func (g *Guard) Check(ap netip.AddrPort) error {
	addr := ap.Addr().WithZone("").Unmap()
	if !addr.IsValid() {
		return &ForbiddenError{Addr: ap, Reason: "invalid address"}
	}
	ap = netip.AddrPortFrom(addr, ap.Port())
	if g.isSelf(ap) {
		return &ForbiddenError{Addr: ap, Reason: "the kernel's own listen address"}
	}
	if r := g.decide(addr); r != "" {
		return &ForbiddenError{Addr: ap, Reason: r}
	}
	if embedded, ok := nat64(addr); ok {
		if g.isSelf(netip.AddrPortFrom(embedded, ap.Port())) {
			return &ForbiddenError{Addr: ap, Reason: "the kernel's own listen address (NAT64)"}
		}
		if r := g.decide(embedded); r != "" {
			return &ForbiddenError{Addr: ap, Reason: r + " (NAT64 " + embedded.String() + ")"}
		}
	}
	return nil
}

// decide returns the reason addr is refused, or "" when it is allowed: the
// longest matching prefix decides; between equal prefixes a configured deny
// beats a configured allow, which beats a default.
func (g *Guard) decide(addr netip.Addr) string {
	best, bits := (*rule)(nil), -1
	for i := range g.rules {
		r := &g.rules[i]
		if !r.prefix.Contains(addr) {
			continue
		}
		if b := r.prefix.Bits(); b > bits || b == bits && r.rank > best.rank {
			best, bits = r, b
		}
	}
	if best == nil || !best.deny {
		return ""
	}
	return best.reason
}

var nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")

// nat64 returns the IPv4 address a well-known-prefix NAT64 address embeds.
func nat64(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() || !nat64Prefix.Contains(a) {
		return netip.Addr{}, false
	}
	b := a.As16()
	return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
}

// isSelf reports whether ap is one of the kernel's own listen addresses.
func (g *Guard) isSelf(ap netip.AddrPort) bool {
	self := g.self.Load()
	if self == nil {
		return false
	}
	for _, s := range *self {
		if s.Port() != ap.Port() {
			continue
		}
		if s.Addr() == ap.Addr() {
			return true
		}
		if s.Addr().IsUnspecified() && g.isLocal(ap.Addr()) {
			return true
		}
	}
	return false
}

// isLocal reports whether a is an address of this host: loopback, or one
// of its interfaces' addresses.
func (g *Guard) isLocal(a netip.Addr) bool {
	if a.IsLoopback() || a.IsUnspecified() {
		return true
	}
	g.ifMu.Lock()
	defer g.ifMu.Unlock()
	if time.Since(g.ifAt) > ifRefresh {
		g.ifAddrs = g.ifAddrs[:0]
		if as, err := net.InterfaceAddrs(); err == nil {
			for _, ia := range as {
				if n, ok := ia.(*net.IPNet); ok {
					if x, ok := netip.AddrFromSlice(n.IP); ok {
						g.ifAddrs = append(g.ifAddrs, x.Unmap())
					}
				}
			}
		}
		g.ifAt = time.Now()
	}
	for _, x := range g.ifAddrs {
		if x == a {
			return true
		}
	}
	return false
}

// Control is a net.Dialer Control hook: it refuses a connection whose
// resolved address is forbidden, before it is attempted.
//
//	d := &net.Dialer{Timeout: 5 * time.Second, Control: g.Control}
func (g *Guard) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &ForbiddenError{Reason: fmt.Sprintf("unparsable %s address %q", network, address)}
	}
	return g.Check(ap)
}

// Dialer returns a copy of d whose connections g checks: its Control hook
// runs g.Control (after d's own Control, if any), and it resolves names with
// the guard's resolver unless d names one. Use its DialContext in an
// http.Transport; a client built so also refuses a redirect that leads to
// a forbidden address, when it dials it.
func (g *Guard) Dialer(d net.Dialer) *net.Dialer {
	if own := d.ControlContext; own != nil {
		d.ControlContext = func(ctx context.Context, network, address string, c syscall.RawConn) error {
			if err := own(ctx, network, address, c); err != nil {
				return err
			}
			return g.Control(network, address, c)
		}
	} else {
		own := d.Control
		d.Control = func(network, address string, c syscall.RawConn) error {
			if own != nil {
				if err := own(network, address, c); err != nil {
					return err
				}
			}
			return g.Control(network, address, c)
		}
	}
	if d.Resolver == nil {
		d.Resolver = g.resolver
	}
	return &d
}

// CheckURL checks where an http(s) URL leads: a literal IP is checked as is,
// a host name is resolved (bounded by ctx) and each of its addresses is
// checked. It returns a *ForbiddenError when an address is refused, a
// plain error when the URL is not http(s) or the name does not resolve
// (which says nothing about where it will lead later: the dial-time check
// decides then), and nil otherwise.
func (g *Guard) CheckURL(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("netguard: parse URL: %w", err)
	}
	var port uint16
	switch u.Scheme {
	case "http":
		port = 80
	case "https":
		port = 443
	default:
		return fmt.Errorf("netguard: URL scheme %q is not http or https", u.Scheme)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return fmt.Errorf("netguard: URL port %q is invalid", p)
		}
		port = uint16(n)
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		return g.Check(netip.AddrPortFrom(a, port))
	}
	addrs, err := g.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("netguard: resolve %s: %w", host, err)
	}
	for _, a := range addrs {
		if err := g.Check(netip.AddrPortFrom(a, port)); err != nil {
			return err
		}
	}
	return nil
}
