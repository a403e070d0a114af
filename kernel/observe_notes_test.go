package kernel

import (
	"strconv"
	"testing"
)

// notes finds every key it was given, before and after it starts to
// index them, and adds each key once.
func TestNotesManyKeys(t *testing.T) {
	var ns notes[int]
	const n = 3 * notesScanned
	for round := range 2 {
		for i := range n {
			k := recordKey{"t", strconv.Itoa(i)}
			nt := ns.get(k)
			if nt.key != k {
				t.Fatalf("round %d: get(%v) = note of %v", round, k, nt.key)
			}
			if round == 0 {
				nt.to, nt.hasTo = i, true
			} else if !nt.hasTo || nt.to != i {
				t.Fatalf("get(%v) lost its note: %+v", k, *nt)
			}
		}
	}
	if ns.n != n {
		t.Fatalf("%d notes for %d keys", ns.n, n)
	}
}
