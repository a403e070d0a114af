package bbolt

import (
	"errors"
	"fmt"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// v1Golden is what testdata/v1.db.gz holds, as the schema 1 code read it
// back through kernel.ReadTx (testdata/v1.json). It was written by the
// schema 1 code: see TestMigrateV1File.
type v1Golden struct {
	Executions  []*kernel.Execution     `json:"executions"`
	Steps       []*kernel.Step          `json:"steps"`
	Occurrence  kernel.Occurrence       `json:"occurrence"`
	Events      []kernel.Event          `json:"events"`
	Approvals   []*kernel.Approval      `json:"approvals"`
	Agents      []*kernel.Agent         `json:"agents"`
	Tenants     []*kernel.Tenant        `json:"tenants"`
	APIKeys     []*kernel.APIKey        `json:"api_keys"`
	Bundles     []*kernel.BundleRecord  `json:"bundles"`
	Counter     string                  `json:"counter"`
	Idempotency map[string]string       `json:"idempotency"`
	Due         []kernel.DispatchRef    `json:"due"`
	Leases      []kernel.DispatchRef    `json:"leases"`
	Expiring    []kernel.ApprovalRef    `json:"expiring"`
	Owners      map[string]string       `json:"owners"`
	ByHash      *kernel.APIKey          `json:"by_hash"`
	Extra       map[string]*kernel.Step `json:"extra,omitempty"`
}

const (
	v1Exec1 = "01960000-0000-7000-8000-000000000001"
	v1Exec2 = "01960000-0000-7000-8000-000000000002"
)

// readGolden reads every record of the v1 file through tx.
func readGolden(tx kernel.ReadTx, g *v1Golden) error {
	far := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	g.Owners, g.Idempotency = map[string]string{}, map[string]string{}
	for _, c := range []struct{ tenant, id, idem string }{{"t", v1Exec1, "idem-1"}, {"u", v1Exec2, "idem-2"}} {
		e, err := tx.Execution(c.tenant, c.id)
		add(err)
		g.Executions = append(g.Executions, e)
		owner, err := tx.ExecutionTenant(c.id)
		add(err)
		g.Owners[c.id] = owner
		id, err := tx.ExecutionByIdempotencyKey(c.tenant, c.idem)
		add(err)
		g.Idempotency[c.idem] = id
		evs, err := tx.Events(c.tenant, c.id, 0, 0)
		add(err)
		g.Events = append(g.Events, evs...)
	}
	steps, err := tx.ListSteps("t", v1Exec1)
	add(err)
	g.Steps = steps
	g.Occurrence, err = tx.Occurrence("t", v1Exec1, "llm_call\x00ab12\x00gpt")
	add(err)
	g.Approvals, err = tx.ListApprovals("t", "")
	add(err)
	g.Agents, err = tx.ListAgents("t")
	add(err)
	g.Tenants, err = tx.ListTenants()
	add(err)
	g.APIKeys, err = tx.ListAPIKeys("t")
	add(err)
	g.ByHash, err = tx.APIKeyByHash("h1")
	add(err)
	g.Bundles, err = tx.ListBundles("")
	add(err)
	c, err := tx.Counter("t", "rl")
	add(err)
	g.Counter = string(c)
	g.Due, err = tx.DueDispatches(far, 0)
	add(err)
	g.Leases, err = tx.ExpiredLeases(far, 0)
	add(err)
	g.Expiring, err = tx.ExpiredApprovals(far, 0)
	add(err)
	if len(g.Executions) != 2 || len(g.Steps) != 2 || len(g.Events) != 5 {
		add(fmt.Errorf("read %d executions, %d steps, %d events; want 2, 2, 5", len(g.Executions), len(g.Steps), len(g.Events)))
	}
	return errors.Join(errs...)
}
