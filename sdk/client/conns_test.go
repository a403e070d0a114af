package client_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/wicket-run/wicket/sdk/client"
)

// barrier lets n goroutines wait for each other, round after round.
type barrier struct {
	mu         sync.Mutex
	cond       *sync.Cond
	n, arrived int
	round      int
}

func newBarrier(n int) *barrier {
	b := &barrier{n: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *barrier) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	my := b.round
	if b.arrived++; b.arrived == b.n {
		b.arrived, b.round = 0, b.round+1
		b.cond.Broadcast()
	}
	for b.round == my {
		b.cond.Wait()
	}
}

// TestDefaultClientKeepsItsConnections: an agent running many executions
// has more calls in flight than the old idle limit per host (16), with
// pauses between them while tools run; the default client keeps its
// connections over the pauses instead of closing all but 16 and dialling
// again. Here conc callers make a call together (the kernel answers once
// all are in), then pause together, round after round.
func TestDefaultClientKeepsItsConnections(t *testing.T) {
	const conc, rounds = 48, 20
	var dials atomic.Int64
	inFlight := newBarrier(conc)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.wait()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := client.New(srv.URL)
	paused := newBarrier(conc)
	var wg sync.WaitGroup
	errc := make(chan error, conc)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				if err := c.Health(context.Background()); err != nil {
					errc <- err
					return
				}
				paused.wait() // every caller is between calls
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// A connection is dialled when no other is idle: conc of them, plus
	// a few whose return to the pool raced with the next round's calls.
	if n := dials.Load(); n > 2*conc {
		t.Fatalf("%d connections dialled for %d rounds of %d calls at a time", n, rounds, conc)
	}
}
