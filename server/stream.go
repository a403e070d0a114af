package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// hub fans step deltas out to the SSE subscribers of each execution, in
// memory. Publishing never blocks: a subscriber whose buffer is full, or
// holds maxPendingDeltaBytes of deltas not yet written, loses the delta
// (deltas are ephemeral; the step's result is the record).
type hub struct {
	mu   sync.Mutex // guards subs
	subs map[string]map[*deltaSub]struct{}
	n    int // subscribers in total
}

// deltaBuffer is how many deltas a slow subscriber may fall behind.
const deltaBuffer = 256

// MaxDeltaBytes bounds the data of one step delta (POST …/stream).
const MaxDeltaBytes = 64 << 10

// maxPendingDeltaBytes bounds the data of the deltas a subscriber holds
// and has not written yet: a watcher that stops reading holds at most
// this much, whatever the publisher sends.
const maxPendingDeltaBytes = 1 << 20

// deltaSub is one subscriber: its buffer, and the bytes of data in it.
type deltaSub struct {
	c       chan wire.StepDeltaEvent
	pending atomic.Int64
}

// take accounts for d, received from s.c, as no longer held.
func (s *deltaSub) take(d wire.StepDeltaEvent) { s.pending.Add(-int64(len(d.Data))) }

func newHub() *hub { return &hub{subs: map[string]map[*deltaSub]struct{}{}} }

// subscribe registers a subscriber of an execution's deltas; call the
// returned function to unregister. Each delta received from its channel
// must be passed to take.
func (h *hub) subscribe(executionID string) (*deltaSub, func()) {
	sub := &deltaSub{c: make(chan wire.StepDeltaEvent, deltaBuffer)}
	h.mu.Lock()
	m := h.subs[executionID]
	if m == nil {
		m = map[*deltaSub]struct{}{}
		h.subs[executionID] = m
	}
	m[sub] = struct{}{}
	h.n++
	h.mu.Unlock()
	return sub, func() {
		h.mu.Lock()
		if _, ok := h.subs[executionID][sub]; ok {
			delete(h.subs[executionID], sub)
			h.n--
			if len(h.subs[executionID]) == 0 {
				delete(h.subs, executionID)
			}
		}
		h.mu.Unlock()
	}
}

// publish hands d to the execution's subscribers and returns how many took it.
func (h *hub) publish(executionID string, d wire.StepDeltaEvent) int {
	size := int64(len(d.Data))
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for sub := range h.subs[executionID] {
		if sub.pending.Load()+size > maxPendingDeltaBytes {
			continue
		}
		select {
		case sub.c <- d:
			sub.pending.Add(size)
			n++
		default:
		}
	}
	return n
}

// count returns the number of subscribers (open event streams).
func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// stream serves GET /v0/executions/{id}/stream as Server-Sent Events: the
// stored events after after_seq (or Last-Event-ID) first, then new ones as
// they are committed, and step deltas as "step.delta" events (no id: they
// are not stored and cannot be resumed). Each stored event has id = seq,
// event = type and data = the event JSON. The stream ends after the
// execution's terminal event, at CloseStreams, or when the key that opened
// it is revoked; an idle stream gets a comment every 15s. A tenant has at
// most Config.MaxStreamsPerTenant streams open (one more is 429).
func (s *Server) stream(c *call) (int, any, error) {
	id := c.vars("id")
	after, err := seqParam(c.r.URL.Query().Get("after_seq"), "after_seq")
	if err != nil {
		return 0, nil, err
	}
	if lei := c.r.Header.Get("Last-Event-ID"); lei != "" {
		if after, err = seqParam(lei, "Last-Event-ID"); err != nil {
			return 0, nil, err
		}
	}
	e, err := s.k.GetExecution(c.ctx, c.tenant, id)
	if err != nil {
		return 0, nil, err
	}
	// The stream counts against its tenant's limit, and ends when its key
	// is revoked: at once on this kernel, at the next heartbeat otherwise.
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	reg, err := s.streams.open(c.tenant, c.p, cancel)
	if err != nil {
		return 0, nil, err
	}
	defer s.streams.close(reg)
	// Subscribe before reading, so nothing committed in between is missed.
	wake, stopWatch := s.k.Watch(id)
	defer stopWatch()
	deltas, stopDeltas := s.deltas.subscribe(id)
	defer stopDeltas()

	rc := http.NewResponseController(c.w)
	h := c.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	c.w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(c.w)
	// Each flush has its own write deadline: a client that stops reading
	// loses its stream instead of holding it (and its slot) forever.
	flush := func() bool {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		return bw.Flush() == nil && rc.Flush() == nil
	}
	if !flush() {
		return 0, nil, nil
	}

	last := after
	// send writes the stored events after last; it reports whether the
	// terminal event was sent, and false in ok when the client is gone.
	send := func() (done, ok bool) {
		for {
			evs, err := s.k.Events(ctx, c.tenant, id, last, 1000)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Error("event stream: read events", "execution_id", id, "err", err)
				}
				return false, false
			}
			for _, ev := range evs {
				b, err := json.Marshal(eventView(ev))
				if err != nil {
					return false, false
				}
				bw.WriteString("id: " + strconv.FormatUint(ev.Seq, 10) + "\nevent: " + string(ev.Type) + "\ndata: ")
				bw.Write(b)
				bw.WriteString("\n\n")
				last = ev.Seq
				if terminalEvent(ev.Type) {
					return true, flush()
				}
			}
			if len(evs) < 1000 {
				return false, flush()
			}
		}
	}
	done, ok := send()
	if done || !ok {
		return 0, nil, nil
	}
	// A terminal execution whose events the client already has: nothing
	// more will come.
	if e.Status.Terminal() && last >= e.LastSeq {
		return 0, nil, nil
	}
	tick := time.NewTicker(s.heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0, nil, nil
		case <-s.closing:
			return 0, nil, nil
		case <-wake:
			if done, ok := send(); done || !ok {
				return 0, nil, nil
			}
		case d := <-deltas.c:
			deltas.take(d)
			b, err := json.Marshal(d)
			if err != nil {
				return 0, nil, nil
			}
			bw.WriteString("event: step.delta\ndata: ")
			bw.Write(b)
			bw.WriteString("\n\n")
			if !flush() {
				return 0, nil, nil
			}
		case <-tick.C:
			if c.token != "" {
				if _, err := s.k.AuthenticateKey(ctx, c.token); kernel.CodeOf(err) == kernel.CodeUnauthenticated {
					return 0, nil, nil // revoked (on another replica)
				}
			}
			bw.WriteString(": heartbeat\n\n")
			if !flush() {
				return 0, nil, nil
			}
		}
	}
}

func terminalEvent(typ kernel.EventType) bool {
	return typ == kernel.EvExecutionCompleted || typ == kernel.EvExecutionFailed || typ == kernel.EvExecutionCancelled
}
