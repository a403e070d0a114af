package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// TestFieldCeilings: what a tenant-admin configures is held to sizes that
// keep every record small: the kernel keeps agents (secret and webhook URL
// included) in memory and a verifier per secret, so a 1 MiB secret or URL
// per agent multiplied memory by the body limit. Each over-long field is a
// 400 naming the field and the ceiling, and nothing is stored.
func TestFieldCeilings(t *testing.T) {
	e := newEnv(t)
	long := func(n int) string { return strings.Repeat("s", n) }
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		field      string
	}{
		{"agent secret", "/v0/agents", map[string]any{"id": "big-secret", "secret": long(kernel.MaxSecretBytes + 1)}, "secret"},
		{"agent webhook_url", "/v0/agents", map[string]any{"id": "big-url", "secret": long(32), "webhook_url": "http://127.0.0.1:9/" + long(kernel.MaxWebhookURLBytes)}, "webhook_url"},
		{"key principal", "/v0/tenants/default/keys", map[string]any{"role": "client", "principal": long(kernel.MaxPrincipalBytes + 1)}, "principal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eb := e.admin("POST", tc.path, tc.body).wantErr(t, http.StatusBadRequest, wire.CodeValidation)
			if !strings.Contains(eb.Message, tc.field) || !strings.Contains(eb.Message, "at most") {
				t.Fatalf("the answer does not name %s and its ceiling: %s", tc.field, eb.Message)
			}
		})
	}
	var l wire.AgentList
	e.admin("GET", "/v0/agents", nil).want(t, http.StatusOK).decode(t, &l)
	for _, a := range l.Agents {
		if strings.HasPrefix(a.ID, "big-") {
			t.Fatalf("a refused agent was stored: %s", a.ID)
		}
	}
	// At the ceilings, all is well.
	e.admin("POST", "/v0/agents", map[string]any{"id": "max", "secret": long(kernel.MaxSecretBytes), "webhook_url": "http://127.0.0.1:9/" + long(kernel.MaxWebhookURLBytes-len("http://127.0.0.1:9/"))}).want(t, http.StatusCreated)
	e.admin("POST", "/v0/tenants/default/keys", map[string]any{"role": "client", "principal": long(kernel.MaxPrincipalBytes)}).want(t, http.StatusCreated)
}
