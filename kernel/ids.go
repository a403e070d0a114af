package kernel

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"time"
)

// idGen makes UUIDv7 ids (RFC 9562): 48 bits of Unix milliseconds, then a
// 12-bit counter that keeps ids made within one millisecond in order, then
// 62 random bits. Ids from one generator are strictly increasing, so byte
// order is creation order (keyset paging relies on it).
type idGen struct {
	mu     sync.Mutex
	lastMS int64
	seq    uint16
}

func (g *idGen) next(now time.Time) string {
	ms := now.UnixMilli()
	g.mu.Lock()
	if ms <= g.lastMS {
		g.seq++
		if g.seq > 0xfff { // counter exhausted: borrow the next millisecond
			g.lastMS++
			g.seq = 0
		}
		ms = g.lastMS
	} else {
		g.lastMS = ms
		g.seq = 0
	}
	seq := g.seq
	g.mu.Unlock()

	var b [16]byte
	_, _ = rand.Read(b[8:])
	binary.BigEndian.PutUint64(b[0:8], uint64(ms)<<16)
	b[6] = 0x70 | byte(seq>>8)
	b[7] = byte(seq)
	b[8] = 0x80 | (b[8] & 0x3f)
	return uuidText(&b)
}

// uuidText is the canonical text form of a UUID (8-4-4-4-12 hex digits).
func uuidText(b *[16]byte) string {
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}
