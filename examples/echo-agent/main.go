// Command echo-agent is the smallest complete Wicket agent: it verifies the
// kernel's signed webhook, reads its execution, runs one step ("echo") under
// the dispatch lease, and completes the execution with the step's result. A
// re-delivered dispatch replays the recorded step instead of running it again.
//
//	go run ./examples/echo-agent --kernel http://127.0.0.1:8080 --listen 127.0.0.1:5001 \
//	    --id echo --secret echo-secret-0123456789
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"strconv"
	"time"

	"github.com/wicket-run/wicket/server/wire"
)

type agent struct {
	kernel, id string
	secret     []byte
	hc         *http.Client
}

// call sends a signed request; lease is nil for reads.
func (a *agent) call(method, path string, lease *wire.WebhookPayload, body any, out any) error {
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	req, _ := http.NewRequest(method, a.kernel+path, bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.HeaderAgentID, a.id)
	req.Header.Set(wire.HeaderSignature, wire.Sign(a.secret, raw))
	if lease != nil {
		req.Header.Set(wire.HeaderDispatchID, lease.DispatchID)
		req.Header.Set(wire.HeaderDispatchAttempt, strconv.Itoa(lease.DispatchAttempt))
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s %s", method, path, resp.Status, data)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

func (a *agent) run(p wire.WebhookPayload) error {
	base := "/v0/executions/" + p.ExecutionID
	var exec struct {
		Input json.RawMessage `json:"input"`
	}
	if err := a.call("GET", base, nil, nil, &exec); err != nil {
		return err
	}
	var d struct {
		Decision string          `json:"decision"`
		StepID   string          `json:"step_id"`
		Result   json.RawMessage `json:"result"`
		Reason   string          `json:"reason"`
	}
	if err := a.call("POST", base+"/steps", &p, map[string]any{"kind": "tool_call", "target": "echo", "args": exec.Input, "effect": "read_only"}, &d); err != nil {
		return err
	}
	result := d.Result
	switch d.Decision {
	case "proceed": // run the effect, then record it
		result, _ = json.Marshal(map[string]any{"echo": exec.Input, "at": time.Now().UTC()})
		if err := a.call("POST", base+"/steps/"+d.StepID+"/complete", &p, map[string]any{"result": result}, nil); err != nil {
			return err
		}
	case "replay": // already recorded: use it, do not run again
	default:
		log.Printf("execution %s: step %s: %s (%s)", p.ExecutionID, d.StepID, d.Decision, d.Reason)
		return nil // blocked/denied/terminal: the kernel has the record
	}
	return a.call("POST", base+"/complete", &p, map[string]any{"output": result}, nil)
}

func main() {
	kernel := flag.String("kernel", "http://127.0.0.1:8080", "kernel base URL")
	listen := flag.String("listen", "127.0.0.1:5001", "webhook listen address")
	id := flag.String("id", "echo", "agent id")
	secret := flag.String("secret", "echo-secret-0123456789", "HMAC secret shared with the kernel")
	flag.Parse()
	a := &agent{kernel: *kernel, id: *id, secret: []byte(*secret), hc: &http.Client{Timeout: 30 * time.Second}}
	http.HandleFunc("POST /webhook", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if !wire.Verify(a.secret, body, r.Header.Get(wire.HeaderSignature)) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var p wire.WebhookPayload
		if err := json.Unmarshal(body, &p); err != nil {
			http.Error(w, "bad payload", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusAccepted) // ack first; the lease covers the work
		go func() {
			if err := a.run(p); err != nil {
				log.Printf("execution %s: %v", p.ExecutionID, err)
			}
		}()
	})
	log.Printf("echo-agent %s listening on http://%s/webhook", *id, *listen)
	srv := &http.Server{Addr: *listen, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
