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
		a.OnInterrupted = existing.OnInterrupted
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
	if req.OnInterrupted != nil {
		a.OnInterrupted = *req.OnInterrupted
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
	rec, err := s.k.SetAgentPolicy(c.ctx, c.tenant, agentID, []byte(req.Bundle), c.p.bundleOwner())
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
		Target: req.Step.Target, Args: req.Step.Args, Effect: req.Step.Effect, Idempotency: kernel.Idempotency(req.Step.Idempotency), Labels: req.Labels})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, evalView(res), nil
}

func (s *Server) listApprovals(c *call) (int, any, error) {
	q := c.r.URL.Query()
	n, err := intParam(q.Get("limit"), "limit", 1000, 1000)
	if err != nil {
		return 0, nil, err
	}
	cursor := q.Get("cursor")
	if len(cursor) > 128 {
		return 0, nil, errorf(kernel.CodeValidation, "cursor is %d bytes; a cursor is an approval id", len(cursor))
	}
	as, next, err := s.k.ListApprovals(c.ctx, c.tenant, kernel.ApprovalStatus(q.Get("status")), cursor, n)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.ApprovalList{Approvals: mapSlice(as, approvalView), NextCursor: next}, nil
}

func (s *Server) getApproval(c *call) (int, any, error) {
	a, err := s.k.GetApproval(c.ctx, c.tenant, c.vars("approval_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, approvalView(a), nil
}

// Answers to an approval. retry is grant under the name an
// interrupted_side_effect approval's answer has; happened is for those only.
const (
	answerGrant    = "grant"
	answerDeny     = "deny"
	answerRetry    = "retry"
	answerHappened = "happened"
)

func (s *Server) grantApproval(c *call) (int, any, error) { return s.resolveApproval(c, answerGrant) }
func (s *Server) denyApproval(c *call) (int, any, error)  { return s.resolveApproval(c, answerDeny) }
func (s *Server) retryApproval(c *call) (int, any, error) { return s.resolveApproval(c, answerRetry) }
func (s *Server) happenedApproval(c *call) (int, any, error) {
	return s.resolveApproval(c, answerHappened)
}

// resolveApproval grants or denies. The decider is the key's principal: a
// body decided_by that names anyone else is 403, except for admin keys,
// which may decide for a named person (both are recorded).
func (s *Server) resolveApproval(c *call, answer string) (int, any, error) {
	var req wire.ResolveApprovalRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	if answer != answerHappened && len(req.Result) > 0 && string(req.Result) != "null" {
		return 0, nil, errorf(kernel.CodeValidation, "result is only given with happened (an interrupted side effect that happened)")
	}
	if answer == answerRetry || answer == answerHappened {
		a, err := s.k.GetApproval(c.ctx, c.tenant, c.vars("approval_id"))
		if err != nil {
			return 0, nil, err
		}
		if a.Type != kernel.ApprovalInterrupted {
			return 0, nil, errorf(kernel.CodeConflict, "approval %s is of type %s: %s answers an %s approval (use grant or deny)", a.ID, approvalType(a), answer, kernel.ApprovalInterrupted)
		}
	}
	by := c.p.Name
	if req.DecidedBy != "" && req.DecidedBy != by {
		if c.p.Kind != PrincipalAdmin {
			// Another tenant's approval, or none, is 404 as on every route.
			if _, err := s.k.GetApproval(c.ctx, c.tenant, c.vars("approval_id")); err != nil {
				return 0, nil, err
			}
			return 0, nil, errorf(kernel.CodeForbidden, "decided_by %q is not this key's principal %q: a decision is made by the key's holder (only admin keys may decide for someone else)", req.DecidedBy, by)
		}
		by = req.DecidedBy
	}
	a, err := s.k.ResolveApproval(c.ctx, kernel.Resolution{Tenant: c.tenant, ApprovalID: c.vars("approval_id"),
		Grant: answer == answerGrant || answer == answerRetry, Happened: answer == answerHappened, Result: req.Result,
		DecidedBy: by, KeyID: c.p.KeyID, Principal: c.p.Name, ByAdmin: c.p.Kind == PrincipalAdmin || c.p.IssuedByAdmin,
		Rationale: req.Rationale, RequestHash: req.RequestHash})
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
	t, err := s.k.CreateTenant(c.ctx, kernel.Tenant{ID: req.ID, Guards: req.Guards, Retention: req.Retention})
	if err != nil {
		return 0, nil, err
	}
	c.w.Header().Set("Location", "/v0/tenants/"+t.ID)
	return http.StatusCreated, tenantView(t), nil
}

// updateTenant sets a tenant's guards: PUT /v0/tenants/{tenant}
// {"guards": [...]} ([] removes them). Each must name an admin-owned bundle
// of that tenant.
func (s *Server) updateTenant(c *call) (int, any, error) {
	var req wire.TenantUpdateRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	if req.Guards == nil && req.Retention == nil {
		return 0, nil, errorf(kernel.CodeValidation, `guards is required: the tenant's guard bundles ([] removes them all); or retention`)
	}
	var t *kernel.Tenant
	var err error
	if req.Retention != nil {
		if err := kernel.ValidRetention(*req.Retention); err != nil {
			return 0, nil, err
		}
	}
	if req.Guards != nil {
		if t, err = s.k.SetTenantGuards(c.ctx, c.vars("tenant"), *req.Guards); err != nil {
			return 0, nil, err
		}
	}
	if req.Retention != nil {
		if t, err = s.k.SetTenantRetention(c.ctx, c.vars("tenant"), *req.Retention); err != nil {
			return 0, nil, err
		}
	}
	return http.StatusOK, tenantView(t), nil
}

func (s *Server) listTenants(c *call) (int, any, error) {
	ts, err := s.k.ListTenants(c.ctx)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.TenantList{Tenants: mapSlice(ts, tenantView)}, nil
}

// createKey issues a key. An admin may issue any role for any tenant (an
// admin key only in the default tenant); a tenant-admin only keys of its own
// tenant, and never an admin key.
func (s *Server) createKey(c *call) (int, any, error) {
	var req wire.KeyRequest
	if err := decode(c.body, &req); err != nil {
		return 0, nil, err
	}
	tenant := c.vars("tenant")
	if err := s.ownKeys(c, tenant); err != nil {
		return 0, nil, err
	}
	if c.p.Kind != PrincipalAdmin && req.Role == kernel.RoleAdmin {
		return 0, nil, errorf(kernel.CodeForbidden, "a %s key may not issue admin keys", c.p.Kind)
	}
	key, secret, err := s.k.IssueKey(c.ctx, tenant, req.Role, req.Principal, "", c.p.Kind == PrincipalAdmin)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, wire.CreatedKey{KeyID: key.ID, Key: secret, Role: key.Role, Principal: key.Principal,
		Tenant: key.Tenant, CreatedAt: key.CreatedAt}, nil
}

// ownKeys holds a tenant-admin to the keys of its own tenant.
func (s *Server) ownKeys(c *call, tenant string) error {
	if c.p.Kind != PrincipalAdmin && tenant != c.p.Tenant {
		return errorf(kernel.CodeForbidden, "a %s key manages the keys of its own tenant (%s) only", c.p.Kind, c.p.Tenant)
	}
	return nil
}

func (s *Server) listKeys(c *call) (int, any, error) {
	t := c.vars("tenant")
	if err := s.ownKeys(c, t); err != nil {
		return 0, nil, err
	}
	if err := s.requireTenant(c, t); err != nil {
		return 0, nil, err
	}
	keys, err := s.k.ListKeys(c.ctx, t)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.KeyList{Keys: mapSlice(keys, keyView)}, nil
}

// deleteKey revokes a key and ends the event streams it opened. A
// tenant-admin may revoke keys of its own tenant, but not an admin key.
func (s *Server) deleteKey(c *call) (int, any, error) {
	tenant, id := c.vars("tenant"), c.vars("key_id")
	if err := s.ownKeys(c, tenant); err != nil {
		return 0, nil, err
	}
	if c.p.Kind != PrincipalAdmin {
		keys, err := s.k.ListKeys(c.ctx, tenant)
		if err != nil {
			return 0, nil, err
		}
		for _, k := range keys {
			if k.ID == id && k.Role == kernel.RoleAdmin {
				return 0, nil, errorf(kernel.CodeForbidden, "a %s key may not revoke an admin key", c.p.Kind)
			}
		}
	}
	if err := s.k.DeleteKey(c.ctx, tenant, id); err != nil {
		return 0, nil, err
	}
	if n := s.streams.revoke(tenant, id); n > 0 {
		s.log.Info("key revoked: event streams closed", "tenant", tenant, "key_id", id, "streams", n)
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
