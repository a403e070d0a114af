package rules

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestScratchCPU(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rs := benchRuleSet(t)
	for _, target := range []string{"github.create_issue", "email.send", "github.delete_repo"} {
		in := benchInput(t, target)
		best := time.Hour
		for r := 0; r < 5; r++ {
			const n = 200000
			s := cpuNow()
			for i := 0; i < n; i++ {
				rs.Evaluate(in)
			}
			if d := (cpuNow() - s) / n; d < best {
				best = d
			}
		}
		t.Logf("%s: %v CPU/op", target, best)
	}
}
