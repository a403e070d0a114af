package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// gcHeadroom is the least room the kernel's heap is given to grow between
// collections (docs/RATIONALE.md, "GC headroom").
const gcHeadroom = 64 << 20

// startGCHeadroom keeps the garbage collector's heap goal at least
// headroom bytes above the live heap: after every collection it sets the
// GC percentage to max(100, headroom/live). The kernel's live heap is
// small (a few MiB) and it allocates per request, so with Go's default
// (goal = twice the live heap) it collects dozens of times a second under
// load; a fixed headroom bounds what that saves in memory (at most
// headroom more than Go's default), whatever the live heap, and a large
// live heap (big compiled bundles) keeps Go's default.
//
// It does nothing when GOGC is set: the operator's setting wins. A
// GOMEMLIMIT still bounds the heap, as with any GOGC. stop ends it.
func startGCHeadroom(headroom uint64) (stop func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	t := &gcTuner{headroom: headroom, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}, last: 100}
	t.arm()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if !t.stopped {
			t.stopped = true
			debug.SetGCPercent(100)
		}
	}
}

// gcTuner re-arms a finalizer on a fresh sentinel each cycle: the
// finalizer runs after the collection that found the sentinel unreachable.
type gcTuner struct {
	headroom uint64
	sample   []metrics.Sample
	last     int

	// mu makes stop and a tune exclusive: a tune that had seen stopped
	// false must not set its percentage after stop restored Go's default.
	mu      sync.Mutex
	stopped bool
}

type gcSentinel struct{ _ [16]byte } // not tiny-allocated: finalizers need their own object

func (t *gcTuner) arm() {
	runtime.SetFinalizer(&gcSentinel{}, func(*gcSentinel) { t.tune() })
}

// tune runs after a collection (on the finalizer goroutine).
func (t *gcTuner) tune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	metrics.Read(t.sample)
	if v := t.sample[0].Value; v.Kind() == metrics.KindUint64 {
		if p := gcPercent(v.Uint64(), t.headroom); p != t.last {
			debug.SetGCPercent(p)
			t.last = p
		}
	}
	t.arm()
}

// gcPercent is the GC percentage that puts the heap goal headroom bytes
// above live, and never below Go's default (100) nor above 10,000.
func gcPercent(live, headroom uint64) int {
	if live < 1<<20 {
		live = 1 << 20
	}
	p := headroom * 100 / live
	switch {
	case p < 100:
		return 100
	case p > 10000:
		return 10000
	}
	return int(p)
}
