package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// PrincipalKind is who a request acts as.
type PrincipalKind string

// Principal kinds. All but PrincipalAgent are the roles of bearer keys.
const (
	// PrincipalAdmin administers the whole kernel and may name ?tenant=.
	PrincipalAdmin PrincipalKind = kernel.RoleAdmin
	// PrincipalTenantAdmin administers one tenant.
	PrincipalTenantAdmin PrincipalKind = kernel.RoleTenantAdmin
	// PrincipalClient runs and reads executions of one tenant.
	PrincipalClient PrincipalKind = kernel.RoleClient
	// PrincipalApprover reads and decides approvals and reads executions of
	// one tenant.
	PrincipalApprover PrincipalKind = kernel.RoleApprover
	// PrincipalAgent is an agent that signed its request; it may touch only
	// its own executions.
	PrincipalAgent PrincipalKind = "agent"
)

// Principal is the authenticated caller of a request.
type Principal struct {
	Kind PrincipalKind
	// Tenant is the key's tenant, or for an agent the execution's.
	Tenant string
	// AgentID is set for agents.
	AgentID string
	// KeyID is the id of the bearer key ("admin-key" for Config.AdminKey,
	// "auth-disabled" when authentication is off).
	KeyID string
	// Name is the key's principal (who holds it), or the agent id.
	Name string
	// IssuedByAdmin is set for admin keys and for keys the admin issued
	// (kernel.APIKey.IssuedByAdmin).
	IssuedByAdmin bool
}

// String names the principal in logs.
func (p Principal) String() string {
	if p.Kind == PrincipalAgent {
		return "agent:" + p.Tenant + "/" + p.AgentID
	}
	return string(p.Kind) + ":" + p.Tenant + "/" + p.KeyID
}

func (p Principal) bearer() bool { return p.Kind != PrincipalAgent }

// bundleOwner is who owns the bundles p stores, and the rights p has over
// stored ones: admin keys act as the admin, everything else as the tenant.
func (p Principal) bundleOwner() kernel.BundleOwner {
	if p.Kind == PrincipalAdmin {
		return kernel.BundleOwnerAdmin
	}
	return kernel.BundleOwnerTenant
}

func sha256Sum(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// authenticate establishes c.p and c.tenant from the request's credentials.
// It is the only place credentials are read.
//
// Agent credentials (Rebuno-Agent-Id) are used on routes that admit agents;
// otherwise a bearer key; otherwise, with Config.AuthDisabled and on a route
// that admits bearer principals, the request acts as admin.
func (s *Server) authenticate(c *call, cl class) error {
	r := c.r
	agentID := headerValue(r.Header, wire.HeaderAgentID)
	authz := headerValue(r.Header, "Authorization")
	switch {
	case agentID != "" && (cl == classAgent || cl == classExecRead) && authz == "":
		return s.authenticateAgent(c, agentID)
	case authz != "":
		if err := s.authenticateBearer(c, authz); err != nil {
			return err
		}
	case s.cfg.AuthDisabled:
		// On agent routes this drives sessions only (the kernel refuses a
		// bearer caller on a webhook execution): agents always sign.
		c.p = Principal{Kind: PrincipalAdmin, Tenant: kernel.DefaultTenant, KeyID: "auth-disabled", Name: "admin", IssuedByAdmin: true}
	case cl == classAgent:
		return errorf(kernel.CodeUnauthenticated, "this route needs an agent signature (%s and %s), or the API key holding a session's lease", wire.HeaderAgentID, wire.HeaderWicketSignature)
	default:
		return errorf(kernel.CodeUnauthenticated, "missing credentials: send Authorization: Bearer <api key>")
	}
	// A bearer principal acts in its key's tenant; admins may name another.
	c.tenant = c.p.Tenant
	if t := r.URL.Query().Get("tenant"); t != "" && t != c.p.Tenant {
		if c.p.Kind != PrincipalAdmin {
			return errorf(kernel.CodeForbidden, "only admin keys may name ?tenant=")
		}
		if !kernel.ValidID(t) {
			return errorf(kernel.CodeValidation, "tenant %q is invalid", t)
		}
		// A tenant that does not exist is 404 on every route, reads
		// included: an empty list would pass a typo for an empty tenant.
		if err := s.k.RequireTenant(c.ctx, t); err != nil {
			return err
		}
		c.tenant = t
	}
	return nil
}

// authenticateBearer checks a bearer key: the configured admin key, then
// the kernel's stored keys.
func (s *Server) authenticateBearer(c *call, authz string) error {
	scheme, token, ok := strings.Cut(authz, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return errorf(kernel.CodeUnauthenticated, `the Authorization header must be "Bearer <api key>"`)
	}
	if s.cfg.AdminKey != "" {
		h := sha256Sum(token)
		if subtle.ConstantTimeCompare(h[:], s.adminHash[:]) == 1 {
			c.p = Principal{Kind: PrincipalAdmin, Tenant: kernel.DefaultTenant, KeyID: "admin-key", Name: "admin", IssuedByAdmin: true}
			return nil
		}
	}
	key, err := s.k.AuthenticateKey(c.ctx, token)
	if err != nil {
		if kernel.CodeOf(err) == kernel.CodeUnauthenticated {
			return errorf(kernel.CodeUnauthenticated, "invalid API key")
		}
		return err
	}
	switch key.Role {
	case kernel.RoleAdmin, kernel.RoleTenantAdmin, kernel.RoleClient, kernel.RoleApprover:
	default:
		return errorf(kernel.CodeForbidden, "API key %s has unknown role %q", key.ID, key.Role)
	}
	c.p = Principal{Kind: PrincipalKind(key.Role), Tenant: key.Tenant, KeyID: key.ID, Name: key.Principal,
		IssuedByAdmin: key.IssuedByAdmin || key.Role == kernel.RoleAdmin}
	c.token = token
	return nil
}

// agentCall reports whether r authenticates as an agent on a route of
// class cl: the test authenticate makes.
func agentCall(r *http.Request, cl class) bool {
	return (cl == classAgent || cl == classExecRead) && headerValue(r.Header, wire.HeaderAgentID) != "" && headerValue(r.Header, "Authorization") == ""
}

// headerValue is h.Get(key) for a key already in canonical form (every
// header the server reads by name): the map is read without Get's
// canonicalisation of the key (TestHeaderKeysCanonical checks the keys).
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// agentOf finds the agent a request names, from its headers alone (the
// server calls it before reading the body). A signature header must be
// there, and what can be checked of it without the secret is checked first
// (its form, and a v1 timestamp's window). The execution in the path then
// fixes the tenant; an unknown execution, another agent's, or one whose
// agent is gone are all refused with errNotAdmitted, as a signature that
// does not match is: an agent's credentials never tell whether an
// execution of another tenant (or agent) exists.
func (s *Server) agentOf(c *call, agentID string) (*kernel.Agent, string, error) {
	v1Header := headerValue(c.r.Header, wire.HeaderWicketSignature)
	bodyHeader := headerValue(c.r.Header, wire.HeaderSignature)
	switch {
	case v1Header == "" && bodyHeader == "":
		return nil, "", errorf(kernel.CodeUnauthenticated, "missing %s (or %s for agents registered with signing: body)", wire.HeaderWicketSignature, wire.HeaderSignature)
	case v1Header != "" && bodyHeader != "":
		// One scheme per agent (no downgrade): a request carrying both
		// would be admitted on whichever is the agent's, so that a v1
		// agent's traffic could carry the body scheme's replayable value
		// unnoticed. Refused before any lookup: it needs no secret.
		return nil, "", errorf(kernel.CodeUnauthenticated, "carry one signature, %s or %s (for agents registered with signing: body), not both", wire.HeaderWicketSignature, wire.HeaderSignature)
	case bodyHeader == "":
		if err := wire.CheckV1(v1Header, time.Now(), s.cfg.SignatureTolerance); err != nil {
			return nil, "", errorf(kernel.CodeUnauthenticated, "%s: %v", wire.HeaderWicketSignature, err)
		}
	case v1Header == "":
		if !wire.WellFormed(bodyHeader) {
			return nil, "", errorf(kernel.CodeUnauthenticated, "%s malformed: want %q followed by 64 hex digits", wire.HeaderSignature, wire.SignaturePrefix)
		}
	}
	id := c.vars("id")
	tenant, owner, err := s.k.ExecutionOwner(c.ctx, id)
	switch {
	case kernel.CodeOf(err) == kernel.CodeNotFound || err == nil && owner != agentID:
		return nil, "", errNotAdmitted(id, agentID)
	case err != nil:
		return nil, "", err
	}
	a, err := s.k.Agent(c.ctx, tenant, agentID)
	if err != nil {
		if kernel.CodeOf(err) == kernel.CodeNotFound {
			return nil, "", errNotAdmitted(id, agentID)
		}
		return nil, "", err
	}
	return a, tenant, nil
}

// errNotAdmitted refuses an agent's request about execution id: one answer
// for an unknown execution, another agent's, an agent no longer registered,
// the other signing scheme and a signature that does not match, so that it
// tells nothing of what exists.
func errNotAdmitted(id, agentID string) error {
	return errorf(kernel.CodeUnauthenticated, "no execution %s of agent %s accepts this signature (an unknown execution, or a wrong secret or signing scheme)", id, agentID)
}

// authenticateAgent checks an agent's signature under the agent's scheme
// (kernel.Agent.SigningScheme): for v1, Wicket-Signature over the method,
// the request target, the lease headers and the raw body, within
// Config.SignatureTolerance of the server's clock; for body, the Rebuno
// signature of the raw body. A request signed the other way is refused:
// accepting both would leave v1 agents open to the body scheme's replays.
// See agentOf for who the agent may be.
func (s *Server) authenticateAgent(c *call, agentID string) error {
	a, tenant := c.agent, c.agentTenant
	if a == nil || a.ID != agentID {
		var err error
		if a, tenant, err = s.agentOf(c, agentID); err != nil {
			return err
		}
	}
	v1Header := headerValue(c.r.Header, wire.HeaderWicketSignature)
	bodyHeader := headerValue(c.r.Header, wire.HeaderSignature)
	switch scheme := a.SigningScheme(); scheme {
	case kernel.SigningBody:
		if bodyHeader == "" || !wire.Verify([]byte(a.Secret), c.body, bodyHeader) {
			return errNotAdmitted(c.vars("id"), agentID)
		}
	default:
		if v1Header == "" {
			return errNotAdmitted(c.vars("id"), agentID)
		}
		m := wire.SignedRequest{Method: c.r.Method, Target: wire.RequestTarget(c.r), DispatchID: headerValue(c.r.Header, wire.HeaderDispatchID),
			DispatchAttempt: headerValue(c.r.Header, wire.HeaderDispatchAttempt), Body: c.body}
		if err := s.verifiers.get(a.Secret).Verify(v1Header, m, time.Now(), s.cfg.SignatureTolerance); err != nil {
			if errors.Is(err, wire.ErrSignatureMismatch) {
				return errNotAdmitted(c.vars("id"), agentID)
			}
			return errorf(kernel.CodeUnauthenticated, "%s: %v", wire.HeaderWicketSignature, err)
		}
	}
	c.p = Principal{Kind: PrincipalAgent, Tenant: tenant, AgentID: agentID, Name: agentID}
	c.tenant = tenant
	return nil
}

// roles lists, for each class of bearer route, the key roles it admits
// (agents are admitted by classAgent and classExecRead only). On
// classAgent a bearer key is admitted to drive a session, and the kernel
// then holds it to the session whose lease it holds.
var roles = map[class][]PrincipalKind{
	classAgent:     {PrincipalAdmin, PrincipalTenantAdmin, PrincipalClient},
	classClient:    {PrincipalAdmin, PrincipalTenantAdmin, PrincipalClient},
	classRead:      {PrincipalAdmin, PrincipalTenantAdmin, PrincipalClient, PrincipalApprover},
	classExecRead:  {PrincipalAdmin, PrincipalTenantAdmin, PrincipalClient, PrincipalApprover},
	classApprovals: {PrincipalAdmin, PrincipalTenantAdmin, PrincipalApprover},
	classAdmin:     {PrincipalAdmin, PrincipalTenantAdmin},
	classKeys:      {PrincipalAdmin, PrincipalTenantAdmin},
	classTenants:   {PrincipalAdmin},
}

// authorize checks c.p against the route's class. It is the only place
// roles are checked (tenant-admins on key routes are held to their own
// tenant by the key handlers).
func (s *Server) authorize(c *call, cl class) error {
	p := c.p
	switch cl {
	case classOpen:
		return nil
	case classAgent:
		if p.Kind == PrincipalAgent || slices.Contains(roles[cl], p.Kind) {
			return nil
		}
		return errorf(kernel.CodeForbidden, "this route is for the execution's agent (%s and %s), or the API key holding a session's lease", wire.HeaderAgentID, wire.HeaderWicketSignature)
	}
	if p.Kind == PrincipalAgent {
		if cl == classExecRead {
			return nil
		}
		return errorf(kernel.CodeForbidden, "agents may not call this route")
	}
	if slices.Contains(roles[cl], p.Kind) {
		return nil
	}
	names := make([]string, len(roles[cl]))
	for i, k := range roles[cl] {
		names[i] = string(k)
	}
	return errorf(kernel.CodeForbidden, "this route needs a key of role %s; this key is %s", strings.Join(names, ", "), p.Kind)
}

// leaseOf reads the caller's lease from the dispatch headers.
func leaseOf(r *http.Request) (kernel.Lease, error) {
	id := headerValue(r.Header, wire.HeaderDispatchID)
	at := headerValue(r.Header, wire.HeaderDispatchAttempt)
	if id == "" || at == "" {
		return kernel.Lease{}, errorf(kernel.CodeValidation, "%s and %s are required on agent mutations", wire.HeaderDispatchID, wire.HeaderDispatchAttempt)
	}
	n, err := strconv.Atoi(at)
	if err != nil || n < 1 {
		return kernel.Lease{}, errorf(kernel.CodeValidation, "%s must be a positive integer, got %q", wire.HeaderDispatchAttempt, at)
	}
	return kernel.Lease{DispatchID: id, Attempt: n}, nil
}

// verifiers keeps a wire.Verifier per agent secret, so that checking a
// request reuses MACs keyed with its secret (wire.Verifier).
type verifiers struct {
	mu sync.RWMutex
	m  map[string]*wire.Verifier // by secret
}

// maxVerifiers bounds the verifiers kept; when full it starts over.
const maxVerifiers = 4096

// get returns the verifier of secret.
func (vs *verifiers) get(secret string) *wire.Verifier {
	vs.mu.RLock()
	v := vs.m[secret]
	vs.mu.RUnlock()
	if v != nil {
		return v
	}
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if v = vs.m[secret]; v == nil {
		if vs.m == nil || len(vs.m) >= maxVerifiers {
			vs.m = make(map[string]*wire.Verifier)
		}
		v = wire.NewVerifier([]byte(secret))
		vs.m[secret] = v
	}
	return v
}
