package bbolt_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/store/bbolt"
)

// pageAudit counts the pages each commit writes, by bucket, by reading the
// file after every commit. bbolt never rewrites a page in place: every
// page a commit changes gets a new page id, so the pages of the new tree
// that are not in the previous tree are what the commit wrote (their
// overflow pages included), plus the freelist and one meta page.
type pageAudit struct {
	f        *os.File
	pageSize int
	pages    map[uint64]*auditPage // the previous tree's pages, parsed
	// per bucket (name, "(root)" for the bucket of buckets): leaf and
	// branch pages written over the audited commits.
	leaf, branch map[string]int
	freelist     int
	commits      int
	updates      int
	counting     bool
	err          error
}

type auditPage struct {
	leaf     bool
	overflow int
	children []uint64 // branch: child pages; leaf of the root bucket: sub-bucket roots
	names    []string // the sub-buckets' names, beside children (root bucket leaves)
}

const (
	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	freelistPageFlag = 0x10
	bucketLeafFlag   = 0x01
)

func newPageAudit(path string) (*pageAudit, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return &pageAudit{f: f, pageSize: os.Getpagesize(), pages: map[uint64]*auditPage{},
		leaf: map[string]int{}, branch: map[string]int{}}, nil
}

func (a *pageAudit) read(id uint64) ([]byte, error) {
	b := make([]byte, a.pageSize)
	if _, err := a.f.ReadAt(b, int64(id)*int64(a.pageSize)); err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	if ov := binary.LittleEndian.Uint32(b[12:]); ov > 0 {
		b = make([]byte, a.pageSize*int(ov+1))
		if _, err := a.f.ReadAt(b, int64(id)*int64(a.pageSize)); err != nil {
			return nil, fmt.Errorf("page %d: %w", id, err)
		}
	}
	return b, nil
}

// meta returns the root bucket's page and the freelist page of the newest
// meta page.
func (a *pageAudit) meta() (root, freelist uint64, err error) {
	var best uint64
	for id := range uint64(2) {
		b, err := a.read(id)
		if err != nil {
			return 0, 0, err
		}
		m := b[16:]
		if txid := binary.LittleEndian.Uint64(m[48:]); txid >= best {
			best = txid
			root = binary.LittleEndian.Uint64(m[16:])
			freelist = binary.LittleEndian.Uint64(m[32:])
		}
	}
	return root, freelist, nil
}

// parse reads page id, from the cache when the previous tree had it.
func (a *pageAudit) parse(id uint64, rootBucket bool) (*auditPage, bool, error) {
	if p, ok := a.pages[id]; ok {
		return p, false, nil
	}
	b, err := a.read(id)
	if err != nil {
		return nil, false, err
	}
	flags, count := binary.LittleEndian.Uint16(b[8:]), int(binary.LittleEndian.Uint16(b[10:]))
	p := &auditPage{overflow: int(binary.LittleEndian.Uint32(b[12:]))}
	switch {
	case flags&branchPageFlag != 0:
		for i := range count {
			e := b[16+16*i:]
			p.children = append(p.children, binary.LittleEndian.Uint64(e[8:]))
		}
	case flags&leafPageFlag != 0:
		p.leaf = true
		if rootBucket {
			for i := range count {
				off := 16 + 16*i
				e := b[off:]
				if binary.LittleEndian.Uint32(e)&bucketLeafFlag == 0 {
					continue
				}
				pos, ks := int(binary.LittleEndian.Uint32(e[4:])), int(binary.LittleEndian.Uint32(e[8:]))
				name := string(b[off+pos : off+pos+ks])
				if r := binary.LittleEndian.Uint64(b[off+pos+ks:]); r != 0 { // 0: inline, no page
					p.children = append(p.children, r)
					p.names = append(p.names, name)
				}
			}
		}
	default:
		return nil, false, fmt.Errorf("page %d: flags %#x", id, flags)
	}
	return p, true, nil
}

// snapshot walks the current tree; with counting on, it adds the pages
// that are new since the last snapshot to the counts.
func (a *pageAudit) snapshot(updates int) {
	if a.err != nil {
		return
	}
	root, fl, err := a.meta()
	if err != nil {
		a.err = err
		return
	}
	next := make(map[uint64]*auditPage, len(a.pages)+64)
	var walk func(id uint64, bucket string, rootBucket bool) error
	walk = func(id uint64, bucket string, rootBucket bool) error {
		p, fresh, err := a.parse(id, rootBucket)
		if err != nil {
			return err
		}
		next[id] = p
		if fresh && a.counting {
			if p.leaf {
				a.leaf[bucket] += 1 + p.overflow
			} else {
				a.branch[bucket] += 1 + p.overflow
			}
		}
		for i, c := range p.children {
			if p.leaf { // a sub-bucket's root
				if err := walk(c, p.names[i], false); err != nil {
					return err
				}
			} else if err := walk(c, bucket, rootBucket); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root, "(root)", true); err != nil {
		a.err = err
		return
	}
	a.pages = next
	if a.counting {
		if b, err := a.read(fl); err == nil {
			a.freelist += 1 + int(binary.LittleEndian.Uint32(b[12:]))
		}
		a.commits++
		a.updates += updates
	}
}

// report returns the audit as "bucket: leaf+branch pages per commit" lines.
func (a *pageAudit) report() string {
	names := make([]string, 0, len(a.leaf)+len(a.branch))
	for n := range a.leaf {
		names = append(names, n)
	}
	for n := range a.branch {
		if _, ok := a.leaf[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	c := float64(a.commits)
	total := 1.0 + float64(a.freelist)/c // the meta page
	s := fmt.Sprintf("%d commits, %.2f updates/commit\n", a.commits, float64(a.updates)/c)
	for _, n := range names {
		s += fmt.Sprintf("  %-12s leaf %5.2f  branch %5.2f\n", n, float64(a.leaf[n])/c, float64(a.branch[n])/c)
		total += float64(a.leaf[n]+a.branch[n]) / c
	}
	s += fmt.Sprintf("  %-12s %5.2f\n  %-12s %5.2f\n  total        %5.2f pages/commit", "freelist", float64(a.freelist)/c, "meta", 1.0, total)
	return s
}

// auditDeliverer hands the kernel's deliveries to the benchmark.
type auditDeliverer struct{ got chan kernel.Delivery }

func (d *auditDeliverer) Deliver(_ context.Context, dl kernel.Delivery) error {
	d.got <- dl
	return nil
}

// BenchmarkCommitPages runs the kernel's step path (SubmitStep and
// CompleteStep, as `wicket bench` does over HTTP) on 10 executions
// concurrently against a store with fsync on, and reports the pages each
// commit writes, by bucket (the breakdown is logged; -v shows it). One op
// is one step; the first half of the steps are not audited (the trees
// grow to their working size first).
//
// The executions' input is a small number (as in `wicket bench`) or a
// 2 KiB document.
//
//	go test -run '^$' -bench CommitPages -benchtime 10000x -v ./store/bbolt/
func BenchmarkCommitPages(b *testing.B) {
	b.Run("input=small", func(b *testing.B) { benchCommitPages(b, nil) })
	doc := json.RawMessage(`{"task":"` + strings.Repeat("x", 2048-11) + `"}`)
	b.Run("input=2KiB", func(b *testing.B) { benchCommitPages(b, doc) })
}

func benchCommitPages(b *testing.B, input json.RawMessage) {
	const conc = 10
	path := filepath.Join(b.TempDir(), "wicket.db")
	if p := os.Getenv("PAGES_DB"); p != "" {
		path = p
	}
	var audit *pageAudit
	var mu sync.Mutex
	st, err := bbolt.Open(path, bbolt.Options{OnCommit: func(_ time.Duration, updates int) {
		mu.Lock()
		defer mu.Unlock()
		if audit != nil {
			audit.snapshot(updates)
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	deliv := &auditDeliverer{got: make(chan kernel.Delivery, conc)}
	k, err := kernel.New(st, deliv, nil, nil, kernel.Config{ReapInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := k.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = k.Close(ctx); _ = st.Close() }()
	if _, err := k.PutAgent(ctx, kernel.Agent{ID: "bench", WebhookURL: "http://127.0.0.1:1/webhook", Secret: "bench-secret-0123456789"}); err != nil {
		b.Fatal(err)
	}
	calls := make([]kernel.AgentCall, conc)
	for i := range conc {
		in := input
		if in == nil {
			in = json.RawMessage(strconv.Itoa(i))
		}
		if _, _, err := k.CreateExecution(ctx, kernel.CreateExecution{AgentID: "bench", Input: in}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range conc {
		d := <-deliv.got
		calls[i] = kernel.AgentCall{Tenant: d.Tenant, ExecutionID: d.ExecutionID, AgentID: d.AgentID,
			Lease: kernel.Lease{DispatchID: d.DispatchID, Attempt: d.Attempt}}
	}
	steps := func(from, n int) { // steps from..n-1, each with its own args
		var wg sync.WaitGroup
		for i := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := from + i; j < n; j += conc {
					d, err := k.SubmitStep(ctx, kernel.StepRequest{AgentCall: calls[i], Kind: "tool_call", Target: "search",
						Args: json.RawMessage(`{"n":` + strconv.Itoa(j) + `,"q":"bench"}`)})
					if err != nil || d.Decision != kernel.DecisionProceed {
						b.Errorf("submit: %+v %v", d, err)
						return
					}
					if _, err := k.CompleteStep(ctx, kernel.StepOutcome{AgentCall: calls[i], StepID: d.StepID,
						Result: json.RawMessage(`{"hits":` + strconv.Itoa(j) + `}`)}); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	steps(0, b.N/2)
	a, err := newPageAudit(path)
	if err != nil {
		b.Fatal(err)
	}
	defer a.f.Close()
	mu.Lock()
	a.snapshot(0)
	a.counting = true
	audit = a
	mu.Unlock()
	b.ResetTimer()
	s0 := st.Stats()
	steps(b.N/2, b.N)
	b.StopTimer()
	s1 := st.Stats()
	mu.Lock()
	defer mu.Unlock()
	audit = nil
	if a.err != nil {
		b.Fatal(a.err)
	}
	if a.commits == 0 {
		b.Fatal("no commit audited")
	}
	b.ReportMetric(float64(a.updates)/float64(a.commits), "updates/commit")
	b.ReportMetric(float64(s1.DB.TxStats.GetWrite()-s0.DB.TxStats.GetWrite())/float64(s1.Commits-s0.Commits), "writes/commit")
	b.ReportMetric(float64(s1.Size)/float64(b.N), "bytes/step")
	b.Logf("pages written per commit, by bucket:\n%s", a.report())
}
