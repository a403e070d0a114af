//go:build !linux

package kernel_test

// threadCPU is not measured here (see cputime_linux_test.go).
func threadCPU() (ns int64, ok bool) { return 0, false }
