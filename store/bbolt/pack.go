package bbolt

import (
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/wicket-run/wicket/kernel"
)

// Packed JSON (events of binary format 3, schema 7).
//
// An event's payload is JSON the kernel builds from a few shapes: every
// step event names its step_id (64 hex digits), kind and target; most
// name a dispatch_id (a UUID); the field names are the same every time.
// Stored as they are, the names and the hex digits were most of a step's
// bytes on disk. packJSON rewrites such a payload losslessly:
//
//	0x01…0x1b          one of the strings of packWords
//	0x1c n             packWordsExt[n]
//	0x1e + 32 bytes    64 lowercase hex digits (after a '"')
//	0x1f + 16 bytes    a lowercase UUID, 8-4-4-4-12 (after a '"')
//	any byte >= 0x20   itself
//
// JSON never holds a raw byte below 0x20 (control characters in strings
// are escaped), so every such byte of a packed payload is a token; a
// payload that does hold one (not valid JSON) is stored as it is. Unpacking
// gives back exactly the bytes packed. The tables are part of the file
// format: entries are never changed nor reordered, and packWordsExt may
// only grow (an older binary refuses what it does not know).

// packWords are the strings of the one-byte tokens 0x01…0x1b, in order.
var packWords = [...]string{
	`{"step_id":"`,
	`","kind":"`,
	`","target":"`,
	`","args_hash":"`,
	`","occurrence":`,
	`,"idempotency":"`,
	`","effect":"`,
	`","dispatch_id":"`,
	`","dispatch_attempt":`,
	`","decision":"`,
	`","reason":"`,
	`","rule_id":"`,
	`","bundle":{"name":"`,
	`","revision":"`,
	`","sha256":"`,
	`","engine":"`,
	`"},"engine":"`,
	`","eval_ns":`,
	`","approval_id":"`,
	`tool_call`,
	`llm_call`,
	`at_most_once`,
	`kernel default policy: allow`,
	`kernel_default`,
	`kernel-default`,
	`builtin`,
	`{"dispatch_id":"`,
}

// packWordsExt are the strings of the two-byte tokens 0x1c n.
var packWordsExt = [...]string{
	`{"dispatch_attempt":`,
	`,"dispatch_id":"`,
	`","lease_until":"`,
	`{"agent_id":"`,
	`","agent_version":"`,
	`","labels":null,"limits":{}}`,
	`","rate_limit_id":"`,
	`,"error":`,
	`,"usage":{"input_tokens":`,
	`,"output_tokens":`,
	`,"total_tokens":`,
	`,"cost_usd":`,
	`{"reason":"`,
	`","due_at":"`,
	`","orphaned_from":{"dispatch_id":"`,
	`","reconciled_by":"`,
	`{"approval_id":"`,
	`","step_id":"`,
	`","status":"`,
	`","decided_by":"`,
	`{"code":"`,
	`","message":"`,
	`","outcome":"`,
	`","expired_at":"`,
	`succeeded`,
	`executing`,
	`awaiting_approval`,
	`rate_limited`,
	`interrupted`,
	`cancelled`,
	`safe_to_retry`,
}

const (
	packExt  byte = 0x1c
	packHex  byte = 0x1e
	packUUID byte = 0x1f
)

// packEntry is a dictionary string and the token that stands for it.
type packEntry struct {
	s   string
	tok []byte
}

// packByFirst lists the dictionary's entries by their first byte, longest
// first (the longest match is taken).
var packByFirst = func() (t [256][]packEntry) {
	for i, w := range packWords {
		t[w[0]] = append(t[w[0]], packEntry{w, []byte{byte(i + 1)}})
	}
	for i, w := range packWordsExt {
		t[w[0]] = append(t[w[0]], packEntry{w, []byte{packExt, byte(i)}})
	}
	for i := range t {
		slices.SortStableFunc(t[i], func(a, b packEntry) int { return len(b.s) - len(a.s) })
	}
	return t
}()

// packByFirstFourth lists the same entries by their first and fourth
// bytes (every word has seven or more), longest first: nil for a first
// byte that starts no word.
var packByFirstFourth = func() (t [256]*[256][]packEntry) {
	for c, es := range packByFirst {
		for _, e := range es {
			if t[c] == nil {
				t[c] = new([256][]packEntry)
			}
			t[c][e.s[3]] = append(t[c][e.s[3]], e)
		}
	}
	return t
}()

func init() {
	if len(packWords) != int(packExt)-1 || len(packWordsExt) > 256 {
		panic("bbolt: packWords must fill the tokens 0x01…0x1b")
	}
	for _, w := range append(packWords[:], packWordsExt[:]...) {
		if len(w) < 7 {
			panic("bbolt: a packed word is shorter than 7 bytes: " + w)
		}
	}
}

func isLowerHex(c byte) bool { return hexValue[c] < 16 }

// hexValue is the value of each lowercase hex digit, 0xff for every other
// byte.
var hexValue = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i, c := range "0123456789abcdef" {
		t[c] = byte(i)
	}
	return t
}()

// packSpecial marks the bytes at which packJSON cannot copy on: control
// bytes (which stop it), '"' (after which hex digits and UUIDs pack) and
// the first bytes of packByFirst's words. Every other byte stands for
// itself, so runs of them are copied at once.
var packSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'] = true
	for c, ws := range packByFirst {
		if len(ws) > 0 {
			t[c] = true
		}
	}
	return t
}()

// decodeHex writes the bytes of the len(dst)*2 hex digits at the start of
// h to dst; ok is false when one of them is not a lowercase hex digit (dst
// then holds garbage). h must hold that many bytes.
func decodeHex[S ~string | ~[]byte](dst []byte, h S) (ok bool) {
	h = h[:2*len(dst)]
	bad := byte(0)
	for i := range dst {
		hi, lo := hexValue[h[2*i]], hexValue[h[2*i+1]]
		bad |= hi | lo
		dst[i] = hi<<4 | lo
	}
	return bad < 16
}

// packHexAt appends the packed form of the 64 hex digits or the UUID that
// src starts with, and how many bytes of src that was: 64, 36, or 0 (dst
// unchanged) when src starts with neither.
func packHexAt[S ~string | ~[]byte](dst []byte, src S) (_ []byte, read int) {
	n := len(dst)
	if len(src) >= 64 {
		dst = slices.Grow(dst, 33)[:n+33]
		if decodeHex(dst[n+1:], src) {
			dst[n] = packHex
			return dst, 64
		}
		dst = dst[:n]
	}
	if len(src) < 36 || src[8] != '-' || src[13] != '-' || src[18] != '-' || src[23] != '-' {
		return dst, 0
	}
	dst = slices.Grow(dst, 17)[:n+17]
	u := dst[n+1:]
	if decodeHex(u[:4], src) && decodeHex(u[4:6], src[9:]) && decodeHex(u[6:8], src[14:]) &&
		decodeHex(u[8:10], src[19:]) && decodeHex(u[10:], src[24:]) {
		dst[n] = packUUID
		return dst, 36
	}
	return dst[:n], 0
}

// packJSON appends the packed form of src to dst; ok is false (and dst
// unchanged) when src holds a byte below 0x20 or packing saves nothing.
// Hex digits and UUIDs are packed after a '"' only (JSON strings), or at
// the start too when atStart is set (a string field, packStr). It never
// writes more bytes than it has read.
func packJSON[S ~string | ~[]byte](dst []byte, src S, atStart bool) (_ []byte, ok bool) {
	start := len(dst)
	hexNext := atStart // src[i] follows a '"' (or starts a string)
	for i := 0; i < len(src); {
		c := src[i]
		if hexNext && isLowerHex(c) {
			var read int
			if dst, read = packHexAt(dst, src[i:]); read > 0 {
				i, hexNext = i+read, false
				continue
			}
		}
		if !packSpecial[c] {
			// A run of bytes that stand for themselves (none is '"').
			j := i + 1
			for j < len(src) && !packSpecial[src[j]] {
				j++
			}
			dst = append(dst, src[i:j]...)
			i, hexNext = j, false
			continue
		}
		if c < 0x20 {
			return dst[:start], false
		}
		matched := false
		if ws := packByFirstFourth[c]; ws != nil && len(src)-i >= 7 {
			for _, e := range ws[src[i+3]] {
				if len(src)-i >= len(e.s) && string(src[i:i+len(e.s)]) == e.s {
					dst = append(dst, e.tok...)
					i += len(e.s)
					matched = true
					break
				}
			}
		}
		if !matched {
			dst = append(dst, c)
			i++
		}
		hexNext = src[i-1] == '"'
	}
	if len(dst)-start >= len(src) {
		return dst[:start], false
	}
	return dst, true
}

// unpackedLen is the length of the JSON packed as b, or an error when b
// is not a packed form.
func unpackedLen(b []byte) (int, error) {
	n := 0
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c >= 0x20:
			n++
			i++
		case c >= 0x01 && c < packExt:
			n += len(packWords[c-1])
			i++
		case c == packExt:
			if i+1 >= len(b) || int(b[i+1]) >= len(packWordsExt) {
				return 0, fmt.Errorf("%w: packed JSON: unknown token at byte %d", errMalformed, i)
			}
			n += len(packWordsExt[b[i+1]])
			i += 2
		case c == packHex:
			if len(b)-i < 33 {
				return 0, fmt.Errorf("%w: packed JSON: short hex at byte %d", errMalformed, i)
			}
			n += 64
			i += 33
		case c == packUUID:
			if len(b)-i < 17 {
				return 0, fmt.Errorf("%w: packed JSON: short UUID at byte %d", errMalformed, i)
			}
			n += 36
			i += 17
		default:
			return 0, fmt.Errorf("%w: packed JSON: byte %#x at %d", errMalformed, c, i)
		}
	}
	return n, nil
}

// unpackJSON appends the JSON packed as b to dst; b must have passed
// unpackedLen.
func unpackJSON(dst, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c >= 0x20:
			dst = append(dst, c)
			i++
		case c < packExt:
			dst = append(dst, packWords[c-1]...)
			i++
		case c == packExt:
			dst = append(dst, packWordsExt[b[i+1]]...)
			i += 2
		case c == packHex:
			dst = hex.AppendEncode(dst, b[i+1:i+33])
			i += 33
		default: // packUUID
			u := b[i+1 : i+17]
			dst = hex.AppendEncode(dst, u[:4])
			dst = append(dst, '-')
			dst = hex.AppendEncode(dst, u[4:6])
			dst = append(dst, '-')
			dst = hex.AppendEncode(dst, u[6:8])
			dst = append(dst, '-')
			dst = hex.AppendEncode(dst, u[8:10])
			dst = append(dst, '-')
			dst = hex.AppendEncode(dst, u[10:])
			i += 17
		}
	}
	return dst
}

// eventTypes numbers the event types for the head of a format 3 event
// (code i+1; 0: the type is spelled out). Part of the file format: the
// list only grows.
var eventTypes = [...]kernel.EventType{
	kernel.EvExecutionCreated, kernel.EvExecutionStarted, kernel.EvExecutionBlocked, kernel.EvExecutionResumed,
	kernel.EvExecutionCompleted, kernel.EvExecutionFailed, kernel.EvExecutionCancelled,
	kernel.EvStepProposed, kernel.EvStepAllowed, kernel.EvStepDenied, kernel.EvStepRateLimited,
	kernel.EvStepAwaitingApproval, kernel.EvStepExecuting, kernel.EvStepSucceeded, kernel.EvStepFailed,
	kernel.EvStepCancelled, kernel.EvStepInterrupted, kernel.EvStepReconciled,
	kernel.EvApprovalRequested, kernel.EvApprovalGranted, kernel.EvApprovalDenied, kernel.EvApprovalExpired,
	kernel.EvApprovalHappened, kernel.EvSessionAttached, kernel.EvSessionDetached,
	kernel.EvDispatchQueued, kernel.EvDispatchClaimed, kernel.EvDispatchAcked, kernel.EvDispatchFailed,
	kernel.EvDispatchSuperseded, kernel.EvDispatchDiscarded,
}

// eventTypeCodes maps each type of eventTypes to its code.
var eventTypeCodes = func() map[kernel.EventType]uint64 {
	m := make(map[kernel.EventType]uint64, len(eventTypes))
	for i, t := range eventTypes {
		m[t] = uint64(i + 1)
	}
	return m
}()
