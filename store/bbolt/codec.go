package bbolt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/kernel/policy"
)

// The record encoding lives here and only here (with the frozen schema 1
// decoder in codec_v1.go), so that it can change, with a migration, without
// touching the rest of the package.
//
// # Hot records: binary
//
// The records of the step hot path (Execution, Step, Event, Occurrence) are
// stored in a binary form (schema 2 and later), read and written without
// reflection:
//
//	format(1) kind(1) blobLen(uvarint)… head blob…
//
// format is formatBinary1; kind names the record type (kindExecution, …),
// so that a record read from the wrong bucket is refused rather than
// misread. The blobs are the record's raw JSON fields (input, args, result,
// payload…), stored as they are; their lengths come first and their bytes
// last. The head holds every other field, in a fixed order per kind:
//
//	string    uvarint length, bytes
//	int       zig-zag varint; uint64: uvarint
//	float64   8 bytes, little-endian IEEE 754 bits
//	bool      1 byte, 0 or 1 (also the presence flag of an optional field)
//	time      varint seconds since 0001-01-01 UTC (the zero time is 0),
//	          uvarint nanoseconds, varint zone offset in seconds
//	map       uvarint count, then key, value strings in key order
//
// Readers check both bytes and that the head is consumed exactly, so a
// record is never half-understood. Unlike JSON, the form does not follow
// the kernel types by itself: a field added to kernel.Execution, Step,
// Event or Occurrence (or to a struct they embed) must be added here, at
// the end of its head, with a new format byte whose decoder still reads
// format 1 records (the new field zero), and SchemaVersion must be bumped
// (a migration rewriting the records, or one doing nothing) so that an
// older binary refuses the file. TestCodecRoundTripsEveryField fails
// until the codec carries every field.
//
// The binary form keeps what the JSON form kept, with the same decoded
// values (a test compares the two): a nil non-omitempty raw field is stored
// as null, an empty omitempty one reads back nil, an empty map reads back
// nil, times come back in UTC (or the local zone, or a fixed zone, as
// time.Parse would return them). It does not re-validate nor compact raw
// fields (the kernel stores canonical JSON only) and keeps strings' bytes
// as they are (JSON replaced invalid UTF-8 by U+FFFD).
//
// # Format 3 (schema 7): what the key holds is not stored again
//
// Events, step records and occurrence counters are written in format 3.
// A step's record leaves its tenant, execution id and step id to its key
// (stepLogKey), an event its execution id and seq too (eventKey): they
// are read with decodeStepAt and decodeEvent, which take them from the
// key. Their strings are packed strings (appendPStr: a 64-digit hex hash
// in 33 bytes, a UUID in 17, the kernel's usual words in one or two), an
// event's type is a number (eventTypes) and its payload is packed JSON
// (packJSON). pack.go has the tables, which are part of the format. On a
// step of `wicket bench` the four events and the record take 910 bytes
// of leaf instead of 2,027 (docs/benchmarks.md).
//
// Decoding allocates little: the head is turned into one string once, and
// every string field is a substring of it (a packed string that is not a
// lone word is one allocation); the blobs are copied in one allocation and
// handed out as capacity-limited subslices. Records never
// share memory with bbolt's pages, which live only as long as the
// transaction.
//
// # Other records: JSON
//
// Agents, approvals, bundles, tenants and API keys are stored as compact
// JSON (encodeJSON, decodeJSON), as in schema 1: they are off the hot path.

// Binary record format and kinds.
const (
	formatBinary1 byte = 0x01 // JSON records start with '{'
	// formatBinary2 (schema 5) adds, at the end of the head, an
	// execution's session holder and a step's on_interrupted.
	formatBinary2 byte = 0x02
	// formatBinary3 (schema 7; events, steps and occurrence counters)
	// leaves out what the key holds (the tenant, execution id and step id;
	// an event's seq) and packs strings and payloads (pack.go): see
	// encodeEvent, encodeStep, appendOccurrence.
	formatBinary3 byte = 0x03

	kindExecution  byte = 'E'
	kindStep       byte = 'S'
	kindEvent      byte = 'V'
	kindOccurrence byte = 'O'
)

// errMalformed is wrapped by every error about an undecodable binary record.
var errMalformed = errors.New("malformed record")

// zeroUnix is the Unix time of the zero time.Time (0001-01-01 UTC).
const zeroUnix = -62135596800

// encode returns the stored form of a record of any type: binary for the
// hot records, JSON for the others.
func encode(v any) ([]byte, error) {
	switch x := v.(type) {
	case *kernel.Execution:
		return encodeExecution(x), nil
	case *kernel.Step:
		return encodeStep(x), nil
	case *kernel.Event:
		return encodeEvent(x), nil
	case kernel.Event:
		return encodeEvent(&x), nil
	case kernel.Occurrence:
		return encodeOccurrence(x), nil
	case *kernel.Occurrence:
		return encodeOccurrence(*x), nil
	}
	return encodeJSON(v)
}

// decode parses a stored record into a new T. The result shares no memory
// with b, which bbolt owns only for the life of the transaction. Events
// and steps are not decoded here: their key completes them (decodeEvent,
// decodeStepAt).
func decode[T any](b []byte) (*T, error) {
	var v any
	var err error
	switch any((*T)(nil)).(type) {
	case *kernel.Execution:
		v, err = decodeExecution(b)
	case *kernel.Occurrence:
		o := new(kernel.Occurrence)
		*o, err = decodeOccurrence(b)
		v = o
	default:
		return decodeJSON[T](b)
	}
	if err != nil {
		return nil, err
	}
	return v.(*T), nil
}

// encodeJSON returns the JSON form of a record. HTML characters are not
// escaped, so that raw JSON fields keep their bytes; they are compacted.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// decodeJSON parses a JSON record into a new T.
func decodeJSON[T any](b []byte) (*T, error) {
	v := new(T)
	if err := json.Unmarshal(b, v); err != nil {
		return nil, err
	}
	return v, nil
}

// ---- writing ----

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendInt(b []byte, v int64) []byte { return binary.AppendVarint(b, v) }

func appendUint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

func appendFloat(b []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendTime(b []byte, t time.Time) []byte {
	_, off := t.Zone()
	b = binary.AppendVarint(b, t.Unix()-zeroUnix)
	b = binary.AppendUvarint(b, uint64(t.Nanosecond()))
	return binary.AppendVarint(b, int64(off))
}

func appendOptTime(b []byte, t *time.Time) []byte {
	if t == nil {
		return appendBool(b, false)
	}
	return appendTime(appendBool(b, true), *t)
}

// appendLabels appends m's entries in key order.
func appendLabels(b []byte, m map[string]string) []byte {
	b = appendUint(b, uint64(len(m)))
	switch len(m) {
	case 0:
	case 1:
		for k, v := range m {
			b = appendStr(appendStr(b, k), v)
		}
	default:
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b = appendStr(appendStr(b, k), m[k])
		}
	}
	return b
}

// orNull is raw, or null when raw is empty: what the JSON form stored for
// a raw field without omitempty.
func orNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

// header starts a record of kind whose blobs are blobs; size is a capacity
// hint for the head.
func header(format, kind byte, size int, blobs ...[]byte) []byte {
	for _, bl := range blobs {
		size += len(bl) + binary.MaxVarintLen32
	}
	b := make([]byte, 0, size+2)
	b = append(b, format, kind)
	for _, bl := range blobs {
		b = appendUint(b, uint64(len(bl)))
	}
	return b
}

// encodeExecution returns the stored form of e. The fields the indexes
// derive from come first, so that PutExecution can read them alone (see
// decodeExecIndex).
func encodeExecution(e *kernel.Execution) []byte { return encodeExecutionWith(e, e.Input) }

// encodeExecutionWith is encodeExecution with input in place of e.Input.
func encodeExecutionWith(e *kernel.Execution, input json.RawMessage) []byte {
	input = orNull(input)
	size := 160 + len(e.ID) + len(e.Tenant) + len(e.IdempotencyKey) + len(e.Dispatch.State) +
		len(e.AgentID) + len(e.AgentVersion) + len(e.Status) + len(e.Reason) + len(e.Limits.MaxDuration) +
		len(e.Lease.DispatchID) + len(e.Dispatch.ID) + len(e.BlockedOn)
	for k, v := range e.Labels {
		size += len(k) + len(v) + 4
	}
	if h := e.Holder; h != nil {
		size += 2 + len(h.KeyID) + len(h.Principal)
	}
	b := header(formatBinary2, kindExecution, size, input, e.Output, e.Error)
	// Index fields.
	b = appendStr(b, e.ID)
	b = appendStr(b, e.Tenant)
	b = appendStr(b, e.IdempotencyKey)
	b = appendStr(b, string(e.Dispatch.State))
	b = appendTime(b, e.Dispatch.DueAt)
	b = appendTime(b, e.Dispatch.LeaseUntil)
	// The rest.
	b = appendStr(b, e.AgentID)
	b = appendStr(b, e.AgentVersion)
	b = appendStr(b, string(e.Status))
	b = appendStr(b, e.Reason)
	b = appendLabels(b, e.Labels)
	l := &e.Limits
	b = appendInt(b, l.MaxSteps)
	b = appendInt(b, l.MaxLLMCalls)
	b = appendInt(b, l.MaxOutputTokensPerCall)
	b = appendInt(b, l.MaxTotalTokens)
	b = appendFloat(b, l.MaxCostUSD)
	b = appendStr(b, l.MaxDuration)
	b = appendInt(b, l.MaxConsecutiveFailures)
	b = appendInt(b, l.MaxLoopRepetitions)
	b = appendInt(b, e.Totals.Steps)
	b = appendInt(b, e.Totals.LLMCalls)
	b = appendInt(b, e.Totals.Tokens)
	b = appendFloat(b, e.Totals.CostUSD)
	b = appendOptTime(b, e.Deadline)
	b = appendTime(b, e.CreatedAt)
	b = appendTime(b, e.UpdatedAt)
	b = appendUint(b, e.LastSeq)
	b = appendStr(b, e.Lease.DispatchID)
	b = appendInt(b, int64(e.Lease.Attempt))
	b = appendStr(b, e.Dispatch.ID)
	b = appendInt(b, int64(e.Dispatch.Attempt))
	b = appendInt(b, int64(e.Dispatch.Failures))
	b = appendStr(b, e.BlockedOn)
	// Format 2.
	b = appendBool(b, e.Holder != nil)
	if h := e.Holder; h != nil {
		b = appendStr(b, h.KeyID)
		b = appendStr(b, h.Principal)
	}
	b = append(b, input...)
	b = append(b, e.Output...)
	return append(b, e.Error...)
}

// encodeStep returns the stored form of s, format 3: its tenant,
// execution id and id are not stored (its key, stepLogKey, holds them:
// see decodeStepAt), and its string fields are packed strings (appendPStr):
// hashes, UUIDs and the kernel's usual words take a few bytes.
func encodeStep(s *kernel.Step) []byte {
	args := orNull(s.Args)
	size := 96 + len(s.Kind) + len(s.Target) +
		len(s.ArgsHash) + len(s.Idempotency) + len(s.Effect) + len(s.Status) + len(s.Lease.DispatchID) + len(s.ApprovalID)
	if d := s.Verdict; d != nil {
		size += 48 + len(d.Action) + len(d.Reason) + len(d.RuleID) + len(d.Bundle.Name) +
			len(d.Bundle.Revision) + len(d.Bundle.Digest) + len(d.Bundle.Engine)
	}
	size += len(s.OnInterrupted)
	b := header(formatBinary3, kindStep, size, args, s.Result, s.Error)
	b = appendPStr(b, s.Kind)
	b = appendPStr(b, s.Target)
	b = appendPStr(b, s.ArgsHash)
	b = appendInt(b, int64(s.Occurrence))
	b = appendPStr(b, string(s.Idempotency))
	b = appendPStr(b, s.Effect)
	b = appendPStr(b, string(s.Status))
	b = appendBool(b, s.Usage != nil)
	if u := s.Usage; u != nil {
		b = appendInt(b, u.InputTokens)
		b = appendInt(b, u.OutputTokens)
		b = appendInt(b, u.TotalTokens)
		b = appendFloat(b, u.CostUSD)
	}
	b = appendPStr(b, s.Lease.DispatchID)
	b = appendInt(b, int64(s.Lease.Attempt))
	b = appendBool(b, s.Verdict != nil)
	if d := s.Verdict; d != nil {
		b = appendPStr(b, string(d.Action))
		b = appendPStr(b, d.Reason)
		b = appendPStr(b, d.RuleID)
		b = appendPStr(b, d.Bundle.Name)
		b = appendPStr(b, d.Bundle.Revision)
		b = appendPStr(b, d.Bundle.Digest)
		b = appendPStr(b, d.Bundle.Engine)
		b = appendInt(b, int64(d.EvalTime))
	}
	b = appendPStr(b, s.ApprovalID)
	b = appendUint(b, s.Seq)
	b = appendTime(b, s.CreatedAt)
	b = appendOptTime(b, s.CompletedAt)
	b = appendPStr(b, s.OnInterrupted)
	b = append(b, args...)
	b = append(b, s.Result...)
	return append(b, s.Error...)
}

// appendPStr appends a packed string: uvarint(n<<1 | packed), then n
// bytes, s itself or, when that is shorter, packJSON's form of it (with
// hex digits and UUIDs packed from its first byte).
func appendPStr(b []byte, s string) []byte {
	if len(s) >= 7 { // nothing shorter packs
		at := len(b) + binary.MaxVarintLen32
		b = append(b, make([]byte, binary.MaxVarintLen32)...)
		if p, ok := packJSON(b[at:at], s, true); ok {
			n := len(p)
			b = b[:at-binary.MaxVarintLen32]
			b = appendUint(b, uint64(n)<<1|1)
			// The packed bytes sit after the varint's room: move them.
			return append(b, p[:n:n]...)
		}
		b = b[:at-binary.MaxVarintLen32]
	}
	b = appendUint(b, uint64(len(s))<<1)
	return append(b, s...)
}

// encodeEvent returns the stored form of ev, format 3: its execution id
// and seq are not stored (the key holds them: see decodeEvent), its type
// is a number when it is one of eventTypes, and its payload is packed
// (packJSON) when that makes it shorter. The head is
//
//	flags(uvarint: 1 = payload packed) typeCode(uvarint) [type string if code 0] time
//
// and the payload is the only blob.
func encodeEvent(ev *kernel.Event) []byte {
	payload := orNull(ev.Payload)
	code := eventTypeCodes[ev.Type]
	headMax := 2 + 20 + binary.MaxVarintLen64
	if code == 0 {
		headMax += binary.MaxVarintLen64 + len(ev.Type)
	}
	// The payload is packed into the tail of the buffer, then moved right
	// behind the head: one allocation. Packing never writes more bytes
	// than it has read, so it stays within the tail.
	tail := 2 + binary.MaxVarintLen32 + headMax
	buf := make([]byte, tail+len(payload))
	blob, packed := packJSON(buf[tail:tail], payload, false)
	if !packed {
		blob = payload
	}
	b := append(buf[:0], formatBinary3, kindEvent)
	b = appendUint(b, uint64(len(blob)))
	if packed {
		b = appendUint(b, 1)
	} else {
		b = appendUint(b, 0)
	}
	b = appendUint(b, code)
	if code == 0 {
		b = appendStr(b, string(ev.Type))
	}
	b = appendTime(b, ev.Time)
	return append(b, blob...)
}

// encodeOccurrence returns the stored form of o.
func encodeOccurrence(o kernel.Occurrence) []byte {
	return appendOccurrence(make([]byte, 0, occurrenceSize(o)), o)
}

// occurrenceSize bounds the length of o's stored form.
func occurrenceSize(o kernel.Occurrence) int {
	return 2 + 3*binary.MaxVarintLen64 + len(o.Lease.DispatchID)
}

// appendOccurrence appends the stored form of o (a record without blobs),
// format 3: the lease's dispatch id (a UUID) as a packed string.
func appendOccurrence(b []byte, o kernel.Occurrence) []byte {
	b = append(b, formatBinary3, kindOccurrence)
	b = appendPStr(b, o.Lease.DispatchID)
	b = appendInt(b, int64(o.Lease.Attempt))
	return appendInt(b, int64(o.Count))
}

// ---- reading ----

// reader reads a binary record. After the first error every read returns
// a zero value; err reports it.
type reader struct {
	b []byte // the record
	s string // b[:end] as a string: string fields are substrings of it
	// format is the record's format byte (formatBinary1, 2 or 3).
	format byte
	off    int // next byte to read
	end    int // end of the head (start of the blobs)
	err    error
}

// fail records an error at the current byte; nothing can be read after it.
func (r *reader) fail() {
	if r.err == nil {
		r.err = fmt.Errorf("%w: byte %d of %d", errMalformed, r.off, len(r.b))
	}
	r.off, r.end = 0, 0
}

// begin checks the record's format and kind, reads the lengths of its
// blobs into lens and positions r at the start of the head. When str is
// set, string fields can be read (one allocation); otherwise only raw
// fields (rawStr) can.
func (r *reader) begin(b []byte, kind byte, lens []int, str bool) {
	r.b = b
	if len(b) < 2 || (b[0] != formatBinary1 && b[0] != formatBinary2 && (b[0] != formatBinary3 || kind == kindExecution)) || b[1] != kind {
		if len(b) > 0 && b[0] == '{' {
			r.err = fmt.Errorf("%w: a JSON record (schema 1) where a binary one is expected", errMalformed)
		} else {
			r.err = fmt.Errorf("%w: not a %q record", errMalformed, kind)
		}
		return
	}
	r.format = b[0]
	r.off, r.end = 2, len(b)
	total := 0
	for i := range lens {
		n := r.uvarint()
		if n > uint64(len(b)) {
			r.fail()
			return
		}
		lens[i] = int(n)
		total += int(n)
	}
	if r.err != nil {
		return
	}
	if total > len(b)-r.off {
		r.fail()
		return
	}
	r.end = len(b) - total
	if str {
		r.s = string(b[:r.end])
	}
}

// finish checks that the head was read exactly.
func (r *reader) finish() error {
	if r.err == nil && r.off != r.end {
		r.err = fmt.Errorf("%w: %d unread byte(s) in the head", errMalformed, r.end-r.off)
	}
	return r.err
}

// blobs copies the blobs (whose lengths are lens) in one allocation and
// stores them in out; an empty blob is nil. Each is capacity-limited, so
// that appending to one never writes into the next.
func (r *reader) blobs(lens []int, out ...*json.RawMessage) {
	if r.err != nil {
		return
	}
	tail := bytes.Clone(r.b[r.end:])
	at := 0
	for i, n := range lens {
		if n > 0 {
			*out[i] = tail[at : at+n : at+n]
		}
		at += n
	}
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b[r.off:r.end])
	if n <= 0 {
		r.fail()
		return 0
	}
	r.off += n
	return v
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b[r.off:r.end])
	if n <= 0 {
		r.fail()
		return 0
	}
	r.off += n
	return v
}

func (r *reader) int() int { return int(r.varint()) }

// strLen reads a string's length and checks it fits.
func (r *reader) strLen() int {
	n := r.uvarint()
	if n > uint64(r.end-r.off) {
		r.fail()
		return 0
	}
	return int(n)
}

func (r *reader) str() string {
	n := r.strLen()
	s := r.s[r.off : r.off+n]
	r.off += n
	return s
}

// pstr reads a packed string (appendPStr).
func (r *reader) pstr() string {
	tag := r.uvarint()
	n := tag >> 1
	if n > uint64(r.end-r.off) {
		r.fail()
		return ""
	}
	raw := r.b[r.off : r.off+int(n)]
	if tag&1 == 0 {
		s := r.s[r.off : r.off+int(n)]
		r.off += int(n)
		return s
	}
	if _, err := unpackedLen(raw); err != nil {
		r.fail()
		return ""
	}
	r.off += int(n)
	// A lone word is the table's string; the rest is unpacked on the
	// stack and copied once.
	switch {
	case len(raw) == 1 && raw[0] < packExt:
		return packWords[raw[0]-1]
	case len(raw) == 2 && raw[0] == packExt:
		return packWordsExt[raw[1]]
	}
	var buf [128]byte
	return string(unpackJSON(buf[:0], raw))
}

// field reads a string field: a packed string (pstr) when packed is set,
// else a plain one (str).
func (r *reader) field(packed bool) string {
	if packed {
		return r.pstr()
	}
	return r.str()
}

// rawStr reads a string field as a subslice of the record (no copy).
func (r *reader) rawStr() []byte {
	n := r.strLen()
	s := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return s
}

func (r *reader) float() float64 {
	if r.end-r.off < 8 {
		r.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return math.Float64frombits(v)
}

func (r *reader) bool() bool {
	if r.off >= r.end || r.b[r.off] > 1 {
		r.fail()
		return false
	}
	r.off++
	return r.b[r.off-1] == 1
}

// timeParts reads a time's Unix seconds, nanoseconds and zone offset.
func (r *reader) timeParts() (sec, nsec int64, off int) {
	s := r.varint()
	ns := r.uvarint()
	o := r.varint()
	if r.err != nil {
		return 0, 0, 0
	}
	if s < math.MinInt64-zeroUnix || ns >= 1e9 || o <= -1<<31 || o >= 1<<31 {
		r.fail()
		return 0, 0, 0
	}
	return s + zeroUnix, int64(ns), int(o)
}

func (r *reader) time() time.Time {
	sec, nsec, off := r.timeParts()
	if r.err != nil {
		return time.Time{}
	}
	return mkTime(sec, nsec, off)
}

// mkTime returns the instant in the location time.Parse would give a
// timestamp with zone offset off: UTC for 0, the local zone when it has
// that offset at that instant, else a fixed zone.
func mkTime(sec, nsec int64, off int) time.Time {
	t := time.Unix(sec, nsec)
	if off == 0 {
		return t.UTC()
	}
	lt := t.In(time.Local)
	if _, o := lt.Zone(); o == off {
		return lt
	}
	return t.In(time.FixedZone("", off))
}

// timeNanos reads a time as the Unix nanoseconds putTime stores for it
// (all the indexes need).
func (r *reader) timeNanos() int64 {
	sec, nsec, _ := r.timeParts()
	return clampNanos(time.Unix(sec, nsec))
}

func (r *reader) optTime() *time.Time {
	if !r.bool() {
		return nil
	}
	t := r.time()
	return &t
}

func (r *reader) labels() map[string]string {
	n := r.uvarint()
	if n == 0 {
		return nil
	}
	if n > uint64(r.end-r.off)/2 {
		r.fail()
		return nil
	}
	m := make(map[string]string, n)
	for range n {
		k := r.str()
		m[k] = r.str()
	}
	return m
}

func malformed(what string, err error) error {
	return fmt.Errorf("%s: %w", what, err)
}

// decodeExecution parses the stored form of an execution.
func decodeExecution(b []byte) (*kernel.Execution, error) {
	var r reader
	var lens [3]int
	r.begin(b, kindExecution, lens[:], true)
	e := new(kernel.Execution)
	e.ID = r.str()
	e.Tenant = r.str()
	e.IdempotencyKey = r.str()
	e.Dispatch.State = kernel.DispatchStatus(r.str())
	e.Dispatch.DueAt = r.time()
	e.Dispatch.LeaseUntil = r.time()
	e.AgentID = r.str()
	e.AgentVersion = r.str()
	e.Status = kernel.ExecStatus(r.str())
	e.Reason = r.str()
	e.Labels = r.labels()
	l := &e.Limits
	l.MaxSteps = r.varint()
	l.MaxLLMCalls = r.varint()
	l.MaxOutputTokensPerCall = r.varint()
	l.MaxTotalTokens = r.varint()
	l.MaxCostUSD = r.float()
	l.MaxDuration = r.str()
	l.MaxConsecutiveFailures = r.varint()
	l.MaxLoopRepetitions = r.varint()
	e.Totals.Steps = r.varint()
	e.Totals.LLMCalls = r.varint()
	e.Totals.Tokens = r.varint()
	e.Totals.CostUSD = r.float()
	e.Deadline = r.optTime()
	e.CreatedAt = r.time()
	e.UpdatedAt = r.time()
	e.LastSeq = r.uvarint()
	e.Lease.DispatchID = r.str()
	e.Lease.Attempt = r.int()
	e.Dispatch.ID = r.str()
	e.Dispatch.Attempt = r.int()
	e.Dispatch.Failures = r.int()
	e.BlockedOn = r.str()
	if r.format >= formatBinary2 && r.bool() {
		e.Holder = &kernel.Holder{KeyID: r.str(), Principal: r.str()}
	}
	if err := r.finish(); err != nil {
		return nil, malformed("execution", err)
	}
	r.blobs(lens[:], &e.Input, &e.Output, &e.Error)
	return e, nil
}

// execIndex is what the indexes of a stored execution derive from. Its
// byte slices point into the record.
type execIndex struct {
	id, tenant, idemKey []byte
	state               []byte
	dueAt, leaseUntil   int64 // Unix nanoseconds, clamped as putTime does
}

// decodeExecIndex reads the index fields of a stored execution without
// decoding (or copying) the rest.
func decodeExecIndex(b []byte) (execIndex, error) {
	var r reader
	var lens [3]int
	r.begin(b, kindExecution, lens[:], false)
	var x execIndex
	x.id = r.rawStr()
	x.tenant = r.rawStr()
	x.idemKey = r.rawStr()
	x.state = r.rawStr()
	x.dueAt = r.timeNanos()
	x.leaseUntil = r.timeNanos()
	if r.err != nil {
		return execIndex{}, malformed("execution", r.err)
	}
	return x, nil
}

// decodeStep parses the stored form of a step: the fields the record
// holds. A format 3 record does not hold its tenant, execution id nor id
// (they are left empty): decodeStepAt completes them from the key.
func decodeStep(b []byte) (*kernel.Step, error) {
	var r reader
	var lens [3]int
	r.begin(b, kindStep, lens[:], true)
	s := new(kernel.Step)
	p := r.format == formatBinary3 // packed strings, no ids
	if !p {
		s.ID = r.str()
		s.ExecutionID = r.str()
		s.Tenant = r.str()
	}
	s.Kind = r.field(p)
	s.Target = r.field(p)
	s.ArgsHash = r.field(p)
	s.Occurrence = r.int()
	s.Idempotency = kernel.Idempotency(r.field(p))
	s.Effect = r.field(p)
	s.Status = kernel.StepStatus(r.field(p))
	if r.bool() {
		s.Usage = &kernel.Usage{InputTokens: r.varint(), OutputTokens: r.varint(), TotalTokens: r.varint(), CostUSD: r.float()}
	}
	s.Lease.DispatchID = r.field(p)
	s.Lease.Attempt = r.int()
	if r.bool() {
		d := new(kernel.StepVerdict)
		d.Action = policy.Action(r.field(p))
		d.Reason = r.field(p)
		d.RuleID = r.field(p)
		d.Bundle.Name = r.field(p)
		d.Bundle.Revision = r.field(p)
		d.Bundle.Digest = r.field(p)
		d.Bundle.Engine = r.field(p)
		d.EvalTime = time.Duration(r.varint())
		s.Verdict = d
	}
	s.ApprovalID = r.field(p)
	s.Seq = r.uvarint()
	s.CreatedAt = r.time()
	s.CompletedAt = r.optTime()
	if r.format >= formatBinary2 {
		s.OnInterrupted = r.field(p)
	}
	if err := r.finish(); err != nil {
		return nil, malformed("step", err)
	}
	r.blobs(lens[:], &s.Args, &s.Result, &s.Error)
	return s, nil
}

// stepStatus reads the status of a stored step from its head alone,
// without its arguments, result and error; ok is false when the head does
// not read (decodeStep then says why).
func stepStatus(b []byte) (st kernel.StepStatus, ok bool) {
	var r reader
	var lens [3]int
	r.begin(b, kindStep, lens[:], true)
	p := r.format == formatBinary3
	if !p {
		r.str()
		r.str()
		r.str()
	}
	r.field(p) // kind
	r.field(p) // target
	r.field(p) // args hash
	r.int()    // occurrence
	r.field(p) // idempotency
	r.field(p) // effect
	st = kernel.StepStatus(r.field(p))
	return st, r.err == nil
}

// decodeStepAt parses the stored form of step id of execution execID of
// tenant (the ids its key names): a format 3 record takes them from the
// arguments, an older one holds them.
func decodeStepAt(b []byte, tenant, execID, id string) (*kernel.Step, error) {
	s, err := decodeStep(b)
	if err != nil {
		return nil, err
	}
	if b[0] == formatBinary3 {
		s.Tenant, s.ExecutionID, s.ID = tenant, execID, id
	}
	return s, nil
}

// decodeEvent parses the stored form of an event of execution execID
// stored at seq into ev. A format 3 record takes its execution id and seq
// from the arguments (its key); an older one holds them.
func decodeEvent(b []byte, execID string, seq uint64, ev *kernel.Event) error {
	var r reader
	var lens [1]int
	r.begin(b, kindEvent, lens[:], len(b) > 0 && b[0] != formatBinary3)
	packed := false
	if r.format == formatBinary3 {
		ev.ExecutionID, ev.Seq = execID, seq
		switch flags := r.uvarint(); flags {
		case 0, 1:
			packed = flags == 1
		default:
			r.fail()
		}
		code := r.uvarint()
		switch {
		case code == 0:
			ev.Type = kernel.EventType(r.rawStr())
		case code <= uint64(len(eventTypes)):
			ev.Type = eventTypes[code-1]
		default:
			r.fail()
		}
	} else {
		ev.ExecutionID = r.str()
		ev.Seq = r.uvarint()
		ev.Type = kernel.EventType(r.str())
	}
	ev.Time = r.time()
	if err := r.finish(); err != nil {
		*ev = kernel.Event{}
		return malformed("event", err)
	}
	ev.Payload = nil
	if !packed {
		r.blobs(lens[:], &ev.Payload)
		return nil
	}
	tail := r.b[r.end:]
	n, err := unpackedLen(tail)
	if err != nil {
		*ev = kernel.Event{}
		return malformed("event", err)
	}
	if n > 0 {
		ev.Payload = unpackJSON(make([]byte, 0, n), tail)
	}
	return nil
}

// decodeOccurrence parses the stored form of an occurrence counter.
func decodeOccurrence(b []byte) (kernel.Occurrence, error) {
	var r reader
	r.begin(b, kindOccurrence, nil, true)
	var o kernel.Occurrence
	o.Lease.DispatchID = r.field(r.format == formatBinary3)
	o.Lease.Attempt = r.int()
	o.Count = r.int()
	if err := r.finish(); err != nil {
		return kernel.Occurrence{}, malformed("occurrence", err)
	}
	return o, nil
}

// decodeApprovalIndex reads the fields of a stored approval its expiry
// index derives from (the rest of the record is skipped, not decoded).
func decodeApprovalIndex(b []byte) (*kernel.Approval, error) {
	var x struct {
		ID        string                `json:"id"`
		Tenant    string                `json:"tenant"`
		Status    kernel.ApprovalStatus `json:"status"`
		ExpiresAt time.Time             `json:"expires_at"`
	}
	if err := json.Unmarshal(b, &x); err != nil {
		return nil, err
	}
	return &kernel.Approval{ID: x.ID, Tenant: x.Tenant, Status: x.Status, ExpiresAt: x.ExpiresAt}, nil
}
