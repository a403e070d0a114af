package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// rawConn sends head (a request line and headers, without the blank line)
// and then prefix, and leaves the connection open: the rest of the body
// never comes.
func (e *env) rawConn(t *testing.T, head string, prefix string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", e.ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, strings.ReplaceAll(head, "\n", "\r\n")+"\r\n\r\n"+prefix); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// TestRefusedBeforeTheBody: a caller whose headers do not admit it gets its
// answer before it has sent its body, however large it declares it, and the
// connection is closed rather than drained. Before, every body was read
// (up to 32 MiB for bundles) before the credentials were looked at, so
// stalled uploads held memory and connections for as long as they liked.
func TestRefusedBeforeTheBody(t *testing.T) {
	e := newEnv(t, func(o *envOpts) { o.loader = &fakeLoader{} })
	client := e.createKey(t, "default", "client", "ci")
	r := e.start("bot")
	other := e.createKey(t, "default", "client", "other-loop")
	sess := e.begin(client, "bot")
	const big = "Content-Length: 33554432\nContent-Type: application/gzip"
	zeroSig := wire.SignaturePrefix + strings.Repeat("0", 64) // well formed, matches nothing
	for _, tc := range []struct {
		name, head string
		st         int
		code       string
	}{
		{"no credentials", "PUT /v0/bundles/x HTTP/1.1\nHost: k\n" + big, 401, wire.CodeUnauthenticated},
		{"a wrong key", "PUT /v0/bundles/x HTTP/1.1\nHost: k\nAuthorization: Bearer wk_guessed-0123456789\n" + big, 401, wire.CodeUnauthenticated},
		{"a client key on a bundle route", "PUT /v0/bundles/x HTTP/1.1\nHost: k\nAuthorization: Bearer " + client + "\n" + big, 403, wire.CodeForbidden},
		{"a client key over the body limit", "POST /v0/executions HTTP/1.1\nHost: k\nAuthorization: Bearer " + client + "\nContent-Length: 2097152", 413, wire.CodeTooLarge},
		{"a chunked body without credentials", "POST /v0/executions HTTP/1.1\nHost: k\nTransfer-Encoding: chunked", 401, wire.CodeUnauthenticated},
		{"an agent of no execution", "POST /v0/executions/01960000-0000-7000-8000-00000000dead/steps HTTP/1.1\nHost: k\n" +
			wire.HeaderAgentID + ": bot\n" + wire.HeaderSignature + ": " + zeroSig + "\nContent-Length: 1048000", 401, wire.CodeUnauthenticated},
		{"another agent's execution", "POST /v0/executions/" + r.id + "/steps HTTP/1.1\nHost: k\n" +
			wire.HeaderAgentID + ": other\n" + wire.HeaderSignature + ": " + zeroSig + "\nContent-Length: 1048000", 401, wire.CodeUnauthenticated},
		{"a malformed signature", "POST /v0/executions/" + r.id + "/steps HTTP/1.1\nHost: k\n" +
			wire.HeaderAgentID + ": bot\n" + wire.HeaderSignature + ": sha256=00\nContent-Length: 1048000", 401, wire.CodeUnauthenticated},
		{"a stale signature", "POST /v0/executions/" + r.id + "/steps HTTP/1.1\nHost: k\n" +
			wire.HeaderAgentID + ": bot\n" + wire.HeaderWicketSignature + ": t=1700000000,v1=" + strings.Repeat("0", 64) + "\nContent-Length: 1048000", 401, wire.CodeUnauthenticated},
		{"no such route", "POST /v0/nothing-here HTTP/1.1\nHost: k\nTransfer-Encoding: chunked", 404, wire.CodeNotFound},
		{"a method the route does not take", "PATCH /v0/executions HTTP/1.1\nHost: k\nTransfer-Encoding: chunked", 405, wire.CodeMethodNotAllowed},
		{"another key on a session", "POST /v0/executions/" + sess.id + "/steps HTTP/1.1\nHost: k\nAuthorization: Bearer " + other + "\n" +
			wire.HeaderDispatchID + ": " + sess.lease.DispatchID + "\n" + wire.HeaderDispatchAttempt + ": 1\nContent-Length: 1048000", 403, wire.CodeForbidden},
		{"a key on an agent's execution", "POST /v0/executions/" + r.id + "/steps HTTP/1.1\nHost: k\nAuthorization: Bearer " + client + "\n" +
			wire.HeaderDispatchID + ": " + r.lease.DispatchID + "\n" + wire.HeaderDispatchAttempt + ": 1\nContent-Length: 1048000", 403, wire.CodeForbidden},
		{"an unregistered agent's signature missing", "POST /v0/executions/" + r.id + "/steps HTTP/1.1\nHost: k\n" +
			wire.HeaderAgentID + ": bot\nContent-Length: 1048000", 401, wire.CodeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, br := e.rawConn(t, tc.head, "a few bytes of a body that never ends")
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer while the body stalls: %v", err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.st || !strings.Contains(string(b), `"code":"`+tc.code+`"`) {
				t.Fatalf("answer %d %s, want %d %s", res.StatusCode, b, tc.st, tc.code)
			}
			// The server hangs up instead of draining the body.
			if _, err := br.ReadByte(); !errors.Is(err, io.EOF) && !isReset(err) {
				t.Fatalf("after the answer: %v, want the connection closed", err)
			}
		})
	}
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && !oe.Timeout()
}

// TestStalledBodyTimesOut: an authenticated upload that stalls is cut at
// ReadTimeout.
func TestStalledBodyTimesOut(t *testing.T) {
	e := newEnv(t, func(o *envOpts) { o.loader = &fakeLoader{}; o.scfg.ReadTimeout = 300 * time.Millisecond })
	conn, br := e.rawConn(t, "PUT /v0/bundles/x HTTP/1.1\nHost: k\nAuthorization: Bearer "+testAdminKey+"\nContent-Type: application/gzip\nContent-Length: 1000000", "\x1f\x8b")
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(br, nil)
	if err == nil {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Fatalf("stalled upload answered %d %s", res.StatusCode, b)
		}
	} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isReset(err) {
		t.Fatalf("stalled upload: %v, want an answer or the connection closed at the read timeout", err)
	}
	// A long handler is not cut by the read timeout once the body is read:
	// an event stream outlives it.
	r := e.start("bot")
	ch, res2 := e.sse(t, "/v0/executions/"+r.id+"/stream", bearer(testAdminKey))
	if res2.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", res2.StatusCode)
	}
	deadline := time.After(1500 * time.Millisecond) // 5× the read timeout
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				t.Fatal("the event stream ended at the read timeout")
			}
			continue
		case <-deadline:
		}
		break
	}
}

// TestIdleConnectionsCannotLockOut: more idle connections than MaxConns
// (never sending a request, like a slowloris) neither exhaust the server nor
// keep a new client out: the oldest idle ones are closed for room, and open
// connections never exceed the limit.
func TestIdleConnectionsCannotLockOut(t *testing.T) {
	const maxConns = 32
	e := newEnv(t, func(o *envOpts) { o.scfg.MaxConns = maxConns })
	addr := e.ts.Listener.Addr().String()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	for range 4 * maxConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "GET /v0/health HTTP/1.1\r\nHost: k\r\n") // headers never finished
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 5 {
		res, err := hc.Get(e.ts.URL + "/v0/health")
		if err != nil {
			t.Fatalf("health %d with %d idle connections open: %v", i, len(conns), err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("health %d: %d", i, res.StatusCode)
		}
		if n := e.srv.conns.count(); n > maxConns {
			t.Fatalf("%d connections open, limit %d", n, maxConns)
		}
	}
}

// openStream opens an event stream and returns its status and a function
// that closes it.
func (e *env) openStream(t *testing.T, path string) (int, func()) {
	t.Helper()
	return e.openStreamAs(t, path, testAdminKey)
}

// openStreamAs is openStream with key.
func (e *env) openStreamAs(t *testing.T, path, key string) (int, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", e.ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := e.ts.Client().Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	return res.StatusCode, func() { cancel(); res.Body.Close() }
}

// TestStreamsPerTenant: a tenant has at most MaxStreamsPerTenant event
// streams open; one more is 429, other tenants are not affected, and a
// closed stream frees its slot.
func TestStreamsPerTenant(t *testing.T) {
	e := newEnv(t, func(o *envOpts) { o.scfg.MaxStreamsPerTenant = 2 })
	r := e.start("bot")
	path := "/v0/executions/" + r.id + "/stream"
	for i := range 2 {
		st, closeIt := e.openStream(t, path)
		t.Cleanup(closeIt)
		if st != 200 {
			t.Fatalf("stream %d: %d", i+1, st)
		}
	}
	st, closeThird := e.openStream(t, path)
	closeThird()
	if st != http.StatusTooManyRequests {
		t.Fatalf("third stream: %d, want 429", st)
	}
	// Another tenant streams its own execution.
	e.admin("POST", "/v0/tenants", map[string]any{"id": "acme"}).want(t, http.StatusCreated)
	if _, err := e.k.PutAgent(t.Context(), kernel.Agent{ID: "bot", Tenant: "acme", WebhookURL: "http://127.0.0.1:9/acme", Secret: botSecret}); err != nil {
		t.Fatal(err)
	}
	var x wire.Execution
	e.admin("POST", "/v0/executions?tenant=acme", map[string]any{"agent_id": "bot"}).want(t, http.StatusCreated).decode(t, &x)
	st, closeOther := e.openStream(t, "/v0/executions/"+x.ID+"/stream?tenant=acme")
	defer closeOther()
	if st != 200 {
		t.Fatalf("other tenant's stream: %d", st)
	}
	// A closed stream frees its slot (once the server sees it gone).
	st, closeFirst := e.openStream(t, path)
	closeFirst()
	if st != http.StatusTooManyRequests {
		t.Fatalf("stream over the limit: %d", st)
	}
	e.srv.streams.mu.Lock()
	n := e.srv.streams.tenant["default"]
	e.srv.streams.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d streams counted for default, want 2", n)
	}
}

// TestRevokedKeyEndsItsStreams: deleting a key closes the event streams it
// opened at once; streams of other keys go on.
func TestRevokedKeyEndsItsStreams(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	var k wire.CreatedKey
	e.admin("POST", "/v0/tenants/default/keys", map[string]any{"role": "client", "principal": "watcher"}).want(t, http.StatusCreated).decode(t, &k)
	path := "/v0/executions/" + r.id + "/stream"
	revoked, _ := e.sse(t, path, bearer(k.Key))
	kept, _ := e.sse(t, path, bearer(testAdminKey))
	e.admin("DELETE", "/v0/tenants/default/keys/"+k.KeyID, nil).want(t, http.StatusNoContent)
	timeout := time.After(10 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-revoked:
		case <-timeout:
			t.Fatal("the stream of a revoked key is still open")
		}
	}
	select {
	case _, ok := <-kept:
		if !ok {
			t.Fatal("another key's stream ended")
		}
	case <-time.After(200 * time.Millisecond):
	}
	e.do("GET", path, nil, bearer(k.Key)).wantErr(t, http.StatusUnauthorized, wire.CodeUnauthenticated)
}

// fakeConn is a net.Conn that only records Close.
type fakeConn struct {
	net.Conn
	name   string
	closed bool
}

func (c *fakeConn) Close() error { c.closed = true; return nil }

// TestConnGuardOrder: past the high mark a new connection evicts the
// connection idle the longest; an active one is never evicted, and one
// that goes idle again moves to the end of the line.
func TestConnGuardOrder(t *testing.T) {
	g := newConnGuard(4) // high: 4 - 4/8 = 4
	conns := make([]*fakeConn, 7)
	for i := range conns {
		conns[i] = &fakeConn{name: fmt.Sprint("c", i)}
	}
	for _, c := range conns[:4] {
		g.state(c, http.StateNew)
	}
	g.state(conns[0], http.StateActive) // c0 serves a request
	g.state(conns[1], http.StateActive)
	g.state(conns[1], http.StateIdle) // c1 done: now the newest idle
	g.state(conns[4], http.StateNew)  // evicts c2, the oldest idle
	g.state(conns[5], http.StateNew)  // evicts c3
	g.state(conns[6], http.StateNew)  // evicts c1 (c0 is active)
	for i, want := range []bool{false, true, true, true, false, false, false} {
		if conns[i].closed != want {
			t.Errorf("%s closed %v, want %v", conns[i].name, conns[i].closed, want)
		}
	}
	if n := g.count(); n != 4 {
		t.Errorf("%d open, want 4", n)
	}
	g.state(conns[0], http.StateClosed)
	g.state(conns[4], http.StateHijacked)
	if n := g.count(); n != 2 {
		t.Errorf("%d open after a close and a hijack, want 2", n)
	}
	// The list still holds c5, c6 in order: two new connections past the
	// mark evict them oldest first.
	g.state(&fakeConn{}, http.StateNew)
	g.state(&fakeConn{}, http.StateNew)
	g.state(&fakeConn{}, http.StateNew)
	if !conns[5].closed || conns[6].closed {
		t.Errorf("c5 closed %v, c6 closed %v: want the older idle one evicted first", conns[5].closed, conns[6].closed)
	}
}
