package wasm

import (
	"errors"
	"fmt"
)

// Tables live outside a module's linear memory, so the memory cap does
// not bound them: wazero keeps 8 bytes per element, and a 160-byte module
// declaring (table 134217728 funcref) and filling it took 1 GiB of the
// kernel's memory per instance. capTables bounds what an instance's tables
// can hold, together, to MaxTableElements: a module whose tables start
// larger is refused, and each table's maximum is lowered so that table.grow
// answers -1 past the bound (as memory.grow does past the memory cap).

// MaxTableElements is how many elements a module's tables may hold
// together (8 MiB of the host's memory per instance). Go modules declare
// one table of about 6,000 functions, OPA's and the C SDK's a few.
const MaxTableElements = 1 << 20

const secTable = 4

// capTables returns bin with every table's maximum lowered so that all of
// them together hold at most MaxTableElements, or an error naming the
// table that cannot fit. The first tables get the headroom left above the
// tables' minimums.
func capTables(bin []byte) ([]byte, error) {
	secs, err := readSections(bin)
	if err != nil {
		return bin, nil // not a module: wazero says why
	}
	idx := -1
	for i, s := range secs {
		if s.id == secTable {
			if idx >= 0 {
				return bin, nil // invalid: wazero says why
			}
			idx = i
		}
	}
	if idx < 0 {
		return bin, nil
	}
	type table struct {
		ref         byte
		min, max    uint64
		declaresMax bool
	}
	r := &reader{b: secs[idx].content}
	n, err := r.u32()
	if err != nil {
		return nil, fmt.Errorf("table section: %w", err)
	}
	if uint64(n) > MaxTableElements {
		return nil, fmt.Errorf("module declares %d tables", n)
	}
	tables := make([]table, 0, n)
	var total uint64
	for i := range n {
		ref, err := r.byte()
		if err != nil {
			return nil, fmt.Errorf("table section: %w", err)
		}
		if ref != 0x70 && ref != 0x6f { // funcref, externref
			return nil, fmt.Errorf("table %d: unsupported table type 0x%02x", i, ref)
		}
		flags, err := r.byte()
		if err != nil {
			return nil, fmt.Errorf("table section: %w", err)
		}
		if flags > 1 {
			return nil, fmt.Errorf("table %d: unsupported limits 0x%02x", i, flags)
		}
		t := table{ref: ref, declaresMax: flags == 1}
		if t.min, err = r.uleb(32); err != nil {
			return nil, fmt.Errorf("table section: %w", err)
		}
		if t.declaresMax {
			if t.max, err = r.uleb(32); err != nil {
				return nil, fmt.Errorf("table section: %w", err)
			}
		}
		total += t.min
		if total > MaxTableElements {
			return nil, fmt.Errorf("table %d: the module's tables start with %d elements or more, over the limit of %d", i, total, MaxTableElements)
		}
		tables = append(tables, t)
	}
	if r.i != len(r.b) {
		return nil, errors.New("table section: trailing bytes")
	}
	headroom := MaxTableElements - total
	content := appendULEB(nil, uint64(n))
	for _, t := range tables {
		max := t.min + headroom
		if t.declaresMax && t.max < max {
			max = t.max
		}
		if max > t.min {
			headroom -= max - t.min
		}
		content = append(content, t.ref, 0x01)
		content = appendULEB(content, t.min)
		content = appendULEB(content, max)
	}
	out := append([]byte(nil), wasmMagic...)
	for i, s := range secs {
		if i == idx {
			out = appendSection(out, s.id, content)
		} else {
			out = appendSection(out, s.id, s.content)
		}
	}
	return out, nil
}
