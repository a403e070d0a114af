package bbolt

import (
	"encoding/binary"
	"fmt"

	"github.com/wicket-run/wicket/kernel"
)

// A slot is a value of the steps bucket (schema 6), under
// tenant␀execID␀name. It holds up to two things named alike: the seq of
// step name, whose record is in the events bucket (stepLogKey), and the
// occurrence counter stored under key name. The kernel keys the counter of
// a (kind, target, args) triple by the id of its first occurrence's step,
// so that a new step's counter and index entry are one record, written
// once, instead of two records on two pages.
//
//	flags(1) [seq(8) if slotStep] [occurrence record if slotOcc]
type slot struct {
	seq    uint64
	hasSeq bool
	occ    []byte // the encoded occurrence counter (encodeOccurrence); nil: none
}

const (
	slotStep = 1 << iota
	slotOcc
)

// decodeSlot reads a slot; occ aliases b.
func decodeSlot(b []byte) (slot, error) {
	var s slot
	if len(b) < 1 || b[0]&^(slotStep|slotOcc) != 0 || b[0] == 0 {
		return s, fmt.Errorf("%w: step index entry of %d bytes", errMalformed, len(b))
	}
	rest := b[1:]
	if b[0]&slotStep != 0 {
		if len(rest) < 8 {
			return s, fmt.Errorf("%w: step index entry of %d bytes", errMalformed, len(b))
		}
		s.seq, s.hasSeq, rest = binary.BigEndian.Uint64(rest), true, rest[8:]
	}
	if b[0]&slotOcc != 0 {
		if len(rest) == 0 {
			return s, fmt.Errorf("%w: step index entry without its occurrence counter", errMalformed)
		}
		s.occ, rest = rest, nil
	}
	if len(rest) != 0 {
		return s, fmt.Errorf("%w: step index entry: %d bytes left over", errMalformed, len(rest))
	}
	return s, nil
}

// encode returns the stored form of s (a new slice).
func (s slot) encode() []byte {
	b := make([]byte, 1, 9+len(s.occ))
	if s.hasSeq {
		b[0] |= slotStep
		b = binary.BigEndian.AppendUint64(b, s.seq)
	}
	if s.occ != nil {
		b[0] |= slotOcc
		b = append(b, s.occ...)
	}
	return b
}

// encodeWith returns the stored form of s with the occurrence counter o
// (a new slice).
func (s slot) encodeWith(o kernel.Occurrence) []byte {
	b := make([]byte, 1, 9+occurrenceSize(o))
	b[0] = slotOcc
	if s.hasSeq {
		b[0] |= slotStep
		b = binary.BigEndian.AppendUint64(b, s.seq)
	}
	return appendOccurrence(b, o)
}
