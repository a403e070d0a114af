package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// API routes whose permission decides what a page shows (spelled as the
// API's route table spells them; see GET /v0/whoami).
const (
	routeApprovals     = "GET /v0/approvals"
	routeGrant         = "POST /v0/approvals/{approval_id}/grant"
	routeExecutions    = "GET /v0/executions"
	routeCancel        = "POST /v0/executions/{id}/cancel"
	routeBundles       = "GET /v0/bundles"
	routeAgents        = "GET /v0/agents"
	routeTenants       = "GET /v0/tenants"
	routeCreateTenant  = "POST /v0/tenants"
	routeKeys          = "GET /v0/tenants/{tenant}/keys"
	routeCreateKey     = "POST /v0/tenants/{tenant}/keys"
	routeRevokeKey     = "DELETE /v0/tenants/{tenant}/keys/{key_id}"
	maxDecidedListed   = 200
	maxTimelineEvents  = 1000
	executionsPageSize = 50
)

// The API's pages the console reads (variables for tests): approvals are
// read a page at a time up to maxPendingListed pending ones, and an
// execution's steps stepsPageSize at a time, with links to the next page.
var (
	approvalsPageSize = 1000
	maxPendingListed  = 5000
	maxApprovalsRead  = 20000
	stepsPageSize     = 1000
)

// landing sends a key to its first page: approvals for those who may read
// them (an approver's landing page), executions otherwise.
func (c *Console) landing(q *req) {
	switch {
	case q.may(routeApprovals):
		http.Redirect(q.w, q.r, q.link("/ui/approvals"), http.StatusSeeOther)
	case q.may(routeExecutions):
		http.Redirect(q.w, q.r, q.link("/ui/executions"), http.StatusSeeOther)
	default:
		c.render(q.w, q.r, http.StatusOK, "empty", q, nil)
	}
}

// link adds the page's ?tenant= (an admin looking at another tenant) to a
// console path.
func (q *req) link(path string) string {
	t := q.r.URL.Query().Get("tenant")
	if t == "" {
		return path
	}
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return path + sep + "tenant=" + url.QueryEscape(t)
}

// approvalView is an approval as the page shows it.
type approvalView struct {
	wire.Approval
	// MayDecide: the key may call the decision routes and the kernel will
	// take its decision (kernel.MayDecide over the approvers); an admin may
	// also decide for a named approver.
	MayDecide bool
	Admin     bool
	// OnBehalf: the viewer is an admin not among the approval's approvers,
	// so the kernel takes a decision only on behalf of one of them.
	OnBehalf bool
}

func (c *Console) approvalsPage(q *req) {
	if !q.may(routeApprovals) {
		c.fail(q.w, q.r, q, http.StatusForbidden, "This key ("+q.who.Role+") may not read approvals.")
		return
	}
	qs := q.r.URL.Query()
	status, agent := qs.Get("status"), strings.TrimSpace(qs.Get("agent"))
	// Every pending approval (the oldest expire first, so none may hide
	// behind a page), up to maxPendingListed.
	pending, morePending, err := c.approvals(q, string(kernel.ApprovalPending), maxPendingListed, nil)
	if err != nil {
		c.apiFail(q, err)
		return
	}
	// The newest decided ones the filter wants, one more than are listed
	// (to tell there are more): a status filter reads only that status.
	decidedStatus := ""
	if status != string(kernel.ApprovalPending) {
		decidedStatus = status
	}
	all, moreDecided, err := c.approvals(q, decidedStatus, maxDecidedListed+1, func(a wire.Approval) bool {
		return a.Status != string(kernel.ApprovalPending) && (agent == "" || a.AgentID == agent)
	})
	if err != nil {
		c.apiFail(q, err)
		return
	}
	admin := q.who.Role == kernel.RoleAdmin
	var pv []approvalView
	for _, a := range pending {
		if agent != "" && a.AgentID != agent {
			continue
		}
		may := q.may(routeGrant) && (admin || kernel.MayDecide(a.Approvers, q.who.Principal))
		pv = append(pv, approvalView{Approval: a, MayDecide: may, Admin: admin, OnBehalf: admin && !kernel.MayDecide(a.Approvers, q.who.Principal)})
	}
	sort.SliceStable(pv, func(i, j int) bool { return pv[i].ExpiresAt.Before(pv[j].ExpiresAt) })
	var decided []wire.Approval
	for _, a := range all {
		if a.Status == string(kernel.ApprovalPending) || status != "" && a.Status != status || agent != "" && a.AgentID != agent {
			continue
		}
		decided = append(decided, a)
	}
	sort.SliceStable(decided, func(i, j int) bool { return decidedAt(decided[i]).After(decidedAt(decided[j])) })
	more := moreDecided
	if len(decided) > maxDecidedListed {
		more = true
		decided = decided[:maxDecidedListed]
	}
	c.render(q.w, q.r, http.StatusOK, "approvals", q, map[string]any{
		"Pending": pv, "MorePending": morePending, "MaxPending": maxPendingListed, "Decided": decided, "More": more, "Status": status, "Agent": agent,
		"Statuses": []string{"granted", "denied", "expired", "happened"}, "Done": qs.Get("done"),
	})
}

// approvals reads a key's approvals of a status ("": every status), newest
// first, following the API's pages until there are none left, until most
// of those read are wanted (want nil: all are), or until maxApprovalsRead
// are read; more reports that some were left unread.
func (c *Console) approvals(q *req, status string, most int, want func(wire.Approval) bool) (list []wire.Approval, more bool, err error) {
	v := url.Values{}
	if status != "" {
		v.Set("status", status)
	}
	v.Set("limit", strconv.Itoa(approvalsPageSize))
	wanted := 0
	for read := 0; ; {
		var page wire.ApprovalList
		if err := c.call(q, "GET", "/v0/approvals?"+v.Encode(), nil, &page); err != nil {
			return nil, false, err
		}
		read += len(page.Approvals)
		for _, a := range page.Approvals {
			if want == nil || want(a) {
				list = append(list, a)
				wanted++
			}
		}
		if page.NextCursor == "" {
			return list, false, nil
		}
		if wanted >= most || read >= maxApprovalsRead {
			return list, true, nil
		}
		v.Set("cursor", page.NextCursor)
	}
}

func decidedAt(a wire.Approval) time.Time {
	if a.DecidedAt != nil {
		return *a.DecidedAt
	}
	return a.ExpiresAt
}

// decide grants or denies (or, for an interrupted side effect, retries or
// records as happened) an approval, as the session's key.
func (c *Console) decide(q *req) {
	id, answer := q.r.PathValue("id"), q.r.PathValue("answer")
	switch answer {
	case "grant", "deny", "retry", "happened":
	default:
		c.fail(q.w, q.r, q, http.StatusNotFound, "No such answer: "+answer)
		return
	}
	body := wire.ResolveApprovalRequest{Rationale: strings.TrimSpace(q.form.Get("rationale")),
		RequestHash: q.form.Get("request_hash"), DecidedBy: strings.TrimSpace(q.form.Get("on_behalf_of"))}
	if answer == "happened" {
		res := strings.TrimSpace(q.form.Get("result"))
		if res == "" {
			res = "null"
		}
		if !json.Valid([]byte(res)) {
			c.fail(q.w, q.r, q, http.StatusBadRequest, "The result of an effect that happened must be JSON (a string in quotes, a number, an object…).")
			return
		}
		body.Result = json.RawMessage(res)
	}
	if err := c.call(q, "POST", "/v0/approvals/"+url.PathEscape(id)+"/"+answer, body, nil); err != nil {
		c.apiFail(q, err)
		return
	}
	http.Redirect(q.w, q.r, q.link("/ui/approvals?done="+url.QueryEscape(answer+" "+id)), http.StatusSeeOther)
}

func (c *Console) executionsPage(q *req) {
	if !q.may(routeExecutions) {
		c.fail(q.w, q.r, q, http.StatusForbidden, "This key ("+q.who.Role+") may not read executions.")
		return
	}
	qs := q.r.URL.Query()
	v := url.Values{}
	for _, k := range []string{"status", "agent_id", "cursor"} {
		if x := strings.TrimSpace(qs.Get(k)); x != "" {
			v.Set(k, x)
		}
	}
	v.Set("limit", strconv.Itoa(executionsPageSize))
	var list wire.ExecutionList
	if err := c.call(q, "GET", "/v0/executions?"+v.Encode(), nil, &list); err != nil {
		c.apiFail(q, err)
		return
	}
	next := ""
	if list.NextCursor != "" {
		nv := url.Values{}
		for _, k := range []string{"status", "agent_id"} {
			if x := v.Get(k); x != "" {
				nv.Set(k, x)
			}
		}
		nv.Set("cursor", list.NextCursor)
		next = q.link("/ui/executions?" + nv.Encode())
	}
	c.render(q.w, q.r, http.StatusOK, "executions", q, map[string]any{
		"Executions": list.Executions, "Status": v.Get("status"), "Agent": v.Get("agent_id"), "Next": next,
		"Paged":    v.Get("cursor") != "",
		"Statuses": []string{"pending", "running", "blocked", "completed", "failed", "cancelled"},
	})
}

// executionData is what the execution page and its live fragment show.
type executionData struct {
	Execution wire.Execution
	// Steps is a page of the execution's steps in seq order: the first,
	// or the one after the step seq the page's steps query names.
	Steps []wire.Step
	// StepsFirst and StepsNext link to the first page of steps (set when
	// this is not it) and to the next one (set when there is one).
	StepsFirst, StepsNext string
	Terminal              bool
	MayCancel             bool
}

func (c *Console) loadExecution(q *req) (*executionData, error) {
	id := url.PathEscape(q.r.PathValue("id"))
	d := &executionData{}
	if err := c.call(q, "GET", "/v0/executions/"+id, nil, &d.Execution); err != nil {
		return nil, err
	}
	v := url.Values{}
	v.Set("limit", strconv.Itoa(stepsPageSize))
	after := strings.TrimSpace(q.r.URL.Query().Get("steps"))
	if after != "" {
		v.Set("cursor", after)
	}
	var steps wire.StepList
	if err := c.call(q, "GET", "/v0/executions/"+id+"/steps?"+v.Encode(), nil, &steps); err != nil {
		return nil, err
	}
	d.Steps = steps.Steps
	page := "/ui/executions/" + id
	if after != "" {
		d.StepsFirst = q.link(page)
	}
	if steps.NextCursor != "" {
		d.StepsNext = q.link(page + "?" + url.Values{"steps": {steps.NextCursor}}.Encode())
	}
	switch d.Execution.Status {
	case string(kernel.ExecCompleted), string(kernel.ExecFailed), string(kernel.ExecCancelled):
		d.Terminal = true
	}
	d.MayCancel = !d.Terminal && q.may(routeCancel)
	return d, nil
}

func (c *Console) executionPage(q *req) {
	d, err := c.loadExecution(q)
	if err != nil {
		c.apiFail(q, err)
		return
	}
	var evs wire.EventList
	if err := c.call(q, "GET", "/v0/executions/"+url.PathEscape(d.Execution.ID)+"/events?limit="+strconv.Itoa(maxTimelineEvents), nil, &evs); err != nil {
		c.apiFail(q, err)
		return
	}
	var last uint64
	if n := len(evs.Events); n > 0 {
		last = evs.Events[n-1].Seq
	}
	c.render(q.w, q.r, http.StatusOK, "execution", q, map[string]any{
		"D": d, "Events": evs.Events, "LastSeq": last, "Truncated": len(evs.Events) == maxTimelineEvents,
		"Stream": q.link("/ui/executions/" + url.PathEscape(d.Execution.ID) + "/stream"),
		"Live":   q.link("/ui/executions/" + url.PathEscape(d.Execution.ID) + "/live" + stepsQuery(q)),
	})
}

// stepsQuery is the query that keeps the page of steps q shows ("" for
// the first), for the page's live fragment.
func stepsQuery(q *req) string {
	if after := strings.TrimSpace(q.r.URL.Query().Get("steps")); after != "" {
		return "?" + url.Values{"steps": {after}}.Encode()
	}
	return ""
}

// executionLive is the execution page's live part (status, totals, output,
// steps), which the page's script fetches again as events arrive.
func (c *Console) executionLive(q *req) {
	d, err := c.loadExecution(q)
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			http.Error(q.w, ae.Message, ae.Status)
			return
		}
		http.Error(q.w, err.Error(), http.StatusBadGateway)
		return
	}
	c.render(q.w, q.r, http.StatusOK, "live", q, map[string]any{"D": d})
}

func (c *Console) cancel(q *req) {
	id := q.r.PathValue("id")
	if err := c.call(q, "POST", "/v0/executions/"+url.PathEscape(id)+"/cancel", struct{}{}, nil); err != nil {
		c.apiFail(q, err)
		return
	}
	http.Redirect(q.w, q.r, q.link("/ui/executions/"+url.PathEscape(id)), http.StatusSeeOther)
}

// bundleRow is a bundle with the agents bound to it.
type bundleRow struct {
	wire.Bundle
	Agents []string
}

func (c *Console) bundlesPage(q *req) {
	if !q.may(routeBundles) {
		c.fail(q.w, q.r, q, http.StatusForbidden, "This key ("+q.who.Role+") may not read bundles.")
		return
	}
	var bl wire.BundleList
	if err := c.call(q, "GET", "/v0/bundles", nil, &bl); err != nil {
		c.apiFail(q, err)
		return
	}
	var al wire.AgentList
	if q.may(routeAgents) {
		if err := c.call(q, "GET", "/v0/agents", nil, &al); err != nil {
			c.apiFail(q, err)
			return
		}
	}
	rows := make([]bundleRow, 0, len(bl.Bundles))
	for _, b := range bl.Bundles {
		row := bundleRow{Bundle: b}
		for _, a := range al.Agents {
			if a.Bundle == b.Name {
				row.Agents = append(row.Agents, a.ID)
			}
		}
		rows = append(rows, row)
	}
	c.render(q.w, q.r, http.StatusOK, "bundles", q, map[string]any{"Bundles": rows})
}

func (c *Console) tenantsPage(q *req) {
	if !q.may(routeTenants) {
		c.fail(q.w, q.r, q, http.StatusForbidden, "This key ("+q.who.Role+") may not list tenants.")
		return
	}
	var tl wire.TenantList
	if err := c.call(q, "GET", "/v0/tenants", nil, &tl); err != nil {
		c.apiFail(q, err)
		return
	}
	c.render(q.w, q.r, http.StatusOK, "tenants", q, map[string]any{"Tenants": tl.Tenants, "MayCreate": q.may(routeCreateTenant)})
}

func (c *Console) createTenant(q *req) {
	id := strings.TrimSpace(q.form.Get("id"))
	if err := c.call(q, "POST", "/v0/tenants", wire.TenantRequest{ID: id}, nil); err != nil {
		c.apiFail(q, err)
		return
	}
	http.Redirect(q.w, q.r, "/ui/tenants", http.StatusSeeOther)
}

// keysTenant is the tenant whose keys a keys page shows: ?tenant= or the
// key's own.
func (q *req) keysTenant() string {
	if t := q.r.URL.Query().Get("tenant"); t != "" {
		return t
	}
	return q.who.Tenant
}

func (c *Console) keysPage(q *req) { c.showKeys(q, http.StatusOK, nil) }

func (c *Console) showKeys(q *req, status int, created *wire.CreatedKey) {
	if !q.may(routeKeys) {
		c.fail(q.w, q.r, q, http.StatusForbidden, "This key ("+q.who.Role+") may not manage keys.")
		return
	}
	t := q.keysTenant()
	var kl wire.KeyList
	if err := c.call(q, "GET", "/v0/tenants/"+url.PathEscape(t)+"/keys", nil, &kl); err != nil {
		c.apiFail(q, err)
		return
	}
	roles := []string{kernel.RoleApprover, kernel.RoleClient, kernel.RoleTenantAdmin}
	if q.who.Role == kernel.RoleAdmin && t == kernel.DefaultTenant {
		roles = append(roles, kernel.RoleAdmin)
	}
	if created != nil {
		q.w.Header().Set("Cache-Control", "no-store")
	}
	c.render(q.w, q.r, status, "keys", q, map[string]any{"Tenant": t, "Keys": kl.Keys, "Created": created, "Roles": roles,
		"MayCreate": q.may(routeCreateKey), "MayRevoke": q.may(routeRevokeKey)})
}

// createKey issues a key and shows its secret on the answer to the POST
// itself (never in a URL, never again).
func (c *Console) createKey(q *req) {
	t := q.keysTenant()
	var ck wire.CreatedKey
	body := wire.KeyRequest{Role: q.form.Get("role"), Principal: strings.TrimSpace(q.form.Get("principal"))}
	if err := c.call(q, "POST", "/v0/tenants/"+url.PathEscape(t)+"/keys", body, &ck); err != nil {
		c.apiFail(q, err)
		return
	}
	c.showKeys(q, http.StatusCreated, &ck)
}

func (c *Console) revokeKey(q *req) {
	t := q.keysTenant()
	if err := c.call(q, "DELETE", "/v0/tenants/"+url.PathEscape(t)+"/keys/"+url.PathEscape(q.r.PathValue("id")), nil, nil); err != nil {
		c.apiFail(q, err)
		return
	}
	http.Redirect(q.w, q.r, q.link("/ui/keys"), http.StatusSeeOther)
}

// apiFail shows an API refusal with the API's status and message; a key
// found invalid mid-request ends the session.
func (c *Console) apiFail(q *req, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		if ae.Status == http.StatusUnauthorized {
			if ck, e := q.r.Cookie(CookieName); e == nil {
				c.sess.drop(ck.Value)
			}
			c.clearCookie(q.w, q.r)
			c.toSignin(q.w, q.r, "Your session has ended: its API key is no longer valid. Sign in again.")
			return
		}
		c.fail(q.w, q.r, q, ae.Status, ae.Message)
		return
	}
	c.log.Error("console: API call", "path", q.r.URL.Path, "err", err)
	c.fail(q.w, q.r, q, http.StatusInternalServerError, "Internal error (see the kernel log).")
}

// fail renders an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, q *req, status int, msg string) {
	c.render(w, r, status, "error", q, map[string]any{"Message": msg, "Status": status, "StatusText": http.StatusText(status)})
}

// prettyJSON indents a JSON value (as text; the template folds long strings).
func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

// navItem is one entry of the navigation.
type navItem struct {
	Label, Href string
	Current     bool
}

// nav lists the pages the key may see.
func (q *req) nav() []navItem {
	var out []navItem
	add := func(label, path, route string) {
		if q.may(route) {
			out = append(out, navItem{Label: label, Href: q.link(path), Current: strings.HasPrefix(q.r.URL.Path, path)})
		}
	}
	add("Approvals", "/ui/approvals", routeApprovals)
	add("Executions", "/ui/executions", routeExecutions)
	add("Bundles", "/ui/bundles", routeBundles)
	add("Tenants", "/ui/tenants", routeTenants)
	add("Keys", "/ui/keys", routeKeys)
	return out
}

// timeLeft says how long until t, for people.
func timeLeft(now, t time.Time) string {
	d := t.Sub(now)
	if d <= 0 {
		return "expired"
	}
	switch {
	case d < time.Minute:
		return "under a minute left"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + " min left"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + " h " + strconv.Itoa(int(d%time.Hour/time.Minute)) + " min left"
	default:
		return strconv.Itoa(int(d/(24*time.Hour))) + " days left"
	}
}

// contains is slices.Contains for templates.
func contains(list []string, s string) bool { return slices.Contains(list, s) }
