package bbolt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/wicket-run/wicket/kernel"
)

// SpaceReport says where the bytes of a store file go: the file's pages by
// use (buckets, free, the freelist itself), each bucket's leaf bytes in
// use against those allocated, and the records by type with their key and
// value sizes. `wicket store stats` prints it.
type SpaceReport struct {
	PageSize int
	// Pages is the high-water mark: the pages the file holds in use or
	// free (the file may be longer, bbolt grows it in steps).
	Pages int
	// FileBytes is the file's length.
	FileBytes int64
	// FreePages are free for reuse; PendingPages were freed by a
	// transaction a reader may still see (zero in a file no one has open).
	FreePages, PendingPages int
	// FreelistPages hold the free-page list itself (0 when it is not
	// stored in the file: Options.NoFreelistSync).
	FreelistPages int
	Buckets       []BucketSpace
	Records       []RecordSpace
}

// BucketSpace is the page use of one top-level bucket (bbolt's
// Bucket.Stats, pages counted with their overflow).
type BucketSpace struct {
	Name                     string
	Keys                     int
	Depth                    int
	LeafPages, BranchPages   int
	LeafInuse, LeafAlloc     int
	BranchInuse, BranchAlloc int
}

// RecordSpace is the records of one type: how many, and the bytes of
// their keys and values. Blob is the part of the values that is raw JSON
// the kernel hands the store (payload; args, result, error; input), as
// stored (an event's payload is packed: packJSON).
// A record's leaf cost is 16 bytes of bbolt's element header plus its key
// and value.
type RecordSpace struct {
	Bucket, Type         string
	N                    int
	KeyBytes, ValueBytes int64
	BlobBytes            int64
	MinValue, MaxValue   int
}

// leafElementSize is the header bbolt stores beside each key/value pair
// on a leaf page.
const leafElementSize = 16

// Space measures the store file at path, opened read-only (a running
// kernel's lock makes it fail with ErrLocked after timeout).
func Space(path string, timeout time.Duration) (*SpaceReport, error) {
	db, err := openOffline("space", path, timeout, bolt.Options{PreLoadFreelist: true})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rep := &SpaceReport{PageSize: db.Info().PageSize}
	st := db.Stats()
	rep.FreePages, rep.PendingPages = st.FreePageN, st.PendingPageN
	fl, err := freelistPage(path, rep.PageSize)
	if err != nil {
		return nil, fmt.Errorf("bbolt: space %s: %w", path, err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		rep.Pages = int(tx.Size() / int64(rep.PageSize))
		if fl != nil {
			p, err := tx.Page(int(*fl))
			if err != nil || p == nil {
				return fmt.Errorf("freelist page %d: %v", *fl, err)
			}
			rep.FreelistPages = 1 + p.OverflowCount
		}
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			s := b.Stats()
			rep.Buckets = append(rep.Buckets, BucketSpace{Name: string(name), Keys: s.KeyN, Depth: s.Depth,
				LeafPages: s.LeafPageN + s.LeafOverflowN, BranchPages: s.BranchPageN + s.BranchOverflowN,
				LeafInuse: s.LeafInuse, LeafAlloc: s.LeafAlloc, BranchInuse: s.BranchInuse, BranchAlloc: s.BranchAlloc})
			return spaceRecords(rep, string(name), b)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("bbolt: space %s: %w", path, err)
	}
	if fi, err := os.Stat(path); err == nil {
		rep.FileBytes = fi.Size()
	}
	return rep, nil
}

// freelistPage returns the id of the freelist page the newest meta page
// of the file names, or nil when the freelist is not stored.
func freelistPage(path string, pageSize int) (*uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var best *fileMeta
	buf := make([]byte, pageSize)
	for i := range int64(2) {
		if _, err := f.ReadAt(buf, i*int64(pageSize)); err != nil {
			return nil, err
		}
		if m, err := parseMeta(buf); err == nil && (best == nil || m.txid > best.txid) {
			best = &m
		}
	}
	if best == nil {
		return nil, errors.New("no valid meta page")
	}
	if best.freelist == ^uint64(0) {
		return nil, nil
	}
	return &best.freelist, nil
}

// spaceRecords adds the records of bucket name to rep, by type.
func spaceRecords(rep *SpaceReport, name string, b *bolt.Bucket) error {
	byType := map[string]*RecordSpace{}
	add := func(typ string, k, v []byte, blob int) {
		r := byType[typ]
		if r == nil {
			r = &RecordSpace{Bucket: name, Type: typ, MinValue: len(v)}
			byType[typ] = r
		}
		r.N++
		r.KeyBytes += int64(len(k))
		r.ValueBytes += int64(len(v))
		r.BlobBytes += int64(blob)
		r.MinValue = min(r.MinValue, len(v))
		r.MaxValue = max(r.MaxValue, len(v))
	}
	err := b.ForEach(func(k, v []byte) error {
		typ, blob := "record", 0
		switch name {
		case string(bEvents):
			typ, blob = classifyLogRecord(v)
		case string(bSteps):
			typ = "slot"
			if sl, err := decodeSlot(v); err != nil {
				typ = "slot (undecodable)"
			} else if sl.hasSeq && sl.occ != nil {
				typ = "slot: seq + occurrence"
			} else if sl.hasSeq {
				typ = "slot: seq"
			} else {
				typ = "slot: occurrence"
			}
		case string(bExecutions):
			if isInputKey(k) {
				typ, blob = "input", len(v)
			} else {
				typ = "execution"
				if e, err := decodeExecution(v); err == nil {
					blob = len(e.Input) + len(e.Output) + len(e.Error)
				}
			}
		}
		add(typ, k, v, blob)
		return nil
	})
	if err != nil {
		return err
	}
	start := len(rep.Records)
	for _, r := range byType {
		rep.Records = append(rep.Records, *r)
	}
	slices.SortFunc(rep.Records[start:], func(a, b RecordSpace) int { return int(b.KeyBytes+b.ValueBytes) - int(a.KeyBytes+a.ValueBytes) })
	return nil
}

// classifyLogRecord names a record of the events bucket: an event by its
// type, or a step's record by its status.
func classifyLogRecord(v []byte) (typ string, blob int) {
	var ev kernel.Event
	if err := decodeEvent(v, "", 0, &ev); err == nil {
		return "event " + string(ev.Type), storedBlobs(v, 1)
	}
	if s, err := decodeStep(v); err == nil {
		return "step record (" + string(s.Status) + ")", storedBlobs(v, 3)
	}
	return "(undecodable)", 0
}

// storedBlobs is the length of the n blobs of a binary record, as stored.
func storedBlobs(v []byte, n int) int {
	total, off := 0, 2
	for range n {
		l, k := binary.Uvarint(v[off:])
		if k <= 0 {
			return 0
		}
		total, off = total+int(l), off+k
	}
	return total
}

// WriteTo prints the report as text tables (empty buckets left out).
func (r *SpaceReport) WriteTo(w io.Writer) (int64, error) {
	var buf bytes.Buffer
	ps := r.PageSize
	used := 0
	for _, b := range r.Buckets {
		used += b.LeafPages + b.BranchPages
	}
	fmt.Fprintf(&buf, "file: %d bytes, %d pages of %d bytes in use or free (%d bytes)\n", r.FileBytes, r.Pages, ps, r.Pages*ps)
	fmt.Fprintf(&buf, "  bucket pages %d, free %d, pending %d, freelist %d, meta 2, bucket directory %d\n",
		used, r.FreePages, r.PendingPages, r.FreelistPages, r.Pages-used-r.FreePages-r.PendingPages-r.FreelistPages-2)
	fmt.Fprintf(&buf, "\n%-13s %9s %5s %8s %8s %12s %12s %6s %12s\n", "bucket", "keys", "depth", "leaf pg", "branch", "leaf inuse", "leaf alloc", "fill", "branch inuse")
	for _, b := range r.Buckets {
		if b.Keys == 0 {
			continue
		}
		fill := "inline" // a small bucket lives in its parent's page
		if b.LeafAlloc > 0 {
			fill = fmt.Sprintf("%.1f%%", 100*float64(b.LeafInuse)/float64(b.LeafAlloc))
		}
		fmt.Fprintf(&buf, "%-13s %9d %5d %8d %8d %12d %12d %6s %12d\n", b.Name, b.Keys, b.Depth, b.LeafPages, b.BranchPages, b.LeafInuse, b.LeafAlloc, fill, b.BranchInuse)
	}
	fmt.Fprintf(&buf, "\n%-13s %-34s %8s %8s %8s %8s %8s %8s\n", "bucket", "record", "count", "avg key", "avg val", "avg blob", "max val", "leaf B")
	for _, x := range r.Records {
		n := float64(x.N)
		fmt.Fprintf(&buf, "%-13s %-34s %8d %8.1f %8.1f %8.1f %8d %8.1f\n", x.Bucket, x.Type, x.N, float64(x.KeyBytes)/n,
			float64(x.ValueBytes)/n, float64(x.BlobBytes)/n, x.MaxValue, leafElementSize+float64(x.KeyBytes+x.ValueBytes)/n)
	}
	n, err := w.Write(buf.Bytes())
	return int64(n), err
}
