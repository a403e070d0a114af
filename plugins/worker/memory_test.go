package worker

import "testing"

// TestMemoryDeath: the first lines a worker's standard error starts with
// when it dies of its memory cap without saying "out of memory", and
// crashes that are not the cap's. The pthread_create shape is the one
// TestMemoryBound met about once in 13 runs on a loaded machine (the memory
// bomb then failed as "exited (exit status 2): gs 0x0", the last line of
// the abort's register dump).
func TestMemoryDeath(t *testing.T) {
	for _, c := range []struct {
		first string
		want  bool
	}{
		{"SIGSEGV: segmentation violation", true},
		{"SIGBUS: bus error", true},
		{"unexpected fault address 0x7f0c3a000000", true},
		{"runtime/cgo: pthread_create failed: Resource temporarily unavailable", true},
		{"runtime: failed to create new OS thread (have 9 already; errno=11)", true},
		{"fatal error: concurrent map writes", false},
		{"SIGABRT: abort", false},
		{"goroutine 1 [running]:", false},
		{"", false},
	} {
		if got := memoryDeath(c.first); got != c.want {
			t.Errorf("memoryDeath(%q) = %v, want %v", c.first, got, c.want)
		}
	}
}
