package server

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// Defaults of Config.
const (
	DefaultMaxBodyBytes   int64 = 1 << 20  // 1 MiB
	DefaultMaxBundleBytes int64 = 32 << 20 // 32 MiB
	// SSEHeartbeat is how often an idle event stream gets a comment line.
	SSEHeartbeat = 15 * time.Second
)

// Config configures a Server. The zero value of a field means its default.
type Config struct {
	// AdminKey is the bearer key of the kernel-wide admin (tenant default;
	// it may name ?tenant=). Empty: no admin key is accepted.
	AdminKey string
	// AuthDisabled makes every client or admin request without a bearer key
	// act as admin. The caller sets it only when no keys are configured and
	// it serves loopback only. Agent routes always require a signature.
	AuthDisabled bool
	// MaxBodyBytes bounds request bodies (default 1 MiB); more is 413.
	MaxBodyBytes int64
	// MaxBundleBytes bounds the body of PUT /v0/bundles/{name} (default 32 MiB).
	MaxBundleBytes int64
	// SignatureTolerance is how far the timestamp of an agent's v1
	// signature may be from the server's clock (default 300 s); an older
	// or newer request is 401.
	SignatureTolerance time.Duration
	// Logger receives request logs (debug) and internal errors (default slog.Default()).
	Logger *slog.Logger
}

// Server serves the /v0 API of one kernel. Create it with New; it is safe
// for concurrent use.
type Server struct {
	k         *kernel.Kernel
	cfg       Config
	log       *slog.Logger
	adminHash [32]byte // sha256 of cfg.AdminKey; unused when AdminKey is ""
	router    *mux.Router
	handler   http.Handler
	ready     atomic.Bool
	metrics   *metrics
	deltas    *hub
	// heartbeat is the SSE heartbeat interval (SSEHeartbeat; tests shorten it).
	heartbeat time.Duration
	// closing is closed by CloseStreams; event streams end when it is.
	closing   chan struct{}
	closeOnce sync.Once
}

// New builds a server for k.
func New(k *kernel.Kernel, cfg Config) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxBundleBytes <= 0 {
		cfg.MaxBundleBytes = DefaultMaxBundleBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SignatureTolerance <= 0 {
		cfg.SignatureTolerance = wire.DefaultSignatureTolerance
	}
	s := &Server{
		k:         k,
		cfg:       cfg,
		log:       cfg.Logger,
		metrics:   newMetrics(),
		deltas:    newHub(),
		heartbeat: SSEHeartbeat,
		closing:   make(chan struct{}),
	}
	if cfg.AdminKey != "" {
		s.adminHash = sha256Sum(cfg.AdminKey)
	}
	s.ready.Store(true)
	s.router = s.routes()
	s.handler = s.outer(s.router)
	return s
}

// Handler returns the HTTP handler of the whole API.
func (s *Server) Handler() http.Handler { return s.handler }

// SetReady sets what GET /v0/ready answers: 200 when true, 503 when false
// (the command sets it false while shutting down).
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// CloseStreams ends every open event stream (clients resume with
// Last-Event-ID) and makes new ones end at once. Register it with
// http.Server.RegisterOnShutdown: Shutdown waits for requests in flight, and
// an event stream otherwise lasts until its execution ends.
func (s *Server) CloseStreams() { s.closeOnce.Do(func() { close(s.closing) }) }

// route classes: who may call a route (see authorize).
type class int

const (
	classOpen     class = iota // no authentication
	classClient                // bearer: client, tenant-admin, admin
	classAdmin                 // bearer: tenant-admin, admin
	classTenants               // bearer: admin
	classAgent                 // the execution's agent (signed)
	classExecRead              // bearer of the execution's tenant, or the execution's agent
)

// routeOpts are per-route settings.
type routeOpts struct {
	// lease: the route is an agent mutation and needs the dispatch headers.
	lease bool
	// bundle: the body may be up to MaxBundleBytes.
	bundle bool
}

// routes builds the router. Every route is registered here, in one table.
func (s *Server) routes() *mux.Router {
	r := mux.NewRouter()
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s.writeError(w, req, &kernel.Error{Code: kernel.CodeNotFound, Message: "no route for " + req.Method + " " + req.URL.Path})
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s.writeJSON(w, http.StatusMethodNotAllowed, wire.ErrorBody{Code: wire.CodeMethodNotAllowed,
			Message: "method " + req.Method + " is not allowed on " + req.URL.Path})
	})
	mutation := routeOpts{lease: true}
	type rt struct {
		method, path string
		cl           class
		h            handlerFunc
		o            routeOpts
	}
	for _, x := range []rt{
		{"GET", "/v0/health", classOpen, s.health, routeOpts{}},
		{"GET", "/v0/ready", classOpen, s.readyz, routeOpts{}},
		{"GET", "/metrics", classOpen, s.metricsz, routeOpts{}},

		{"POST", "/v0/executions", classClient, s.createExecution, routeOpts{}},
		{"GET", "/v0/executions", classClient, s.listExecutions, routeOpts{}},
		{"GET", "/v0/executions/{id}", classExecRead, s.getExecution, routeOpts{}},
		{"GET", "/v0/executions/{id}/events", classExecRead, s.listEvents, routeOpts{}},
		{"GET", "/v0/executions/{id}/stream", classClient, s.stream, routeOpts{}},
		{"POST", "/v0/executions/{id}/cancel", classClient, s.cancelExecution, routeOpts{}},

		{"POST", "/v0/executions/{id}/steps", classAgent, s.submitStep, mutation},
		{"GET", "/v0/executions/{id}/steps", classExecRead, s.listSteps, routeOpts{}},
		{"GET", "/v0/executions/{id}/steps/{step_id}", classExecRead, s.getStep, routeOpts{}},
		{"POST", "/v0/executions/{id}/steps/{step_id}/complete", classAgent, s.completeStep, mutation},
		{"POST", "/v0/executions/{id}/steps/{step_id}/fail", classAgent, s.failStep, mutation},
		{"POST", "/v0/executions/{id}/steps/{step_id}/stream", classAgent, s.streamDelta, mutation},
		{"POST", "/v0/executions/{id}/heartbeat", classAgent, s.heartbeatExecution, mutation},
		{"POST", "/v0/executions/{id}/complete", classAgent, s.completeExecution, mutation},
		{"POST", "/v0/executions/{id}/fail", classAgent, s.failExecution, mutation},

		{"POST", "/v0/agents", classAdmin, s.putAgent, routeOpts{}},
		{"GET", "/v0/agents", classAdmin, s.listAgents, routeOpts{}},
		{"GET", "/v0/agents/{agent_id}", classAdmin, s.getAgent, routeOpts{}},
		{"DELETE", "/v0/agents/{agent_id}", classAdmin, s.deleteAgent, routeOpts{}},
		{"POST", "/v0/policies/{agent_id}", classAdmin, s.setPolicy, routeOpts{}},
		{"PUT", "/v0/bundles/{name}", classAdmin, s.putBundle, routeOpts{bundle: true}},
		{"GET", "/v0/bundles", classAdmin, s.listBundles, routeOpts{}},
		{"GET", "/v0/bundles/{name}", classAdmin, s.getBundle, routeOpts{}},
		{"DELETE", "/v0/bundles/{name}", classAdmin, s.deleteBundle, routeOpts{}},
		{"POST", "/v0/policy/eval", classAdmin, s.evalPolicy, routeOpts{}},
		{"GET", "/v0/approvals", classAdmin, s.listApprovals, routeOpts{}},
		{"GET", "/v0/approvals/{approval_id}", classAdmin, s.getApproval, routeOpts{}},
		{"POST", "/v0/approvals/{approval_id}/grant", classAdmin, s.grantApproval, routeOpts{}},
		{"POST", "/v0/approvals/{approval_id}/deny", classAdmin, s.denyApproval, routeOpts{}},

		{"POST", "/v0/tenants", classTenants, s.createTenant, routeOpts{}},
		{"GET", "/v0/tenants", classTenants, s.listTenants, routeOpts{}},
		{"POST", "/v0/tenants/{tenant}/keys", classTenants, s.createKey, routeOpts{}},
		{"GET", "/v0/tenants/{tenant}/keys", classTenants, s.listKeys, routeOpts{}},
		{"DELETE", "/v0/tenants/{tenant}/keys/{key_id}", classTenants, s.deleteKey, routeOpts{}},
	} {
		r.Handle(x.path, s.wrap(x.path, x.cl, x.o, x.h)).Methods(x.method)
	}
	return r
}

// call is one authenticated request as a handler sees it.
type call struct {
	w    http.ResponseWriter
	r    *http.Request
	ctx  context.Context
	body []byte
	p    Principal
	// tenant is the tenant the request acts in: the key's (or ?tenant= for
	// admins), or for agents the execution's.
	tenant string
	// lease is the caller's lease (agent mutations only).
	lease kernel.Lease
}

// vars returns a path variable.
func (c *call) vars(name string) string { return mux.Vars(c.r)[name] }

// handlerFunc handles a call: it returns the status and the value to send
// as JSON (nil: no body), or an error. A handler that wrote the answer
// itself returns status 0.
type handlerFunc func(c *call) (int, any, error)

// wrap turns a handlerFunc into an http.Handler: it reads the body within
// its limit, authenticates, authorises, runs the handler and writes the
// answer or the error envelope.
func (s *Server) wrap(template string, cl class, o routeOpts, h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rec, ok := w.(*recorder); ok {
			rec.route = template
		}
		limit := s.cfg.MaxBodyBytes
		if o.bundle {
			limit = s.cfg.MaxBundleBytes
		}
		body, err := readBody(w, r, limit)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		c := &call{w: w, r: r, ctx: r.Context(), body: body}
		if cl != classOpen {
			if err := s.authenticate(c, cl); err != nil {
				s.writeError(w, r, err)
				return
			}
			if rec, ok := w.(*recorder); ok {
				rec.principal = c.p.String()
			}
			if err := s.authorize(c, cl); err != nil {
				s.writeError(w, r, err)
				return
			}
			if o.lease {
				if c.lease, err = leaseOf(r); err != nil {
					s.writeError(w, r, err)
					return
				}
			}
		}
		status, v, err := h(c)
		switch {
		case err != nil:
			s.writeError(w, r, err)
		case status == 0:
			// written by the handler
		case v == nil:
			w.WriteHeader(status)
		default:
			s.writeJSON(w, status, v)
		}
	})
}

// open routes

func (s *Server) health(*call) (int, any, error) {
	return http.StatusOK, wire.Status{Status: "ok"}, nil
}

func (s *Server) readyz(*call) (int, any, error) {
	if !s.ready.Load() {
		return 0, nil, &kernel.Error{Code: kernel.CodeUnavailable, Message: "not ready"}
	}
	return http.StatusOK, wire.Status{Status: "ready"}, nil
}

func (s *Server) metricsz(c *call) (int, any, error) {
	c.w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	c.w.WriteHeader(http.StatusOK)
	s.metrics.write(c.w, s.ready.Load(), s.deltas.count(), s.k.DeliveriesInFlight())
	return 0, nil, nil
}
