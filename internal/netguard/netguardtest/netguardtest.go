// Package netguardtest helps test code that resolves names through a
// netguard.Guard.
package netguardtest

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
)

// FakeDNS starts a UDP DNS server on loopback that answers every A query with
// the address answer() returns at that moment (TTL 0) and AAAA queries with
// no records, until the test ends. It returns a resolver that asks only it:
// give it to netguard.Options.Resolver to make a name resolve to chosen
// addresses, and change them between lookups (DNS rebinding).
func FakeDNS(t testing.TB, answer func() netip.Addr) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			if len(q) < 12 {
				continue
			}
			// Skip the question name to find its type.
			i := 12
			for i < len(q) && q[i] != 0 {
				i += int(q[i]) + 1
			}
			if i+5 > len(q) {
				continue
			}
			qtype := binary.BigEndian.Uint16(q[i+1:])
			qend := i + 5
			resp := append([]byte(nil), q[:qend]...)
			binary.BigEndian.PutUint16(resp[2:], 0x8180) // response, recursion available, no error
			binary.BigEndian.PutUint16(resp[6:], 0)      // answers
			binary.BigEndian.PutUint16(resp[8:], 0)
			binary.BigEndian.PutUint16(resp[10:], 0)
			if qtype == 1 {
				a := answer().As4()
				binary.BigEndian.PutUint16(resp[6:], 1)
				resp = append(resp, 0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4)
				resp = append(resp, a[:]...)
			}
			_, _ = pc.WriteTo(resp, from)
		}
	}()
	addr := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}
