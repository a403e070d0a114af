package bbolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// ErrDamaged is returned by CheckFile (and so by Open) for a store file
// that is empty, truncated or whose header pages are corrupt: bbolt would
// start a 0-byte file silently empty and crash on a truncated one.
var ErrDamaged = errors.New("store file is damaged")

// The header of a bbolt file: two meta pages (0 and 1) of pageSize bytes.
// Each starts with a 16-byte page header (id, flags, count, overflow),
// then the meta: magic, version, pageSize, flags (4 bytes each), the root
// bucket (root page id, sequence), the freelist page id, the high-water
// mark (pages in use), the transaction id and an FNV-64a checksum of the
// meta bytes before it. Integers are little-endian (bbolt writes them in
// the machine's order, and we build for little-endian machines only).
const (
	boltMagic       = 0xED0CDAED
	boltVersion     = 2
	pageHeaderSize  = 16
	metaSize        = 64 // through the checksum
	metaChecksumOff = 56 // bytes the checksum covers
	minPageSize     = 1024
	maxPageSize     = 1 << 24
)

// fileMeta is the part of a meta page CheckFile needs.
type fileMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	hwm      uint64 // pages the file must hold
	txid     uint64
}

// parseMeta decodes and validates the meta page at the start of b.
func parseMeta(b []byte) (fileMeta, error) {
	if len(b) < pageHeaderSize+metaSize {
		return fileMeta{}, errors.New("short page")
	}
	m := b[pageHeaderSize : pageHeaderSize+metaSize]
	le := binary.LittleEndian
	if le.Uint32(m[0:]) != boltMagic {
		return fileMeta{}, errors.New("not a bbolt page (bad magic)")
	}
	if v := le.Uint32(m[4:]); v != boltVersion {
		return fileMeta{}, fmt.Errorf("bbolt format version %d, want %d", v, boltVersion)
	}
	h := fnv.New64a()
	_, _ = h.Write(m[:metaChecksumOff])
	if h.Sum64() != le.Uint64(m[metaChecksumOff:]) {
		return fileMeta{}, errors.New("meta checksum mismatch")
	}
	fm := fileMeta{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]), hwm: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}
	if fm.pageSize < minPageSize || fm.pageSize > maxPageSize || fm.pageSize&(fm.pageSize-1) != 0 {
		return fileMeta{}, fmt.Errorf("page size %d is invalid", fm.pageSize)
	}
	if fm.root >= fm.hwm || (fm.freelist >= fm.hwm && fm.freelist != ^uint64(0)) {
		return fileMeta{}, fmt.Errorf("page ids above the high-water mark %d", fm.hwm)
	}
	return fm, nil
}

// CheckFile checks, without opening it as a database, that the file at
// path can be a bbolt store: not empty, one valid meta page at least, and
// long enough for every page the newest valid meta says is in use. A
// missing file is fine (Open creates it). It reads two pages, whatever the
// file's size; [Store.Check] is the full check.
func CheckFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bbolt: check %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("bbolt: check %s: %w", path, err)
	}
	size := fi.Size()
	damaged := func(format string, args ...any) error {
		return fmt.Errorf("bbolt: %s: %w: %s (restore it from a backup, or move it away to start empty)", path, ErrDamaged, fmt.Sprintf(format, args...))
	}
	if size == 0 {
		return damaged("it is empty (0 bytes), not a store")
	}
	buf := make([]byte, 4096)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("bbolt: check %s: %w", path, err)
	}
	metas := []fileMeta{}
	m0, err0 := parseMeta(buf[:n])
	if err0 == nil {
		metas = append(metas, m0)
	}
	// Meta page 1 sits one page in: the page size of meta 0 when it is
	// valid, else every size bbolt may have used.
	sizes := []int64{}
	if err0 == nil {
		sizes = append(sizes, int64(m0.pageSize))
	} else {
		for ps := int64(minPageSize); ps <= maxPageSize; ps <<= 1 {
			sizes = append(sizes, ps)
		}
	}
	var err1 error = errors.New("beyond the end of the file")
	for _, ps := range sizes {
		if ps+pageHeaderSize+metaSize > size {
			break
		}
		n, err := f.ReadAt(buf, ps)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("bbolt: check %s: %w", path, err)
		}
		m1, err := parseMeta(buf[:n])
		if err == nil && int64(m1.pageSize) == ps {
			metas = append(metas, m1)
			err1 = nil
			break
		}
		err1 = err
	}
	if len(metas) == 0 {
		return damaged("no valid header page (page 0: %v; page 1: %v)", err0, err1)
	}
	best := metas[0]
	for _, m := range metas[1:] {
		if m.txid > best.txid {
			best = m
		}
	}
	if need := int64(best.hwm) * int64(best.pageSize); size < need {
		return damaged("it is truncated: %d bytes, but its last commit (transaction %d) uses %d pages of %d bytes (%d bytes)",
			size, best.txid, best.hwm, best.pageSize, need)
	}
	return nil
}
