package kernel

import (
	"fmt"
	"log/slog"
	"time"
)

// ApprovalExpiry is what an expired approval does (Config.ApprovalExpiry).
type ApprovalExpiry string

// Approval-expiry behaviours.
const (
	// ExpireFailsExecution fails the execution with reason approval_expired (default).
	ExpireFailsExecution ApprovalExpiry = "fail_execution"
	// ExpireDeniesStep denies the step and resumes the execution.
	ExpireDeniesStep ApprovalExpiry = "deny_step"
)

// Config holds the kernel's operational settings. The zero value of a field
// means its default; see DefaultConfig.
type Config struct {
	// LeaseTimeout is how long a claimed dispatch attempt holds its lease
	// without a heartbeat or mutation (default 90s).
	LeaseTimeout time.Duration
	// DispatchMaxAttempts bounds the claims of one dispatch; past it the
	// execution fails with dispatch_exhausted (default 10).
	DispatchMaxAttempts int
	// DispatchTimeout bounds one webhook POST (default 10s); it must be shorter than LeaseTimeout.
	DispatchTimeout time.Duration
	// DispatchBackoff is the delay after the first failed delivery; it
	// doubles per failure up to DispatchBackoffMax (defaults 500ms, 1m).
	DispatchBackoff    time.Duration
	DispatchBackoffMax time.Duration
	// DeliveryConcurrency bounds webhook POSTs in flight (default 64).
	DeliveryConcurrency int
	// ApprovalTimeout is the default lifetime of an approval (default 24h).
	ApprovalTimeout time.Duration
	// ApprovalExpiry is ExpireFailsExecution (default) or ExpireDeniesStep.
	ApprovalExpiry ApprovalExpiry
	// ReapInterval is how often expired leases and approvals are looked for (default 1s).
	ReapInterval time.Duration
	// BundleLoadTimeout bounds the compilation of one stored bundle at
	// boot; a bundle that takes longer is skipped (default 10s).
	BundleLoadTimeout time.Duration
	// BundleLoadTenantBudget bounds the time one tenant's stored bundles
	// spend compiling when they are loaded together (at boot, and when a
	// replica resynchronises): past it, the tenant's bundles not yet
	// compiled are skipped like ones that failed (default 60s; negative:
	// no budget). Without it a tenant's bundles held the boot for
	// BundleLoadTimeout each.
	BundleLoadTenantBudget time.Duration
	// Logger receives operational logs (default slog.Default()).
	Logger *slog.Logger
	// Replica names this kernel among the replicas sharing its store; the
	// dispatch.claimed events it writes carry it ("replica"), so the log
	// says which replica delivered each attempt. Empty: not recorded.
	Replica string
	// Clock is the kernel's time: event times, lease and approval expiry,
	// execution deadlines and max_duration (default SystemClock). Tests set
	// a clock they move by hand.
	Clock Clock
	// Observer receives measurements (nil: none are taken).
	Observer Observer
	// Retention is how long terminal executions are kept before retention
	// deletes them with their events, steps, approvals and counters (0:
	// forever, the default; at least MinRetention). Tenant.Retention
	// overrides it per tenant.
	Retention time.Duration
	// RetentionInterval is the time between retention passes (default 1m).
	RetentionInterval time.Duration
	// RetentionBatch bounds the records one retention transaction deletes
	// (default 2000; an execution larger than that is deleted alone).
	RetentionBatch int
	// RetentionPause is the pause between retention transactions (default
	// 10ms), so that step traffic keeps the store's writer.
	RetentionPause time.Duration
	// MaxTenantBundles bounds the bundles a tenant's own keys may store in
	// it (default 1000; negative: no ceiling). Bundles the admin stores are
	// counted but never refused.
	MaxTenantBundles int
	// MaxTenantBundleBytes bounds the bytes of a tenant's bundles, each
	// counting the larger of its stored archive and its unpacked files
	// (which the kernel holds in memory), as MaxTenantBundles bounds their
	// number (default 256 MiB; negative: no ceiling).
	MaxTenantBundleBytes int64
	// MaxTenantAgents bounds the agents of a tenant (default 10000;
	// negative: no ceiling).
	MaxTenantAgents int
	// MaxTenantKeys bounds the API keys of a tenant (default 1000;
	// negative: no ceiling).
	MaxTenantKeys int
	// LLMGatewayTokens gives every claimed dispatch attempt an LLM gateway
	// token (Delivery.LLMGatewayToken; see AuthenticateLLMToken). Set it
	// when the LLM gateway is served.
	LLMGatewayTokens bool
}

// Clock tells the kernel the time. Now must be safe for concurrent use.
type Clock interface {
	Now() time.Time
}

// SystemClock is the machine's clock.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }

// DefaultConfig returns the defaults `wicket serve` documents (README,
// Configuration).
func DefaultConfig() Config {
	return Config{
		LeaseTimeout:         90 * time.Second,
		DispatchMaxAttempts:  10,
		DispatchTimeout:      10 * time.Second,
		DispatchBackoff:      500 * time.Millisecond,
		DispatchBackoffMax:   time.Minute,
		DeliveryConcurrency:  64,
		ApprovalTimeout:      24 * time.Hour,
		ApprovalExpiry:       ExpireFailsExecution,
		ReapInterval:         time.Second,
		BundleLoadTimeout:    10 * time.Second,
		RetentionInterval:    time.Minute,
		RetentionBatch:       2000,
		RetentionPause:       10 * time.Millisecond,
		MaxTenantBundles:     1000,
		MaxTenantBundleBytes: 256 << 20,
		MaxTenantAgents:      10000,
		MaxTenantKeys:        1000,

		BundleLoadTenantBudget: time.Minute,
	}
}

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.LeaseTimeout == 0 {
		c.LeaseTimeout = d.LeaseTimeout
	}
	if c.DispatchMaxAttempts == 0 {
		c.DispatchMaxAttempts = d.DispatchMaxAttempts
	}
	if c.DispatchTimeout == 0 {
		c.DispatchTimeout = min(d.DispatchTimeout, c.LeaseTimeout/2)
	}
	if c.DispatchBackoff == 0 {
		c.DispatchBackoff = d.DispatchBackoff
	}
	if c.DispatchBackoffMax == 0 {
		c.DispatchBackoffMax = d.DispatchBackoffMax
	}
	if c.DeliveryConcurrency == 0 {
		c.DeliveryConcurrency = d.DeliveryConcurrency
	}
	if c.ApprovalTimeout == 0 {
		c.ApprovalTimeout = d.ApprovalTimeout
	}
	if c.ApprovalExpiry == "" {
		c.ApprovalExpiry = d.ApprovalExpiry
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = d.ReapInterval
	}
	if c.BundleLoadTimeout <= 0 {
		c.BundleLoadTimeout = d.BundleLoadTimeout
	}
	if c.BundleLoadTenantBudget == 0 {
		c.BundleLoadTenantBudget = d.BundleLoadTenantBudget
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = d.RetentionInterval
	}
	if c.RetentionBatch == 0 {
		c.RetentionBatch = d.RetentionBatch
	}
	if c.RetentionPause == 0 {
		c.RetentionPause = d.RetentionPause
	}
	if c.MaxTenantBundles == 0 {
		c.MaxTenantBundles = d.MaxTenantBundles
	}
	if c.MaxTenantBundleBytes == 0 {
		c.MaxTenantBundleBytes = d.MaxTenantBundleBytes
	}
	if c.MaxTenantAgents == 0 {
		c.MaxTenantAgents = d.MaxTenantAgents
	}
	if c.MaxTenantKeys == 0 {
		c.MaxTenantKeys = d.MaxTenantKeys
	}
	return c
}

// Validate reports the first invalid setting.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.LeaseTimeout < 10*time.Millisecond:
		return fmt.Errorf("lease timeout %s is too short", c.LeaseTimeout)
	case c.DispatchMaxAttempts < 1:
		return fmt.Errorf("dispatch max attempts must be >= 1, got %d", c.DispatchMaxAttempts)
	case c.DispatchTimeout < 0:
		return fmt.Errorf("dispatch timeout %s must not be negative", c.DispatchTimeout)
	case c.ApprovalTimeout < 0:
		return fmt.Errorf("approval timeout %s must not be negative", c.ApprovalTimeout)
	case c.DispatchTimeout >= c.LeaseTimeout:
		return fmt.Errorf("dispatch timeout %s must be shorter than the lease timeout %s", c.DispatchTimeout, c.LeaseTimeout)
	case c.DispatchBackoff <= 0 || c.DispatchBackoffMax < c.DispatchBackoff:
		return fmt.Errorf("dispatch backoff %s..%s is invalid", c.DispatchBackoff, c.DispatchBackoffMax)
	case c.ApprovalExpiry != ExpireFailsExecution && c.ApprovalExpiry != ExpireDeniesStep:
		return fmt.Errorf("approval expiry must be %s or %s, got %q", ExpireFailsExecution, ExpireDeniesStep, c.ApprovalExpiry)
	case c.DeliveryConcurrency < 1:
		return fmt.Errorf("delivery concurrency must be >= 1")
	case c.Retention < 0 || (c.Retention > 0 && c.Retention < MinRetention):
		return fmt.Errorf("retention %s must be 0 (keep forever) or at least %s", c.Retention, MinRetention)
	case c.RetentionInterval < 0 || c.RetentionBatch < 0 || c.RetentionPause < 0:
		return fmt.Errorf("retention interval, batch and pause must not be negative")
	}
	return nil
}

// backoff returns the delay before the next delivery after n failures (n >= 1).
func (c Config) backoff(n int) time.Duration {
	d := c.DispatchBackoff
	for i := 1; i < n && d < c.DispatchBackoffMax; i++ {
		d *= 2
	}
	return min(d, c.DispatchBackoffMax)
}
