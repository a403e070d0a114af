package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/wicket-run/wicket/kernel/policy"
)

// Delivery is one webhook the kernel asks a Deliverer to send.
type Delivery struct {
	Tenant     string
	AgentID    string
	WebhookURL string
	Secret     string
	// Signing is the agent's scheme (SigningV1 or SigningBody): how the
	// webhook is signed.
	Signing     string
	ExecutionID string
	DispatchID  string
	Attempt     int
	// LLMGatewayToken authenticates the attempt's calls to the LLM gateway
	// (Config.LLMGatewayTokens; empty otherwise). It is a secret: the
	// Deliverer hands it to the agent and nobody else.
	LLMGatewayToken string
}

// Deliverer sends webhooks (internal/webhook implements it). Deliver returns
// nil only when the agent acknowledged with a 2xx; it must honour ctx. A
// failure should be a *DeliveryError: its class is what the dispatch.failed
// event records (the full error goes to the log only).
type Deliverer interface {
	Deliver(ctx context.Context, d Delivery) error
}

// WebhookValidator is implemented by a Deliverer that refuses some webhook
// URLs (addresses the kernel must not reach). PutAgent calls it; an error
// makes the registration a 400 that quotes it.
type WebhookValidator interface {
	ValidateWebhookURL(ctx context.Context, rawURL string) error
}

// Classes of DeliveryError: what a dispatch.failed event says went wrong.
// They are coarse on purpose: a tenant reads them, and the raw dial error
// of an arbitrary URL would make the kernel a port scanner.
const (
	DeliveryConnectRefused   = "connect_refused"   // nothing listens there
	DeliveryTimeout          = "timeout"           // connect or answer took longer than --dispatch-timeout
	DeliveryForbiddenAddress = "forbidden_address" // the address policy refused the destination
	DeliveryHTTPStatus       = "http_status"       // the agent answered non-2xx (its status is recorded)
	DeliveryDNS              = "dns_error"         // the host name did not resolve
	DeliveryTLS              = "tls_error"         // the TLS handshake or certificate failed
	DeliveryUnreachable      = "unreachable"       // no route to the network or host
	DeliveryConnection       = "connection_error"  // the connection broke (reset, closed early)
	DeliveryInvalidURL       = "invalid_url"       // the webhook URL cannot be requested
	DeliveryOther            = "delivery_error"    // anything else
)

// DeliveryError is a failed delivery: Class for the event log, Status for
// DeliveryHTTPStatus, Err (logged, never recorded) for the operator.
type DeliveryError struct {
	Class  string
	Status int
	Err    error
}

func (e *DeliveryError) Error() string {
	if e.Err == nil {
		return e.Class
	}
	return e.Class + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *DeliveryError) Unwrap() error { return e.Err }

// deliveryClass returns the class and HTTP status of a Deliver error.
func deliveryClass(err error) (string, int) {
	var de *DeliveryError
	switch {
	case errors.As(err, &de) && de.Class != "":
		return de.Class, de.Status
	case errors.Is(err, context.DeadlineExceeded):
		return DeliveryTimeout, 0
	}
	return DeliveryOther, 0
}

// Verdict is the policy layer's answer for one step, with what produced it:
// the composed action (default_action already applied), the bundle and rule
// behind it, how long the evaluation took, and what the action needs (an
// approval's settings, the rate limits to count). The step records the
// first five fields as its [StepVerdict].
type Verdict struct {
	Action   policy.Action    `json:"action"`
	Reason   string           `json:"reason,omitempty"`
	RuleID   string           `json:"rule_id,omitempty"`
	Bundle   policy.BundleRef `json:"bundle"`
	EvalTime time.Duration    `json:"eval_ns"`
	// Approval configures a require_approval verdict (nil: the kernel's defaults).
	Approval *policy.Approval `json:"approval,omitempty"`
	// RateLimits are the limits to check and count for this step: the one
	// attached to the winning answer and those declared by the manifests of
	// the evaluated bundles that match the step.
	RateLimits []RateLimitRule `json:"rate_limits,omitempty"`
	// OnInterrupted is OnInterruptedApproval when a bundle evaluated for
	// the step declares on_interrupted: approval; the step records it when
	// it proceeds.
	OnInterrupted string `json:"on_interrupted,omitempty"`
}

// record is what the step records of v.
func (v *Verdict) record() *StepVerdict {
	return &StepVerdict{Action: v.Action, Reason: v.Reason, RuleID: v.RuleID, Bundle: v.Bundle, EvalTime: v.EvalTime}
}

// VerdictOf makes the verdict of an engine's answer from bundle ref.
func VerdictOf(a *policy.Answer, ref policy.BundleRef) Verdict {
	return Verdict{Action: a.Action, Reason: a.Reason, RuleID: a.RuleID, Bundle: ref, Approval: a.Approval}
}

// RateLimitRule is a rate limit with the id its counter is kept under.
type RateLimitRule struct {
	ID               string `json:"id"`
	policy.RateLimit `json:",inline"`
}

// PolicyRequest is what the policy layer decides on: the input document and
// the bundles that apply, read by the kernel in the transaction that read
// the execution, so a decision needs no read of its own.
type PolicyRequest struct {
	Input *policy.Input
	// Guards are the tenant's guard bundles, evaluated first, in order.
	Guards []string
	// Bundle is the agent's bundle; empty when the agent is bound to none.
	Bundle string
}

// Policy decides steps (plugins.Host implements it).
//
// Decide must not return an error for a policy that fails to answer: it
// returns a deny verdict with the reason instead (fail closed). An error
// means the request itself is wrong. Decide must be safe for concurrent use
// and must honour ctx.
type Policy interface {
	Decide(ctx context.Context, req *PolicyRequest) (Verdict, error)
}

// DefaultPolicy is the kernel's policy for agents bound to no bundle: it
// answers Action for every step (an unmatched local step is always allowed).
type DefaultPolicy struct{ Action policy.Action }

// DefaultBundleRef names the kernel's default policy in decision events.
var DefaultBundleRef = policy.BundleRef{Name: "kernel-default", Revision: "1", Engine: "builtin"}

// Decide implements Policy. It ignores the request's bundles.
func (p DefaultPolicy) Decide(_ context.Context, req *PolicyRequest) (Verdict, error) {
	return p.Verdict(req.Input.Step.Kind), nil
}

// Verdict is the default policy's verdict for a step of the given kind.
func (p DefaultPolicy) Verdict(kind string) Verdict {
	a := p.Action
	if a == "" {
		a = policy.Allow
	}
	v := VerdictOf(policy.ApplyDefault(nil, a, kind), DefaultBundleRef)
	v.Reason = "kernel default policy: " + string(v.Action)
	v.RuleID = "kernel_default"
	return v
}

// CheckWritable commits an empty transaction: it fails when the store
// cannot write (a read-only or full file system, an I/O error, a closed
// store or an unreachable database), which reads alone would not show.
func (k *Kernel) CheckWritable(ctx context.Context) error {
	if err := k.store.Update(ctx, func(Tx) error { return nil }); err != nil {
		return fmt.Errorf("store write check: %w", err)
	}
	return nil
}

// Kernel is the domain service. Create it with New, call Start to run the
// dispatcher and reapers, and Close to stop them.
type Kernel struct {
	store   Store
	deliv   Deliverer
	policy  Policy
	bundles BundleLoader
	puller  BundlePuller
	cfg     Config
	log     *slog.Logger
	ids     idGen

	wake      chan struct{} // a dispatch was queued
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	sem       chan struct{} // bounds deliveries in flight
	closeOnce sync.Once

	// runMu guards runCtx and closed: deliveries start (wg.Add) only while
	// the kernel runs, never once Close waits for them.
	runMu  sync.Mutex
	runCtx context.Context // the background loops' context; nil before Start
	closed bool

	agentsMu sync.RWMutex
	agents   map[agentKey]*Agent // filled lazily
	// agentsGen counts the changes to agents this kernel learned of (its
	// own writes, the other replicas' announcements): a read into the
	// cache that overlapped one may be stale and is not kept.
	agentsGen uint64

	ownersMu sync.RWMutex
	owners   map[string]owner // execution id → owner (immutable once created)

	subsMu sync.Mutex
	subs   map[string]map[chan struct{}]struct{} // execution id → watchers (SSE)

	sh sharedState // following the other replicas (replicas.go)
}

type owner struct{ tenant, agentID string }

// agentKey names an agent in the kernel's cache of agents.
type agentKey struct{ tenant, id string }

// New builds a kernel from its collaborators, which it uses from then on
// and never replaces:
//
//   - st, the store (store/bbolt); required;
//   - deliv, the webhook sender (internal/webhook); nil only for a kernel
//     that never calls Start;
//   - pol, the policy layer (plugins.Host); nil means DefaultPolicy{Allow};
//   - bundles, the bundle loader (plugins.Host); nil means a kernel without
//     policy engines, whose bundle routes answer unavailable.
//
// cfg is checked with Config.Validate; its zero fields take the defaults of
// DefaultConfig.
func New(st Store, deliv Deliverer, pol Policy, bundles BundleLoader, cfg Config) (*Kernel, error) {
	if st == nil {
		return nil, errors.New("kernel: no store")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kernel config: %w", err)
	}
	cfg = cfg.withDefaults()
	if pol == nil {
		pol = DefaultPolicy{Action: policy.Allow}
	}
	return &Kernel{
		store:   st,
		deliv:   deliv,
		policy:  pol,
		bundles: bundles,
		cfg:     cfg,
		log:     cfg.Logger,
		wake:    make(chan struct{}, 1),
		sem:     make(chan struct{}, cfg.DeliveryConcurrency),
		agents:  map[agentKey]*Agent{},
		owners:  map[string]owner{},
		subs:    map[string]map[chan struct{}]struct{}{},
	}, nil
}

// now is the kernel's clock reading, in UTC.
func (k *Kernel) now() time.Time { return k.cfg.Clock.Now().UTC() }

// Start requeues the deliveries a previous process left in flight, then
// runs the dispatcher, the lease reaper and the approval expirer until
// Close.
func (k *Kernel) Start(ctx context.Context) error {
	if k.deliv == nil {
		return errors.New("kernel: start: no deliverer")
	}
	if err := k.checkCopyMark(ctx); err != nil {
		return fmt.Errorf("kernel: start: %w", err)
	}
	t0 := time.Now()
	counts, err := k.countExecutions(ctx)
	if err != nil {
		return fmt.Errorf("kernel: start: %w", err)
	}
	if obs := k.cfg.Observer; obs != nil {
		obs.ExecutionsAtStart(counts)
	}
	resumed := []any{}
	n := 0
	for _, st := range []ExecStatus{ExecPending, ExecRunning, ExecBlocked} {
		resumed = append(resumed, string(st), counts[st])
		n += counts[st]
	}
	k.log.Info("executions resumed", append(append([]any{"executions", n}, resumed...), "counted_in", time.Since(t0).Round(time.Millisecond).String())...)
	// Deliveries the previous process left in flight are requeued before
	// this process claims anything: until runCtx is set no transaction
	// claims (claimNow), so every delivering dispatch recovery sees is one
	// the previous process started, never one of ours still in flight.
	// On a shared store the deliveries left "delivering" may be another
	// replica's, in flight: their leases decide (replicas.go).
	if _, shared := k.shared(); !shared {
		if err := k.recoverDeliveries(ctx); err != nil {
			return fmt.Errorf("kernel: start: recover deliveries: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	k.cancel = cancel
	k.runMu.Lock()
	k.runCtx = ctx
	k.runMu.Unlock()
	k.wg.Add(3)
	go func() { defer k.wg.Done(); k.dispatchLoop(ctx) }()
	go func() { defer k.wg.Done(); k.reapLoop(ctx) }()
	go func() { defer k.wg.Done(); k.retentionLoop(ctx) }()
	if f, ok := k.shared(); ok {
		k.wg.Add(1)
		go func() { defer k.wg.Done(); k.follow(ctx, f) }()
	}
	return nil
}

// Close stops the background loops and waits for deliveries in flight. It
// does not close the store.
func (k *Kernel) Close(ctx context.Context) error {
	k.closeOnce.Do(func() {
		k.runMu.Lock()
		k.closed = true
		k.runMu.Unlock()
		if k.cancel != nil {
			k.cancel()
		}
	})
	done := make(chan struct{})
	go func() { k.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("kernel: close: %w", ctx.Err())
	}
}

// poke wakes the dispatcher.
func (k *Kernel) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Watch returns a channel that receives a value whenever new events of the
// execution are committed, and a function that stops watching.
func (k *Kernel) Watch(executionID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	k.subsMu.Lock()
	m := k.subs[executionID]
	if m == nil {
		m = map[chan struct{}]struct{}{}
		k.subs[executionID] = m
	}
	m[ch] = struct{}{}
	k.subsMu.Unlock()
	return ch, func() {
		k.subsMu.Lock()
		delete(k.subs[executionID], ch)
		if len(k.subs[executionID]) == 0 {
			delete(k.subs, executionID)
		}
		k.subsMu.Unlock()
	}
}

// notify tells watchers of the executions that new events were committed.
func (k *Kernel) notify(ids ...string) {
	k.subsMu.Lock()
	defer k.subsMu.Unlock()
	if len(k.subs) == 0 {
		return
	}
	for _, id := range ids {
		for ch := range k.subs[id] {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// update runs fn in a store transaction; fn gets a fresh recorder per run.
func (k *Kernel) update(ctx context.Context, fn func(r *rec) error) ([]string, error) {
	// What the runs of fn leave behind, in one allocation (the closure
	// below shares it with this function).
	var u struct {
		touched []string
		queued  bool
		last    *rec // the latest run of fn: the committed one when err is nil
		slots   int  // delivery slots held by runs that did not commit
	}
	err := k.store.Update(ctx, func(tx Tx) error {
		if u.last != nil { // fn runs again (another function of the batch failed)
			u.slots += u.last.slots
		}
		r := &rec{tx: tx, now: k.now()}
		if k.cfg.Observer != nil {
			r.obs = &observed{}
			r.tx = &observedTx{Tx: tx, o: r.obs}
		}
		u.last = r
		if err := fn(r); err != nil {
			return err
		}
		if err := k.claimNow(r); err != nil {
			return err
		}
		u.touched, u.queued = r.touched, r.queued
		return nil
	})
	if u.last != nil && err != nil {
		u.slots += u.last.slots
	}
	k.releaseSlots(u.slots)
	if err == nil {
		if u.last.obs != nil {
			u.last.obs.report(k.cfg.Observer, u.last.now)
		}
		k.startClaimed(u.last)
		k.notify(u.touched...)
		if u.queued {
			k.poke()
		}
	}
	return u.touched, err
}

// rec records state changes and their events inside one transaction.
type rec struct {
	tx      Tx
	now     time.Time
	touched []string
	queued  bool // a dispatch was queued: wake the dispatcher after commit
	// dueNow are the executions whose dispatch was queued due now: claimNow
	// claims them in the same transaction when a delivery slot is free.
	dueNow []*Execution
	// claimed are the deliveries claimed in this transaction, each holding
	// one of slots delivery slots; they start once it commits.
	claimed []Delivery
	slots   int
	// obs collects what the Observer is told once this run commits (nil
	// without an Observer).
	obs *observed
}

// event appends an event to e's log; it refuses to append after the
// terminal execution event.
func (r *rec) event(e *Execution, typ EventType, payload any) error {
	if e.Status.Terminal() && !isTerminalExecEvent(typ) {
		return &Error{Code: CodeInternal, Message: fmt.Sprintf("refusing %s after terminal execution event", typ)}
	}
	var raw json.RawMessage
	switch p := payload.(type) {
	case nil:
		raw = json.RawMessage("{}")
	case json.RawMessage:
		raw = p
	default:
		b, err := encodePayload(p)
		if err != nil {
			return fmt.Errorf("encode %s payload: %w", typ, err)
		}
		raw = b
	}
	e.LastSeq++
	e.UpdatedAt = r.now
	if err := r.tx.AppendEvent(e.Tenant, Event{ExecutionID: e.ID, Seq: e.LastSeq, Type: typ, Time: r.now, Payload: raw}); err != nil {
		return fmt.Errorf("append %s to %s: %w", typ, e.ID, err)
	}
	if r.obs != nil {
		r.obs.observeEvent(payload)
	}
	if len(r.touched) == 0 || r.touched[len(r.touched)-1] != e.ID {
		r.touched = append(r.touched, e.ID)
	}
	return nil
}

func isTerminalExecEvent(typ EventType) bool {
	return typ == EvExecutionCompleted || typ == EvExecutionFailed || typ == EvExecutionCancelled
}

// loadExec reads an execution of a tenant.
func loadExec(tx ReadTx, tenant, id string) (*Execution, error) {
	e, err := tx.Execution(tenant, id)
	if err = execReadError(err, id); err != nil {
		return nil, err
	}
	return e, nil
}

// execReadError is the error of loadExec for the store's err (nil: nil).
func execReadError(err error, id string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotFound):
		return Errorf(CodeNotFound, "execution %s not found", id)
	}
	return fmt.Errorf("read execution %s: %w", id, err)
}
