//go:build !unix

package cpubench

import "time"

// cpuTime is zero where getrusage is not available: the metric reads 0.
func cpuTime() time.Duration { return 0 }
