package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/wicket-run/wicket/server/wire"
)

// Admin routes need a tenant-admin or admin key; the tenant routes
// (CreateTenant and the key methods) need an admin key.

// ---- approvals ----

// Approvals lists the tenant's approvals; status ("pending", "granted",
// "denied", "expired") filters them, "" lists all.
// It follows the pages the kernel answers in.
func (c *Client) Approvals(ctx context.Context, status string) ([]Approval, error) {
	var all []Approval
	cursor := ""
	for {
		q := url.Values{}
		if status != "" {
			q.Set("status", status)
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		path := "/v0/approvals"
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		var l wire.ApprovalList
		if err := c.Do(ctx, http.MethodGet, path, nil, nil, &l); err != nil {
			return nil, err
		}
		all = append(all, l.Approvals...)
		if l.NextCursor == "" {
			if all == nil {
				all = []Approval{}
			}
			return all, nil
		}
		cursor = l.NextCursor
	}
}

// Approval reads one approval.
func (c *Client) Approval(ctx context.Context, id string) (*Approval, error) {
	var a Approval
	if err := c.Do(ctx, http.MethodGet, "/v0/approvals/"+seg(id), nil, nil, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// Grant grants a pending approval; the execution resumes. The decider is
// the principal of the client's key (an approver, tenant-admin or admin
// key): leave DecidedBy empty, or set it to that principal. Only with an
// admin key may DecidedBy name someone else, the person the admin decides
// for; the approval then records both, with the key's id. The kernel
// answers 403 if DecidedBy names anyone else, or if the approval names
// approvers and the decider is not one of them, and 409 if RequestHash is
// set and differs from the approval's.
func (c *Client) Grant(ctx context.Context, id string, req ResolveApprovalRequest) (*Approval, error) {
	return c.resolve(ctx, id, "grant", req)
}

// Deny denies a pending approval; the step is denied. The rules of Grant
// apply.
func (c *Client) Deny(ctx context.Context, id string, req ResolveApprovalRequest) (*Approval, error) {
	return c.resolve(ctx, id, "deny", req)
}

// Retry answers an interrupted_side_effect approval: the effect did not
// happen (or may run again); the step proceeds again when next proposed.
// The rules of Grant apply; on a policy's approval it is 409.
func (c *Client) Retry(ctx context.Context, id string, req ResolveApprovalRequest) (*Approval, error) {
	return c.resolve(ctx, id, "retry", req)
}

// Happened answers an interrupted_side_effect approval: the effect
// happened, and req.Result (any JSON) is recorded as the step's result,
// which its replay returns. The rules of Grant apply; on a policy's
// approval it is 409.
func (c *Client) Happened(ctx context.Context, id string, req ResolveApprovalRequest) (*Approval, error) {
	return c.resolve(ctx, id, "happened", req)
}

func (c *Client) resolve(ctx context.Context, id, verb string, req ResolveApprovalRequest) (*Approval, error) {
	var a Approval
	if err := c.Do(ctx, http.MethodPost, "/v0/approvals/"+seg(id)+"/"+verb, nil, req, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// ---- agents ----

// PutAgent registers an agent or updates it (an upsert). On update an
// omitted Secret keeps the stored one and an omitted Policy keeps the
// binding; a Policy of "" unbinds.
func (c *Client) PutAgent(ctx context.Context, req AgentRequest) (*Agent, error) {
	var a Agent
	if err := c.Do(ctx, http.MethodPost, "/v0/agents", nil, req, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// Agents lists the tenant's agents.
func (c *Client) Agents(ctx context.Context) ([]Agent, error) {
	var l wire.AgentList
	if err := c.Do(ctx, http.MethodGet, "/v0/agents", nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Agents, nil
}

// Agent reads one agent.
func (c *Client) Agent(ctx context.Context, id string) (*Agent, error) {
	var a Agent
	if err := c.Do(ctx, http.MethodGet, "/v0/agents/"+seg(id), nil, nil, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// DeleteAgent deletes an agent (204).
func (c *Client) DeleteAgent(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, "/v0/agents/"+seg(id), nil, nil, nil)
}

// ---- policy and bundles ----

// SetPolicy stores native YAML rules as the agent's own bundle and binds the
// agent to it. A policy that does not load is refused whole (400) and the
// running one stays.
func (c *Client) SetPolicy(ctx context.Context, agentID, rulesYAML string) (*PolicyResponse, error) {
	var p PolicyResponse
	if err := c.Do(ctx, http.MethodPost, "/v0/policies/"+seg(agentID), nil, wire.PolicyRequest{Bundle: rulesYAML}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// PutBundle stores a bundle from its .tar.gz (sent as application/gzip)
// and makes it live. A bundle that does not load is refused whole (400).
func (c *Client) PutBundle(ctx context.Context, name string, tarGz []byte) (*Bundle, error) {
	if tarGz == nil {
		tarGz = []byte{}
	}
	var b Bundle
	if err := c.Do(ctx, http.MethodPut, "/v0/bundles/"+seg(name), http.Header{"Content-Type": {"application/gzip"}}, tarGz, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// PutBundleFiles stores a bundle from its files (the JSON form: text files
// in Files, binary ones base64 in FilesBase64) and makes it live. Without a
// bundle.yaml among the files the kernel makes one from name and Engine.
func (c *Client) PutBundleFiles(ctx context.Context, name string, req BundleFilesRequest) (*Bundle, error) {
	var b Bundle
	if err := c.Do(ctx, http.MethodPut, "/v0/bundles/"+seg(name), nil, req, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// Bundles lists the tenant's bundles.
func (c *Client) Bundles(ctx context.Context) ([]Bundle, error) {
	var l wire.BundleList
	if err := c.Do(ctx, http.MethodGet, "/v0/bundles", nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Bundles, nil
}

// Bundle reads a bundle's metadata.
func (c *Client) Bundle(ctx context.Context, name string) (*Bundle, error) {
	var b Bundle
	if err := c.Do(ctx, http.MethodGet, "/v0/bundles/"+seg(name), nil, nil, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// BundleArchive downloads a bundle as the .tar.gz the kernel stores.
func (c *Client) BundleArchive(ctx context.Context, name string) ([]byte, error) {
	var b []byte
	if err := c.Do(ctx, http.MethodGet, "/v0/bundles/"+seg(name)+"?archive=1", http.Header{"Accept": {"application/gzip"}}, nil, &b); err != nil {
		return nil, err
	}
	return b, nil
}

// DeleteBundle deletes a bundle (204).
func (c *Client) DeleteBundle(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodDelete, "/v0/bundles/"+seg(name), nil, nil, nil)
}

// EvalPolicy asks what policy would decide for a step of req.AgentID, and
// which bundle and rule would decide it, without recording anything.
func (c *Client) EvalPolicy(ctx context.Context, req PolicyEvalRequest) (*PolicyEvalResponse, error) {
	var r PolicyEvalResponse
	if err := c.Do(ctx, http.MethodPost, "/v0/policy/eval", nil, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// ---- tenants (admin keys only) ----

// CreateTenant creates a tenant (201).
func (c *Client) CreateTenant(ctx context.Context, req TenantRequest) (*Tenant, error) {
	var t Tenant
	if err := c.Do(ctx, http.MethodPost, "/v0/tenants", nil, req, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// SetTenantGuards replaces a tenant's guard bundles (an empty list removes
// them). Each must name a bundle the admin stored into that tenant
// (PutBundle with WithTenant and an admin key); anything else is a
// validation error naming the guard.
func (c *Client) SetTenantGuards(ctx context.Context, tenant string, guards []string) (*Tenant, error) {
	if guards == nil {
		guards = []string{}
	}
	var t Tenant
	if err := c.Do(ctx, http.MethodPut, "/v0/tenants/"+seg(tenant), nil, wire.TenantUpdateRequest{Guards: &guards}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Tenants lists the kernel's tenants.
func (c *Client) Tenants(ctx context.Context) ([]Tenant, error) {
	var l wire.TenantList
	if err := c.Do(ctx, http.MethodGet, "/v0/tenants", nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Tenants, nil
}

// CreateKey creates an API key of tenant (201). The answer's Key is the
// secret: it is shown this once, and the kernel stores only its hash.
func (c *Client) CreateKey(ctx context.Context, tenant string, req KeyRequest) (*CreatedKey, error) {
	var k CreatedKey
	if err := c.Do(ctx, http.MethodPost, "/v0/tenants/"+seg(tenant)+"/keys", nil, req, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// Keys lists a tenant's API keys (never their secrets).
func (c *Client) Keys(ctx context.Context, tenant string) ([]Key, error) {
	var l wire.KeyList
	if err := c.Do(ctx, http.MethodGet, "/v0/tenants/"+seg(tenant)+"/keys", nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Keys, nil
}

// DeleteKey revokes a tenant's API key (204).
func (c *Client) DeleteKey(ctx context.Context, tenant, keyID string) error {
	return c.Do(ctx, http.MethodDelete, "/v0/tenants/"+seg(tenant)+"/keys/"+seg(keyID), nil, nil, nil)
}

// ---- store (admin keys only) ----

// Backup streams a consistent copy of the kernel's store, taken while it
// serves, to w (GET /v0/store/backup), and returns the bytes copied. The
// copy is a store file: `wicket store check` verifies it and `wicket serve
// --data` runs on it. A transfer cut short is an error; w then holds a
// partial copy that must not be used.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	const path = "/v0/store/backup"
	req, err := c.newRequest(ctx, http.MethodGet, path, http.Header{"Accept": {"application/octet-stream"}}, nil)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", path, err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", path, unwrapURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return 0, fmt.Errorf("GET %s: %w", path, apiError(resp))
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("GET %s: copy interrupted after %d bytes: %w", path, n, err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("GET %s: got %d of %d bytes", path, n, resp.ContentLength)
	}
	return n, nil
}
