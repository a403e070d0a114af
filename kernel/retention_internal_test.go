package kernel

import (
	"testing"
	"time"
)

// TestIDFloor: every id made at t or later sorts at or above idFloor(t),
// every id made before it below: the cutoff retention pages from.
func TestIDFloor(t *testing.T) {
	var g idGen
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	floor := idFloor(base)
	for _, at := range []time.Time{base, base.Add(time.Microsecond), base.Add(time.Millisecond), base.Add(time.Hour)} {
		if id := g.next(at); id < floor {
			t.Errorf("id %s made at %s sorts below the floor %s", id, at, floor)
		}
	}
	var h idGen
	for _, at := range []time.Time{base.Add(-time.Millisecond), base.Add(-time.Hour)} {
		if id := h.next(at); id >= floor {
			t.Errorf("id %s made at %s sorts at or above the floor %s", id, at, floor)
		}
	}
	if idFloor(time.Unix(-5, 0)) != "00000000-0000-7000-8000-000000000000" {
		t.Errorf("floor before 1970: %s", idFloor(time.Unix(-5, 0)))
	}
}
