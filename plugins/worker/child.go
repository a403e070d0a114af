package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// Serve is the worker side: it reads requests from in and answers on out
// until in ends. newEngine builds the engine the kernel's [Engine] stands
// for (rego.New(rego.WithLimits(l)) for the Rego engine), with the limits
// the kernel sends first.
//
// Serve lowers the process's scheduling priority (nice 10) so that busy
// policies yield the CPU to the kernel. Before building the engine it caps the process's data segment at the
// memory the kernel asked for (RLIMIT_DATA, where the OS has it): the Go
// heap cannot grow past it, and the process dies with "fatal error: runtime:
// out of memory" instead, which the kernel reports and recovers from. The
// Go runtime's soft limit is set below it, so that garbage is collected
// before the hard limit is reached.
//
// A program calls Serve from main, in a process started by [Engine] (the
// wicket binary's hidden "policy-worker" command), and exits when it returns.
func Serve(in io.Reader, out io.Writer, newEngine func(bundle.Limits) plugins.Engine) error {
	r := bufio.NewReaderSize(in, 64<<10)
	var init request
	if err := readFrame(r, maxRequest, &init); err != nil {
		return fmt.Errorf("worker: read init: %w", err)
	}
	if init.Op != opInit || init.Limits == nil {
		return fmt.Errorf("worker: first request is %q, want init", init.Op)
	}
	w := &childWriter{w: bufio.NewWriter(out)}
	if err := Confine(init.Memory); err != nil {
		_ = w.send(response{ID: init.ID, Error: err.Error()})
		return err
	}
	eng := newEngine(*init.Limits)
	if err := w.send(response{ID: init.ID}); err != nil {
		return err
	}

	var (
		mu  sync.Mutex
		evs = map[uint64]policy.Evaluator{}
		wg  sync.WaitGroup
	)
	defer wg.Wait()
	for {
		var req request
		if err := readFrame(r, maxRequest, &req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("worker: read request: %w", err)
		}
		switch req.Op {
		case opCompile:
			// Compile in line: requests after it may use the bundle.
			b, err := bundle.Options{Name: req.Name}.LoadFiles(req.Files)
			var ev policy.Evaluator
			if err == nil {
				ev, err = eng.Compile(context.Background(), b)
			}
			res := response{ID: req.ID}
			if err != nil {
				res.Error = err.Error()
			} else {
				mu.Lock()
				evs[req.ID] = ev
				mu.Unlock()
			}
			if err := w.send(res); err != nil {
				return err
			}
		case opEval:
			mu.Lock()
			ev := evs[req.Bundle]
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = w.send(evaluate(ev, req))
			}()
		case opClose:
			mu.Lock()
			ev := evs[req.Bundle]
			delete(evs, req.Bundle)
			mu.Unlock()
			if ev != nil {
				_ = ev.Close()
			}
			if err := w.send(response{ID: req.ID}); err != nil {
				return err
			}
		default:
			if err := w.send(response{ID: req.ID, Error: fmt.Sprintf("unknown operation %q", req.Op)}); err != nil {
				return err
			}
		}
	}
}

func evaluate(ev policy.Evaluator, req request) response {
	res := response{ID: req.ID}
	if ev == nil {
		res.Error = fmt.Sprintf("bundle %d is not compiled in this worker", req.Bundle)
		return res
	}
	var in policy.Input
	if err := json.Unmarshal(req.Input, &in); err != nil {
		res.Error = "decode input: " + err.Error()
		return res
	}
	d, err := ev.Evaluate(context.Background(), &in)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	res.Decision = d
	return res
}

// childWriter serialises responses from concurrent evaluations.
type childWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (c *childWriter) send(res response) error {
	if len(res.Error) > maxErrorText {
		res.Error = res.Error[:maxErrorText] + "…"
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	if len(b) > maxResponse {
		b, _ = json.Marshal(response{ID: res.ID, Error: fmt.Sprintf("the answer is too large: %d bytes (at most %d)", len(b), maxResponse)})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := writeRaw(c.w, b); err != nil {
		return err
	}
	return c.w.Flush()
}

// workerNice is the niceness of a worker process.
const workerNice = 10

// maxErrorText bounds an error's text in a response.
const maxErrorText = 64 << 10
