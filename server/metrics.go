package server

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// metrics are the server's Prometheus metrics, kept by hand (no client
// library): requests by route template, method and status; request latency
// sum and count by route and method; step decisions by decision.
type metrics struct {
	mu        sync.Mutex // guards the maps
	requests  map[reqKey]uint64
	latency   map[latKey]*latency
	decisions map[string]uint64
}

type reqKey struct {
	route, method string
	status        int
}

type latKey struct{ route, method string }

type latency struct {
	sum   float64
	count uint64
}

func newMetrics() *metrics {
	return &metrics{requests: map[reqKey]uint64{}, latency: map[latKey]*latency{}, decisions: map[string]uint64{}}
}

func (m *metrics) observe(route, method string, status int, d time.Duration) {
	switch method {
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS":
	default:
		method = "OTHER" // clients choose methods freely: bound the label's values
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests[reqKey{route, method, status}]++
	l := m.latency[latKey{route, method}]
	if l == nil {
		l = &latency{}
		m.latency[latKey{route, method}] = l
	}
	l.sum += d.Seconds()
	l.count++
}

func (m *metrics) decision(d string) {
	m.mu.Lock()
	m.decisions[d]++
	m.mu.Unlock()
}

// write renders the text exposition format (version 0.0.4), sorted so the
// output is stable.
func (m *metrics) write(w io.Writer, ready bool, streams, deliveries int) {
	m.mu.Lock()
	reqs := make([]reqKey, 0, len(m.requests))
	for k := range m.requests {
		reqs = append(reqs, k)
	}
	lats := make([]latKey, 0, len(m.latency))
	for k := range m.latency {
		lats = append(lats, k)
	}
	decs := make([]string, 0, len(m.decisions))
	for k := range m.decisions {
		decs = append(decs, k)
	}
	slices.SortFunc(reqs, func(a, b reqKey) int {
		return cmpStrings(a.route+" "+a.method, b.route+" "+b.method)*2 + cmpInts(a.status, b.status)
	})
	slices.SortFunc(lats, func(a, b latKey) int { return cmpStrings(a.route+" "+a.method, b.route+" "+b.method) })
	slices.Sort(decs)

	bw := bufio.NewWriter(w)
	bw.WriteString("# HELP wicket_http_requests_total HTTP requests by route template, method and status.\n")
	bw.WriteString("# TYPE wicket_http_requests_total counter\n")
	for _, k := range reqs {
		fmt.Fprintf(bw, "wicket_http_requests_total{method=%s,route=%s,status=\"%d\"} %d\n", label(k.method), label(k.route), k.status, m.requests[k])
	}
	bw.WriteString("# HELP wicket_http_request_duration_seconds Time to answer HTTP requests (event streams: their whole life).\n")
	bw.WriteString("# TYPE wicket_http_request_duration_seconds summary\n")
	for _, k := range lats {
		l := m.latency[k]
		fmt.Fprintf(bw, "wicket_http_request_duration_seconds_sum{method=%s,route=%s} %s\n", label(k.method), label(k.route), strconv.FormatFloat(l.sum, 'g', -1, 64))
		fmt.Fprintf(bw, "wicket_http_request_duration_seconds_count{method=%s,route=%s} %d\n", label(k.method), label(k.route), l.count)
	}
	bw.WriteString("# HELP wicket_step_decisions_total Step submissions by decision.\n")
	bw.WriteString("# TYPE wicket_step_decisions_total counter\n")
	for _, d := range decs {
		fmt.Fprintf(bw, "wicket_step_decisions_total{decision=%s} %d\n", label(d), m.decisions[d])
	}
	m.mu.Unlock()
	bw.WriteString("# HELP wicket_event_streams Open event streams (SSE).\n# TYPE wicket_event_streams gauge\n")
	fmt.Fprintf(bw, "wicket_event_streams %d\n", streams)
	bw.WriteString("# HELP wicket_deliveries_in_flight Webhook deliveries holding a delivery slot.\n# TYPE wicket_deliveries_in_flight gauge\n")
	fmt.Fprintf(bw, "wicket_deliveries_in_flight %d\n", deliveries)
	r := 0
	if ready {
		r = 1
	}
	bw.WriteString("# HELP wicket_ready Whether the server reports ready.\n# TYPE wicket_ready gauge\n")
	fmt.Fprintf(bw, "wicket_ready %d\n", r)
	_ = bw.Flush()
}

func cmpStrings(a, b string) int { return strings.Compare(a, b) }

func cmpInts(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// label quotes a label value: backslash, double quote and newline escaped.
func label(v string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v) + `"`
}

// recorder wraps the ResponseWriter of one request: it keeps the status for
// logs and metrics, and the route template and principal that the route's
// handler fills in.
type recorder struct {
	http.ResponseWriter
	status    int
	written   bool
	route     string
	principal string
}

func (r *recorder) WriteHeader(st int) {
	if !r.written {
		r.status, r.written = st, true
	}
	r.ResponseWriter.WriteHeader(st)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.written {
		r.status, r.written = http.StatusOK, true
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flush, deadlines).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Flush implements http.Flusher.
func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// outer is the outermost handler: it recovers panics into 500 envelopes,
// counts the request in the metrics and logs it at debug level.
func (s *Server) outer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &recorder{ResponseWriter: w, route: "unmatched"}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic serving request", "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
				if !rec.written {
					s.writeError(rec, r, &kernel.Error{Code: kernel.CodeInternal, Message: fmt.Sprint(v)})
				}
			}
			d := time.Since(start)
			st := rec.status
			if !rec.written {
				st = http.StatusOK
			}
			s.metrics.observe(rec.route, r.Method, st, d)
			s.log.Debug("http request", "method", r.Method, "path", r.URL.Path, "route", rec.route, "status", st,
				"duration", d, "principal", rec.principal, "remote", r.RemoteAddr)
		}()
		next.ServeHTTP(rec, r)
	})
}
