package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

// MaxEventsPage is the largest page of Events the kernel answers.
const MaxEventsPage = 1000

// CreateExecution starts an execution of req.AgentID on req.Input (201).
// A non-empty idempotencyKey is sent as the Idempotency-Key header: a
// retried create with the same key returns the first execution (200)
// instead of starting another.
func (c *Client) CreateExecution(ctx context.Context, req CreateExecutionRequest, idempotencyKey string) (*Execution, error) {
	var h http.Header
	if idempotencyKey != "" {
		h = http.Header{wire.HeaderIdempotencyKey: {idempotencyKey}}
	}
	var e Execution
	if err := c.Do(ctx, http.MethodPost, "/v0/executions", h, req, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// GetExecution reads an execution. An agent client (WithAgent) may read its
// own executions.
func (c *Client) GetExecution(ctx context.Context, id string) (*Execution, error) {
	var e Execution
	if err := c.Do(ctx, http.MethodGet, "/v0/executions/"+seg(id), nil, nil, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// ListOptions filter and page ListExecutions. Zero fields are unset.
type ListOptions struct {
	// AgentID keeps the executions of one agent.
	AgentID string
	// Status keeps one status: pending, running, blocked, completed,
	// failed or cancelled.
	Status string
	// Cursor is the NextCursor of the previous page.
	Cursor string
	// Limit is the page size (kernel default 50, at most 1000).
	Limit int
}

// ListExecutions lists one page of the tenant's executions, newest first.
// Pass the answer's NextCursor as o.Cursor for the next page; it is empty
// on the last one.
func (c *Client) ListExecutions(ctx context.Context, o ListOptions) (*ExecutionList, error) {
	q := url.Values{}
	for k, v := range map[string]string{"agent_id": o.AgentID, "status": o.Status, "cursor": o.Cursor} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	path := "/v0/executions"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var l ExecutionList
	if err := c.Do(ctx, http.MethodGet, path, nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Events reads up to limit events of an execution's log after afterSeq (0:
// from the start), in order. limit 0 means the kernel's default (100); at
// most MaxEventsPage.
func (c *Client) Events(ctx context.Context, id string, afterSeq uint64, limit int) ([]Event, error) {
	q := url.Values{}
	if afterSeq > 0 {
		q.Set("after_seq", strconv.FormatUint(afterSeq, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v0/executions/" + seg(id) + "/events"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var l wire.EventList
	if err := c.Do(ctx, http.MethodGet, path, nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Events, nil
}

// AllEvents reads an execution's whole event log as it is now, paging
// through it MaxEventsPage events at a time.
func (c *Client) AllEvents(ctx context.Context, id string) ([]Event, error) {
	return c.EventsAfter(ctx, id, 0)
}

// EventsAfter reads every event of an execution's log after afterSeq, as
// it is now, paging through it MaxEventsPage events at a time.
func (c *Client) EventsAfter(ctx context.Context, id string, afterSeq uint64) ([]Event, error) {
	var all []Event
	for {
		page, err := c.Events(ctx, id, afterSeq, MaxEventsPage)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < MaxEventsPage {
			if all == nil {
				all = []Event{}
			}
			return all, nil
		}
		afterSeq = page[len(page)-1].Seq
	}
}

// Steps lists an execution's steps, following the pages the kernel
// answers in.
func (c *Client) Steps(ctx context.Context, id string) ([]Step, error) {
	var all []Step
	cursor := ""
	for {
		path := "/v0/executions/" + seg(id) + "/steps"
		if cursor != "" {
			path += "?cursor=" + url.QueryEscape(cursor)
		}
		var l wire.StepList
		if err := c.Do(ctx, http.MethodGet, path, nil, nil, &l); err != nil {
			return nil, err
		}
		all = append(all, l.Steps...)
		if l.NextCursor == "" {
			if all == nil {
				all = []Step{}
			}
			return all, nil
		}
		cursor = l.NextCursor
	}
}

// Step reads one step of an execution.
func (c *Client) Step(ctx context.Context, id, stepID string) (*Step, error) {
	var s Step
	if err := c.Do(ctx, http.MethodGet, "/v0/executions/"+seg(id)+"/steps/"+seg(stepID), nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Cancel cancels an execution (204). Cancelling a finished execution is a
// 409 conflict.
func (c *Client) Cancel(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodPost, "/v0/executions/"+seg(id)+"/cancel", nil, nil, nil)
}

// BeginSession begins a session: an execution of req.AgentID that no
// webhook drives, held by this client's key (client, tenant-admin or admin)
// for its own loop. The answer carries the lease; sdk/agent's Session
// wraps it. The agent may be gate-only (registered without webhook_url).
func (c *Client) BeginSession(ctx context.Context, req SessionRequest) (*Session, error) {
	var s Session
	if err := c.Do(ctx, http.MethodPost, "/v0/sessions", nil, req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// AttachSession takes the lease of a session whose holder is gone (its
// lease expired or was given up): a new attempt, whose steps replay what
// was recorded. While the lease is live the kernel answers 409
// wire.CodeExecutionLeased, with details.lease_until.
func (c *Client) AttachSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	if err := c.Do(ctx, http.MethodPost, "/v0/executions/"+seg(id)+"/attach", nil, struct{}{}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Health checks that the kernel answers GET /v0/health.
func (c *Client) Health(ctx context.Context) error {
	return c.Do(ctx, http.MethodGet, "/v0/health", nil, nil, nil)
}

// Ready checks GET /v0/ready: nil when the kernel takes traffic, a 503
// *APIError while it shuts down.
func (c *Client) Ready(ctx context.Context) error {
	return c.Do(ctx, http.MethodGet, "/v0/ready", nil, nil, nil)
}

// WaitReady polls Ready until the kernel takes traffic, backing off from
// 50ms to 1s between tries: for an agent or a script that may start before
// its kernel. It returns nil once ready, or the last error when ctx ends.
func (c *Client) WaitReady(ctx context.Context) error {
	wait := 50 * time.Millisecond
	for {
		err := c.Ready(ctx)
		if err == nil {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("kernel at %s not ready: %w", c.base, err)
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}
