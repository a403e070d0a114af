package webhook

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

func TestDeliver(t *testing.T) {
	const secret = "webhook-secret-0123456789"
	var got wire.WebhookPayload
	status := http.StatusAccepted
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !wire.Verify([]byte(secret), body, r.Header.Get(wire.HeaderSignature)) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_ = json.Unmarshal(body, &got)
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
			return
		}
		if r.URL.Path == "/slow" {
			time.Sleep(time.Second)
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	s := New()
	defer s.Close()
	d := kernel.Delivery{AgentID: "a", WebhookURL: srv.URL + "/hook", Secret: secret, ExecutionID: "e1", DispatchID: "d1", Attempt: 3}
	ctx := context.Background()
	if err := s.Deliver(ctx, d); err != nil {
		t.Fatalf("2xx: %v", err)
	}
	if got != (wire.WebhookPayload{ExecutionID: "e1", DispatchID: "d1", DispatchAttempt: 3}) {
		t.Errorf("payload %+v", got)
	}
	for _, tc := range []struct {
		name string
		mod  func(*kernel.Delivery)
		st   int
		want string
	}{
		{"agent refuses", func(*kernel.Delivery) {}, 500, "500"},
		{"wrong secret is refused by the agent", func(d *kernel.Delivery) { d.Secret = "another-secret-0123456789" }, 202, "401"},
		{"a redirect is not an acknowledgement", func(d *kernel.Delivery) { d.WebhookURL = srv.URL + "/redirect" }, 202, "302"},
		{"nobody listening", func(d *kernel.Delivery) { d.WebhookURL = "http://127.0.0.1:1/hook" }, 202, "connect"},
	} {
		status = tc.st
		dd := d
		tc.mod(&dd)
		if err := s.Deliver(ctx, dd); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
	status = 202
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	d.WebhookURL = srv.URL + "/slow"
	if err := s.Deliver(tctx, d); err == nil {
		t.Error("a delivery past its deadline succeeded")
	}
}
