package client

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name, in string
		want     []sseEvent
	}{
		{"kernel event", "id: 3\nevent: step.proposed\ndata: {\"seq\":3}\n\n",
			[]sseEvent{{typ: "step.proposed", id: "3", hasID: true, data: []byte(`{"seq":3}`)}}},
		{"delta, comments, heartbeat", ": heartbeat\n\nevent: step.delta\n: note\ndata: {}\n\n: heartbeat\n\n",
			[]sseEvent{{typ: "step.delta", data: []byte(`{}`)}}},
		{"multi-line data", "data: a\ndata:b\ndata:  c\n\n",
			[]sseEvent{{typ: "message", data: []byte("a\nb\n c")}}},
		{"CRLF and CR", "id: 1\r\nevent: x\r\ndata: d\r\n\r\nid: 2\revent: y\rdata: e\r\r",
			[]sseEvent{{typ: "x", id: "1", hasID: true, data: []byte("d")}, {typ: "y", id: "2", hasID: true, data: []byte("e")}}},
		{"BOM, field without colon, unknown fields, retry", "\uFEFFdata\nretry: 10\nfoo: bar\n\n",
			[]sseEvent{{typ: "message", data: []byte("")}}},
		{"no data: not dispatched", "id: 5\nevent: x\n\ndata: y\n\n",
			[]sseEvent{{typ: "message", data: []byte("y")}}},
		{"id with NUL ignored", "id: a\x00b\ndata: z\n\n",
			[]sseEvent{{typ: "message", data: []byte("z")}}},
		{"incomplete event at EOF discarded", "id: 1\ndata: ok\n\nid: 2\ndata: {\"trunc",
			[]sseEvent{{typ: "message", id: "1", hasID: true, data: []byte("ok")}}},
		{"incomplete event without blank line", "id: 1\ndata: done\n",
			nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// One byte at a time: a CR at a read boundary must wait for LF.
			for _, r := range []io.Reader{strings.NewReader(tc.in), iotest.OneByteReader(strings.NewReader(tc.in))} {
				sr := newSSEReader(r)
				var got []sseEvent
				for {
					ev, err := sr.next()
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, ev)
				}
				if len(got) != len(tc.want) {
					t.Fatalf("got %d events %+v, want %+v", len(got), got, tc.want)
				}
				for i := range got {
					g, w := got[i], tc.want[i]
					if g.typ != w.typ || g.id != w.id || g.hasID != w.hasID || string(g.data) != string(w.data) {
						t.Fatalf("event %d: got %+v (%q), want %+v (%q)", i, g, g.data, w, w.data)
					}
				}
			}
		})
	}
}

func TestSSEReaderErrors(t *testing.T) {
	broken := errors.New("connection reset")
	sr := newSSEReader(io.MultiReader(strings.NewReader("id: 1\ndata: x\n\nid: 2\ndata: "), iotest.ErrReader(broken)))
	if ev, err := sr.next(); err != nil || ev.id != "1" {
		t.Fatalf("first: %+v %v", ev, err)
	}
	if _, err := sr.next(); !errors.Is(err, broken) {
		t.Fatalf("a broken stream must return its error: %v", err)
	}
	long := newSSEReader(strings.NewReader("data: " + strings.Repeat("x", maxSSELine) + "\n\n"))
	if _, err := long.next(); err == nil || err == io.EOF {
		t.Fatalf("an over-long line: %v", err)
	}
}

func TestBackoff(t *testing.T) {
	for n, want := range map[int]string{1: "100ms", 2: "200ms", 3: "400ms", 6: "3.2s", 7: "5s", 50: "5s"} {
		if got := backoff(n).String(); got != want {
			t.Errorf("backoff(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestWithTenant(t *testing.T) {
	c := New("http://k", WithTenant("acme"))
	for in, want := range map[string]string{
		"/v0/executions":                      "/v0/executions?tenant=acme",
		"/v0/executions?status=running":       "/v0/executions?status=running&tenant=acme",
		"/v0/executions?tenant=globex":        "/v0/executions?tenant=globex",
		"/v0/bundles/b?archive=1":             "/v0/bundles/b?archive=1&tenant=acme",
		"/v0/health":                          "/v0/health",
		"/v0/tenants":                         "/v0/tenants",
		"/v0/tenants/acme/keys":               "/v0/tenants/acme/keys",
		"/v0/executions/x/stream?after_seq=4": "/v0/executions/x/stream?after_seq=4&tenant=acme",
	} {
		if got := c.withTenant(in); got != want {
			t.Errorf("withTenant(%q) = %q, want %q", in, got, want)
		}
	}
	if got := New("http://k").withTenant("/v0/executions"); got != "/v0/executions" {
		t.Errorf("no tenant: %q", got)
	}
}
