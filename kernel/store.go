package kernel

import (
	"context"
	"time"
)

// Store is the kernel's durable state: projections (executions, steps,
// agents, approvals, bundles, counters) and the append-only event log, all
// scoped by tenant. store/bbolt implements it on one bbolt file,
// store/postgres on a PostgreSQL database that several kernels (replicas)
// may share. kernel/storetest is the conformance suite every
// implementation must pass.
//
// # Transactions
//
// Update runs fn in a read-write transaction and commits when fn returns
// nil; an error or a panic rolls everything fn wrote back and is returned.
// Concurrent Updates may be folded into one commit (group commit): fn may
// therefore be run more than once (when another function in its batch fails
// the batch is retried without it), so fn must have no effect outside tx and
// must compute everything from what it reads in tx. Update returns only after
// the commit is durable (fsync'd, unless the store was opened without sync).
//
// View runs fn in a read-only snapshot.
//
// # Errors
//
// Lookups return an error matching ErrNotFound (errors.Is) when there is no
// such record. Put* validate nothing the kernel already validated, but
// AppendEvent refuses to overwrite an existing (execution, seq) and returns
// an error matching ErrConflict.
type Store interface {
	Update(ctx context.Context, fn func(tx Tx) error) error
	View(ctx context.Context, fn func(tx ReadTx) error) error
	Close() error
}

// ExecutionFilter selects executions for listing, newest first.
type ExecutionFilter struct {
	AgentID string
	Status  ExecStatus
	// Before, when set, returns only executions whose id sorts before it (keyset paging).
	Before string
	Limit  int
}

// DispatchRef names an execution whose dispatch is due or whose lease expired.
type DispatchRef struct {
	Tenant      string
	ExecutionID string
	At          time.Time
}

// ApprovalRef names a pending approval and when it expires.
type ApprovalRef struct {
	Tenant     string
	ApprovalID string
	At         time.Time
}

// OpenStepsLister is implemented by a store's transactions that can list
// the steps of an execution that are not terminal (succeeded, failed,
// cancelled) without reading every step's arguments and results; the
// kernel ends an execution with it, and with ReadTx.ListSteps otherwise.
type OpenStepsLister interface {
	OpenSteps(tenant, executionID string) ([]*Step, error)
}

// BundleRecord is a stored bundle: its identity, its owner and its archive
// (a reproducible .tar.gz of the bundle files).
type BundleRecord struct {
	Tenant   string `json:"tenant"`
	Name     string `json:"name"`
	Revision string `json:"revision"`
	Digest   string `json:"sha256"`
	Engine   string `json:"engine"`
	// Owner is who controls the bundle (BundleOwnerAdmin or
	// BundleOwnerTenant); a store returns what it was given, and a record
	// stored without one reads as the tenant's (BundleRecord.OwnedBy).
	Owner     BundleOwner `json:"owner,omitempty"`
	Archive   []byte      `json:"archive"`
	UpdatedAt time.Time   `json:"updated_at"`
	// Source, when set, is the bundle server the bundle is pulled from.
	Source *BundlePull `json:"source,omitempty"`
}

// BundleOwner is who controls a stored bundle.
type BundleOwner string

// Bundle owners.
const (
	// BundleOwnerAdmin: stored with an admin key (PUT ?tenant=) or by the
	// provisioning manifest. A tenant-admin may not replace or delete it;
	// only such a bundle may be one of its tenant's guards.
	BundleOwnerAdmin BundleOwner = "admin"
	// BundleOwnerTenant: stored by the tenant (a tenant-admin key).
	BundleOwnerTenant BundleOwner = "tenant"
)

// OwnedBy returns the bundle's owner; a record without one (stored before
// owners existed, by a store that does not migrate it) is the tenant's.
func (b *BundleRecord) OwnedBy() BundleOwner {
	if b.Owner == "" {
		return BundleOwnerTenant
	}
	return b.Owner
}

// Tenant is an isolated namespace.
type Tenant struct {
	ID     string   `json:"id"`
	Guards []string `json:"guards,omitempty"`
	// Retention overrides Config.Retention for the tenant's executions: a
	// Go duration ("720h"); "0s" keeps them forever; "" follows the kernel.
	Retention string `json:"retention,omitempty"`
	// BundleKeys verify the signatures of the tenant's bundles, beside the
	// kernel's own keys; with any key, its bundles must be signed.
	BundleKeys []BundleKey `json:"bundle_keys,omitempty"`
	// AllowBundleSources lets the tenant's tenant-admins point its bundles
	// at bundle servers (admins always may).
	AllowBundleSources bool      `json:"allow_bundle_sources,omitempty"`
	CreatedAt          time.Time `json:"created_at"`
}

// BundleKey is a key that verifies bundle signatures (OPA's key config): a
// PEM public key, or the shared secret of an HS* algorithm.
type BundleKey struct {
	ID        string `json:"id"`
	Algorithm string `json:"algorithm,omitempty"`
	Key       string `json:"key"`
	Scope     string `json:"scope,omitempty"`
}

// Key roles.
const (
	RoleAdmin       = "admin"
	RoleTenantAdmin = "tenant-admin"
	RoleClient      = "client"
	// RoleApprover reads and decides approvals and reads executions of its
	// tenant, and nothing else.
	RoleApprover = "approver"
)

// APIKey is a stored API key; only the sha256 of the secret is kept.
type APIKey struct {
	ID        string    `json:"key_id"`
	Tenant    string    `json:"tenant"`
	Role      string    `json:"role"`
	Principal string    `json:"principal"`
	Hash      string    `json:"hash"`
	CreatedAt time.Time `json:"created_at"`
	// IssuedByAdmin is set on keys the admin issued (an admin key, the
	// provisioning manifest): only they decide the approvals a tenant's
	// guards ask for. A tenant-admin's keys, and keys stored before the
	// field existed, are the tenant's.
	IssuedByAdmin bool `json:"issued_by_admin,omitempty"`
}

// ReadTx is a read-only view of the store.
type ReadTx interface {
	// Execution returns the execution, or ErrNotFound (also when it belongs to another tenant).
	Execution(tenant, id string) (*Execution, error)
	// ExecutionTenant returns the tenant that owns execution id, or ErrNotFound.
	ExecutionTenant(id string) (string, error)
	// ExecutionByIdempotencyKey returns the id created with key, or ErrNotFound.
	ExecutionByIdempotencyKey(tenant, key string) (string, error)
	// ListExecutions returns up to f.Limit executions, newest (largest id) first.
	ListExecutions(tenant string, f ExecutionFilter) ([]*Execution, error)

	// Step returns one step, or ErrNotFound.
	Step(tenant, executionID, stepID string) (*Step, error)
	// ListSteps returns the steps of an execution ordered by Seq.
	ListSteps(tenant, executionID string) ([]*Step, error)
	// StepsPage returns the steps of an execution with Seq > afterSeq,
	// ordered by Seq: at most limit of them, and no more once the records
	// read take maxBytes (at least one is returned; <= 0: no bound). more
	// reports that steps are left after the page.
	StepsPage(tenant, executionID string, afterSeq uint64, limit, maxBytes int) (steps []*Step, more bool, err error)
	// Occurrence returns the counter stored under key (zero value when absent).
	Occurrence(tenant, executionID, key string) (Occurrence, error)

	// Events returns up to limit events with seq > afterSeq, in seq order.
	Events(tenant, executionID string, afterSeq uint64, limit int) ([]Event, error)

	// Agent returns the agent (with its secret), or ErrNotFound.
	Agent(tenant, id string) (*Agent, error)
	// ListAgents returns the tenant's agents ordered by id.
	ListAgents(tenant string) ([]*Agent, error)
	// CountAgents returns how many agents the tenant has.
	CountAgents(tenant string) (int, error)

	// DueDispatches returns executions whose dispatch is queued with DueAt <= now, oldest first.
	DueDispatches(now time.Time, limit int) ([]DispatchRef, error)
	// NextDue returns the earliest DueAt of any queued dispatch (zero, false when none).
	NextDue() (time.Time, bool, error)
	// ExpiredLeases returns executions whose dispatch is delivering or acked with LeaseUntil <= now.
	ExpiredLeases(now time.Time, limit int) ([]DispatchRef, error)

	// Approval returns one approval, or ErrNotFound.
	Approval(tenant, id string) (*Approval, error)
	// ListApprovals returns the tenant's approvals (all when status is empty), newest first.
	ListApprovals(tenant string, status ApprovalStatus) ([]*Approval, error)
	// ExpiredApprovals returns pending approvals with ExpiresAt <= now.
	ExpiredApprovals(now time.Time, limit int) ([]ApprovalRef, error)

	// Bundle returns a stored bundle, or ErrNotFound.
	Bundle(tenant, name string) (*BundleRecord, error)
	// ListBundles returns all stored bundles of a tenant ordered by name; tenant "" lists every tenant's.
	ListBundles(tenant string) ([]*BundleRecord, error)

	// Counter returns the opaque rate-limit state stored under key (nil when absent).
	Counter(tenant, key string) ([]byte, error)

	// Tenant returns a tenant, or ErrNotFound; ListTenants lists all.
	Tenant(id string) (*Tenant, error)
	ListTenants() ([]*Tenant, error)
	// APIKeyByHash finds a key by the sha256 of its secret, or ErrNotFound.
	APIKeyByHash(hash string) (*APIKey, error)
	// ListAPIKeys lists a tenant's keys.
	ListAPIKeys(tenant string) ([]*APIKey, error)
	// CountAPIKeys returns how many keys the tenant has.
	CountAPIKeys(tenant string) (int, error)
}

// ExecutionHeadReader is implemented by a ReadTx that can read an
// execution without its input, which a store may keep apart from the
// rest of the record (the embedded store does). SubmitStep's read before
// it decides uses it when the store offers it: it never looks at the
// input, which may be large, and would otherwise read and copy it on
// every step. A store without it is read with Execution.
type ExecutionHeadReader interface {
	// ExecutionHead is Execution, except that in a read-only transaction
	// it may leave Input nil. In a write transaction (whose executions
	// may be written back) it must read the input as Execution does.
	ExecutionHead(tenant, id string) (*Execution, error)
}

// ExecutionScanner is implemented by a ReadTx whose reads can hold up the
// store's writer while they run (the embedded store's Views read its open
// write transaction under a lock). ListExecutions with a filter uses it to
// examine a tenant's executions a bounded number at a time, one read
// transaction each, instead of all of them in one: a filter that matches
// few of many executions would otherwise hold every tenant's writes for as
// long as it scans. A store without it is read with ListExecutions.
type ExecutionScanner interface {
	// ScanExecutions is ListExecutions examining at most maxScan of the
	// tenant's executions (newest first, from f.Before). resume is the id
	// to pass as f.Before to go on after the last one examined, "" when
	// none is left or f.Limit was reached.
	ScanExecutions(tenant string, f ExecutionFilter, maxScan int) (out []*Execution, resume string, err error)
}

// ApprovalScanner is to ListApprovals what ExecutionScanner is to
// ListExecutions: ListApprovals reads a tenant's approvals a bounded
// number per read transaction with it.
type ApprovalScanner interface {
	// ScanApprovals returns, in no particular order, the tenant's
	// approvals with the status (all when empty) among at most maxScan of
	// them, in the store's order from just after the key position after
	// ("" from the first). resume is where the next call goes on ("" when
	// none is left).
	ScanApprovals(tenant string, status ApprovalStatus, after string, maxScan int) (out []*Approval, resume string, err error)
}

// PendingApprovalScanner lets PendingApprovals read the store's index of
// pending approvals a bounded number per read transaction, as
// ExecutionScanner does for lists.
type PendingApprovalScanner interface {
	// ScanPendingApprovals returns up to max entries of the index of
	// pending approvals (ExpiredApprovals's, in its order) after the
	// position after ("" from the first). resume is where the next call
	// goes on ("" when none is left).
	ScanPendingApprovals(after string, max int) (refs []ApprovalRef, resume string, err error)
}

// Tx is a read-write transaction.
type Tx interface {
	ReadTx
	// PutExecution writes the execution and keeps every index derived from it
	// (tenant, idempotency key, due dispatches, lease expiry, listing) in step
	// with its new value.
	PutExecution(e *Execution) error
	// PutStep writes a step.
	PutStep(s *Step) error
	// PutOccurrence writes an occurrence counter.
	PutOccurrence(tenant, executionID, key string, o Occurrence) error
	// AppendEvent appends an event; an existing (execution, seq) is ErrConflict.
	AppendEvent(tenant string, ev Event) error

	PutAgent(a *Agent) error
	DeleteAgent(tenant, id string) error

	// PutApproval writes an approval and keeps the expiry index of pending ones.
	PutApproval(a *Approval) error

	PutBundle(b *BundleRecord) error
	DeleteBundle(tenant, name string) error

	PutCounter(tenant, key string, value []byte) error

	// DeleteExecution deletes an execution and everything stored under it:
	// its steps, the approvals they asked for, occurrence counters, the
	// counters whose key starts with ExecCounterPrefix(id), its events and
	// finally the execution with its index entries. It deletes at most
	// limit records (limit <= 0: all), the events newest first with LastSeq
	// following them (the log left is always 1..LastSeq), and reports what
	// it deleted and whether the execution itself is gone (done); call it
	// again, in another transaction, until it is. An implementation may
	// delete more than limit. A missing execution is ErrNotFound.
	// Retention calls it for terminal executions.
	DeleteExecution(tenant, id string, limit int) (st PurgeStats, done bool, err error)

	PutTenant(t *Tenant) error
	PutAPIKey(k *APIKey) error
	DeleteAPIKey(tenant, id string) error
}
