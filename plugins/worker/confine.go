package worker

import (
	"runtime/debug"
	"strings"
)

// Confine caps the calling process as serve caps its policy workers: a
// lower CPU priority than the kernel's and, when memory > 0, a data
// segment of memory bytes (RLIMIT_DATA, where the OS has it) with the Go
// runtime's soft limit below it, so that garbage goes first. A process the
// kernel starts for one untrusted job (a worker, a wasm compile) calls it
// before the job.
func Confine(memory int64) error {
	lowerPriority()
	if memory <= 0 {
		return nil
	}
	if err := limitMemory(memory * raceFactor); err != nil {
		return err
	}
	debug.SetMemoryLimit(memory * 3 / 4)
	return nil
}

// DiedOfMemory reports whether a confined process that ended abnormally,
// its standard error starting with first and holding stderr, died of its
// memory cap: the Go runtime said so, or faulted, or could not start a
// thread (memoryDeath). A Go panic is not counted.
func DiedOfMemory(first, stderr string) bool {
	if strings.Contains(stderr, "out of memory") || strings.Contains(stderr, "cannot allocate memory") {
		return true
	}
	return !strings.Contains(stderr, "panic: ") && memoryDeath(first)
}
