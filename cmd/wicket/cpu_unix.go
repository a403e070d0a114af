//go:build unix

package main

import (
	"syscall"
	"time"
)

// readCPU returns this process's CPU time so far (getrusage RUSAGE_SELF).
func readCPU() procCPU {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return procCPU{}
	}
	return procCPU{user: time.Duration(ru.Utime.Nano()), sys: time.Duration(ru.Stime.Nano()), ok: true}
}
