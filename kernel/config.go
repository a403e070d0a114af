package kernel

import (
	"fmt"
	"log/slog"
	"time"
)

// Approval-expiry behaviours (Config.ApprovalExpiry).
const (
	// ExpireFailsExecution fails the execution with reason approval_expired (default).
	ExpireFailsExecution = "fail_execution"
	// ExpireDeniesStep denies the step and resumes the execution.
	ExpireDeniesStep = "deny_step"
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
	ApprovalExpiry string
	// ReapInterval is how often expired leases and approvals are looked for (default 1s).
	ReapInterval time.Duration
	// Logger receives operational logs (default slog.Default()).
	Logger *slog.Logger
	// Replica names this kernel among the replicas sharing its store; the
	// dispatch.claimed events it writes carry it ("replica"), so the log
	// says which replica delivered each attempt. Empty: not recorded.
	Replica string
}

// DefaultConfig returns the defaults `wicket serve` documents (README,
// Configuration).
func DefaultConfig() Config {
	return Config{
		LeaseTimeout:        90 * time.Second,
		DispatchMaxAttempts: 10,
		DispatchTimeout:     10 * time.Second,
		DispatchBackoff:     500 * time.Millisecond,
		DispatchBackoffMax:  time.Minute,
		DeliveryConcurrency: 64,
		ApprovalTimeout:     24 * time.Hour,
		ApprovalExpiry:      ExpireFailsExecution,
		ReapInterval:        time.Second,
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
	if c.Logger == nil {
		c.Logger = slog.Default()
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
	case c.DispatchTimeout >= c.LeaseTimeout:
		return fmt.Errorf("dispatch timeout %s must be shorter than the lease timeout %s", c.DispatchTimeout, c.LeaseTimeout)
	case c.DispatchBackoff <= 0 || c.DispatchBackoffMax < c.DispatchBackoff:
		return fmt.Errorf("dispatch backoff %s..%s is invalid", c.DispatchBackoff, c.DispatchBackoffMax)
	case c.ApprovalExpiry != ExpireFailsExecution && c.ApprovalExpiry != ExpireDeniesStep:
		return fmt.Errorf("approval expiry must be %s or %s, got %q", ExpireFailsExecution, ExpireDeniesStep, c.ApprovalExpiry)
	case c.DeliveryConcurrency < 1:
		return fmt.Errorf("delivery concurrency must be >= 1")
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
