package bbolt

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestOpenTxViewsNeverReturnAFailedBatch: writers and readers run while the
// log fails at some record: no successful View returns the failed batch,
// or any batch whose Update did not return nil, and every acknowledged
// batch stays readable.
func TestOpenTxViewsNeverReturnAFailedBatch(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer full.Close()
	for round := range 3 {
		opts := walOptions
		opts.walSegment = 8 << 20
		opts.CommitInterval = 2 * time.Millisecond
		s := openStore(t, opts, false)
		var calls atomic.Int64
		failAt := int64(50 + 40*round)
		testHookSync = func() {
			if calls.Add(1) == failAt {
				if err := syscall.Dup3(int(full.Fd()), int(s.wal.log.f.Fd()), 0); err != nil {
					panic(err)
				}
			}
		}
		acked, seen := runWritersAndReaders(t, s, 4, 3, 1000)
		testHookSync = nil
		failed := 0
		for i := range acked {
			for _, err := range acked[i] {
				if err != nil {
					failed++
				}
			}
		}
		if failed == 0 {
			t.Fatalf("round %d: no Update failed", round)
		}
		for _, got := range seen {
			for i, seq := range got {
				if seq == 0 {
					continue
				}
				if err, ok := acked[i][seq]; !ok || err != nil {
					t.Fatalf("round %d: a View returned w%d=%d, whose Update returned %v (answered: %v)", round, i, seq, err, ok)
				}
			}
		}
		// Every acknowledged value is what a View reads now.
		err := s.View(context.Background(), func(tx kernel.ReadTx) error {
			for i := range acked {
				want := 0
				for seq, err := range acked[i] {
					if err == nil && seq > want {
						want = seq
					}
				}
				v, _ := tx.Counter("t", "w"+strconv.Itoa(i))
				if n, _ := strconv.Atoi(string(v)); n != want {
					return fmt.Errorf("w%d = %q, want the last acknowledged %d", i, v, want)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}
