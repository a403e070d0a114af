package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

// BenchmarkAnswerOverHTTP measures what net/http and writeJSON spend on a
// step's answer (a Step, as POST …/complete answers), on a real loopback
// connection: the client pipelines requests with a tiny body and reads
// the answers back, so the handler's writeJSON, net/http's response
// header and the connection's reads and writes are most of ns/op. It
// runs with b.N requests on one keep-alive connection.
func BenchmarkAnswerOverHTTP(b *testing.B) {
	now := time.Date(2026, 12, 1, 17, 30, 0, 123456789, time.UTC)
	st := wire.Step{ID: strings.Repeat("9a", 32), ExecutionID: "019ad6a2-67a0-7000-8000-1234567890ab", Kind: "tool_call",
		Target: "search", Args: json.RawMessage(`{"n":1,"q":"bench"}`), ArgsHash: strings.Repeat("c3", 32), Idempotency: "at_most_once",
		Status: "succeeded", Result: json.RawMessage(`{"hits":1}`), Lease: &wire.Lease{DispatchID: "019ad6a2-67a0-7000-8000-ba0987654321", Attempt: 1},
		Seq: 42, CreatedAt: now, CompletedAt: &now}
	s := &Server{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.writeJSON(w, http.StatusOK, st)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	req := []byte("POST /v0/executions/x/steps/y/complete HTTP/1.1\r\nHost: k\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	br := bufio.NewReaderSize(conn, 64<<10)
	const window = 16 // requests in flight
	sent := 0
	write := func(n int) {
		_, err := conn.Write(bytes.Repeat(req, n))
		if err != nil {
			b.Fatal(err)
		}
		sent += n
	}
	b.ReportAllocs()
	b.ResetTimer()
	write(min(window, b.N))
	for i := 0; i < b.N; i++ {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK || resp.ContentLength <= 0 {
			b.Fatalf("answer %d: %d, Content-Length %d, %v", i, resp.StatusCode, resp.ContentLength, err)
		}
		resp.Body.Close()
		if sent < b.N {
			write(1)
		}
	}
}

// BenchmarkAppendAnswer measures the hand encoding of a step's two
// answers (a decision, then the completed step), as the step routes send
// them.
func BenchmarkAppendAnswer(b *testing.B) {
	now := time.Date(2026, 12, 1, 17, 30, 0, 123456789, time.UTC)
	d := wire.StepDecision{Decision: "proceed", StepID: strings.Repeat("9a", 32)}
	st := wire.Step{ID: strings.Repeat("9a", 32), ExecutionID: "019ad6a2-67a0-7000-8000-1234567890ab", Kind: "tool_call",
		Target: "search", Args: json.RawMessage(`{"n":1,"q":"bench"}`), ArgsHash: strings.Repeat("c3", 32), Idempotency: "at_most_once",
		Status: "succeeded", Result: json.RawMessage(`{"hits":1}`), Lease: &wire.Lease{DispatchID: "019ad6a2-67a0-7000-8000-ba0987654321", Attempt: 1},
		Seq: 42, CreatedAt: now, CompletedAt: &now}
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		var ok1, ok2 bool
		buf, ok1 = appendAnswer(buf[:0], d)
		buf, ok2 = appendAnswer(buf[:0], st)
		if !ok1 || !ok2 {
			b.Fatal("not hand-encoded")
		}
	}
}
