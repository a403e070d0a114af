package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/wicket-run/wicket/kernel"
)

// Defaults of the request and connection limits of Config.
const (
	DefaultReadHeaderTimeout   = 10 * time.Second
	DefaultReadTimeout         = 60 * time.Second
	DefaultIdleTimeout         = 120 * time.Second
	DefaultMaxConns            = 4096
	DefaultMaxStreamsPerTenant = 256
	streamWriteTimeout         = 30 * time.Second
)

// HTTPServer returns the http.Server that serves s with the limits of its
// Config: header, request and idle timeouts, the connection accounting
// that evicts idle connections (see Listener), and CloseStreams on
// Shutdown. Serve it on s.Listener(ln).
func (s *Server) HTTPServer() *http.Server {
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ConnState:         s.conns.state,
	}
	hs.RegisterOnShutdown(s.CloseStreams) // SSE clients reconnect with Last-Event-ID
	return hs
}

// Listener bounds ln to Config.MaxConns open connections
// (netutil.LimitListener: Accept waits for a free slot). Connections that
// have not sent a request yet, or sit idle between requests, are closed
// oldest first once the open ones pass seven eighths of the limit, so that
// a flood of idle connections cannot keep a new client out; a connection
// in the middle of a request is never closed for room.
func (s *Server) Listener(ln net.Listener) net.Listener {
	return netutil.LimitListener(ln, s.cfg.MaxConns)
}

// connGuard counts open connections and evicts idle ones above high.
type connGuard struct {
	high int

	mu   sync.Mutex             // guards the rest
	open map[net.Conn]*connNode // open connections
	// head and tail are the idle list: connections in StateNew or
	// StateIdle, oldest first.
	head, tail *connNode
}

// connNode is an open connection, linked into the idle list while idle.
// It is made once per connection: a request moving it off the list and
// back allocates nothing.
type connNode struct {
	c          net.Conn
	prev, next *connNode
	idle       bool
}

func newConnGuard(maxConns int) *connGuard {
	high := maxConns - maxConns/8
	if high < 1 {
		high = 1
	}
	return &connGuard{high: high, open: map[net.Conn]*connNode{}}
}

// pushIdle puts n at the end of the idle list.
func (g *connGuard) pushIdle(n *connNode) {
	n.prev, n.next, n.idle = g.tail, nil, true
	if g.tail != nil {
		g.tail.next = n
	} else {
		g.head = n
	}
	g.tail = n
}

// unidle takes n off the idle list, if it is on it.
func (g *connGuard) unidle(n *connNode) {
	if !n.idle {
		return
	}
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		g.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		g.tail = n.prev
	}
	n.prev, n.next, n.idle = nil, nil, false
}

// state is the http.Server ConnState hook.
func (g *connGuard) state(c net.Conn, st http.ConnState) {
	var evict net.Conn
	g.mu.Lock()
	switch st {
	case http.StateNew:
		if len(g.open) >= g.high {
			if n := g.head; n != nil {
				evict = n.c
				g.unidle(n)
				delete(g.open, evict) // closed below: it no longer counts
			}
		}
		n := &connNode{c: c}
		g.open[c] = n
		g.pushIdle(n)
	case http.StateIdle:
		if n, ok := g.open[c]; ok {
			g.unidle(n)
			g.pushIdle(n)
		}
	case http.StateActive:
		if n, ok := g.open[c]; ok {
			g.unidle(n)
		}
	case http.StateHijacked, http.StateClosed:
		if n, ok := g.open[c]; ok {
			g.unidle(n)
			delete(g.open, c)
		}
	}
	g.mu.Unlock()
	if evict != nil {
		_ = evict.Close() // frees its slot now; its serve loop ends
	}
}

// count returns the open connections.
func (g *connGuard) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.open)
}

// streamSet tracks the open event streams: how many each tenant has (at
// most max), and which key opened each, so that revoking a key ends them.
type streamSet struct {
	max int

	mu     sync.Mutex // guards the rest
	tenant map[string]int
	byKey  map[string]map[*openStream]struct{} // key tenant␀key id → streams
}

// openStream is one open event stream.
type openStream struct {
	tenant, key string
	cancel      context.CancelFunc
}

func newStreamSet(max int) *streamSet {
	return &streamSet{max: max, tenant: map[string]int{}, byKey: map[string]map[*openStream]struct{}{}}
}

// open registers a stream of tenant opened with p's key; cancel ends it.
// More than max streams of one tenant is rate_limited.
func (ss *streamSet) open(tenant string, p Principal, cancel context.CancelFunc) (*openStream, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.tenant[tenant] >= ss.max {
		return nil, (&kernel.Error{Code: kernel.CodeRateLimited,
			Message: fmt.Sprintf("tenant %s has %d open event streams, the limit (serve --max-streams-per-tenant): close one or poll the events route", tenant, ss.max)}).
			WithDetails(map[string]any{"limit": ss.max})
	}
	st := &openStream{tenant: tenant, key: p.Tenant + "\x00" + p.KeyID, cancel: cancel}
	ss.tenant[tenant]++
	m := ss.byKey[st.key]
	if m == nil {
		m = map[*openStream]struct{}{}
		ss.byKey[st.key] = m
	}
	m[st] = struct{}{}
	return st, nil
}

// close unregisters st.
func (ss *streamSet) close(st *openStream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if _, ok := ss.byKey[st.key][st]; !ok {
		return
	}
	delete(ss.byKey[st.key], st)
	if len(ss.byKey[st.key]) == 0 {
		delete(ss.byKey, st.key)
	}
	if ss.tenant[st.tenant]--; ss.tenant[st.tenant] <= 0 {
		delete(ss.tenant, st.tenant)
	}
}

// revoke ends the streams opened with a key of tenant and returns how many.
func (ss *streamSet) revoke(tenant, keyID string) int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	m := ss.byKey[tenant+"\x00"+keyID]
	for st := range m {
		st.cancel()
	}
	return len(m)
}
