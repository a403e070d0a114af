package kernel_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// TestFilteredListInChunks: a filtered ListExecutions that reads the
// tenant's executions a few at a time, one read transaction each, pages
// through the same executions as one that reads them all at once, and as
// a store that cannot scan in chunks (plainReadStore).
func TestFilteredListInChunks(t *testing.T) {
	bst, err := bbolt.Open(filepath.Join(t.TempDir(), "wicket.db"), bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	k, calls := runningKernel(t, bst, bst, 13, nil)
	ctx := context.Background()
	for i, c := range calls {
		if i%3 == 0 {
			if err := k.CancelExecution(ctx, kernel.DefaultTenant, c.ExecutionID, "test"); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A kernel on the same store whose read transactions only offer
	// kernel.ReadTx.
	plain := readingKernel(t, plainReadStore{bst})
	// pages lists every page's ids, following next to the end.
	pages := func(k *kernel.Kernel, f kernel.ExecutionFilter) [][]string {
		var out [][]string
		for {
			l, next, err := k.ListExecutions(ctx, kernel.DefaultTenant, f)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, e := range l {
				ids = append(ids, e.ID)
			}
			out = append(out, ids)
			if next == "" {
				return out
			}
			f.Before = next
		}
	}
	for _, f := range []kernel.ExecutionFilter{
		{Status: kernel.ExecCancelled, Limit: 2}, {Status: kernel.ExecRunning, Limit: 4},
		{AgentID: "nobody", Limit: 5}, {AgentID: calls[0].AgentID, Limit: 6},
	} {
		want := pages(k, f)
		if len(want) < 2 && f.AgentID != "nobody" {
			t.Fatalf("%+v: one page, %v: the test needs several", f, want)
		}
		if got := pages(plain, f); !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("%+v on a store without scans: %v, want %v", f, got, want)
		}
		for _, chunk := range []int{1, 2, 5} {
			restore := kernel.SetListScanChunk(chunk)
			got := pages(k, f)
			restore()
			if !slices.EqualFunc(got, want, slices.Equal) {
				t.Errorf("%+v %d at a time: %v, want %v", f, chunk, got, want)
			}
		}
	}
}

// TestListApprovalsInChunks: ListApprovals read a few approvals at a time
// lists what a store that cannot scan in chunks lists, in the same order
// (newest first, then by id).
func TestListApprovalsInChunks(t *testing.T) {
	ctx := context.Background()
	base := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	statuses := []kernel.ApprovalStatus{kernel.ApprovalPending, kernel.ApprovalGranted, kernel.ApprovalDenied}
	bst := storeWithApprovals(t, 11, func(i int) *kernel.Approval {
		return &kernel.Approval{Tenant: kernel.DefaultTenant, ID: "ap-" + string(rune('a'+i)), ExecutionID: "e",
			Status: statuses[i%3], CreatedAt: base.Add(time.Duration(i%4) * time.Minute), ExpiresAt: base.Add(time.Hour)}
	})
	scanning, plain := readingKernel(t, bst), readingKernel(t, plainReadStore{bst})
	list := func(k *kernel.Kernel, status kernel.ApprovalStatus) []string {
		l, _, err := k.ListApprovals(ctx, kernel.DefaultTenant, status, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, a := range l {
			ids = append(ids, a.ID)
		}
		return ids
	}
	for _, status := range append([]kernel.ApprovalStatus{""}, statuses...) {
		want := list(plain, status)
		if len(want) < 3 {
			t.Fatalf("%q: %v: the test needs more", status, want)
		}
		for _, chunk := range []int{1, 2, 5, 2000} {
			restore := kernel.SetListScanChunk(chunk)
			got := list(scanning, status)
			restore()
			if !slices.Equal(got, want) {
				t.Errorf("%q %d at a time: %v, want %v", status, chunk, got, want)
			}
		}
	}
}

// TestPendingApprovalsInChunks: PendingApprovals reading the index of
// pending approvals a few entries at a time counts what a store without
// the scan counts, across tenants, and finds the same oldest.
func TestPendingApprovalsInChunks(t *testing.T) {
	ctx := context.Background()
	base := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	statuses := []kernel.ApprovalStatus{kernel.ApprovalPending, kernel.ApprovalGranted, kernel.ApprovalPending}
	bst := storeWithApprovals(t, 13, func(i int) *kernel.Approval {
		return &kernel.Approval{Tenant: []string{kernel.DefaultTenant, "t2"}[i%2], ID: "ap-" + string(rune('a'+i)), ExecutionID: "e",
			Status: statuses[i%3], CreatedAt: base.Add(time.Duration(13-i) * time.Minute), ExpiresAt: base.Add(time.Duration(i%4) * time.Hour)}
	})
	wantN, wantOldest, err := readingKernel(t, plainReadStore{bst}).PendingApprovals(ctx)
	if err != nil || wantN != 9 || !wantOldest.Equal(base.Add(time.Minute)) {
		t.Fatalf("without the scan: %d pending, oldest %s, %v; want 9, %s", wantN, wantOldest, err, base.Add(time.Minute))
	}
	scanning := readingKernel(t, bst)
	for _, chunk := range []int{1, 2, 5, 2000} {
		restore := kernel.SetListScanChunk(chunk)
		n, oldest, err := scanning.PendingApprovals(ctx)
		restore()
		if err != nil || n != wantN || !oldest.Equal(wantOldest) {
			t.Errorf("%d at a time: %d pending, oldest %s, %v; want %d, %s", chunk, n, oldest, err, wantN, wantOldest)
		}
	}
}

// storeWithApprovals is an embedded store (without fsync) holding the n
// approvals approval makes.
func storeWithApprovals(t *testing.T, n int, approval func(i int) *kernel.Approval) *bbolt.Store {
	t.Helper()
	bst, err := bbolt.Open(filepath.Join(t.TempDir(), "wicket.db"), bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bst.Close() })
	err = bst.Update(context.Background(), func(tx kernel.Tx) error {
		for i := range n {
			if err := tx.PutApproval(approval(i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bst
}

// readingKernel is a kernel on st that is not started: it only reads.
func readingKernel(t *testing.T, st kernel.Store) *kernel.Kernel {
	t.Helper()
	k, err := kernel.New(st, &deliverer{got: make(chan kernel.Delivery, 1)}, &script{}, nil, kernel.Config{ReapInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return k
}
