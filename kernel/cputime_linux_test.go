package kernel_test

import (
	"syscall"
	"unsafe"
)

// threadCPU returns the CPU time the calling OS thread has used, in
// nanoseconds. The caller locks its goroutine to the thread
// (runtime.LockOSThread) between two readings.
func threadCPU() (ns int64, ok bool) {
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	var ts syscall.Timespec
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0, false
	}
	return ts.Nano(), true
}
