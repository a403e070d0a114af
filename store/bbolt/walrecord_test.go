package bbolt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestWALRecordTooLarge: a commit whose writes exceed the largest record
// the log reads back is not acknowledged (recovery would take its record
// for a torn write and end the log there, losing it and every commit
// after it). A batch that exceeds it only together is committed one
// Update at a time; an Update that exceeds it alone gets an error, and
// the store goes on.
func TestWALRecordTooLarge(t *testing.T) {
	defer func(n int) { walMaxRecord = n }(walMaxRecord)
	walMaxRecord = 32 << 10
	opts := walOptions
	opts.walSegment = 1 << 20
	s := openStore(t, opts, true)
	ctx := context.Background()
	put := func(k string, n int) error {
		return s.Update(ctx, func(tx kernel.Tx) error { return tx.PutCounter("t", k, []byte(strings.Repeat("v", n))) })
	}
	if err := put("huge", 40<<10); err == nil || !strings.Contains(err.Error(), "write-ahead log") {
		t.Errorf("an Update past the log's record size: %v, want an error naming the log", err)
	}
	// Twelve of 10 KiB at once: a batch of several is past the limit.
	// They queue while the writer runs an Update that waits for them,
	// and the writer then takes them all in one batch.
	hold, running := make(chan struct{}), make(chan struct{}, 1)
	held := make(chan error, 1)
	go func() {
		held <- s.Update(ctx, func(kernel.Tx) error {
			running <- struct{}{}
			<-hold
			return nil
		})
	}()
	<-running
	var wg sync.WaitGroup
	errs := make([]error, 12)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = put(fmt.Sprint("k", i), 10<<10)
		}()
	}
	for s.waiting.Load() < int64(len(errs)) {
		time.Sleep(time.Millisecond)
	}
	close(hold)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Update %d (10 KiB): %v", i, err)
		}
	}
	if err := put("after", 10); err != nil {
		t.Fatalf("the store after a refused Update: %v", err)
	}
	want := dumpStore(t, s)
	sameDump(t, recovered(t, crashCopy(t, s, nil)), want)
	for _, r := range want {
		if strings.HasPrefix(r, "counters ") && strings.Contains(r, fmt.Sprintf("%x", "t\x00huge")) {
			t.Error("the refused Update was committed")
		}
	}
}

// TestWALRecordGap: records whose lsns skip one are damage, reported at
// the offset of the record after the gap; the records a checkpoint covers
// are skipped, and so are not a gap.
func TestWALRecordGap(t *testing.T) {
	dir := t.TempDir()
	w := &wal{dir: dir, segSize: 1 << 16, spare: make(chan spareSegment, 1)}
	defer w.close()
	if err := w.createSegment(0); err != nil {
		t.Fatal(err)
	}
	var b walBatch
	at := int64(0)
	for i, lsn := range []uint64{1, 3} {
		b.reset()
		b.put([]byte("b"), []byte(fmt.Sprint("k", i)), []byte("v"))
		w.lsn = lsn - 1
		at = w.off
		if err := w.append(&b); err != nil {
			t.Fatal(err)
		}
	}
	_, err := readRecords(dir, 0, func(uint64, []byte) error { return nil })
	want := fmt.Sprintf("offset %d: record 3 follows 1", at)
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), want) {
		t.Fatalf("readRecords after 0 = %v, want ErrDamaged naming %q", err, want)
	}
	var got []uint64
	last, err := readRecords(dir, 2, func(lsn uint64, _ []byte) error { got = append(got, lsn); return nil })
	if err != nil || last != 3 || len(got) != 1 || got[0] != 3 {
		t.Fatalf("readRecords after 2 = %d, %v, applied %v; want 3, nil, [3]", last, err, got)
	}
}
