package netguard

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/internal/netguard/netguardtest"
)

func mustPrefixes(t *testing.T, ss ...string) []netip.Prefix {
	t.Helper()
	ps, err := ParsePrefixes(ss)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestCheckDefaults(t *testing.T) {
	g := New(Options{})
	for _, tc := range []struct {
		addr   string
		reason string // "" = allowed
	}{
		{"127.0.0.1:8080", ""},
		{"127.0.0.2:9000", ""},
		{"[::1]:80", ""},
		{"10.1.2.3:80", ""},
		{"192.168.1.10:443", ""},
		{"93.184.216.34:443", ""},
		{"[2001:db8::1]:443", ""},
		{"169.254.169.254:80", "cloud metadata"},
		{"[::ffff:169.254.169.254]:80", "cloud metadata"},
		{"[64:ff9b::a9fe:a9fe]:80", "cloud metadata"}, // NAT64 of 169.254.169.254
		{"169.254.170.2:80", "cloud metadata"},
		{"[fd00:ec2::254]:80", "cloud metadata"},
		{"[fd20:ce::254]:80", "cloud metadata"},
		{"100.100.100.200:80", "Alibaba"},
		{"168.63.129.16:80", "Azure"},
		{"192.0.0.192:80", "Oracle"},
		{"169.254.1.1:80", "link-local"},
		{"[fe80::1]:80", "link-local"},
		{"[fe80::1%eth0]:80", "link-local"},
		{"0.0.0.0:8080", "unspecified"},
		{"0.1.2.3:8080", "unspecified"},
		{"[::]:8080", "unspecified"},
		{"224.0.0.1:80", "multicast"},
		{"[ff02::1]:80", "multicast"},
		{"255.255.255.255:80", "broadcast"},
	} {
		err := g.Check(netip.MustParseAddrPort(tc.addr))
		if tc.reason == "" {
			if err != nil {
				t.Errorf("%s: %v, want allowed", tc.addr, err)
			}
			continue
		}
		var fe *ForbiddenError
		if !errors.As(err, &fe) || !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s: %v, want a ForbiddenError mentioning %q", tc.addr, err, tc.reason)
		}
	}
}

func TestCheckPrefixes(t *testing.T) {
	g := New(Options{
		Allow: mustPrefixes(t, "169.254.10.5", "10.1.2.0/24", "169.254.169.0/24"),
		Deny:  mustPrefixes(t, "10.0.0.0/8", "127.0.0.0/8", "::ffff:192.168.0.0/112"),
		What:  "--webhook-deny-cidr",
	})
	for _, tc := range []struct {
		addr   string
		reason string
	}{
		{"169.254.10.5:80", ""},                           // a longer allow beats link-local
		{"169.254.10.6:80", "link-local"},                 // its neighbour does not
		{"169.254.169.254:80", "cloud metadata"},          // the /32 metadata deny beats the /24 allow
		{"169.254.169.1:80", ""},                          // the /24 allow beats the /16 link-local
		{"10.1.2.3:80", ""},                               // a longer allow beats --deny 10/8
		{"10.9.9.9:80", "--webhook-deny-cidr 10.0.0.0/8"}, // the deny names its flag
		{"127.0.0.1:80", "127.0.0.0/8"},                   // loopback can be denied
		{"192.168.0.7:80", "192.168.0.0/16"},              // a mapped deny prefix applies to IPv4
		{"[::ffff:10.9.9.9]:80", "10.0.0.0/8"},
	} {
		err := g.Check(netip.MustParseAddrPort(tc.addr))
		if tc.reason == "" {
			if err != nil {
				t.Errorf("%s: %v, want allowed", tc.addr, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s: %v, want refused mentioning %q", tc.addr, err, tc.reason)
		}
	}

	// An allow and a deny of the same prefix: the deny wins.
	g = New(Options{Allow: mustPrefixes(t, "10.0.0.0/8"), Deny: mustPrefixes(t, "10.0.0.0/8")})
	if err := g.Check(netip.MustParseAddrPort("10.0.0.1:80")); err == nil {
		t.Error("an equal allow overrode a deny")
	}
	// A configured allow of exactly a default deny re-admits it (explicit
	// configuration beats a default); a wider allow does not.
	g = New(Options{Allow: mustPrefixes(t, "169.254.169.254/32")})
	if err := g.Check(netip.MustParseAddrPort("169.254.169.254:80")); err != nil {
		t.Errorf("explicitly allowed metadata address: %v", err)
	}
	g = New(Options{Allow: mustPrefixes(t, "169.254.0.0/16")})
	if err := g.Check(netip.MustParseAddrPort("169.254.169.254:80")); err == nil {
		t.Error("allowing link-local admitted the metadata endpoint")
	}
	if err := g.Check(netip.MustParseAddrPort("169.254.1.1:80")); err != nil {
		t.Errorf("allowed link-local: %v", err)
	}
}

func TestParsePrefixes(t *testing.T) {
	ps, err := ParsePrefixes([]string{" 10.0.0.0/8", "", "fd00::1", "10.1.2.3/16"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "fd00::1/128", "10.1.0.0/16"}
	if len(ps) != len(want) {
		t.Fatalf("got %v", ps)
	}
	for i, p := range ps {
		if p.String() != want[i] {
			t.Errorf("%d: %s, want %s", i, p, want[i])
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "10.0.0", "fe80::1%eth0/64"} {
		if _, err := ParsePrefixes([]string{bad}); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestSelf(t *testing.T) {
	g := New(Options{Allow: mustPrefixes(t, "0.0.0.0/0", "::/0")})
	g.SetSelf(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080})
	if err := g.Check(netip.MustParseAddrPort("127.0.0.1:8080")); err == nil || !strings.Contains(err.Error(), "own listen") {
		t.Errorf("own listener: %v; the allow prefixes must not admit it", err)
	}
	if err := g.Check(netip.MustParseAddrPort("[::ffff:127.0.0.1]:8080")); err == nil {
		t.Error("own listener in IPv4-mapped form admitted")
	}
	if err := g.Check(netip.MustParseAddrPort("127.0.0.1:8081")); err != nil {
		t.Errorf("another port on loopback: %v", err)
	}

	// Listening on every address: the port is ours on loopback and on the
	// host's interfaces.
	g.SetSelf(&net.TCPAddr{IP: net.IPv6unspecified, Port: 9090})
	for _, a := range []string{"127.0.0.1:9090", "127.0.0.9:9090", "[::1]:9090"} {
		if err := g.Check(netip.MustParseAddrPort(a)); err == nil {
			t.Errorf("%s admitted while the kernel listens on [::]:9090", a)
		}
	}
	addrs, _ := net.InterfaceAddrs()
	for _, ia := range addrs {
		n, ok := ia.(*net.IPNet)
		if !ok {
			continue
		}
		a, _ := netip.AddrFromSlice(n.IP)
		if err := g.Check(netip.AddrPortFrom(a.Unmap(), 9090)); err == nil {
			t.Errorf("interface address %s:9090 admitted while the kernel listens on [::]:9090", a)
		}
	}
	if err := g.Check(netip.MustParseAddrPort("127.0.0.1:9091")); err != nil {
		t.Errorf("another port: %v", err)
	}
}

func TestCheckURL(t *testing.T) {
	g := New(Options{})
	g.SetSelf(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080})
	ctx := context.Background()
	for _, tc := range []struct {
		url       string
		forbidden bool
		err       bool
	}{
		{"http://127.0.0.1:5001/webhook", false, false},
		{"http://169.254.169.254/latest/meta-data", true, false},
		{"http://[fd00:ec2::254]/latest", true, false},
		{"http://[::ffff:a9fe:a9fe]/", true, false},
		{"http://127.0.0.1:8080/v0/executions", true, false},
		{"http://localhost:8080/v0/executions", true, false}, // a name, resolved
		{"https://127.0.0.1:8080/", true, false},
		{"http://127.0.0.1/", false, false},
		{"ftp://127.0.0.1/", false, true},
		{"http://127.0.0.1:99999/", false, true},
		{"http://no-such-host.invalid/", false, true},
	} {
		err := g.CheckURL(ctx, tc.url)
		switch {
		case tc.forbidden && !errors.Is(err, ErrForbidden):
			t.Errorf("%s: %v, want forbidden", tc.url, err)
		case !tc.forbidden && errors.Is(err, ErrForbidden):
			t.Errorf("%s: %v, want not forbidden", tc.url, err)
		case tc.err && err == nil:
			t.Errorf("%s: no error", tc.url)
		case !tc.err && !tc.forbidden && err != nil:
			t.Errorf("%s: %v", tc.url, err)
		}
	}
}

// TestControlRefusesBeforeConnecting dials a real listener that is the
// guard's "own" address: the dial fails with a ForbiddenError and the
// listener never sees a connection.
func TestControlRefusesBeforeConnecting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	g := New(Options{})
	d := &net.Dialer{Timeout: 5 * time.Second, Control: g.Control}
	if c, err := d.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatalf("before SetSelf: %v", err)
	} else {
		c.Close()
	}
	g.SetSelf(ln.Addr())
	_, err = d.Dial("tcp", ln.Addr().String())
	if !errors.Is(err, ErrForbidden) {
		t.Fatalf("dial of the own listener: %v, want ErrForbidden", err)
	}
	// The one connection accepted is the one made before SetSelf.
	deadline := time.Now().Add(5 * time.Second)
	for accepted.Load() < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("listener accepted %d connections, want 1", n)
	}
}

// TestDNSRebinding: a name that resolves to an allowed address when the URL
// is checked and to a metadata address when it is dialled is refused at
// dial time, by an http.Client whose dialer carries the guard.
func TestDNSRebinding(t *testing.T) {
	hits := atomic.Int64{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "ok")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	var current atomic.Value
	current.Store(netip.MustParseAddr("127.0.0.1"))
	res := netguardtest.FakeDNS(t, func() netip.Addr { return current.Load().(netip.Addr) })
	g := New(Options{Resolver: res})
	u := "http://agent.test:" + strconv.Itoa(port) + "/hook"
	if err := g.CheckURL(context.Background(), u); err != nil {
		t.Fatalf("registration-time check: %v", err)
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: g.Dialer(net.Dialer{Timeout: 5 * time.Second}).DialContext, DisableKeepAlives: true}}
	resp, err := hc.Get(u)
	if err != nil {
		t.Fatalf("allowed address: %v", err)
	}
	resp.Body.Close()

	current.Store(netip.MustParseAddr("169.254.169.254")) // the name now points at metadata
	_, err = hc.Get(u)
	if !errors.Is(err, ErrForbidden) {
		t.Fatalf("after rebinding: %v, want ErrForbidden", err)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("server saw %d requests, want 1", n)
	}
}
