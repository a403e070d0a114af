package bbolt

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestScanExecutionsMatchesList: a filtered list read maxScan executions
// at a time, each call going on from the last one's resume, lists what one
// unbounded ListExecutions lists, for every filter, limit and maxScan.
func TestScanExecutionsMatchesList(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, true)
	ctx := context.Background()
	const n = 23
	err := s.Update(ctx, func(tx kernel.Tx) error {
		for i := 1; i <= n; i++ {
			e := &kernel.Execution{Tenant: "t", ID: fmt.Sprintf("01960000-0000-7000-8000-%012d", i),
				AgentID: fmt.Sprintf("a%d", i%3), Status: kernel.ExecRunning, Input: []byte(`{}`)}
			if i%4 == 0 {
				e.Status = kernel.ExecCompleted
			}
			if err := tx.PutExecution(e); err != nil {
				return err
			}
		}
		// Neighbouring tenants whose names share a prefix with t.
		for i, tenant := range []string{"t2", "tt", "s"} {
			e := &kernel.Execution{Tenant: tenant, ID: fmt.Sprintf("01960000-0000-7000-8000-%012d", 100+i), AgentID: "a0", Status: kernel.ExecRunning}
			if err := tx.PutExecution(e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := func(l []*kernel.Execution) []string {
		var out []string
		for _, e := range l {
			out = append(out, e.ID)
		}
		return out
	}
	filters := []kernel.ExecutionFilter{
		{}, {AgentID: "a1"}, {Status: kernel.ExecCompleted}, {AgentID: "a0", Status: kernel.ExecCompleted},
		{AgentID: "none"}, {AgentID: "a2", Limit: 3}, {Status: kernel.ExecRunning, Before: "01960000-0000-7000-8000-000000000015"},
	}
	for _, f := range filters {
		var want []string
		err := s.View(ctx, func(tx kernel.ReadTx) error {
			l, err := tx.ListExecutions("t", f)
			want = ids(l)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for maxScan := 1; maxScan <= n+1; maxScan++ {
			var got []string
			g := f
			for calls := 0; ; calls++ {
				if calls > n+1 {
					t.Fatalf("%+v maxScan %d: no end after %d calls", f, maxScan, calls)
				}
				var out []*kernel.Execution
				var resume string
				err := s.View(ctx, func(tx kernel.ReadTx) error {
					var err error
					out, resume, err = tx.(kernel.ExecutionScanner).ScanExecutions("t", g, maxScan)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ids(out)...)
				if g.Limit > 0 {
					g.Limit -= len(out)
				}
				if resume == "" || (f.Limit > 0 && g.Limit <= 0) {
					break
				}
				g.Before = resume
			}
			if !slices.Equal(got, want) {
				t.Errorf("%+v maxScan %d: %v, want %v", f, maxScan, got, want)
			}
		}
	}
}

// TestScanApprovalsMatchesList: a tenant's approvals read maxScan at a
// time, each call going on from the last one's resume, are the ones
// ListApprovals lists, for every status and maxScan.
func TestScanApprovalsMatchesList(t *testing.T) {
	s := openStore(t, Options{NoSync: true}, true)
	ctx := context.Background()
	const n = 17
	statuses := []kernel.ApprovalStatus{kernel.ApprovalPending, kernel.ApprovalGranted, kernel.ApprovalDenied}
	base := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	err := s.Update(ctx, func(tx kernel.Tx) error {
		for i := 1; i <= n; i++ {
			a := &kernel.Approval{Tenant: "t", ID: fmt.Sprintf("ap-%03d", i), ExecutionID: "e", Status: statuses[i%3],
				CreatedAt: base.Add(time.Duration(i%5) * time.Minute), ExpiresAt: base.Add(time.Hour)}
			if err := tx.PutApproval(a); err != nil {
				return err
			}
		}
		for _, tenant := range []string{"t2", "tt", "s"} {
			a := &kernel.Approval{Tenant: tenant, ID: "ap-000", ExecutionID: "e", Status: kernel.ApprovalPending, CreatedAt: base, ExpiresAt: base.Add(time.Hour)}
			if err := tx.PutApproval(a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := func(l []*kernel.Approval) []string {
		var out []string
		for _, a := range l {
			out = append(out, a.ID)
		}
		slices.Sort(out)
		return out
	}
	for _, status := range append([]kernel.ApprovalStatus{"", kernel.ApprovalExpired}, statuses...) {
		var want []string
		err := s.View(ctx, func(tx kernel.ReadTx) error {
			l, err := tx.ListApprovals("t", status)
			want = ids(l)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for maxScan := 1; maxScan <= n+1; maxScan++ {
			var got []*kernel.Approval
			after := ""
			for calls := 0; ; calls++ {
				if calls > n+1 {
					t.Fatalf("%q maxScan %d: no end after %d calls", status, maxScan, calls)
				}
				var out []*kernel.Approval
				var resume string
				err := s.View(ctx, func(tx kernel.ReadTx) error {
					var err error
					out, resume, err = tx.(kernel.ApprovalScanner).ScanApprovals("t", status, after, maxScan)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, out...)
				if resume == "" {
					break
				}
				after = resume
			}
			if g := ids(got); !slices.Equal(g, want) {
				t.Errorf("%q maxScan %d: %v, want %v", status, maxScan, g, want)
			}
		}
	}
}
