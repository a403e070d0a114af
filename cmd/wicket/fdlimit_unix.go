//go:build unix

package main

import "syscall"

// fdLimit returns the process's soft limit of open files (Go raises it to
// the hard limit at start-up).
func fdLimit() (uint64, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, false
	}
	return r.Cur, true
}
