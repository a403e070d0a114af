package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestGCPercent(t *testing.T) {
	for _, c := range []struct {
		live, headroom uint64
		want           int
	}{
		{4 << 20, 64 << 20, 1600},  // a small live heap gets the headroom
		{64 << 20, 64 << 20, 100},  // from headroom = live on, Go's default
		{512 << 20, 64 << 20, 100}, // a large one keeps Go's default
		{0, 64 << 20, 6400},        // below 1 MiB counts as 1 MiB
		{1 << 10, 1 << 40, 10000},  // capped
	} {
		if got := gcPercent(c.live, c.headroom); got != c.want {
			t.Errorf("gcPercent(%d, %d) = %d, want %d", c.live, c.headroom, got, c.want)
		}
	}
}

// gogc reads the GC percentage in effect.
func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// collect runs a collection and waits for the finalizers it queued to
// start running (the tuner's among them, on the same goroutine).
func collect() {
	done := make(chan struct{})
	runtime.SetFinalizer(&gcSentinel{}, func(*gcSentinel) { close(done) })
	runtime.GC()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// TestGCHeadroomTunes: after a collection the GC percentage is the
// headroom's; stop restores Go's default; with GOGC set it is left alone.
func TestGCHeadroomTunes(t *testing.T) {
	t.Setenv("GOGC", "")
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	stop := startGCHeadroom(1 << 40) // far above any live heap: the cap
	deadline := time.Now().Add(20 * time.Second)
	for gogc() != 10000 {
		if time.Now().After(deadline) {
			t.Fatalf("the GC percentage was never tuned (%d)", gogc())
		}
		collect()
	}
	stop()
	if p := gogc(); p != 100 {
		t.Errorf("after stop: GC percent %d, want 100", p)
	}
	collect()
	if p := gogc(); p != 100 {
		t.Errorf("a collection after stop: GC percent %d, want 100", p)
	}

	for _, env := range []string{"100", "off"} {
		t.Setenv("GOGC", env)
		stop = startGCHeadroom(1 << 40)
		for range 3 {
			collect()
		}
		stop()
		if p := gogc(); p != 100 {
			t.Errorf("with GOGC=%s: GC percent %d, want 100 (untouched)", env, p)
		}
	}
}
