package server

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// metricsHandler serves /metrics: the registry's exposition, behind
// Config.MetricsKey when one is set (the admin key is accepted too).
func (s *Server) metricsHandler() http.Handler {
	h := s.metrics.Handler()
	if s.cfg.MetricsKey == "" {
		return h
	}
	want := sha256Sum(s.cfg.MetricsKey)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		got := sha256Sum(strings.TrimSpace(token))
		okKey := ok && strings.EqualFold(scheme, "Bearer") &&
			(subtle.ConstantTimeCompare(got[:], want[:]) == 1 ||
				(s.cfg.AdminKey != "" && subtle.ConstantTimeCompare(got[:], s.adminHash[:]) == 1))
		if !okKey {
			w.Header().Set("WWW-Authenticate", `Bearer realm="wicket-metrics"`)
			s.writeJSON(w, http.StatusUnauthorized, wire.ErrorBody{Code: wire.CodeUnauthenticated, Message: "/metrics needs the metrics key: Authorization: Bearer <key>"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// MetricsHandler returns the /metrics handler (with its key check), for a
// listener of its own (Config.MetricsElsewhere).
func (s *Server) MetricsHandler() http.Handler { return s.metricsHandler() }

// recorder wraps the ResponseWriter of one request: it keeps the status for
// logs and metrics, and the route template and principal that the route's
// handler fills in.
type recorder struct {
	http.ResponseWriter
	status    int
	written   bool
	route     string
	principal *Principal // the authenticated caller, named in the request log
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
			s.metrics.ObserveRequest(rec.route, r.Method, st, d)
			// Checked first: the arguments alone cost a dozen allocations
			// per request, with the level off.
			if s.log.Enabled(r.Context(), slog.LevelDebug) {
				principal := ""
				if rec.principal != nil {
					principal = rec.principal.String()
				}
				s.log.Debug("http request", "method", r.Method, "path", r.URL.Path, "route", rec.route, "status", st,
					"duration", readable(d), "principal", principal, "remote", r.RemoteAddr)
			}
		}()
		next.ServeHTTP(rec, r)
	})
}

// readable rounds a duration for logs: "1.234ms", "87µs", "2.5s".
func readable(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(time.Microsecond).String()
	}
	return d.Round(100 * time.Nanosecond).String()
}
