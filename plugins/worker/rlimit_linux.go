//go:build linux

package worker

import (
	"fmt"
	"syscall"
)

// rlimitData is RLIMIT_DATA: on Linux (since 4.7) it bounds the process's
// private writable mappings, which is where the Go heap lives.
const rlimitData = syscall.RLIMIT_DATA

// limitMemory caps the process's data segment at n bytes.
func limitMemory(n int64) error {
	lim := &syscall.Rlimit{Cur: uint64(n), Max: uint64(n)}
	if err := syscall.Setrlimit(rlimitData, lim); err != nil {
		return fmt.Errorf("worker: set RLIMIT_DATA to %d bytes: %w", n, err)
	}
	return nil
}

// lowerPriority makes the worker nicer (10) than the kernel, so that a
// tenant's busy policies yield the CPU to the kernel's own work.
func lowerPriority() { _ = syscall.Setpriority(syscall.PRIO_PROCESS, 0, workerNice) }
