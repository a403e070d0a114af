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

// SetListScanChunk sets how many executions a filtered ListExecutions
// examines per read transaction, and returns a function restoring it.
func SetListScanChunk(n int) (restore func()) {
	old := listScanChunk
	listScanChunk = n
	return func() { listScanChunk = old }
}
