package bbolt

import (
	"bytes"
	"strings"
	"testing"
)

// packJSONRef is packJSON as first written, byte by byte, kept as the
// reference the faster packJSON must match exactly: what it writes is the
// file format.
func packJSONRef(dst []byte, src []byte, atStart bool) (_ []byte, ok bool) {
	start := len(dst)
	for i := 0; i < len(src); {
		c := src[i]
		if c < 0x20 {
			return dst[:start], false
		}
		if ((i == 0 && atStart) || (i > 0 && src[i-1] == '"')) && isLowerHex(c) {
			if lowerHexRun(src[i:], 64) {
				dst = append(dst, packHex)
				dst = appendHexBytes(dst, src[i:i+64])
				i += 64
				continue
			}
			if isLowerUUID(src[i:]) {
				dst = append(dst, packUUID)
				for _, part := range [...][2]int{{0, 8}, {9, 13}, {14, 18}, {19, 23}, {24, 36}} {
					dst = appendHexBytes(dst, src[i+part[0]:i+part[1]])
				}
				i += 36
				continue
			}
		}
		matched := false
		for _, e := range packByFirst[c] {
			if len(src)-i >= len(e.s) && string(src[i:i+len(e.s)]) == e.s {
				dst = append(dst, e.tok...)
				i += len(e.s)
				matched = true
				break
			}
		}
		if !matched {
			dst = append(dst, c)
			i++
		}
	}
	if len(dst)-start >= len(src) {
		return dst[:start], false
	}
	return dst, true
}

// packCases are inputs on which packJSON must agree with packJSONRef:
// the kernel's payloads, and near misses of every rule.
func packCases() []string {
	hex64 := strings.Repeat("0123456789abcdef", 4)
	uuid := "01a2332b-7573-7000-8239-83a843f0455f"
	cases := append([]string{}, stepPayloads...)
	cases = append(cases, `{}`, `null`, `""`, `"`, "\x7f\xff\xfe", `"é☃\u2028"`,
		hex64, `"`+hex64+`"`, `"`+hex64[:63]+`"`, `"`+hex64[:63]+`G"`, `"`+strings.ToUpper(hex64)+`"`,
		`"`+hex64+hex64+`"`, `""`+hex64, `"`+uuid+`"`, uuid, `"`+uuid[:35]+`"`, `"`+strings.Replace(uuid, "-", "+", 1)+`"`,
		`"`+strings.ToUpper(uuid)+`"`, `"`+uuid+uuid+`"`, `"`+hex64[:8]+"-"+hex64[:4]+"-"+hex64[:4]+"-"+hex64[:4]+"-"+hex64[:11]+`g"`,
		`tool_cal`, `tool_calls`, `{"step_id":`, `{"dispatch_attempt":1,"dispatch_id":"x"}`, "a\x01b", "\x1f", "search",
		"kernel default policy: allow", "at_most_once", "kernel-default", "builtin", "safe_to_retry")
	for _, w := range append(packWords[:], packWordsExt[:]...) {
		cases = append(cases, w, w[:len(w)-1], `"`+w+`"`, w+hex64, w+uuid)
	}
	return cases
}

// TestPackJSONMatchesReference: the fast packJSON writes exactly the bytes
// of the reference, from the start of a string and not, into an empty
// buffer and behind other bytes.
func TestPackJSONMatchesReference(t *testing.T) {
	for _, c := range packCases() {
		for _, atStart := range []bool{false, true} {
			for _, pre := range []string{"", "pre"} {
				want, wok := packJSONRef([]byte(pre), []byte(c), atStart)
				got, gok := packJSON([]byte(pre), []byte(c), atStart)
				gots, sok := packJSON([]byte(pre), c, atStart)
				if gok != wok || !bytes.Equal(got, want) || sok != wok || !bytes.Equal(gots, want) {
					t.Errorf("%q (atStart %v, after %q): packed %v %q (string: %v %q), want %v %q", c, atStart, pre, gok, got, sok, gots, wok, want)
				}
			}
		}
	}
}

func FuzzPackJSONMatchesReference(f *testing.F) {
	for _, c := range packCases() {
		f.Add([]byte(c), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, atStart bool) {
		want, wok := packJSONRef(nil, b, atStart)
		got, gok := packJSON(nil, b, atStart)
		if gok != wok || !bytes.Equal(got, want) {
			t.Fatalf("%q: packed %v %q, want %v %q", b, gok, got, wok, want)
		}
	})
}

// BenchmarkPackJSON packs the payloads of a step's events and the strings
// of its record, as a step's two commits do.
func BenchmarkPackJSON(b *testing.B) {
	var strs []string
	s := benchStep()
	for _, x := range []string{s.Kind, s.Target, s.ArgsHash, string(s.Idempotency), string(s.Status), s.Lease.DispatchID,
		string(s.Verdict.Action), s.Verdict.Reason, s.Verdict.RuleID, s.Verdict.Bundle.Name, s.Verdict.Bundle.Engine} {
		if len(x) >= 7 {
			strs = append(strs, x)
		}
	}
	payloads := make([][]byte, len(stepPayloads))
	n := 0
	for i, p := range stepPayloads {
		payloads[i] = []byte(p)
		n += len(p)
	}
	for _, x := range strs {
		n += 2 * len(x)
	}
	buf := make([]byte, 0, 4096)
	b.Run("fast", func(b *testing.B) {
		b.SetBytes(int64(n))
		b.ReportAllocs()
		for b.Loop() {
			for _, p := range payloads {
				buf, _ = packJSON(buf[:0], p, false)
			}
			for range 2 {
				for _, x := range strs {
					buf, _ = packJSON(buf[:0], x, true)
				}
			}
		}
	})
	b.Run("reference", func(b *testing.B) {
		b.SetBytes(int64(n))
		b.ReportAllocs()
		for b.Loop() {
			for _, p := range payloads {
				buf, _ = packJSONRef(buf[:0], p, false)
			}
			for range 2 {
				for _, x := range strs {
					buf, _ = packJSONRef(buf[:0], []byte(x), true)
				}
			}
		}
	})
}

// lowerHexRun reports whether b starts with n lowercase hex digits.
func lowerHexRun[S ~string | ~[]byte](b S, n int) bool {
	if len(b) < n {
		return false
	}
	for i := range n {
		if !isLowerHex(b[i]) {
			return false
		}
	}
	return true
}

// appendHexBytes appends the bytes of the lowercase hex digits h.
func appendHexBytes[S ~string | ~[]byte](dst []byte, h S) []byte {
	for i := 0; i+1 < len(h); i += 2 {
		dst = append(dst, hexValue[h[i]]<<4|hexValue[h[i+1]])
	}
	return dst
}

// isLowerUUID reports whether b starts with a lowercase 8-4-4-4-12 UUID.
func isLowerUUID[S ~string | ~[]byte](b S) bool {
	if len(b) < 36 || b[8] != '-' || b[13] != '-' || b[18] != '-' || b[23] != '-' {
		return false
	}
	return lowerHexRun(b, 8) && lowerHexRun(b[9:], 4) && lowerHexRun(b[14:], 4) && lowerHexRun(b[19:], 4) && lowerHexRun(b[24:], 12)
}
