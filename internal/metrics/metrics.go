// Package metrics is Wicket's Prometheus instrumentation, on the standard
// client (github.com/prometheus/client_golang): the one package that
// imports it. A Metrics holds one registry with the Go and process
// collectors and every wicket_* family; it implements kernel.Observer, and
// the server and the store report to it through plain methods.
//
// Every label takes its values from a small set the kernel defines (route
// templates, methods, statuses, engines, decisions): never from what a
// tenant or a client chooses. Engine names are the registered engines';
// past a dozen distinct values a label reads "other".
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
)

// Metrics is one registry of Wicket's metrics. Create it with New; it is
// safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec

	executions         *prometheus.GaugeVec
	executionsCreated  prometheus.Counter
	executionsFinished *prometheus.CounterVec
	decisions          *prometheus.CounterVec
	evalSeconds        *prometheus.HistogramVec
	deliveries         *prometheus.CounterVec
	approvalWait       *prometheus.HistogramVec
	purged             *prometheus.CounterVec

	submissions *prometheus.CounterVec

	commitSeconds    prometheus.Histogram
	updatesPerCommit prometheus.Histogram

	engines, decisionsSeen, answers *bounded

	// requests are the request series resolved so far, by route, method
	// and status: resolving labels (hashing them, a lock, a map) on every
	// request was a visible share of a request's CPU. Routes are templates
	// and methods a fixed set, so the map stays small.
	requests seriesCache[requestKey, requestSeries]

	// decided and submitted cache the series of StepDecided and
	// StepSubmitted by the values they are called with (at most
	// maxCachedSeries each), as requests does for ObserveRequest: a
	// step's metrics then cost no label hashing.
	decided   seriesCache[decidedKey, decidedSeries]
	submitted seriesCache[string, prometheus.Counter]
}

// maxCachedSeries bounds each cache of series looked up by label values
// that callers pass (decisions, engines); past it, series are resolved
// on every call.
const maxCachedSeries = 64

// seriesCache maps label values to the series they resolved to. max
// bounds its size (0: none).
type seriesCache[K comparable, V any] struct {
	mu  sync.RWMutex
	m   map[K]V
	max int
}

// lookup returns the series cached for k.
func (c *seriesCache[K, V]) lookup(k K) (V, bool) {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	return v, ok
}

// store caches v for k, unless the cache is full.
func (c *seriesCache[K, V]) store(k K, v V) {
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[K]V)
	}
	if c.max <= 0 || len(c.m) < c.max {
		c.m[k] = v
	}
	c.mu.Unlock()
}

type decidedKey struct {
	engine   string
	decision policy.Action
}

type decidedSeries struct {
	count prometheus.Counter
	eval  prometheus.Observer
}

type requestKey struct {
	route, method string
	status        int
}

type requestSeries struct {
	count    prometheus.Counter
	duration prometheus.Observer
}

// New builds a registry with the Go and process collectors and every
// Wicket family.
func New() *Metrics {
	m := &Metrics{
		reg:       prometheus.NewRegistry(),
		decided:   seriesCache[decidedKey, decidedSeries]{max: maxCachedSeries},
		submitted: seriesCache[string, prometheus.Counter]{max: maxCachedSeries},
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wicket_http_requests_total", Help: "HTTP requests by route template, method and status.",
		}, []string{"route", "method", "status"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wicket_http_request_duration_seconds", Help: "Time to answer HTTP requests by route template and method (event streams: their whole life).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5 ms .. 4 s
		}, []string{"route", "method"}),
		executions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "wicket_executions", Help: "Stored executions by status.",
		}, []string{"status"}),
		executionsCreated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wicket_executions_created_total", Help: "Executions created.",
		}),
		executionsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wicket_executions_finished_total", Help: "Executions that ended, by final status.",
		}, []string{"status"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wicket_step_decisions_total", Help: "Policy decisions of new steps by the engine of the deciding bundle and the decision.",
		}, []string{"engine", "decision"}),
		evalSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wicket_policy_eval_seconds", Help: "Policy evaluation time of a step's decision, by engine.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 3, 12), // 10 µs .. 1.8 s
		}, []string{"engine"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wicket_deliveries_total", Help: "Webhook delivery attempts by result (acked or failed).",
		}, []string{"result"}),
		approvalWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wicket_approval_wait_seconds", Help: "How long resolved approvals were pending, by outcome (granted, denied, expired).",
			Buckets: []float64{1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600},
		}, []string{"outcome"}),
		purged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wicket_retention_deleted_total", Help: "Records deleted by retention, by kind (executions, events, steps, approvals, counters).",
		}, []string{"kind"}),
		submissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wicket_step_submissions_total", Help: "Step submissions by the answer the agent got (proceed, replay, denied, rate_limited, blocked).",
		}, []string{"decision"}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "wicket_store_commit_seconds", Help: "Time to commit one store transaction (write and fsync).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14), // 0.1 ms .. 0.8 s
		}),
		updatesPerCommit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "wicket_store_updates_per_commit", Help: "Update functions sharing one store commit (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 8), // 1 .. 128
		}),
		engines:       newBounded(12),
		decisionsSeen: newBounded(12),
		answers:       newBounded(12),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.httpRequests, m.httpDuration, m.executions, m.executionsCreated, m.executionsFinished,
		m.decisions, m.evalSeconds, m.deliveries, m.approvalWait, m.purged, m.submissions, m.commitSeconds, m.updatesPerCommit,
	)
	return m
}

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// GaugeFunc registers a gauge whose value fn reads at each scrape. A name
// already registered is an error.
func (m *Metrics) GaugeFunc(name, help string, fn func() float64) error {
	return m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, fn))
}

// ObserveRequest counts one answered HTTP request. route is the route
// template ("unmatched" for none); methods beyond the standard ones are
// counted as OTHER.
func (m *Metrics) ObserveRequest(route, method string, status int, d time.Duration) {
	switch method {
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS":
	default:
		method = "OTHER"
	}
	k := requestKey{route, method, status}
	rs, ok := m.requests.lookup(k)
	if !ok {
		rs = requestSeries{m.httpRequests.WithLabelValues(route, method, strconv.Itoa(status)), m.httpDuration.WithLabelValues(route, method)}
		m.requests.store(k, rs)
	}
	rs.count.Inc()
	rs.duration.Observe(d.Seconds())
}

// StepSubmitted counts one step submission by the answer it got.
func (m *Metrics) StepSubmitted(decision string) {
	c, ok := m.submitted.lookup(decision)
	if !ok {
		c = m.submissions.WithLabelValues(m.answers.get(decision))
		m.submitted.store(decision, c)
	}
	c.Inc()
}

// Commit records one store commit: how long it took and how many update
// functions it carried.
func (m *Metrics) Commit(took time.Duration, updates int) {
	m.commitSeconds.Observe(took.Seconds())
	m.updatesPerCommit.Observe(float64(updates))
}

// PendingApprovals registers the gauges of pending approvals: how many,
// and the age of the oldest. read is called at each scrape (with a short
// deadline) and returns the count and the oldest request time.
func (m *Metrics) PendingApprovals(read func(ctx context.Context) (int, time.Time, error)) error {
	return m.reg.Register(&pendingCollector{read: read,
		count: prometheus.NewDesc("wicket_approvals_pending", "Approvals waiting for a decision.", nil, nil),
		age:   prometheus.NewDesc("wicket_approvals_pending_oldest_age_seconds", "Age of the oldest pending approval (0 when none is pending).", nil, nil),
	})
}

// pendingCollector reads the pending approvals at scrape time.
type pendingCollector struct {
	read       func(ctx context.Context) (int, time.Time, error)
	count, age *prometheus.Desc
}

func (c *pendingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.count; ch <- c.age }

func (c *pendingCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, oldest, err := c.read(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.count, err)
		return
	}
	age := 0.0
	if !oldest.IsZero() {
		age = time.Since(oldest).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age)
}

var _ kernel.Observer = (*Metrics)(nil)

// ExecutionsAtStart implements kernel.Observer.
func (m *Metrics) ExecutionsAtStart(counts map[kernel.ExecStatus]int) {
	for _, st := range allStatuses {
		m.executions.WithLabelValues(string(st)).Set(float64(counts[st]))
	}
}

var allStatuses = []kernel.ExecStatus{kernel.ExecPending, kernel.ExecRunning, kernel.ExecBlocked, kernel.ExecCompleted, kernel.ExecFailed, kernel.ExecCancelled}

// ExecutionStatus implements kernel.Observer.
func (m *Metrics) ExecutionStatus(from, to kernel.ExecStatus) {
	if from != "" {
		m.executions.WithLabelValues(status(from)).Dec()
	} else if to != "" {
		m.executionsCreated.Inc()
	}
	if to != "" {
		m.executions.WithLabelValues(status(to)).Inc()
		if to.Terminal() && (from == "" || !from.Terminal()) {
			m.executionsFinished.WithLabelValues(status(to)).Inc()
		}
	}
}

// status bounds an execution status label to the known statuses.
func status(s kernel.ExecStatus) string {
	for _, st := range allStatuses {
		if s == st {
			return string(s)
		}
	}
	return "other"
}

// StepDecided implements kernel.Observer.
func (m *Metrics) StepDecided(engine string, decision policy.Action, eval time.Duration) {
	k := decidedKey{engine, decision}
	ds, ok := m.decided.lookup(k)
	if !ok {
		if engine == "" {
			engine = "none"
		}
		engine = m.engines.get(engine)
		ds = decidedSeries{m.decisions.WithLabelValues(engine, m.decisionsSeen.get(string(decision))), m.evalSeconds.WithLabelValues(engine)}
		m.decided.store(k, ds)
	}
	ds.count.Inc()
	ds.eval.Observe(eval.Seconds())
}

// Delivery implements kernel.Observer.
func (m *Metrics) Delivery(err error) {
	if err != nil {
		m.deliveries.WithLabelValues("failed").Inc()
		return
	}
	m.deliveries.WithLabelValues("acked").Inc()
}

// ApprovalResolved implements kernel.Observer.
func (m *Metrics) ApprovalResolved(st kernel.ApprovalStatus, waited time.Duration) {
	outcome := "other"
	switch st {
	case kernel.ApprovalGranted, kernel.ApprovalDenied, kernel.ApprovalExpired:
		outcome = string(st)
	}
	m.approvalWait.WithLabelValues(outcome).Observe(waited.Seconds())
}

// Purged implements kernel.Observer.
func (m *Metrics) Purged(p kernel.PurgeStats) {
	for _, kv := range []struct {
		kind string
		n    int
	}{{"executions", p.Executions}, {"events", p.Events}, {"steps", p.Steps}, {"approvals", p.Approvals}, {"counters", p.Counters}} {
		if kv.n > 0 {
			m.purged.WithLabelValues(kv.kind).Add(float64(kv.n))
		}
	}
}

// bounded hands out label values: the first max distinct values as they
// are, any later one as "other".
type bounded struct {
	mu   sync.Mutex
	max  int
	seen map[string]bool
}

func newBounded(max int) *bounded { return &bounded{max: max, seen: map[string]bool{}} }

func (b *bounded) get(v string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen[v] {
		return v
	}
	if len(b.seen) >= b.max {
		return "other"
	}
	b.seen[v] = true
	return v
}
