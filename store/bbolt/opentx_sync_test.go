package bbolt

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// runWritersAndReaders drives writers and readers against s: writer i stores its
// sequence number under counter w<i>, and after each Update that returned
// nil reads it back (a later View must see it); readers read every
// counter. It returns, per writer, each sequence number's Update result,
// and the values the readers' successful Views returned.
func runWritersAndReaders(t *testing.T, s *Store, writers, readers, per int) (acked []map[int]error, seen [][]int) {
	t.Helper()
	ctx := context.Background()
	acked = make([]map[int]error, writers)
	var mu sync.Mutex
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range writers {
		acked[i] = map[int]error{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := "w" + strconv.Itoa(i)
			for seq := 1; seq <= per; seq++ {
				err := s.Update(ctx, func(tx kernel.Tx) error {
					return tx.PutCounter("t", k, []byte(strconv.Itoa(seq)))
				})
				mu.Lock()
				acked[i][seq] = err
				mu.Unlock()
				if err != nil {
					return
				}
				var v []byte
				if err := s.View(ctx, func(tx kernel.ReadTx) error {
					var err error
					v, err = tx.Counter("t", k)
					return err
				}); err != nil {
					continue // the store failed since
				}
				if n, _ := strconv.Atoi(string(v)); n < seq {
					t.Errorf("writer %d: a View after Update %d returned nil read %q", i, seq, v)
				}
			}
		}()
	}
	var rwg sync.WaitGroup
	for range readers {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for !stop.Load() {
				got := make([]int, writers)
				err := s.View(ctx, func(tx kernel.ReadTx) error {
					for i := range writers {
						v, err := tx.Counter("t", "w"+strconv.Itoa(i))
						if err != nil {
							return err
						}
						got[i], _ = strconv.Atoi(string(v))
					}
					return nil
				})
				if err == nil {
					mu.Lock()
					seen = append(seen, got)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	rwg.Wait()
	return acked, seen
}

// TestOpenTxViewsAcrossTheLogsEnd: writers and readers run while the writer
// drops the log past its reserve (stopWAL): every Update that returned
// nil is visible to the Views after it.
func TestOpenTxViewsAcrossTheLogsEnd(t *testing.T) {
	opts := walOptions
	opts.walMmap = 1 << 20
	opts.CommitInterval = time.Millisecond
	s := openStore(t, opts, true)
	for range 20 {
		acked, _ := runWritersAndReaders(t, s, 4, 2, 100)
		for i := range acked {
			for seq, err := range acked[i] {
				if err != nil {
					t.Fatalf("w%d Update %d: %v", i, seq, err)
				}
			}
		}
		if _, err := os.Stat(WALDir(s.path)); os.IsNotExist(err) {
			return
		}
		// Grow the file toward the reserve.
		if err := s.Update(context.Background(), func(tx kernel.Tx) error {
			for j := range 200 {
				if err := tx.PutCounter("t", fmt.Sprintf("pad%d-%d", time.Now().UnixNano(), j), make([]byte, 512)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("the log never stopped")
}

// TestOpenTxViewCancelledDuringTheSync: a View that read a batch whose
// record is being synced returns its context's error, not what it read,
// once the context is cancelled; and a View whose function panics
// during the sync leaves the writer free.
func TestOpenTxViewCancelledDuringTheSync(t *testing.T) {
	s := openStore(t, openTxOptions, true)
	ctx := context.Background()
	release, updated := updateHeldInSync(t, s, "k", nil)
	cctx, cancel := context.WithCancel(ctx)
	read, returned := make(chan string, 1), make(chan error, 1)
	go func() {
		returned <- s.View(cctx, func(tx kernel.ReadTx) error {
			v, _ := tx.Counter("t", "k")
			read <- string(v)
			return nil
		})
	}()
	if v := <-read; v != "v" {
		t.Fatalf("read %q", v)
	}
	cancel()
	if err := <-returned; err == nil {
		t.Fatal("a cancelled View that read an unsynced batch returned nil")
	}
	func() {
		defer func() { _ = recover() }()
		_ = s.View(ctx, func(tx kernel.ReadTx) error { panic("boom") })
	}()
	release()
	if err := <-updated; err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(tx kernel.Tx) error { return tx.PutCounter("t", "k", []byte("w")) }); err != nil {
		t.Fatal(err)
	}
	if v := viewCounterErr(s, "k"); v != "w" {
		t.Fatalf("after: %q", v)
	}
}
