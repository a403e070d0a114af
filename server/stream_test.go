package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	id, event, data string
	comment         bool
}

// sse opens an event stream and returns a channel of its events, closed
// when the stream ends.
func (e *env) sse(t *testing.T, path string, hdr map[string]string) (<-chan sseEvent, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", e.ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan sseEvent, 1024)
	go func() {
		defer close(ch)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev != (sseEvent{}) {
					ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, ":"):
				ch <- sseEvent{comment: true}
			case strings.HasPrefix(line, "id: "):
				ev.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[6:]
			}
		}
	}()
	return ch, res
}

// next returns the next non-comment event, failing after a timeout; ok is
// false when the stream ended.
func next(t *testing.T, ch <-chan sseEvent) (sseEvent, bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return sseEvent{}, false
			}
			if ev.comment {
				continue
			}
			return ev, true
		case <-timeout:
			t.Fatal("no event within 10s")
		}
	}
}

// until reads events until one of type typ, and returns it.
func until(t *testing.T, ch <-chan sseEvent, typ string) sseEvent {
	t.Helper()
	for {
		ev, ok := next(t, ch)
		if !ok {
			t.Fatalf("stream ended before %s", typ)
		}
		if ev.event == typ {
			return ev
		}
	}
}

func TestStreamLive(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	ch, res := e.sse(t, "/v0/executions/"+r.id+"/stream", bearer(testAdminKey))
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	// Replay of what is stored: the first event is execution.created, seq 1.
	first, _ := next(t, ch)
	if first.id != "1" || first.event != string(kernel.EvExecutionCreated) {
		t.Fatalf("first event %+v", first)
	}
	var ev wire.Event
	if err := json.Unmarshal([]byte(first.data), &ev); err != nil || ev.Seq != 1 || ev.ExecutionID != r.id {
		t.Fatalf("data %s: %v", first.data, err)
	}
	until(t, ch, string(kernel.EvDispatchAcked))

	// Live: a step, a delta, its result, then the end.
	d := e.submit(r, "llm_call", "gpt", map[string]any{"p": "hi"})
	until(t, ch, string(kernel.EvStepExecuting))
	var acc wire.StreamDeltaAccepted
	e.agent(r.as, "POST", "/v0/executions/"+r.id+"/steps/"+d.StepID+"/stream", map[string]any{"seq": 4, "data": "tok"}).
		want(t, http.StatusAccepted).decode(t, &acc)
	if acc.Subscribers != 1 {
		t.Fatalf("subscribers %d", acc.Subscribers)
	}
	delta := until(t, ch, "step.delta")
	if delta.id != "" {
		t.Fatalf("a delta has no id: %+v", delta)
	}
	var de wire.StepDeltaEvent
	if err := json.Unmarshal([]byte(delta.data), &de); err != nil || de.StepID != d.StepID || de.Seq != 4 || string(de.Data) != `"tok"` {
		t.Fatalf("delta %s: %v", delta.data, err)
	}
	e.agent(r.as, "POST", "/v0/executions/"+r.id+"/steps/"+d.StepID+"/complete", map[string]any{"result": "tok"}).want(t, http.StatusOK)
	until(t, ch, string(kernel.EvStepSucceeded))
	e.agent(r.as, "POST", "/v0/executions/"+r.id+"/complete", map[string]any{"output": 1}).want(t, http.StatusOK)
	last := until(t, ch, string(kernel.EvExecutionCompleted))
	if _, ok := next(t, ch); ok {
		t.Fatal("the stream must end after the terminal event")
	}

	// Resuming after the last id of a finished execution ends at once;
	// resuming earlier replays from there to the end.
	ch2, _ := e.sse(t, "/v0/executions/"+r.id+"/stream", map[string]string{"Authorization": "Bearer " + testAdminKey, "Last-Event-ID": last.id})
	if ev, ok := next(t, ch2); ok {
		t.Fatalf("unexpected %+v", ev)
	}
	ch3, _ := e.sse(t, "/v0/executions/"+r.id+"/stream?after_seq=2", bearer(testAdminKey))
	ev3, _ := next(t, ch3)
	if ev3.id != "3" {
		t.Fatalf("after_seq=2 started at %+v", ev3)
	}
	until(t, ch3, string(kernel.EvExecutionCompleted))

	e.admin("GET", "/v0/executions/"+r.id+"/stream?after_seq=x", nil).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
	if n := e.srv.deltas.count(); n != 0 {
		// The handlers unsubscribe when their streams end.
		deadline := time.Now().Add(5 * time.Second)
		for e.srv.deltas.count() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := e.srv.deltas.count(); n != 0 {
			t.Fatalf("%d subscribers left", n)
		}
	}
}

func TestStreamHeartbeatAndCancel(t *testing.T) {
	e := newEnv(t)
	e.srv.heartbeat = 20 * time.Millisecond
	r := e.start("bot")
	ch, _ := e.sse(t, "/v0/executions/"+r.id+"/stream", bearer(testAdminKey))
	timeout := time.After(10 * time.Second)
	for got := false; !got; {
		select {
		case ev := <-ch:
			got = ev.comment
		case <-timeout:
			t.Fatal("no heartbeat")
		}
	}
	e.admin("POST", "/v0/executions/"+r.id+"/cancel", nil).want(t, http.StatusNoContent)
	until(t, ch, string(kernel.EvExecutionCancelled))
	if _, ok := next(t, ch); ok {
		t.Fatal("the stream must end after execution.cancelled")
	}
}

func TestCloseStreams(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	ch, _ := e.sse(t, "/v0/executions/"+r.id+"/stream", bearer(testAdminKey))
	until(t, ch, string(kernel.EvDispatchAcked))
	e.srv.CloseStreams()
	for {
		if _, ok := next(t, ch); !ok {
			break
		}
	}
	e.srv.CloseStreams() // idempotent
}

// TestDeltasHeldForAStalledWatcherAreBounded: deltas are fanned out to each
// watcher's buffer, and a watcher that stops reading its stream kept up to
// 256 of them, each up to a request body (1 MiB): with 256 streams a
// tenant, 64 GiB of kernel memory for one tenant's session holder. A
// delta's data is at most MaxDeltaBytes (400 beyond), and a watcher holds
// at most maxPendingDeltaBytes of deltas not yet written: past them it
// loses deltas (they are ephemeral; the step's result is the record).
func TestDeltasHeldForAStalledWatcherAreBounded(t *testing.T) {
	e := newEnv(t)
	r := e.start("bot")
	d := e.submit(r, "llm_call", "gpt", map[string]any{"p": 1})
	url := "/v0/executions/" + r.id + "/steps/" + d.StepID + "/stream"
	e.agent(r.as, "POST", url, map[string]any{"seq": 0, "data": strings.Repeat("x", MaxDeltaBytes)}).wantErr(t, http.StatusBadRequest, wire.CodeValidation)

	// A watcher that never reads: the hub's own account of what it holds.
	ch, stop := e.srv.deltas.subscribe(r.id)
	defer stop()
	chunk := strings.Repeat("x", MaxDeltaBytes-1024)
	taken := 0
	for i := range 100 {
		var acc wire.StreamDeltaAccepted
		e.agent(r.as, "POST", url, map[string]any{"seq": i, "data": chunk}).want(t, http.StatusAccepted).decode(t, &acc)
		taken += acc.Subscribers
	}
	if held := taken * len(chunk); taken == 0 || held > maxPendingDeltaBytes {
		t.Fatalf("a watcher that never reads was handed %d deltas (%d bytes), want some, at most %d bytes", taken, held, maxPendingDeltaBytes)
	}
	// Read what it holds: the budget frees as the watcher catches up.
	for range taken {
		ch.take(<-ch.c)
	}
	var acc wire.StreamDeltaAccepted
	e.agent(r.as, "POST", url, map[string]any{"seq": 100, "data": chunk}).want(t, http.StatusAccepted).decode(t, &acc)
	if acc.Subscribers != 1 {
		t.Fatalf("after catching up the watcher got %d deltas, want 1", acc.Subscribers)
	}
}
