package kernel

import (
	"context"
	"errors"
	"time"
)

// claimBatch bounds how many due dispatches one transaction claims.
const claimBatch = 64

// dispatchLoop claims due dispatches and delivers them until ctx ends.
func (k *Kernel) dispatchLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		n, err := k.claimDue(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			k.log.Error("claim dispatches", "err", err)
		}
		if n == claimBatch && err == nil {
			continue // more may be due
		}
		wait := time.Second
		var next time.Time
		var ok bool
		if err := k.store.View(ctx, func(tx ReadTx) error {
			var err error
			next, ok, err = tx.NextDue()
			return err
		}); err == nil && ok {
			wait = max(min(next.Sub(k.now()), time.Second), 0)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-k.wake:
		case <-timer.C:
		}
	}
}

// recoverDeliveries requeues dispatches that were being delivered when the
// kernel stopped: whether the agent got them is unknown, so they are
// delivered again as a new attempt right away instead of after the lease.
// Start runs it before anything of this process can claim: run alongside
// the first claims, it would take a delivery of this process still in
// flight for a lost one and deliver the dispatch a second time.
func (k *Kernel) recoverDeliveries(ctx context.Context) error {
	var refs []DispatchRef
	far := k.now().Add(100 * 365 * 24 * time.Hour)
	if err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		refs, err = tx.ExpiredLeases(far, 1<<20)
		return err
	}); err != nil {
		return err
	}
	if len(refs) == 0 {
		return nil
	}
	_, err := k.update(ctx, func(r *rec) error {
		for _, ref := range refs {
			e, err := r.tx.Execution(ref.Tenant, ref.ExecutionID)
			if err != nil || e.Dispatch.State != DispatchDelivering {
				continue
			}
			if err := k.supersede(r, e, "kernel_restart"); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

// claimDue claims up to claimBatch due dispatches in one transaction and
// starts their deliveries. It returns how many it claimed.
func (k *Kernel) claimDue(ctx context.Context) (int, error) {
	var refs []DispatchRef
	if err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		refs, err = tx.DueDispatches(k.now(), claimBatch)
		return err
	}); err != nil || len(refs) == 0 {
		return 0, err
	}
	var claimed []Delivery
	_, err := k.update(ctx, func(r *rec) error {
		claimed = claimed[:0]
		for _, ref := range refs {
			e, err := r.tx.Execution(ref.Tenant, ref.ExecutionID)
			if err != nil {
				if errors.Is(err, ErrNotFound) {
					continue
				}
				return err
			}
			if e.Dispatch.State != DispatchQueued || e.Dispatch.DueAt.After(r.now) || e.Status.Terminal() {
				continue
			}
			d, err := k.claim(r, e)
			if err != nil {
				return err
			}
			if d != nil {
				claimed = append(claimed, *d)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, d := range claimed {
		select {
		case k.sem <- struct{}{}:
		case <-ctx.Done():
			return len(claimed), ctx.Err()
		}
		k.wg.Add(1)
		go func(d Delivery) {
			defer k.wg.Done()
			defer func() { <-k.sem }()
			k.deliver(ctx, d)
		}(d)
	}
	return len(refs), nil
}

// claimNow claims, at the end of r's transaction, the dispatches r queued
// due now, as far as delivery slots are free, so that their webhooks leave
// as soon as the transaction commits instead of one more commit later (the
// dispatcher's claim). It claims a copy of each execution: what the caller
// already holds (and may return, e.g. a created execution) stays as the
// caller left it. Nothing is claimed before Start or after Close; the
// dispatcher claims what is left.
func (k *Kernel) claimNow(r *rec) error {
	if len(r.dueNow) == 0 || !k.running() {
		return nil
	}
	for _, e := range r.dueNow {
		if e.Dispatch.State != DispatchQueued || e.Dispatch.DueAt.After(r.now) || e.Status.Terminal() {
			continue
		}
		select {
		case k.sem <- struct{}{}:
		default:
			return nil // all slots busy: the dispatcher takes the rest
		}
		r.slots++
		c := *e
		d, err := k.claim(r, &c)
		if err != nil {
			return err
		}
		if d != nil {
			r.claimed = append(r.claimed, *d)
		}
	}
	return nil
}

// DeliveriesInFlight returns how many webhook deliveries hold a delivery
// slot (at most Config.DeliveryConcurrency).
func (k *Kernel) DeliveriesInFlight() int { return len(k.sem) }

// running reports whether the background loops run (after Start, before Close).
func (k *Kernel) running() bool {
	k.runMu.Lock()
	defer k.runMu.Unlock()
	return k.runCtx != nil && !k.closed
}

// releaseSlots frees n delivery slots.
func (k *Kernel) releaseSlots(n int) {
	for range n {
		<-k.sem
	}
}

// startClaimed starts the deliveries r claimed, each on the slot it holds,
// and frees the slots r holds beyond them. After Close the deliveries are
// not started: their dispatches are recovered at the next start, like any
// delivery a stopping kernel leaves behind.
func (k *Kernel) startClaimed(r *rec) {
	if r == nil || r.slots == 0 {
		return
	}
	k.runMu.Lock()
	defer k.runMu.Unlock()
	if k.closed || k.runCtx == nil {
		k.releaseSlots(r.slots)
		return
	}
	k.releaseSlots(r.slots - len(r.claimed))
	ctx := k.runCtx
	for _, d := range r.claimed {
		k.wg.Add(1)
		go func(d Delivery) {
			defer k.wg.Done()
			defer func() { <-k.sem }()
			k.deliver(ctx, d)
		}(d)
	}
}

// claim starts the next attempt of e's dispatch: the occurrence counters
// restart, the previous attempt is superseded, the lease timer starts.
func (k *Kernel) claim(r *rec, e *Execution) (*Delivery, error) {
	agent, err := r.tx.Agent(e.Tenant, e.AgentID)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		return nil, k.finish(r, e, ExecFailed, "agent_deleted", nil, mustJSON(map[string]any{"code": "agent_deleted", "message": "agent " + e.AgentID + " no longer exists"}), nil)
	}
	if agent.GateOnly() {
		return nil, k.finish(r, e, ExecFailed, "agent_gate_only", nil, mustJSON(map[string]any{"code": "agent_gate_only",
			"message": "agent " + e.AgentID + " has no webhook_url any more: nothing can deliver this execution"}), nil)
	}
	if e.Dispatch.Attempt >= k.cfg.DispatchMaxAttempts {
		return nil, k.exhaust(r, e)
	}
	if e.Lease.DispatchID != "" { // the lease parked on an approval ends now
		if err := r.event(e, EvDispatchSuperseded, map[string]any{"dispatch_id": e.Lease.DispatchID, "dispatch_attempt": e.Lease.Attempt, "reason": "new_dispatch"}); err != nil {
			return nil, err
		}
	}
	e.Dispatch.Attempt++
	e.Dispatch.State = DispatchDelivering
	e.Dispatch.DueAt = time.Time{}
	e.Dispatch.LeaseUntil = r.now.Add(k.cfg.LeaseTimeout)
	e.Lease = Lease{DispatchID: e.Dispatch.ID, Attempt: e.Dispatch.Attempt}
	claimed := map[string]any{"dispatch_id": e.Dispatch.ID, "dispatch_attempt": e.Dispatch.Attempt, "lease_until": e.Dispatch.LeaseUntil}
	if k.cfg.Replica != "" {
		claimed["replica"] = k.cfg.Replica
	}
	if err := r.event(e, EvDispatchClaimed, claimed); err != nil {
		return nil, err
	}
	if e.Status == ExecPending {
		e.Status = ExecRunning
		if err := r.event(e, EvExecutionStarted, map[string]any{"dispatch_id": e.Dispatch.ID}); err != nil {
			return nil, err
		}
	}
	if err := r.tx.PutExecution(e); err != nil {
		return nil, err
	}
	d := &Delivery{Tenant: e.Tenant, AgentID: e.AgentID, WebhookURL: agent.WebhookURL, Secret: agent.Secret, Signing: agent.SigningScheme(),
		ExecutionID: e.ID, DispatchID: e.Dispatch.ID, Attempt: e.Dispatch.Attempt}
	if k.cfg.LLMGatewayTokens {
		if d.LLMGatewayToken, err = issueLLMToken(r.tx, e); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// exhaust fails e after its dispatch used every attempt.
func (k *Kernel) exhaust(r *rec, e *Execution) error {
	return k.finish(r, e, ExecFailed, "dispatch_exhausted", nil, mustJSON(map[string]any{"code": "dispatch_exhausted",
		"message": "the dispatch was not completed after the maximum number of attempts", "dispatch_id": e.Dispatch.ID, "attempts": e.Dispatch.Attempt}), nil)
}

// supersede ends the current attempt (its lease) and queues the next one:
// right away after a lease expiry, with backoff after a failed delivery.
func (k *Kernel) supersede(r *rec, e *Execution, reason string) error {
	if err := r.event(e, EvDispatchSuperseded, map[string]any{"dispatch_id": e.Lease.DispatchID, "dispatch_attempt": e.Lease.Attempt, "reason": reason}); err != nil {
		return err
	}
	e.Lease = Lease{}
	if e.Dispatch.Attempt >= k.cfg.DispatchMaxAttempts {
		return k.exhaust(r, e)
	}
	due := r.now
	if reason == "delivery_failed" {
		due = r.now.Add(k.cfg.backoff(e.Dispatch.Failures))
	}
	e.Dispatch.State = DispatchQueued
	e.Dispatch.DueAt = due
	e.Dispatch.LeaseUntil = time.Time{}
	r.queued = true
	if err := r.event(e, EvDispatchQueued, map[string]any{"dispatch_id": e.Dispatch.ID, "reason": reason, "due_at": due}); err != nil {
		return err
	}
	return r.tx.PutExecution(e)
}

// deliver sends one webhook and records the outcome.
func (k *Kernel) deliver(ctx context.Context, d Delivery) {
	dctx, cancel := context.WithTimeout(ctx, k.cfg.DispatchTimeout)
	derr := k.deliv.Deliver(dctx, d)
	cancel()
	if obs := k.cfg.Observer; obs != nil {
		obs.Delivery(derr)
	}
	if ctx.Err() != nil {
		return // shutting down: the lease (or recoverDeliveries) takes over
	}
	lease := Lease{DispatchID: d.DispatchID, Attempt: d.Attempt}
	_, err := k.update(context.WithoutCancel(ctx), func(r *rec) error {
		e, err := r.tx.Execution(d.Tenant, d.ExecutionID)
		if err != nil {
			return err
		}
		if e.Status.Terminal() || e.Lease != lease {
			return nil // late: the attempt is over; nothing is appended
		}
		if derr == nil {
			if e.Dispatch.State == DispatchDelivering {
				e.Dispatch.State = DispatchAcked
			}
			if err := r.event(e, EvDispatchAcked, map[string]any{"dispatch_id": d.DispatchID, "dispatch_attempt": d.Attempt}); err != nil {
				return err
			}
			return r.tx.PutExecution(e)
		}
		if e.Dispatch.State != DispatchDelivering {
			// The agent already acted under this attempt (it got the webhook
			// even though the response failed; its mutations marked the
			// dispatch acked): keep the lease.
			return nil
		}
		e.Dispatch.Failures++
		class, status := deliveryClass(derr)
		p := map[string]any{"dispatch_id": d.DispatchID, "dispatch_attempt": d.Attempt, "error": class}
		if status != 0 {
			p["http_status"] = status
		}
		if err := r.event(e, EvDispatchFailed, p); err != nil {
			return err
		}
		return k.supersede(r, e, "delivery_failed")
	})
	if err != nil && ctx.Err() == nil {
		k.log.Error("record delivery", "execution_id", d.ExecutionID, "err", err)
	}
	if derr != nil {
		// The event records only the class; the operator gets the error.
		class, _ := deliveryClass(derr)
		k.log.Warn("webhook delivery failed", "tenant", d.Tenant, "agent_id", d.AgentID, "execution_id", d.ExecutionID,
			"dispatch_id", d.DispatchID, "attempt", d.Attempt, "class", class, "err", derr)
	}
}

// reapLoop expires leases and approvals every ReapInterval.
func (k *Kernel) reapLoop(ctx context.Context) {
	t := time.NewTicker(k.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := k.expireLeases(ctx, k.now()); err != nil && ctx.Err() == nil {
			k.log.Error("expire leases", "err", err)
		}
		if err := k.expireApprovals(ctx, k.now()); err != nil && ctx.Err() == nil {
			k.log.Error("expire approvals", "err", err)
		}
	}
}

// expireLeases supersedes attempts whose lease ran out and queues re-delivery.
func (k *Kernel) expireLeases(ctx context.Context, now time.Time) error {
	var refs []DispatchRef
	if err := k.store.View(ctx, func(tx ReadTx) error {
		var err error
		refs, err = tx.ExpiredLeases(now, 256)
		return err
	}); err != nil || len(refs) == 0 {
		return err
	}
	_, err := k.update(ctx, func(r *rec) error {
		for _, ref := range refs {
			e, err := r.tx.Execution(ref.Tenant, ref.ExecutionID)
			if err != nil {
				continue
			}
			if !leaseLive(e) || e.Dispatch.LeaseUntil.After(r.now) || e.Status.Terminal() {
				continue
			}
			if e.Session() {
				// Nothing to re-deliver: the session waits for an attach.
				if err := k.detach(r, e, "lease_expired"); err != nil {
					return err
				}
				continue
			}
			if err := k.supersede(r, e, "lease_expired"); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}
