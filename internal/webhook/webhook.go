// Package webhook delivers dispatches to agents: a signed POST of
// {execution_id, dispatch_id, dispatch_attempt} to the agent's webhook_url.
// It implements kernel.Deliverer; the retry policy stays in the kernel.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// Sender posts webhooks over HTTP.
type Sender struct {
	client *http.Client
}

var _ kernel.Deliverer = (*Sender)(nil)

// New returns a Sender with a connection pool sized for many agents.
// Timeouts come from the context the kernel passes to Deliver.
func New() *Sender {
	tr := &http.Transport{
		Proxy:               nil, // webhooks go straight to the agent
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Sender{client: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // a redirect is not an acknowledgement
	}}}
}

// Deliver sends one webhook and returns nil when the agent answered 2xx.
func (s *Sender) Deliver(ctx context.Context, d kernel.Delivery) error {
	body, err := json.Marshal(wire.WebhookPayload{ExecutionID: d.ExecutionID, DispatchID: d.DispatchID, DispatchAttempt: d.Attempt})
	if err != nil {
		return fmt.Errorf("webhook: encode: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("webhook: request for %s: %w", d.WebhookURL, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.HeaderSignature, wire.Sign([]byte(d.Secret), body))
	req.Header.Set(wire.HeaderAgentID, d.AgentID)
	req.Header.Set(wire.HeaderDispatchID, d.DispatchID)
	req.Header.Set(wire.HeaderDispatchAttempt, strconv.Itoa(d.Attempt))
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("webhook: post %s: %w", d.WebhookURL, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook: %s answered %s", d.WebhookURL, resp.Status)
	}
	return nil
}

// Close releases idle connections.
func (s *Sender) Close() { s.client.CloseIdleConnections() }
