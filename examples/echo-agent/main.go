// Command echo-agent is the smallest complete Wicket agent, written against
// the protocol by hand (no SDK): it verifies the kernel's signed webhook,
// reads its execution, runs one step ("echo") under the dispatch lease, and
// completes the execution with the step's result. A re-delivered dispatch
// replays the recorded step instead of running it again.
//
//	go run ./examples/echo-agent --kernel http://127.0.0.1:8080 --listen 127.0.0.1:5001 \
//	    --id echo --secret echo-secret-0123456789
//
// Every request is signed the v1 way (the scheme of new agents):
//
//	Wicket-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, message)>
//	message = "v1\n" + t + "\n" + METHOD + "\n" + path?query + "\n" +
//	          dispatch id + "\n" + dispatch attempt + "\n" + raw body
//
// and the kernel's webhooks arrive signed the same way. With --signing body
// it speaks the Rebuno scheme instead (Rebuno-Signature: sha256=<hex
// HMAC-SHA256(secret, raw body)>), for an agent registered with
// "signing": "body".
package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type agent struct {
	kernel, id, signing string
	secret              []byte
	hc                  *http.Client
}

// lease is the webhook's payload: the dispatch the agent now holds.
type lease struct {
	ExecutionID     string `json:"execution_id"`
	DispatchID      string `json:"dispatch_id"`
	DispatchAttempt int    `json:"dispatch_attempt"`
}

func hexHMAC(secret, msg []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(msg)
	return hex.EncodeToString(m.Sum(nil))
}

// message is what a v1 signature at time t covers.
func message(t, method, target, dispatchID, attempt string, body []byte) []byte {
	return append([]byte("v1\n"+t+"\n"+method+"\n"+target+"\n"+dispatchID+"\n"+attempt+"\n"), body...)
}

// call sends a signed request; l is nil for reads.
func (a *agent) call(method, path string, l *lease, body any, out any) error {
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	req, _ := http.NewRequest(method, a.kernel+path, bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Rebuno-Agent-Id", a.id)
	var dispatchID, attempt string
	if l != nil {
		dispatchID, attempt = l.DispatchID, strconv.Itoa(l.DispatchAttempt)
		req.Header.Set("Rebuno-Dispatch-Id", dispatchID)
		req.Header.Set("Rebuno-Dispatch-Attempt", attempt)
	}
	if a.signing == "body" {
		req.Header.Set("Rebuno-Signature", "sha256="+hexHMAC(a.secret, raw))
	} else {
		t := strconv.FormatInt(time.Now().Unix(), 10)
		// The target is the path and query exactly as they go on the wire.
		sig := hexHMAC(a.secret, message(t, method, req.URL.RequestURI(), dispatchID, attempt, raw))
		req.Header.Set("Wicket-Signature", "t="+t+",v1="+sig)
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

// verify checks a webhook's signature: for v1, the timestamp is within
// 300 s and the HMAC covers this POST, its path, its dispatch headers and
// its body; hmac.Equal compares in constant time.
func (a *agent) verify(r *http.Request, body []byte) bool {
	if a.signing == "body" {
		want := "sha256=" + hexHMAC(a.secret, body)
		return hmac.Equal([]byte(r.Header.Get("Rebuno-Signature")), []byte(want))
	}
	var t, v1 string
	for _, kv := range strings.Split(r.Header.Get("Wicket-Signature"), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		switch k {
		case "t":
			t = v
		case "v1":
			v1 = v
		}
	}
	ts, err := strconv.ParseInt(t, 10, 64)
	if err != nil || time.Since(time.Unix(ts, 0)).Abs() > 300*time.Second {
		return false
	}
	want := hexHMAC(a.secret, message(t, r.Method, r.RequestURI, r.Header.Get("Rebuno-Dispatch-Id"), r.Header.Get("Rebuno-Dispatch-Attempt"), body))
	return hmac.Equal([]byte(v1), []byte(want))
}

func (a *agent) run(p lease) error {
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
	case "denied": // policy said no: without its one step the execution fails
		log.Printf("execution %s: step %s: denied (%s)", p.ExecutionID, d.StepID, d.Reason)
		return a.call("POST", base+"/fail", &p, map[string]any{"error": map[string]any{"message": "step denied: " + d.Reason, "step_id": d.StepID}}, nil)
	default:
		log.Printf("execution %s: step %s: %s (%s)", p.ExecutionID, d.StepID, d.Decision, d.Reason)
		return nil // blocked, rate limited or terminal: a new dispatch comes, or nothing is left to do
	}
	return a.call("POST", base+"/complete", &p, map[string]any{"output": result}, nil)
}

func main() {
	kernel := flag.String("kernel", "http://127.0.0.1:8080", "kernel base URL")
	listen := flag.String("listen", "127.0.0.1:5001", "webhook listen address")
	id := flag.String("id", "echo", "agent id")
	secret := flag.String("secret", "echo-secret-0123456789", "HMAC secret shared with the kernel")
	signing := flag.String("signing", "v1", `signature scheme the agent is registered with: "v1" or "body"`)
	flag.Parse()
	if *signing != "v1" && *signing != "body" {
		log.Fatalf("--signing %q: want v1 or body", *signing)
	}
	a := &agent{kernel: *kernel, id: *id, signing: *signing, secret: []byte(*secret), hc: &http.Client{Timeout: 30 * time.Second}}
	http.HandleFunc("POST /webhook", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if !a.verify(r, body) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var p lease
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
	log.Printf("echo-agent %s (signing %s) listening on http://%s/webhook", *id, *signing, *listen)
	srv := &http.Server{Addr: *listen, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done() // SIGINT or SIGTERM: stop taking webhooks, finish requests
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
