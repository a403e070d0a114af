package worker

import (
	"runtime/debug"
	"strings"
	"sync"
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

// Stderr keeps the start and the end of what a confined process writes
// to its standard error (a Go runtime error comes first, then pages of
// stack traces): set it as the process's Stderr. It is safe for
// concurrent use.
type Stderr struct {
	mu         sync.Mutex
	head, tail []byte
}

const stderrKeep = 4 << 10

// Write keeps the first and the last few KiB of p and what came before.
func (t *Stderr) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := stderrKeep - len(t.head); n > 0 {
		t.head = append(t.head, p[:min(n, len(p))]...)
	}
	t.tail = append(t.tail, p...)
	if len(t.tail) > stderrKeep {
		t.tail = append(t.tail[:0], t.tail[len(t.tail)-stderrKeep:]...)
	}
	return len(p), nil
}

// Contains reports whether the kept start or end holds s.
func (t *Stderr) Contains(s string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Contains(string(t.head), s) || strings.Contains(string(t.tail), s)
}

// First returns the first line written.
func (t *Stderr) First() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, _, _ := strings.Cut(string(t.head), "\n")
	return l
}

// Summary returns the first "fatal error:" or "panic:" line, else the last
// non-empty line, at most 200 bytes.
func (t *Stderr) Summary() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	pick := ""
	for _, l := range strings.Split(string(t.head), "\n") {
		if strings.HasPrefix(l, "fatal error:") || strings.HasPrefix(l, "panic:") {
			pick = l
			break
		}
	}
	lines := strings.Split(string(t.tail), "\n")
	for i := len(lines) - 1; pick == "" && i >= 0; i-- {
		pick = strings.TrimSpace(lines[i])
	}
	if len(pick) > 200 {
		pick = pick[:200] + "…"
	}
	return pick
}

// DiedOfMemory reports whether a confined process that ended abnormally,
// having written this, died of its memory cap: the Go runtime said so, or
// faulted, or could not start a thread (memoryDeath). A Go panic (a bug)
// is not counted.
func (t *Stderr) DiedOfMemory() bool {
	if t.Contains("out of memory") || t.Contains("cannot allocate memory") {
		return true
	}
	return !t.Contains("panic: ") && memoryDeath(t.First())
}
