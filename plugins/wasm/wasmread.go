package wasm

import (
	"bytes"
	"errors"
	"fmt"
)

// A minimal WebAssembly binary reader: the OPA driver reads where a
// module's data segments end (OPA's compiler declares too small a minimum
// memory for policies with much static data) and instruments modules for
// the deadline (instrument.go). The instrumented module, not the one
// uploaded, is what wazero validates: instrument.go refuses code that names
// what the module does not define.

var wasmMagic = []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}

// reader reads a module's binary encoding.
type reader struct {
	b []byte
	i int
}

var errTruncated = errors.New("unexpected end of module")

func (r *reader) byte() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.i]
	r.i++
	return c, nil
}

// uleb reads an unsigned LEB128 number of at most bits bits.
func (r *reader) uleb(bits uint) (uint64, error) {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if shift >= bits+7 {
			return 0, errors.New("LEB128 number too long")
		}
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, nil
		}
	}
}

func (r *reader) u32() (uint32, error) {
	v, err := r.uleb(32)
	return uint32(v), err
}

// sleb reads a signed LEB128 number of at most bits bits.
func (r *reader) sleb(bits uint) (int64, error) {
	var v int64
	var shift uint
	for {
		if shift >= bits+7 {
			return 0, errors.New("LEB128 number too long")
		}
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= int64(c&0x7f) << shift
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v, nil
		}
	}
}

// skip advances n bytes.
func (r *reader) skip(n uint64) error {
	if uint64(len(r.b)-r.i) < n {
		return errTruncated
	}
	r.i += int(n)
	return nil
}

// section is one section of a module: its id and its content.
type section struct {
	id      byte
	content []byte
}

// readSections splits a module into its sections.
func readSections(bin []byte) ([]section, error) {
	if !bytes.HasPrefix(bin, wasmMagic) {
		return nil, errors.New("not a WebAssembly 1.0 module")
	}
	r := &reader{b: bin, i: len(wasmMagic)}
	var out []section
	for r.i < len(r.b) {
		id, err := r.byte()
		if err != nil {
			return nil, err
		}
		n, err := r.u32()
		if err != nil {
			return nil, err
		}
		start := r.i
		if err := r.skip(uint64(n)); err != nil {
			return nil, fmt.Errorf("section %d: %w", id, err)
		}
		out = append(out, section{id: id, content: r.b[start:r.i]})
	}
	return out, nil
}

// dataEnd returns the end address of the highest active data segment of
// memory 0 placed at a constant offset (0 when there is none).
func dataEnd(bin []byte) (uint64, error) {
	secs, err := readSections(bin)
	if err != nil {
		return 0, err
	}
	var end uint64
	for _, s := range secs {
		if s.id != 11 {
			continue
		}
		r := &reader{b: s.content}
		n, err := r.u32()
		if err != nil {
			return 0, err
		}
		for range n {
			flags, err := r.u32()
			if err != nil {
				return 0, err
			}
			active := flags == 0 || flags == 2
			if flags == 2 {
				if _, err := r.u32(); err != nil { // memory index
					return 0, err
				}
			}
			var offset int64
			constant := false
			if active {
				op, err := r.byte()
				if err != nil {
					return 0, err
				}
				switch op {
				case 0x41: // i32.const
					if offset, err = r.sleb(32); err != nil {
						return 0, err
					}
					constant = true
				case 0x23: // global.get
					if _, err := r.u32(); err != nil {
						return 0, err
					}
				default:
					return 0, fmt.Errorf("data segment offset: unsupported instruction 0x%02x", op)
				}
				if c, err := r.byte(); err != nil || c != 0x0b {
					return 0, errors.New("data segment offset: not a single constant")
				}
			}
			size, err := r.u32()
			if err != nil {
				return 0, err
			}
			if err := r.skip(uint64(size)); err != nil {
				return 0, err
			}
			if constant {
				end = max(end, uint64(uint32(offset))+uint64(size))
			}
		}
	}
	return end, nil
}
