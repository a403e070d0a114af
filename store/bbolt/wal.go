package bbolt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The write-ahead log (Options.WAL) makes a commit durable with one
// sequential append and one fdatasync instead of bbolt's two fsyncs over
// every page the commit dirtied. See the package doc, Write-ahead log, for the design.
//
// Files, in the directory WALDir(path):
//
//	<first lsn, 16 hex digits>.wal   segments: walMagic, then records
//	checkpoint                       the base the segments apply to
//
// A record is a 16-byte header — payload length (uint32 LE), CRC-32C of
// the lsn and payload (uint32 LE), lsn (uint64 LE) — then the payload: the
// commit's writes as operations (walBatch). LSNs are consecutive.

const (
	walMagic           = "WKTWAL01"
	ckptMagic          = "WKTCKP01"
	walHeaderSize      = 16
	ckptName           = "checkpoint"
	walSegmentExt      = ".wal"
	walOpPut      byte = 'P'
	walOpDel      byte = 'D'
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// walMaxRecord is the largest record payload: a larger length read back
// is damage, not a record. (A variable for tests.)
var walMaxRecord = 1 << 30

// WALDir returns the directory of the write-ahead log of the store at
// path.
func WALDir(path string) string { return path + "-wal" }

// walBatch collects the writes of one commit as a record payload. Its
// buffer starts with room for the record header, so that the record is
// written with one call.
type walBatch struct {
	buf []byte
	ops int
}

func (b *walBatch) reset() {
	if cap(b.buf) > 16<<20 {
		b.buf = nil // do not keep a purge's buffer forever
	}
	b.buf = append(b.buf[:0], make([]byte, walHeaderSize)...)
	b.ops = 0
}

func (b *walBatch) put(bucket, k, v []byte) {
	b.buf = append(b.buf, walOpPut)
	b.buf = appendBytes(appendBytes(appendBytes(b.buf, bucket), k), v)
	b.ops++
}

func (b *walBatch) del(bucket, k []byte) {
	b.buf = append(b.buf, walOpDel)
	b.buf = appendBytes(appendBytes(b.buf, bucket), k)
	b.ops++
}

func appendBytes(dst, p []byte) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(p))), p...)
}

// walOp is one decoded operation of a record.
type walOp struct {
	op          byte
	bucket, key []byte
	value       []byte // walOpPut only
}

// decodeOps calls fn with every operation of payload, in order. The
// slices alias payload.
func decodeOps(payload []byte, fn func(walOp) error) error {
	for len(payload) > 0 {
		var o walOp
		o.op = payload[0]
		payload = payload[1:]
		var err error
		if o.bucket, payload, err = takeBytes(payload); err != nil {
			return err
		}
		if o.key, payload, err = takeBytes(payload); err != nil {
			return err
		}
		switch o.op {
		case walOpPut:
			if o.value, payload, err = takeBytes(payload); err != nil {
				return err
			}
		case walOpDel:
		default:
			return fmt.Errorf("unknown operation %q", o.op)
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

func takeBytes(p []byte) ([]byte, []byte, error) {
	n, w := binary.Uvarint(p)
	if w <= 0 || n > uint64(len(p)-w) {
		return nil, nil, errors.New("truncated operation")
	}
	end := w + int(n)
	return p[w:end:end], p[end:], nil
}

// wal is the log being written: its active segment.
//
// Segments are written in place over zeros written when the segment was
// made: an append then changes neither the file's size nor its block map,
// so its fdatasync writes the record and flushes the disk's cache without
// a filesystem journal commit (which, on ext4, would also write every
// block the bbolt file allocated since the last one). The next segment
// is made in the background while the active one fills.
type wal struct {
	dir     string
	segSize int64
	f       *os.File
	first   uint64 // first lsn of the active segment (its name)
	off     int64  // where the next record goes in the active segment
	size    int64  // the active segment's size
	lsn     uint64 // last lsn written
	spare   chan spareSegment
	pending bool // a spare is being made
}

// spareSegment is a zero-filled segment made ahead, not yet named.
type spareSegment struct {
	f    *os.File
	size int64
	err  error
}

func segmentName(first uint64) string { return fmt.Sprintf("%016x%s", first, walSegmentExt) }

// makeSegment creates a zero-filled segment file of size bytes (its magic
// first) under a temporary name, synced.
func makeSegment(dir string, size int64) spareSegment {
	f, err := os.CreateTemp(dir, "spare-*.tmp")
	if err != nil {
		return spareSegment{err: fmt.Errorf("wal: make segment: %w", err)}
	}
	fail := func(err error) spareSegment {
		f.Close()
		os.Remove(f.Name())
		return spareSegment{err: fmt.Errorf("wal: make segment %s: %w", f.Name(), err)}
	}
	if err := f.Chmod(FileMode); err != nil {
		return fail(err)
	}
	zeros := make([]byte, 1<<20)
	copy(zeros, walMagic)
	for off := int64(0); off < size; {
		n := min(int64(len(zeros)), size-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return fail(err)
		}
		if off == 0 {
			clear(zeros[:len(walMagic)])
		}
		off += n
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	return spareSegment{f: f, size: size}
}

// createSegment starts a new active segment, with room for a record of
// need bytes at least, whose first record will be lsn w.lsn+1. Its name
// is durable before anything is written to it.
func (w *wal) createSegment(need int64) error {
	var sp spareSegment
	if w.pending && need+int64(len(walMagic)) <= w.segSize {
		sp = <-w.spare
		w.pending = false
	} else {
		sp = makeSegment(w.dir, max(w.segSize, need+int64(len(walMagic))))
	}
	if sp.err != nil {
		return sp.err
	}
	first := w.lsn + 1
	p := filepath.Join(w.dir, segmentName(first))
	if err := os.Rename(sp.f.Name(), p); err != nil {
		sp.f.Close()
		return fmt.Errorf("wal: create segment: %w", err)
	}
	if err := syncDir(w.dir); err != nil {
		sp.f.Close()
		return err
	}
	if w.f != nil {
		_ = w.f.Close() // every record in it was synced when written
	}
	w.f, w.first, w.off, w.size = sp.f, first, int64(len(walMagic)), sp.size
	return nil
}

// prepareSpare starts making the next segment when the active one is
// half full.
func (w *wal) prepareSpare() {
	if w.pending || w.off < w.size/2 {
		return
	}
	w.pending = true
	go func() { w.spare <- makeSegment(w.dir, w.segSize) }()
}

// append writes b as the next record and syncs it. On error the log must
// not be used again: the record may or may not be on disk.
func (w *wal) append(b *walBatch) error {
	lsn := w.lsn + 1
	rec := b.buf
	payload := rec[walHeaderSize:]
	binary.LittleEndian.PutUint32(rec[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint64(rec[8:16], lsn)
	crc := crc32.Update(0, crcTable, rec[8:16])
	binary.LittleEndian.PutUint32(rec[4:8], crc32.Update(crc, crcTable, payload))
	if w.off+int64(len(rec)) > w.size {
		if err := w.createSegment(int64(len(rec))); err != nil {
			return err
		}
	}
	if _, err := w.f.WriteAt(rec, w.off); err != nil {
		return fmt.Errorf("wal: write record %d to %s: %w", lsn, w.segmentPath(), bareError(err))
	}
	if err := fdatasync(w.f); err != nil {
		return fmt.Errorf("wal: sync record %d in %s: %w", lsn, w.segmentPath(), err)
	}
	w.lsn = lsn
	w.off += int64(len(rec))
	w.prepareSpare()
	return nil
}

// segmentPath is the active segment's name (its *os.File still carries
// the spare's name it was made under).
func (w *wal) segmentPath() string { return filepath.Join(w.dir, segmentName(w.first)) }

// bareError drops the path from a file error: the file was renamed.
func bareError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// close closes the active segment and waits for a spare being made.
func (w *wal) close() error {
	if w.pending {
		if sp := <-w.spare; sp.f != nil {
			sp.f.Close()
		}
		w.pending = false
	}
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// segments lists the segment files of dir by first lsn.
func segments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), walSegmentExt)
		if !ok || len(name) != 16 {
			continue
		}
		n, err := strconv.ParseUint(name, 16, 64)
		if err != nil {
			continue
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// readRecords calls fn with every record of dir's segments whose lsn is
// above after, in lsn order, and returns the last lsn read (after when
// none). A record cut short or failing its checksum ends the log when it
// is in the last segment (a write the crash interrupted: never
// acknowledged) and no sound record follows it; anywhere else, and a gap
// in the lsns, is damage.
func readRecords(dir string, after uint64, fn func(lsn uint64, payload []byte) error) (uint64, error) {
	segs, err := segments(dir)
	if err != nil {
		return 0, fmt.Errorf("wal: list %s: %w", dir, err)
	}
	last := after
	for i, s := range segs {
		p := filepath.Join(dir, segmentName(s))
		data, err := os.ReadFile(p)
		if err != nil {
			return 0, fmt.Errorf("wal: read %s: %w", p, err)
		}
		final := i == len(segs)-1
		damaged := func(off int, why string) error {
			return fmt.Errorf("wal: %s at offset %d: %s: %w", p, off, why, ErrDamaged)
		}
		if !bytes.HasPrefix(data, []byte(walMagic)) {
			if final && len(data) < len(walMagic) && bytes.HasPrefix([]byte(walMagic), data) {
				break // created, its magic not yet written
			}
			return 0, damaged(0, "not a write-ahead log segment")
		}
		off := len(walMagic)
		for off < len(data) {
			rest := data[off:]
			if len(rest) < walHeaderSize {
				// Zeros too short for a header end a segment whose
				// next record did not fit (TestWALSegmentTail).
				if final || allZero(rest) {
					break
				}
				return 0, damaged(off, "record header cut short")
			}
			if allZero(rest[:walHeaderSize]) {
				break // the end of what was written in this segment
			}
			n, ok := recordAt(rest)
			if !ok {
				if final {
					break
				}
				return 0, damaged(off, "record cut short")
			}
			payload := rest[walHeaderSize : walHeaderSize+n]
			crc := crc32.Update(0, crcTable, rest[8:16])
			if crc32.Update(crc, crcTable, payload) != binary.LittleEndian.Uint32(rest[4:8]) {
				// A write the crash cut short is the last one written: a
				// sound record after it means this one was acknowledged.
				if final && !soundRecordAt(rest[walHeaderSize+n:]) {
					break
				}
				return 0, damaged(off, "checksum mismatch")
			}
			lsn := binary.LittleEndian.Uint64(rest[8:16])
			at := off
			off += walHeaderSize + int(n)
			if lsn <= after {
				continue
			}
			if lsn != last+1 {
				return 0, damaged(at, fmt.Sprintf("record %d follows %d", lsn, last))
			}
			if err := fn(lsn, payload); err != nil {
				return 0, err
			}
			last = lsn
		}
	}
	return last, nil
}

// recordAt returns the payload length of the record whose header starts
// p, and whether that length is one a record can have and fits in p.
func recordAt(p []byte) (int, bool) {
	if len(p) < walHeaderSize {
		return 0, false
	}
	n := binary.LittleEndian.Uint32(p[0:4])
	if int64(n) > int64(walMaxRecord) || int64(n) > int64(len(p)-walHeaderSize) {
		return 0, false
	}
	return int(n), true
}

// soundRecordAt reports whether p starts with a whole record whose
// checksum holds.
func soundRecordAt(p []byte) bool {
	n, ok := recordAt(p)
	if !ok || allZero(p[:walHeaderSize]) {
		return false
	}
	crc := crc32.Update(0, crcTable, p[8:16])
	return crc32.Update(crc, crcTable, p[walHeaderSize:walHeaderSize+n]) == binary.LittleEndian.Uint32(p[4:8])
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// checkpoint names the base the log applies to: a bbolt state (its
// transaction id and meta page) made durable by an fsync, and the last
// lsn it contains.
type checkpoint struct {
	lsn  uint64
	txid uint64
	// rootSum is the CRC-32C of the page the meta names as its root
	// bucket's: recovery checks the file still holds it before touching
	// anything (a backup restored over the file, with the log of the
	// file it replaced left beside it, does not).
	rootSum uint32
	meta    []byte // the meta page of txid, as bbolt wrote it
}

func (c *checkpoint) encode() []byte {
	b := append([]byte(nil), ckptMagic...)
	b = binary.LittleEndian.AppendUint64(b, c.lsn)
	b = binary.LittleEndian.AppendUint64(b, c.txid)
	b = binary.LittleEndian.AppendUint32(b, c.rootSum)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(c.meta)))
	b = append(b, c.meta...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

func decodeCheckpoint(b []byte) (*checkpoint, error) {
	if len(b) < len(ckptMagic)+24+4 || !bytes.HasPrefix(b, []byte(ckptMagic)) {
		return nil, errors.New("not a checkpoint")
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, crcTable) != sum {
		return nil, errors.New("checksum mismatch")
	}
	p := body[len(ckptMagic):]
	c := &checkpoint{lsn: binary.LittleEndian.Uint64(p[0:8]), txid: binary.LittleEndian.Uint64(p[8:16]),
		rootSum: binary.LittleEndian.Uint32(p[16:20])}
	n := binary.LittleEndian.Uint32(p[20:24])
	if int(n) != len(p)-24 {
		return nil, errors.New("meta page length mismatch")
	}
	m, err := parseMeta(p[24:])
	if err != nil {
		return nil, fmt.Errorf("meta page: %w", err)
	}
	if int(m.pageSize) != int(n) || m.txid != c.txid {
		return nil, errors.New("meta page does not match the checkpoint")
	}
	c.meta = bytes.Clone(p[24:])
	return c, nil
}

// writeCheckpoint replaces dir's checkpoint durably: a new file, synced,
// renamed over the old one, and the directory synced.
func writeCheckpoint(dir string, c *checkpoint) error {
	tmp := filepath.Join(dir, ckptName+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, FileMode)
	if err != nil {
		return fmt.Errorf("wal: checkpoint: %w", err)
	}
	if _, err := f.Write(c.encode()); err != nil {
		f.Close()
		return fmt.Errorf("wal: checkpoint: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("wal: checkpoint: sync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("wal: checkpoint: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ckptName)); err != nil {
		return fmt.Errorf("wal: checkpoint: %w", err)
	}
	return syncDir(dir)
}

// readCheckpoint returns dir's checkpoint, or nil when there is none.
func readCheckpoint(dir string) (*checkpoint, error) {
	p := filepath.Join(dir, ckptName)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wal: read %s: %w", p, err)
	}
	c, err := decodeCheckpoint(b)
	if err != nil {
		return nil, fmt.Errorf("wal: %s: %v: %w", p, err, ErrDamaged)
	}
	return c, nil
}

// removeWAL deletes dir, the log of a file that holds all of it and is
// synced. The checkpoint goes first, durably, then the segments: a crash
// in between leaves segments without a checkpoint, which the next Open
// removes (recoverFile), rightly, for the file holds their records. The
// other order would leave a checkpoint without the records after it, and
// the next Open would take the file back to the checkpoint: every commit
// since lost (TestWALCrashWhileRemovingTheLog).
func removeWAL(dir string) error {
	err := walRemove(filepath.Join(dir, ckptName))
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("wal: remove: %w", err)
	}
	segs, err := segments(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("wal: list %s: %w", dir, err)
	}
	for _, s := range segs {
		if err := walRemove(filepath.Join(dir, segmentName(s))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("wal: remove: %w", err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("wal: remove %s: %w", dir, err)
	}
	return syncDir(filepath.Dir(dir))
}

// walRemove removes a file of the log: tests stop it part way, as a
// crash would.
var walRemove = os.Remove

// syncDir makes the entries of dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("wal: sync directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("wal: sync directory %s: %w", dir, err)
	}
	return nil
}

// Meta pages. bbolt keeps two, in pages 0 and 1; a commit with
// transaction id t writes page t%2, and Open uses the valid one with the
// higher id. parseMeta (filecheck.go) decodes them.

// rootPageSum returns the CRC-32C of the first page of the root bucket the
// meta page names, as f holds it.
func rootPageSum(f *os.File, meta []byte) (uint32, error) {
	m, err := parseMeta(meta)
	if err != nil {
		return 0, fmt.Errorf("wal: meta page: %w", err)
	}
	ps := len(meta)
	page := make([]byte, ps)
	if _, err := f.ReadAt(page, int64(m.root)*int64(ps)); err != nil {
		return 0, fmt.Errorf("wal: read root page %d: %w", m.root, err)
	}
	return crc32.Checksum(page, crcTable), nil
}

// readMeta reads the meta page bbolt wrote for transaction txid.
func readMeta(f *os.File, pageSize int, txid uint64) ([]byte, error) {
	page := make([]byte, pageSize)
	if _, err := f.ReadAt(page, int64(txid%2)*int64(pageSize)); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("wal: read meta page: %w", err)
	}
	m, err := parseMeta(page)
	if err != nil {
		return nil, fmt.Errorf("wal: meta page %d: %w", txid%2, err)
	}
	if m.txid != txid {
		return nil, fmt.Errorf("wal: meta page %d holds transaction %d, not %d", txid%2, m.txid, txid)
	}
	return page, nil
}

// restoreMeta writes the checkpoint's meta page over both of the file's
// meta pages and syncs it: bbolt then opens the checkpoint's state, whose
// pages no later commit has overwritten (see the package doc, Write-ahead log).
func restoreMeta(path string, c *checkpoint) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("wal: restore checkpoint: %w", err)
	}
	defer f.Close()
	if sum, err := rootPageSum(f, c.meta); err != nil || sum != c.rootSum {
		return fmt.Errorf("wal: the write-ahead log in %s is not this file's (its checkpoint's root page is not in it; after restoring a backup, delete that directory): %w",
			WALDir(path), ErrDamaged)
	}
	ps := len(c.meta)
	for slot := range uint64(2) {
		page := bytes.Clone(c.meta)
		binary.NativeEndian.PutUint64(page[0:8], slot)
		if _, err := f.WriteAt(page, int64(slot)*int64(ps)); err != nil {
			return fmt.Errorf("wal: restore checkpoint: write meta page %d: %w", slot, err)
		}
	}
	if err := fdatasync(f); err != nil {
		return fmt.Errorf("wal: restore checkpoint: sync: %w", err)
	}
	return nil
}
