package server

import (
	"net/http"
	"strconv"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// Client routes and the execution reads agents share.

func (s *Server) createExecution(c *call) (int, any, error) {
	var req wire.CreateExecutionRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	e, created, err := s.k.CreateExecution(c.ctx, kernel.CreateExecution{
		Tenant: c.tenant, AgentID: req.AgentID, AgentVersion: req.AgentVersion, Input: req.Input,
		Labels: req.Labels, Limits: limitsFromWire(req.Limits), Deadline: req.Deadline,
		IdempotencyKey: c.r.Header.Get(wire.HeaderIdempotencyKey),
	})
	if err != nil {
		return 0, nil, err
	}
	if !created {
		return http.StatusOK, executionView(e), nil
	}
	c.w.Header().Set("Location", "/v0/executions/"+e.ID)
	return http.StatusCreated, executionView(e), nil
}

var execStatuses = map[string]bool{
	string(kernel.ExecPending): true, string(kernel.ExecRunning): true, string(kernel.ExecBlocked): true,
	string(kernel.ExecCompleted): true, string(kernel.ExecFailed): true, string(kernel.ExecCancelled): true,
}

func (s *Server) listExecutions(c *call) (int, any, error) {
	q := c.r.URL.Query()
	f := kernel.ExecutionFilter{AgentID: q.Get("agent_id"), Before: q.Get("cursor")}
	if st := q.Get("status"); st != "" {
		if !execStatuses[st] {
			return 0, nil, errorf(kernel.CodeValidation, "status %q is invalid (want pending, running, blocked, completed, failed or cancelled)", st)
		}
		f.Status = kernel.ExecStatus(st)
	}
	n, err := intParam(q.Get("limit"), "limit", 50, 1000)
	if err != nil {
		return 0, nil, err
	}
	f.Limit = n
	out, next, err := s.k.ListExecutions(c.ctx, c.tenant, f)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.ExecutionList{Executions: mapSlice(out, executionView), NextCursor: next}, nil
}

func (s *Server) getExecution(c *call) (int, any, error) {
	e, err := s.k.GetExecution(c.ctx, c.tenant, c.vars("id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, executionView(e), nil
}

func (s *Server) listEvents(c *call) (int, any, error) {
	q := c.r.URL.Query()
	after, err := seqParam(q.Get("after_seq"), "after_seq")
	if err != nil {
		return 0, nil, err
	}
	n, err := intParam(q.Get("limit"), "limit", 100, 1000)
	if err != nil {
		return 0, nil, err
	}
	evs, err := s.k.Events(c.ctx, c.tenant, c.vars("id"), after, n)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.EventList{Events: mapSlice(evs, eventView)}, nil
}

func (s *Server) cancelExecution(c *call) (int, any, error) {
	if err := decode(c.body, &struct{}{}); err != nil {
		return 0, nil, err
	}
	if err := s.k.CancelExecution(c.ctx, c.tenant, c.vars("id"), c.p.Name); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// intParam parses an optional positive integer query parameter.
func intParam(v, name string, def, max int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, errorf(kernel.CodeValidation, "%s must be a positive integer, got %q", name, v)
	}
	if n > max {
		return 0, errorf(kernel.CodeValidation, "%s must be at most %d, got %d", name, max, n)
	}
	return n, nil
}

// seqParam parses an optional event sequence number.
func seqParam(v, name string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, errorf(kernel.CodeValidation, "%s must be a non-negative integer, got %q", name, v)
	}
	return n, nil
}

// Agent routes.

// agentCall is the caller of an agent route: the execution's agent (its
// signature), or on a session the bearer key that holds the lease.
func (s *Server) agentCall(c *call) kernel.AgentCall {
	ac := kernel.AgentCall{Tenant: c.tenant, ExecutionID: c.vars("id"), AgentID: c.p.AgentID, Lease: c.lease}
	if c.p.bearer() {
		ac.AgentID, ac.Holder = "", c.p.KeyID
	}
	return ac
}

func (s *Server) submitStep(c *call) (int, any, error) {
	var req wire.StepSubmitRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	d, err := s.k.SubmitStep(c.ctx, kernel.StepRequest{AgentCall: s.agentCall(c), Kind: req.Kind, Target: req.Target,
		Args: req.Args, Idempotency: kernel.Idempotency(req.Idempotency), Effect: req.Effect, ClaimedStepID: headerValue(c.r.Header, wire.HeaderStepID),
		Reconcile: req.Reconcile, Value: req.Result})
	if err != nil {
		return 0, nil, err
	}
	s.metrics.StepSubmitted(string(d.Decision))
	return http.StatusOK, decisionView(d), nil
}

func (s *Server) listSteps(c *call) (int, any, error) {
	terminal := false
	switch st := c.r.URL.Query().Get("status"); st {
	case "":
	case "terminal":
		terminal = true
	default:
		return 0, nil, errorf(kernel.CodeValidation, "status %q is invalid (want terminal or nothing)", st)
	}
	q := c.r.URL.Query()
	after, err := seqParam(q.Get("cursor"), "cursor")
	if err != nil {
		return 0, nil, err
	}
	n, err := intParam(q.Get("limit"), "limit", 1000, 1000)
	if err != nil {
		return 0, nil, err
	}
	steps, next, err := s.k.ListSteps(c.ctx, c.tenant, c.vars("id"), terminal, after, n)
	if err != nil {
		return 0, nil, err
	}
	l := wire.StepList{Steps: mapSlice(steps, stepView)}
	if next > 0 {
		l.NextCursor = strconv.FormatUint(next, 10)
	}
	return http.StatusOK, l, nil
}

func (s *Server) getStep(c *call) (int, any, error) {
	st, err := s.k.GetStep(c.ctx, c.tenant, c.vars("id"), c.vars("step_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, stepView(st), nil
}

func (s *Server) completeStep(c *call) (int, any, error) {
	var req wire.StepCompleteRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	o := kernel.StepOutcome{AgentCall: s.agentCall(c), StepID: c.vars("step_id"), Result: req.Result}
	if u := req.Usage; u != nil {
		o.Usage = &kernel.Usage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, TotalTokens: u.TotalTokens, CostUSD: u.CostUSD}
	}
	st, err := s.k.CompleteStep(c.ctx, o)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, stepView(st), nil
}

func (s *Server) failStep(c *call) (int, any, error) {
	var req wire.StepFailRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	st, err := s.k.FailStep(c.ctx, kernel.StepOutcome{AgentCall: s.agentCall(c), StepID: c.vars("step_id"), Error: req.Error})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, stepView(st), nil
}

// streamDelta fans a step's live output out to the execution's SSE
// subscribers. Nothing is stored; the step must be executing under the
// caller's lease.
func (s *Server) streamDelta(c *call) (int, any, error) {
	var req wire.StreamDelta
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	if req.Seq < 0 {
		return 0, nil, errorf(kernel.CodeValidation, "seq must not be negative")
	}
	if len(req.Data) == 0 {
		return 0, nil, errorf(kernel.CodeValidation, "data is required")
	}
	if len(req.Data) > MaxDeltaBytes {
		return 0, nil, errorf(kernel.CodeValidation, "data is %d bytes; at most %d a delta", len(req.Data), MaxDeltaBytes)
	}
	id, stepID := c.vars("id"), c.vars("step_id")
	// The kernel has no lease check without a write; read and compare as
	// the kernel's own agent mutations do.
	e, err := s.k.GetExecution(c.ctx, c.tenant, id)
	if err != nil {
		return 0, nil, err
	}
	if e.Status.Terminal() {
		return 0, nil, errorf(kernel.CodeConflict, "execution %s is %s", id, e.Status)
	}
	if c.p.bearer() != e.Session() || (e.Session() && e.Holder.KeyID != c.p.KeyID) {
		return 0, nil, errorf(kernel.CodeForbidden, "only the holder of execution %s's lease streams its steps", id)
	}
	if e.Lease != c.lease {
		return 0, nil, (&kernel.Error{Code: kernel.CodeLeaseSuperseded,
			Message: "dispatch " + c.lease.DispatchID + " attempt " + strconv.Itoa(c.lease.Attempt) + " is not the current lease of execution " + id}).
			WithDetails(map[string]any{"dispatch_id": c.lease.DispatchID, "dispatch_attempt": c.lease.Attempt})
	}
	st, err := s.k.GetStep(c.ctx, c.tenant, id, stepID)
	if err != nil {
		return 0, nil, err
	}
	if st.Status != kernel.StepExecuting {
		return 0, nil, errorf(kernel.CodeConflict, "step %s is %s, not executing", stepID, st.Status)
	}
	if st.Lease != c.lease {
		return 0, nil, errorf(kernel.CodeLeaseSuperseded, "step %s was proceeded under another dispatch attempt", stepID)
	}
	n := s.deltas.publish(id, wire.StepDeltaEvent{ExecutionID: id, StepID: stepID, Seq: req.Seq, Data: req.Data})
	return http.StatusAccepted, wire.StreamDeltaAccepted{Subscribers: n}, nil
}

func (s *Server) heartbeatExecution(c *call) (int, any, error) {
	if err := decode(c.body, &struct{}{}); err != nil {
		return 0, nil, err
	}
	until, err := s.k.Heartbeat(c.ctx, s.agentCall(c))
	if err != nil {
		return 0, nil, err
	}
	var resp wire.HeartbeatResponse
	if !until.IsZero() {
		u := until.UTC()
		resp.LeaseUntil = &u
	}
	return http.StatusOK, resp, nil
}

func (s *Server) completeExecution(c *call) (int, any, error) {
	var req wire.ExecutionCompleteRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	e, err := s.k.CompleteExecution(c.ctx, s.agentCall(c), req.Output)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, executionView(e), nil
}

func (s *Server) failExecution(c *call) (int, any, error) {
	var req wire.ExecutionFailRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	e, err := s.k.FailExecution(c.ctx, s.agentCall(c), req.Error)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, executionView(e), nil
}

// Sessions (docs/gate.md).

func (s *Server) beginSession(c *call) (int, any, error) {
	var req wire.SessionRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	e, err := s.k.BeginSession(c.ctx, kernel.BeginSession{CreateExecution: kernel.CreateExecution{
		Tenant: c.tenant, AgentID: req.AgentID, AgentVersion: req.AgentVersion, Input: req.Input,
		Labels: req.Labels, Limits: limitsFromWire(req.Limits), Deadline: req.Deadline,
	}, KeyID: c.p.KeyID, Principal: c.p.Name})
	if err != nil {
		return 0, nil, err
	}
	c.w.Header().Set("Location", "/v0/executions/"+e.ID)
	return http.StatusCreated, sessionView(e), nil
}

func (s *Server) attachSession(c *call) (int, any, error) {
	if err := decode(c.body, &struct{}{}); err != nil {
		return 0, nil, err
	}
	e, err := s.k.AttachSession(c.ctx, c.tenant, c.vars("id"), c.p.KeyID, c.p.Name)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, sessionView(e), nil
}

func (s *Server) detachSession(c *call) (int, any, error) {
	if err := decode(c.body, &struct{}{}); err != nil {
		return 0, nil, err
	}
	if err := s.k.DetachSession(c.ctx, s.agentCall(c)); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

func (s *Server) reconcileStep(c *call) (int, any, error) {
	var req wire.ReconcileRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	rq := kernel.Reconciliation{AgentCall: s.agentCall(c), StepID: c.vars("step_id"), Outcome: req.Outcome,
		Result: req.Result, Detail: req.Detail}
	if c.p.bearer() {
		rq.By, rq.ByKey = c.p.Name, c.p.KeyID
	} else {
		rq.By = "agent:" + c.p.AgentID
	}
	d, err := s.k.ReconcileStep(c.ctx, rq)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, decisionView(d), nil
}

// probeStep answers whether policy denies a step outright (whatever its
// arguments); the execution's agent or its session's holder asks, without
// a lease, and nothing is recorded.
func (s *Server) probeStep(c *call) (int, any, error) {
	var req wire.StepProbeRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	denied, err := s.k.Probe(c.ctx, kernel.ProbeRequest{AgentCall: s.agentCall(c), Kind: req.Kind, Target: req.Target,
		Effect: req.Effect, Idempotency: req.Idempotency})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.StepProbe{DeniedOutright: denied}, nil
}
