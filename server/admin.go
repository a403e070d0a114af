package server

import (
	"net/http"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// Admin routes: agents, policies, policy dry runs, approvals; and the
// admin-only tenant routes. Bundles are in bundles.go.

// putAgent upserts an agent. On update, omitted fields keep their stored
// values: an omitted secret keeps the secret, and an omitted policy keeps
// the binding (so re-registering an agent never silently unbinds its
// policy); "policy": "" unbinds.
func (s *Server) putAgent(c *call) (int, any, error) {
	var req wire.AgentRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	if req.Policy != nil && req.Bundle != nil && *req.Policy != *req.Bundle {
		return 0, nil, errorf(kernel.CodeValidation, "policy %q and bundle %q differ (bundle is an alias of policy; send one)", *req.Policy, *req.Bundle)
	}
	binding := req.Policy
	if binding == nil {
		binding = req.Bundle
	}
	var existing *kernel.Agent
	if kernel.ValidID(req.ID) {
		a, err := s.k.Agent(c.ctx, c.tenant, req.ID)
		switch {
		case err == nil:
			existing = a
		case kernel.CodeOf(err) != kernel.CodeNotFound:
			return 0, nil, err
		}
	}
	a := kernel.Agent{ID: req.ID, Tenant: c.tenant, WebhookURL: req.WebhookURL, Secret: req.Secret, Signing: req.Signing}
	if existing != nil {
		if a.WebhookURL == "" {
			a.WebhookURL = existing.WebhookURL
		}
		if a.Secret == "" {
			a.Secret = existing.Secret
		}
		a.Bundle = existing.Bundle
	}
	if binding != nil {
		a.Bundle = *binding
	}
	out, err := s.k.PutAgent(c.ctx, a)
	if err != nil {
		return 0, nil, err
	}
	if existing == nil {
		return http.StatusCreated, agentView(out), nil
	}
	return http.StatusOK, agentView(out), nil
}

func (s *Server) listAgents(c *call) (int, any, error) {
	as, err := s.k.ListAgents(c.ctx, c.tenant)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.AgentList{Agents: mapSlice(as, agentView)}, nil
}

func (s *Server) getAgent(c *call) (int, any, error) {
	a, err := s.k.Agent(c.ctx, c.tenant, c.vars("agent_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, agentView(a), nil
}

func (s *Server) deleteAgent(c *call) (int, any, error) {
	if err := s.k.DeleteAgent(c.ctx, c.tenant, c.vars("agent_id")); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// setPolicy stores native YAML rules as the agent's own bundle and binds
// the agent to it (the Rebuno form, POST /v0/policies/{agent_id}).
func (s *Server) setPolicy(c *call) (int, any, error) {
	var req wire.PolicyRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	if req.Bundle == "" {
		return 0, nil, errorf(kernel.CodeValidation, "bundle is required: the agent's native YAML rules, as a string")
	}
	agentID := c.vars("agent_id")
	rec, err := s.k.SetAgentPolicy(c.ctx, c.tenant, agentID, []byte(req.Bundle))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.PolicyResponse{AgentID: agentID, Bundle: bundleView(rec)}, nil
}

func (s *Server) evalPolicy(c *call) (int, any, error) {
	var req wire.PolicyEvalRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	if req.AgentID == "" {
		return 0, nil, errorf(kernel.CodeValidation, "agent_id is required")
	}
	res, err := s.k.EvalPolicy(c.ctx, kernel.EvalRequest{Tenant: c.tenant, AgentID: req.AgentID, Kind: req.Step.Kind,
		Target: req.Step.Target, Args: req.Step.Args, Effect: req.Step.Effect, Idempotency: req.Step.Idempotency, Labels: req.Labels})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, evalView(res), nil
}

func (s *Server) listApprovals(c *call) (int, any, error) {
	as, err := s.k.ListApprovals(c.ctx, c.tenant, kernel.ApprovalStatus(c.r.URL.Query().Get("status")))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.ApprovalList{Approvals: mapSlice(as, approvalView)}, nil
}

func (s *Server) getApproval(c *call) (int, any, error) {
	a, err := s.k.GetApproval(c.ctx, c.tenant, c.vars("approval_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, approvalView(a), nil
}

func (s *Server) grantApproval(c *call) (int, any, error) { return s.resolveApproval(c, true) }
func (s *Server) denyApproval(c *call) (int, any, error)  { return s.resolveApproval(c, false) }

// resolveApproval grants or denies; decided_by defaults to the key's principal.
func (s *Server) resolveApproval(c *call, grant bool) (int, any, error) {
	var req wire.ResolveApprovalRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	if req.DecidedBy == "" {
		req.DecidedBy = c.p.Name
	}
	a, err := s.k.ResolveApproval(c.ctx, kernel.Resolution{Tenant: c.tenant, ApprovalID: c.vars("approval_id"), Grant: grant,
		DecidedBy: req.DecidedBy, Rationale: req.Rationale, RequestHash: req.RequestHash})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, approvalView(a), nil
}

// Tenants (admin only).

func (s *Server) createTenant(c *call) (int, any, error) {
	var req wire.TenantRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	for _, g := range req.Guards {
		if !kernel.ValidID(g) {
			return 0, nil, errorf(kernel.CodeValidation, "guard bundle name %q is invalid", g)
		}
	}
	t, err := s.k.CreateTenant(c.ctx, kernel.Tenant{ID: req.ID, Guards: req.Guards})
	if err != nil {
		return 0, nil, err
	}
	c.w.Header().Set("Location", "/v0/tenants/"+t.ID)
	return http.StatusCreated, tenantView(t), nil
}

func (s *Server) listTenants(c *call) (int, any, error) {
	ts, err := s.k.ListTenants(c.ctx)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.TenantList{Tenants: mapSlice(ts, tenantView)}, nil
}

func (s *Server) createKey(c *call) (int, any, error) {
	var req wire.KeyRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	key, secret, err := s.k.CreateKey(c.ctx, c.vars("tenant"), req.Role, req.Principal, "")
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, wire.CreatedKey{KeyID: key.ID, Key: secret, Role: key.Role, Principal: key.Principal,
		Tenant: key.Tenant, CreatedAt: key.CreatedAt}, nil
}

func (s *Server) listKeys(c *call) (int, any, error) {
	t := c.vars("tenant")
	if err := s.requireTenant(c, t); err != nil {
		return 0, nil, err
	}
	keys, err := s.k.ListKeys(c.ctx, t)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.KeyList{Keys: mapSlice(keys, keyView)}, nil
}

func (s *Server) deleteKey(c *call) (int, any, error) {
	if err := s.k.DeleteKey(c.ctx, c.vars("tenant"), c.vars("key_id")); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// requireTenant answers not_found for an unknown tenant (the kernel has no
// single-tenant lookup, so this lists them).
func (s *Server) requireTenant(c *call, id string) error {
	ts, err := s.k.ListTenants(c.ctx)
	if err != nil {
		return err
	}
	for _, t := range ts {
		if t.ID == id {
			return nil
		}
	}
	return errorf(kernel.CodeNotFound, "tenant %s not found", id)
}
