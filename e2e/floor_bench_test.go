package e2e

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkHTTPFloor is the ceiling any kernel meets on this machine with
// a step's shape on the wire: per step, two POSTs of a step's size (about
// 200 bytes, a signature-sized header) over keep-alive loopback
// connections, each answered with about 250 bytes, by a bare net/http
// handler that reads the body and writes a canned answer: no routing,
// no signature check, no store, no policy. Ten clients run at once, as
// `wicket bench --executions 10` does; server and clients share this
// process and the machine's cores. It reports steps/s; what a real
// kernel does (docs/benchmarks.md) is measured against it.
func BenchmarkHTTPFloor(b *testing.B) {
	answer := bytes.Repeat([]byte("a"), 250)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	url := "http://" + ln.Addr().String()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	body := bytes.Repeat([]byte("b"), 200)
	post := func(path string) error {
		req, err := http.NewRequest(http.MethodPost, url+path, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("X-Wicket-Signature", "t=1700000000,v1=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			b.Errorf("status %d", resp.StatusCode)
		}
		return err
	}
	const clients = 10
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, clients)
	b.ResetTimer()
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := next.Add(1); n <= int64(b.N); n = next.Add(1) {
				for _, p := range []string{"/submit", "/complete"} {
					if err := post(p); err != nil {
						errc <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "steps/s")
}
