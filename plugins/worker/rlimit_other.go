//go:build !linux

package worker

// limitMemory does nothing where RLIMIT_DATA does not bound the Go heap:
// the worker then relies on the Go runtime's soft limit alone.
func limitMemory(int64) error { return nil }

// lowerPriority does nothing here.
func lowerPriority() {}
