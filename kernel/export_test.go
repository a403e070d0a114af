package kernel

import (
	"context"
	"time"
)

// PurgeAt runs a retention pass as if it were now (tests and benchmarks:
// the kernel has no clock to move).
func PurgeAt(k *Kernel, ctx context.Context, now time.Time) (PurgeStats, error) {
	return k.purgeAt(ctx, now)
}
