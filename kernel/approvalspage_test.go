package kernel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
)

// TestListApprovalsPaged: GET /v0/approvals answered every approval the
// tenant ever had in one body, each with its step's arguments (up to a
// request body): a client key making executions that wait on approvals
// made the list, and the kernel's memory to build it, as large as it
// liked, and the console reads it. ListApprovals now answers a page, newest
// first: at most limit approvals, fewer once they hold
// MaxApprovalsPageBytes, never none, with the cursor of the next; following
// the cursors yields every approval once, in order, whether the store is
// read a few approvals at a time or all at once, and holds one page.
func TestListApprovalsPaged(t *testing.T) {
	ctx := context.Background()
	base := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	const n = 23
	big := json.RawMessage(`"` + strings.Repeat("x", 3<<20) + `"`)
	bst := storeWithApprovals(t, n, func(i int) *kernel.Approval {
		a := &kernel.Approval{Tenant: kernel.DefaultTenant, ID: fmt.Sprintf("ap-%02d", i), ExecutionID: "e", Status: kernel.ApprovalPending,
			Args: json.RawMessage(`{"i":1}`), CreatedAt: base.Add(time.Duration(i) * time.Second), ExpiresAt: base.Add(time.Hour)}
		if i%8 == 0 {
			a.Args = big
		}
		return a
	})
	var want []string
	for i := n - 1; i >= 0; i-- {
		want = append(want, fmt.Sprintf("ap-%02d", i))
	}
	scanning, plain := readingKernel(t, bst), readingKernel(t, plainReadStore{bst})
	for _, k := range []*kernel.Kernel{scanning, plain} {
		for _, chunk := range []int{2, 2000} {
			for _, limit := range []int{4, 1000} {
				restore := kernel.SetListScanChunk(chunk)
				var got []string
				cursor, pages := "", 0
				for {
					l, next, err := k.ListApprovals(ctx, kernel.DefaultTenant, "", cursor, limit)
					if err != nil {
						t.Fatal(err)
					}
					size := 0
					for _, a := range l {
						got = append(got, a.ID)
						size += len(a.Args)
					}
					if len(l) == 0 || len(l) > limit || len(l) > 1 && size > kernel.MaxApprovalsPageBytes {
						t.Fatalf("chunk %d limit %d: a page of %d approvals, %d bytes of arguments", chunk, limit, len(l), size)
					}
					pages++
					if cursor = next; cursor == "" {
						break
					}
				}
				restore()
				if !slices.Equal(got, want) {
					t.Fatalf("chunk %d limit %d: %v, want %v", chunk, limit, got, want)
				}
				if limit == 1000 && pages < 2 {
					t.Errorf("chunk %d: %d pages for 3 approvals of 3 MiB, want at least 2", chunk, pages)
				}
			}
		}
	}
}
