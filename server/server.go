package server

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"

	"github.com/wicket-run/wicket/internal/metrics"
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
	// it serves loopback only. Agent routes then drive sessions without a
	// key; an agent's own executions always require its signature.
	AuthDisabled bool
	// MaxBodyBytes bounds request bodies (default 1 MiB); more is 413.
	MaxBodyBytes int64
	// MaxBundleBytes bounds the body of PUT /v0/bundles/{name} (default
	// 32 MiB) for admin and tenant-admin keys; everyone else is held to
	// MaxBodyBytes, and nobody's body is read before the headers
	// authenticated it.
	MaxBundleBytes int64
	// ReadHeaderTimeout, ReadTimeout and IdleTimeout are those of the
	// http.Server HTTPServer returns (defaults 10 s, 60 s, 120 s). Once a
	// request is authenticated and its body read, the read deadline is
	// lifted: a long handler or an event stream is not cut at ReadTimeout.
	ReadHeaderTimeout, ReadTimeout, IdleTimeout time.Duration
	// MaxConns bounds open connections (default 4096; see Listener).
	MaxConns int
	// MaxStreamsPerTenant bounds the open event streams of one tenant
	// (default 256); one more is 429.
	MaxStreamsPerTenant int
	// SignatureTolerance is how far the timestamp of an agent's v1
	// signature may be from the server's clock (default 300 s); an older
	// or newer request is 401.
	SignatureTolerance time.Duration
	// Logger receives request logs (debug) and internal errors (default slog.Default()).
	Logger *slog.Logger
	// Backup serves GET /v0/store/backup (admin), a hot copy of the store;
	// nil answers 503.
	Backup Backuper
	// Metrics receives the server's measurements and serves /metrics (nil:
	// a registry of the server's own).
	Metrics *metrics.Metrics
	// MetricsKey, when set, is the bearer key GET /metrics requires (the
	// admin key is accepted too); empty leaves /metrics open.
	MetricsKey string
	// MetricsElsewhere takes /metrics off the API's router: the caller
	// serves MetricsHandler on a listener of its own.
	MetricsElsewhere bool
	// LLM, when set, serves the LLM gateway under /llm/ (server/llmgw): it
	// authenticates its own callers (gateway tokens) and reads its own
	// bodies.
	LLM http.Handler
	// LLMOwnListener serves the gateway only through LLMHandler (a
	// listener of its own), not under /llm/ of Handler.
	LLMOwnListener bool
	// UI, when set, is served under /ui/ on the same listener (the
	// console, server/console). New calls it once with the handler of the
	// API itself: the UI acts by calling the API in process with the
	// signed-in key, so it may do exactly what that key may do.
	UI func(api http.Handler) http.Handler
}

// Server serves the /v0 API of one kernel. Create it with New; it is safe
// for concurrent use.
type Server struct {
	k         *kernel.Kernel
	cfg       Config
	log       *slog.Logger
	adminHash [32]byte // sha256 of cfg.AdminKey; unused when AdminKey is ""
	router    *mux.Router
	hot       [len(hotRoutes)]*routeHandler // the handlers of hotRoutes
	handler   http.Handler
	ready     atomic.Bool
	metrics   *metrics.Metrics
	deltas    *hub
	// heartbeat is the SSE heartbeat interval (SSEHeartbeat; tests shorten it).
	heartbeat time.Duration
	// closing is closed by CloseStreams; event streams end when it is.
	closing   chan struct{}
	closeOnce sync.Once
	// conns counts connections and evicts idle ones (HTTPServer, Listener).
	conns *connGuard
	// streams are the open event streams, by tenant and by key.
	streams *streamSet
	// storeCheck is /v0/ready's store write check.
	storeCheck writeCheck
	// table is every route with its class (GET /v0/whoami lists a key's).
	table []route
	// verifiers check agents' v1 signatures, one per secret.
	verifiers verifiers
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
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxStreamsPerTenant <= 0 {
		cfg.MaxStreamsPerTenant = DefaultMaxStreamsPerTenant
	}
	if cfg.SignatureTolerance <= 0 {
		cfg.SignatureTolerance = wire.DefaultSignatureTolerance
	}
	s := &Server{
		k:          k,
		cfg:        cfg,
		log:        cfg.Logger,
		metrics:    cfg.Metrics,
		deltas:     newHub(),
		heartbeat:  SSEHeartbeat,
		closing:    make(chan struct{}),
		conns:      newConnGuard(cfg.MaxConns),
		streams:    newStreamSet(cfg.MaxStreamsPerTenant),
		storeCheck: writeCheck{interval: time.Second, timeout: 5 * time.Second},
	}
	if cfg.AdminKey != "" {
		s.adminHash = sha256Sum(cfg.AdminKey)
	}
	// A key revoked through another replica ends its streams here too.
	k.OnKeysRevoked(func(tenant, keyID string) {
		if n := s.streams.revoke(tenant, keyID); n > 0 {
			s.log.Info("key revoked on another replica: event streams closed", "tenant", tenant, "key_id", keyID, "streams", n)
		}
	})
	if s.metrics == nil {
		s.metrics = metrics.New()
	}
	for _, g := range []struct {
		name, help string
		fn         func() float64
	}{
		{"wicket_ready", "Whether the server reports ready.", func() float64 { return boolFloat(s.ready.Load()) }},
		{"wicket_event_streams", "Open event streams (SSE).", func() float64 { return float64(s.deltas.count()) }},
		{"wicket_deliveries_in_flight", "Webhook deliveries holding a delivery slot.", func() float64 { return float64(k.DeliveriesInFlight()) }},
	} {
		if err := s.metrics.GaugeFunc(g.name, g.help, g.fn); err != nil {
			s.log.Warn("metric not registered", "name", g.name, "err", err)
		}
	}
	s.ready.Store(true)
	s.router = s.routes()
	s.handler = s.outer(http.HandlerFunc(s.serveRoute))
	if cfg.UI != nil {
		ui := cfg.UI(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }))
		s.router.PathPrefix("/ui/").Handler(uiRoute(ui))
		s.router.Handle("/ui", http.RedirectHandler("/ui/", http.StatusFound)).Methods("GET", "HEAD")
	}
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
	classOpen      class = iota // no authentication
	classClient                 // bearer: client, tenant-admin, admin (executions: create, cancel)
	classRead                   // bearer: also approver (executions: list, stream)
	classApprovals              // bearer: approver, tenant-admin, admin
	classAdmin                  // bearer: tenant-admin, admin
	classKeys                   // bearer: admin; tenant-admin for its own tenant
	classTenants                // bearer: admin
	classAgent                  // the execution's agent (signed), or a session's holder (bearer)
	classExecRead               // any bearer of the execution's tenant, or the execution's agent
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
	// Neither reads a body: like every refusal, they close the connection
	// rather than drain one.
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s.refuse(&call{w: w, r: req}, &kernel.Error{Code: kernel.CodeNotFound, Message: "no route for " + req.Method + " " + req.URL.Path})
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		closeUnread(&call{w: w, r: req})
		s.writeJSON(w, http.StatusMethodNotAllowed, wire.ErrorBody{Code: wire.CodeMethodNotAllowed,
			Message: "method " + req.Method + " is not allowed on " + req.URL.Path})
	})
	mutation := routeOpts{lease: true}
	type rt = route
	s.table = []rt{
		{"GET", "/v0/health", classOpen, s.health, routeOpts{}},
		{"GET", "/v0/ready", classOpen, s.readyz, routeOpts{}},

		{"POST", "/v0/executions", classClient, s.createExecution, routeOpts{}},
		{"GET", "/v0/executions", classRead, s.listExecutions, routeOpts{}},
		{"GET", "/v0/executions/{id}", classExecRead, s.getExecution, routeOpts{}},
		{"GET", "/v0/executions/{id}/events", classExecRead, s.listEvents, routeOpts{}},
		{"GET", "/v0/executions/{id}/stream", classRead, s.stream, routeOpts{}},
		{"POST", "/v0/executions/{id}/cancel", classClient, s.cancelExecution, routeOpts{}},
		{"POST", "/v0/sessions", classClient, s.beginSession, routeOpts{}},
		{"POST", "/v0/executions/{id}/attach", classClient, s.attachSession, routeOpts{}},
		{"POST", "/v0/executions/{id}/detach", classAgent, s.detachSession, mutation},
		{"POST", "/v0/executions/{id}/probe", classAgent, s.probeStep, routeOpts{}},

		{"POST", "/v0/executions/{id}/steps", classAgent, s.submitStep, mutation},
		{"GET", "/v0/executions/{id}/steps", classExecRead, s.listSteps, routeOpts{}},
		{"GET", "/v0/executions/{id}/steps/{step_id}", classExecRead, s.getStep, routeOpts{}},
		{"POST", "/v0/executions/{id}/steps/{step_id}/complete", classAgent, s.completeStep, mutation},
		{"POST", "/v0/executions/{id}/steps/{step_id}/fail", classAgent, s.failStep, mutation},
		{"POST", "/v0/executions/{id}/steps/{step_id}/stream", classAgent, s.streamDelta, mutation},
		{"POST", "/v0/executions/{id}/steps/{step_id}/reconcile", classAgent, s.reconcileStep, mutation},
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
		{"PUT", "/v0/bundles/{name}/source", classAdmin, s.putBundleSource, routeOpts{}},
		{"DELETE", "/v0/bundles/{name}/source", classAdmin, s.deleteBundleSource, routeOpts{}},
		{"POST", "/v0/policy/eval", classAdmin, s.evalPolicy, routeOpts{}},
		{"GET", "/v0/approvals", classApprovals, s.listApprovals, routeOpts{}},
		{"GET", "/v0/approvals/{approval_id}", classApprovals, s.getApproval, routeOpts{}},
		{"POST", "/v0/approvals/{approval_id}/grant", classApprovals, s.grantApproval, routeOpts{}},
		{"POST", "/v0/approvals/{approval_id}/deny", classApprovals, s.denyApproval, routeOpts{}},
		{"POST", "/v0/approvals/{approval_id}/retry", classApprovals, s.retryApproval, routeOpts{}},
		{"POST", "/v0/approvals/{approval_id}/happened", classApprovals, s.happenedApproval, routeOpts{}},

		{"POST", "/v0/tenants", classTenants, s.createTenant, routeOpts{}},
		{"GET", "/v0/tenants", classTenants, s.listTenants, routeOpts{}},
		{"PUT", "/v0/tenants/{tenant}", classTenants, s.updateTenant, routeOpts{}},
		{"POST", "/v0/tenants/{tenant}/keys", classKeys, s.createKey, routeOpts{}},
		{"GET", "/v0/tenants/{tenant}/keys", classKeys, s.listKeys, routeOpts{}},
		{"DELETE", "/v0/tenants/{tenant}/keys/{key_id}", classKeys, s.deleteKey, routeOpts{}},

		{"GET", "/v0/store/backup", classTenants, s.backup, routeOpts{}},

		{"GET", "/v0/whoami", classRead, s.whoami, routeOpts{}},
	}
	for _, x := range s.table {
		h := s.wrap(x.path, x.cl, x.o, x.h)
		r.Handle(x.path, h).Methods(x.method)
		if i := slices.Index(hotRoutes[:], x.path); i >= 0 && x.method == "POST" {
			s.hot[i] = h
		}
	}
	if !s.cfg.MetricsElsewhere {
		mh := s.metricsHandler()
		r.Handle("/metrics", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if rec, ok := w.(*recorder); ok {
				rec.route = "/metrics"
			}
			mh.ServeHTTP(w, req)
		})).Methods("GET")
	}
	if s.cfg.LLM != nil && !s.cfg.LLMOwnListener {
		r.PathPrefix("/llm/").Handler(s.llmRoute())
	}
	return r
}

// hotRoutes are an agent's step traffic, matched by Server.serveRoute
// without the router's regular expressions; all are POSTs.
var hotRoutes = [...]string{
	"/v0/executions/{id}/steps",
	"/v0/executions/{id}/steps/{step_id}/complete",
	"/v0/executions/{id}/steps/{step_id}/fail",
	"/v0/executions/{id}/heartbeat",
}

// serveRoute serves a request: the hot routes by splitting the path, every
// other request (and any hot path that is not in clean form) through the
// router. The two agree: a hot route's variables are non-empty segments
// without a slash, as the router's {id} and {step_id} are, and a path the
// router would clean or redirect (empty, "." or ".." segments) is left to
// it.
func (s *Server) serveRoute(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		if rest, ok := strings.CutPrefix(r.URL.Path, "/v0/executions/"); ok {
			if h, pv := s.hotRoute(rest); h != nil {
				h.serve(w, r, &pv)
				return
			}
		}
	}
	s.router.ServeHTTP(w, r)
}

// hotRoute matches rest, the path after /v0/executions/, against the hot
// routes.
func (s *Server) hotRoute(rest string) (*routeHandler, pathVars) {
	var seg [5]string
	n := 0
	for n < len(seg) {
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			seg[n] = rest
			n++
			break
		}
		seg[n], rest = rest[:i], rest[i+1:]
		n++
		if n == len(seg) {
			return nil, pathVars{} // too many segments for a hot route
		}
	}
	for _, v := range seg[:n] {
		if v == "" || v == "." || v == ".." {
			return nil, pathVars{}
		}
	}
	switch {
	case n == 2 && seg[1] == "steps":
		return s.hot[0], pathVars{id: seg[0]}
	case n == 4 && seg[1] == "steps" && seg[3] == "complete":
		return s.hot[1], pathVars{id: seg[0], stepID: seg[2]}
	case n == 4 && seg[1] == "steps" && seg[3] == "fail":
		return s.hot[2], pathVars{id: seg[0], stepID: seg[2]}
	case n == 2 && seg[1] == "heartbeat":
		return s.hot[3], pathVars{id: seg[0]}
	}
	return nil, pathVars{}
}

// pathVars are the path variables of a hot route.
type pathVars struct{ id, stepID string }

// route is one row of the route table.
type route struct {
	method, path string
	cl           class
	h            handlerFunc
	o            routeOpts
}

// llmRoute is the LLM gateway as the router serves it, named for metrics
// and logs.
func (s *Server) llmRoute() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rec, ok := w.(*recorder); ok {
			rec.route = "/llm/" // one label: paths under it are the caller's
		}
		s.cfg.LLM.ServeHTTP(w, r)
	})
}

// LLMHandler returns the LLM gateway alone (Config.LLM under /llm/, with
// the server's request logs and metrics), for a listener of its own; nil
// without Config.LLM.
func (s *Server) LLMHandler() http.Handler {
	if s.cfg.LLM == nil {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/llm/", s.llmRoute())
	return s.outer(mux)
}

// PublishDelta passes a step delta to the execution's event-stream
// watchers and returns how many took it (the LLM gateway's streams).
func (s *Server) PublishDelta(executionID string, d wire.StepDeltaEvent) int {
	return s.deltas.publish(executionID, d)
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
	// bodyRead is set once body holds the whole request body.
	bodyRead bool
	// token is the bearer key as sent (bearer principals only).
	token string
	// pv are the path variables of a hot route (nil: the router's),
	// pointing at hot.
	pv  *pathVars
	hot pathVars
	// agent and agentTenant are the agent an agent call names and its
	// execution's tenant, found from the headers before the body is read
	// (agentOf); the signature is not checked yet.
	agent       *kernel.Agent
	agentTenant string
}

// vars returns a path variable.
func (c *call) vars(name string) string {
	if c.pv != nil {
		switch name {
		case "id":
			return c.pv.id
		case "step_id":
			return c.pv.stepID
		}
		return ""
	}
	return mux.Vars(c.r)[name]
}

// handlerFunc handles a call: it returns the status and the value to send
// as JSON (nil: no body), or an error. A handler that wrote the answer
// itself returns status 0.
type handlerFunc func(c *call) (int, any, error)

// wrap turns a handlerFunc into an http.Handler: it admits the call
// (authentication, authorisation, then the body within the caller's limit),
// runs the handler and writes the answer or the error envelope.
func (s *Server) wrap(template string, cl class, o routeOpts, h handlerFunc) *routeHandler {
	return &routeHandler{s: s, template: template, cl: cl, o: o, h: h}
}

// routeHandler is a route's handler (see wrap).
type routeHandler struct {
	s        *Server
	template string
	cl       class
	o        routeOpts
	h        handlerFunc
}

// ServeHTTP serves a request the router matched.
func (rh *routeHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { rh.serve(w, r, nil) }

// serve serves a request; pv are its path variables when Server.route
// matched it (nil: the router's), copied into the call.
func (rh *routeHandler) serve(w http.ResponseWriter, r *http.Request, pv *pathVars) {
	s := rh.s
	if rec, ok := w.(*recorder); ok {
		rec.route = rh.template
	}
	c := &call{w: w, r: r, ctx: r.Context()}
	if pv != nil {
		c.hot = *pv
		c.pv = &c.hot
	}
	if err := s.admit(c, rh.cl, rh.o); err != nil {
		s.refuse(c, err)
		return
	}
	status, v, err := rh.h(c)
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
}

// admit authenticates and authorises c, and reads its body. Bearer
// credentials are checked from the headers before a byte of the body is
// read, and the body's limit follows the role: MaxBundleBytes only for
// admin and tenant-admin keys on bundle uploads, MaxBodyBytes otherwise. An
// agent's signature covers its body, so for agents the headers are checked
// first (the execution is the agent's, the agent is registered) and the
// body, held to MaxBodyBytes, is read before the signature is verified.
// Open routes read no body.
func (s *Server) admit(c *call, cl class, o routeOpts) error {
	if cl == classOpen {
		return nil
	}
	agent := agentCall(c.r, cl)
	if agent {
		a, tenant, err := s.agentOf(c, headerValue(c.r.Header, wire.HeaderAgentID))
		if err != nil {
			return err
		}
		c.agent, c.agentTenant = a, tenant // authenticateAgent checks its signature
		if err := s.readBody(c, s.cfg.MaxBodyBytes); err != nil {
			return err
		}
	}
	if err := s.authenticate(c, cl); err != nil {
		if agent && c.r.ContentLength != 0 {
			// As agentOf's refusals before the body: an agent learns
			// nothing from how its connection is handled either.
			c.w.Header().Set("Connection", "close")
		}
		return err
	}
	if rec, ok := c.w.(*recorder); ok {
		rec.principal = &c.p
	}
	if err := s.authorize(c, cl); err != nil {
		return err
	}
	if cl == classAgent && c.p.bearer() {
		// A session's holder: only the key holding the lease, of the
		// execution's tenant, gets its body read.
		if err := s.k.CheckHolder(c.ctx, c.tenant, c.vars("id"), c.p.KeyID); err != nil {
			return err
		}
	}
	if !agent {
		limit := s.cfg.MaxBodyBytes
		if o.bundle && (c.p.Kind == PrincipalAdmin || c.p.Kind == PrincipalTenantAdmin) {
			limit = s.cfg.MaxBundleBytes
		}
		if err := s.readBody(c, limit); err != nil {
			return err
		}
	}
	if o.lease {
		var err error
		if c.lease, err = leaseOf(c.r); err != nil {
			return err
		}
	}
	return nil
}

// readBody reads c's body within limit, and then lifts the read deadline
// (ReadTimeout bounds reading the request; what the handler does next, or
// how long an event stream lasts, is not a read).
func (s *Server) readBody(c *call, limit int64) error {
	b, err := readBody(c.w, c.r, limit)
	if err != nil {
		return err
	}
	c.body, c.bodyRead = b, true
	_ = http.NewResponseController(c.w).SetReadDeadline(time.Time{})
	return nil
}

// refuse answers a call that was not admitted (or failed). When its body
// was not read, the connection is closed after the answer rather than
// drained: a refused caller's upload, stalled or not, costs nothing more.
func (s *Server) refuse(c *call, err error) {
	closeUnread(c)
	s.writeError(c.w, c.r, err)
}

// closeUnread makes net/http close c's connection after the answer instead
// of reading the rest of a body the handler did not read.
func closeUnread(c *call) {
	if !c.bodyRead && c.r.ContentLength != 0 {
		c.w.Header().Set("Connection", "close")
		_ = http.NewResponseController(c.w).SetReadDeadline(time.Now())
	}
}

// open routes

func (s *Server) health(*call) (int, any, error) {
	return http.StatusOK, wire.Status{Status: "ok"}, nil
}

// readyz answers 503 while the server is not ready, and when the store
// cannot write: a kernel that cannot record steps must not be sent any.
func (s *Server) readyz(c *call) (int, any, error) {
	if !s.ready.Load() {
		return 0, nil, &kernel.Error{Code: kernel.CodeUnavailable, Message: "not ready"}
	}
	if err := s.storeCheck.check(c.ctx, s.k.CheckWritable); err != nil {
		s.log.Warn("not ready: the store cannot write", "err", err)
		return 0, nil, &kernel.Error{Code: kernel.CodeUnavailable, Message: "not ready: the store cannot write (see the kernel log)"}
	}
	return http.StatusOK, wire.Status{Status: "ready"}, nil
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// writeCheck runs a store write check at most once per interval, whatever
// the rate of /v0/ready (an open route): callers within the interval share
// the last result, and one check runs at a time, under a deadline.
type writeCheck struct {
	interval, timeout time.Duration

	mu  sync.Mutex // held during a check
	at  time.Time
	err error
}

func (w *writeCheck) check(ctx context.Context, f func(context.Context) error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.at.IsZero() && time.Since(w.at) < w.interval {
		return w.err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.timeout)
	defer cancel()
	w.err = f(ctx)
	w.at = time.Now()
	return w.err
}
