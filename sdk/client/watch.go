package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

// Defaults of WatchOptions.
const (
	// DefaultPollInterval is how often a polling watch asks for new events.
	DefaultPollInterval = 250 * time.Millisecond
	// DefaultIdleTimeout is how long a stream may stay silent before Watch
	// drops it and reconnects: four of the kernel's 15 s heartbeats.
	DefaultIdleTimeout = time.Minute
	// DefaultMaxRetries is how many times in a row Watch retries a stream or
	// poll that fails without delivering anything new before giving up.
	DefaultMaxRetries = 10
)

// Backoff between retries that made no progress: 100ms, doubling, at most 5s.
const (
	retryBase = 100 * time.Millisecond
	retryMax  = 5 * time.Second
)

// StreamItem is one item Watch delivers: a stored event of the execution's
// log, or a live step delta (ephemeral output of a running step, never
// stored, so never replayed on reconnect). Exactly one field is set.
type StreamItem struct {
	Event *Event
	Delta *StepDelta
}

// WatchOptions tune WatchWith. The zero value streams from the start of the
// log.
type WatchOptions struct {
	// AfterSeq skips the events up to and including this seq (0: from the
	// first event).
	AfterSeq uint64
	// Poll reads the log with Events every PollInterval instead of
	// streaming it. A polling watch delivers no step deltas.
	Poll bool
	// PollInterval is the polling period (default DefaultPollInterval).
	PollInterval time.Duration
	// IdleTimeout drops a stream that has been silent this long, heartbeats
	// included, and reconnects (default DefaultIdleTimeout).
	IdleTimeout time.Duration
	// MaxRetries is how many failed attempts in a row (connection errors,
	// 5xx answers, streams that end without a new event) Watch retries,
	// with backoff, before it returns the last error (default
	// DefaultMaxRetries; negative: no retries). Any new event resets the
	// count. Retries start once the kernel has been reached: when the first
	// stream or poll fails, its error is returned at once.
	MaxRetries int
}

// Watch delivers the events of execution id after afterSeq to fn, in order
// and each exactly once, and the live step deltas as they happen, until the
// execution's terminal event (execution.completed, .failed or .cancelled):
// it returns nil once fn has been handed that event. It is WatchWith with
// default options; see there.
func (c *Client) Watch(ctx context.Context, id string, afterSeq uint64, fn func(StreamItem) error) error {
	return c.WatchWith(ctx, id, WatchOptions{AfterSeq: afterSeq}, fn)
}

// WatchWith is Watch with options.
//
// It streams GET /v0/executions/{id}/stream (Server-Sent Events). When the
// connection drops before the terminal event, it reconnects with
// Last-Event-ID set to the last event delivered, so no event is lost or
// delivered twice; deltas sent while it was disconnected are lost (they
// are ephemeral). It polls Events instead when o.Poll is set, when the
// server does not answer the stream with 200 and text/event-stream (a
// proxy that does not pass SSE, say), and for clients that sign as an
// agent without an API key (the stream is a client route).
//
// If o.AfterSeq is at or past the terminal event of a finished execution,
// nothing more can come and WatchWith returns nil at once.
//
// fn runs on the watching goroutine; a slow fn holds the stream back and
// may make the kernel drop deltas for this watcher. An error from fn stops
// the watch and is returned as is.
//
// # Errors
//
// A 4xx answer (unknown execution, bad key, ...) is returned at once as an
// *APIError. Other failures are retried (see WatchOptions.MaxRetries). When
// ctx ends, WatchWith returns ctx.Err().
func (c *Client) WatchWith(ctx context.Context, id string, o WatchOptions, fn func(StreamItem) error) error {
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	switch {
	case o.MaxRetries == 0:
		o.MaxRetries = DefaultMaxRetries
	case o.MaxRetries < 0:
		o.MaxRetries = 0
	}
	w := &watcher{c: c, id: id, o: o, fn: fn, last: o.AfterSeq,
		polling: o.Poll || (c.key == "" && c.agentID != "")}
	return w.run(ctx)
}

// Wait waits until execution id is finished (completed, failed or
// cancelled) and returns it. It reads the execution, and if it is still
// running watches its events from there on until the terminal one.
func (c *Client) Wait(ctx context.Context, id string) (*Execution, error) {
	e, err := c.GetExecution(ctx, id)
	if err != nil {
		return nil, err
	}
	if IsTerminalStatus(e.Status) {
		return e, nil
	}
	if err := c.WatchWith(ctx, id, WatchOptions{AfterSeq: e.LastSeq}, func(StreamItem) error { return nil }); err != nil {
		return nil, err
	}
	return c.GetExecution(ctx, id)
}

// outcome is how one stream connection or polling run ended.
type outcome int

const (
	outDone     outcome = iota // the terminal event was delivered, or nothing more can come
	outFatal                   // stop and return the error
	outRetry                   // reconnect (after a backoff unless there was progress)
	outFallback                // the server does not speak SSE: poll
)

// watcher is the state of one WatchWith call.
type watcher struct {
	c       *Client
	id      string
	o       WatchOptions
	fn      func(StreamItem) error
	last    uint64 // seq of the last event delivered (or AfterSeq)
	polling bool
	reached bool // a stream or poll of the kernel succeeded once
}

func (w *watcher) run(ctx context.Context) error {
	failures := 0
	for {
		before := w.last
		var oc outcome
		var err error
		if w.polling {
			oc, err = w.poll(ctx)
		} else {
			oc, err = w.stream(ctx)
		}
		switch oc {
		case outDone:
			return nil
		case outFatal:
			return err
		case outFallback:
			w.polling = true
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !w.reached && err != nil {
			return err // the kernel was never reached: a wrong URL, say
		}
		if w.last > before {
			failures = 0
			continue
		}
		failures++
		if failures > w.o.MaxRetries {
			if err == nil {
				err = errors.New("the event stream ended before the terminal event")
			}
			return fmt.Errorf("watch execution %s: giving up after %d attempts: %w", w.id, failures, err)
		}
		if err := sleep(ctx, backoff(failures)); err != nil {
			return err
		}
	}
}

// deliver hands a stored event to fn unless it was delivered already; done
// reports the terminal event.
func (w *watcher) deliver(e *Event) (done bool, err error) {
	if e.Seq <= w.last {
		return false, nil
	}
	w.last = e.Seq
	if err := w.fn(StreamItem{Event: e}); err != nil {
		return false, err
	}
	return IsTerminalEvent(e.Type), nil
}

// stream reads one SSE connection.
func (w *watcher) stream(ctx context.Context) (outcome, error) {
	path := "/v0/executions/" + seg(w.id) + "/stream"
	h := http.Header{"Accept": {"text/event-stream"}, "Cache-Control": {"no-cache"}}
	if w.last > 0 {
		s := strconv.FormatUint(w.last, 10)
		path += "?after_seq=" + s
		h.Set("Last-Event-ID", s)
	}
	wrap := func(err error) error { return fmt.Errorf("GET %s: %w", path, err) }
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := w.c.newRequest(cctx, http.MethodGet, path, h, nil)
	if err != nil {
		return outFatal, wrap(err)
	}
	resp, err := w.c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return outFatal, ctx.Err()
		}
		return outRetry, wrap(unwrapURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		ae := apiError(resp)
		if resp.StatusCode/100 == 4 && ae.Code != "" && ae.Code != wire.CodeRateLimited {
			return outFatal, wrap(ae)
		}
		// A tenant at its limit of open streams (429) is told to poll the
		// events route instead; so is a server that does not stream.
		return outFallback, nil
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return outFallback, nil
	}
	w.reached = true
	idle := time.AfterFunc(w.o.IdleTimeout, cancel)
	defer idle.Stop()
	r := newSSEReader(&idleReader{r: resp.Body, t: idle, d: w.o.IdleTimeout})
	got := false
	for {
		ev, err := r.next()
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return outFatal, ctx.Err()
			case errors.Is(err, bufio.ErrTooLong):
				return outFatal, wrap(err)
			case cctx.Err() != nil:
				return outRetry, wrap(fmt.Errorf("no data for %s", w.o.IdleTimeout))
			case err == io.EOF && !got:
				// The kernel ends at once a stream of a finished execution
				// whose events the client has: nothing more will come.
				if done, err := w.finished(ctx); done || err != nil {
					if err != nil {
						return w.classify(ctx, err)
					}
					return outDone, nil
				}
			}
			if err == io.EOF {
				return outRetry, nil
			}
			return outRetry, wrap(err)
		}
		switch {
		case ev.hasID:
			var e Event
			if err := json.Unmarshal(ev.data, &e); err != nil {
				return outFatal, wrap(fmt.Errorf("decode event id %s: %w", ev.id, err))
			}
			got = true
			done, err := w.deliver(&e)
			if err != nil {
				return outFatal, err
			}
			if done {
				return outDone, nil
			}
		case ev.typ == EventStepDelta:
			var d StepDelta
			if err := json.Unmarshal(ev.data, &d); err != nil {
				return outFatal, wrap(fmt.Errorf("decode %s: %w", EventStepDelta, err))
			}
			if err := w.fn(StreamItem{Delta: &d}); err != nil {
				return outFatal, err
			}
		}
		// Other events without an id are not part of this contract: skip them.
	}
}

// poll reads the log with Events until the terminal event or an error.
func (w *watcher) poll(ctx context.Context) (outcome, error) {
	for first := true; ; first = false {
		evs, err := w.c.Events(ctx, w.id, w.last, MaxEventsPage)
		if err != nil {
			return w.classify(ctx, err)
		}
		w.reached = true
		for i := range evs {
			done, err := w.deliver(&evs[i])
			if err != nil {
				return outFatal, err
			}
			if done {
				return outDone, nil
			}
		}
		if len(evs) == MaxEventsPage {
			continue
		}
		if first && len(evs) == 0 {
			if done, err := w.finished(ctx); done || err != nil {
				if err != nil {
					return w.classify(ctx, err)
				}
				return outDone, nil
			}
		}
		if err := sleep(ctx, w.o.PollInterval); err != nil {
			return outFatal, err
		}
	}
}

// finished reports whether the execution is finished and every event of
// its log was delivered (or skipped by AfterSeq).
func (w *watcher) finished(ctx context.Context) (bool, error) {
	e, err := w.c.GetExecution(ctx, w.id)
	if err != nil {
		return false, err
	}
	return IsTerminalStatus(e.Status) && e.LastSeq <= w.last, nil
}

// classify sorts a request error: 4xx answers and a done ctx are fatal,
// the rest is retried.
func (w *watcher) classify(ctx context.Context, err error) (outcome, error) {
	if ctx.Err() != nil {
		return outFatal, ctx.Err()
	}
	var ae *APIError
	if errors.As(err, &ae) && ae.Status/100 == 4 {
		return outFatal, err
	}
	return outRetry, err
}

// backoff is the delay before retry n (1, 2, ...).
func backoff(n int) time.Duration {
	d := retryBase
	for i := 1; i < n && d < retryMax; i++ {
		d *= 2
	}
	return min(d, retryMax)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
