package wasm

// A minimal WebAssembly binary encoder. The engine uses it to build the
// per-bundle "env" module that supplies memory to OPA-ABI modules; the tests
// use it to write hostile modules without a wat2wasm.

// Value types.
const (
	valI32 byte = 0x7f
	valI64 byte = 0x7e
)

// External kinds for imports and exports.
const (
	externFunc   byte = 0x00
	externMemory byte = 0x02
)

type funcType struct {
	params, results []byte
}

type wasmImport struct {
	module, name string
	kind         byte
	typeIndex    uint32 // for externFunc
	memory       memLimits
}

type wasmExport struct {
	name  string
	kind  byte
	index uint32
}

type memLimits struct {
	min    uint32
	max    uint32
	hasMax bool
}

// wasmFunc is a function defined by the module: its type and its body
// (local declarations followed by instructions; the final end is added).
type wasmFunc struct {
	typeIndex uint32
	locals    []byte // encoded local declarations without the count prefix, e.g. {1, valI32}
	nLocals   uint32 // number of local declaration groups in locals
	code      []byte
}

type wasmModule struct {
	types   []funcType
	imports []wasmImport
	funcs   []wasmFunc
	tables  []memLimits // funcref tables
	memory  *memLimits
	exports []wasmExport
	// start, when set, is the index of the function the start section names.
	start *uint32
	data  []wasmData
}

// wasmData is an active data segment for memory 0 at a constant offset.
type wasmData struct {
	offset uint32
	bytes  []byte
}

func appendULEB(b []byte, v uint64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			c |= 0x80
		}
		b = append(b, c)
		if v == 0 {
			return b
		}
	}
}

func appendSLEB(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		done := (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0)
		if !done {
			c |= 0x80
		}
		b = append(b, c)
		if done {
			return b
		}
	}
}

func appendName(b []byte, s string) []byte {
	b = appendULEB(b, uint64(len(s)))
	return append(b, s...)
}

func appendLimits(b []byte, l memLimits) []byte {
	if l.hasMax {
		b = append(b, 0x01)
		b = appendULEB(b, uint64(l.min))
		return appendULEB(b, uint64(l.max))
	}
	b = append(b, 0x00)
	return appendULEB(b, uint64(l.min))
}

func appendSection(b []byte, id byte, content []byte) []byte {
	b = append(b, id)
	b = appendULEB(b, uint64(len(content)))
	return append(b, content...)
}

// encode returns the module's binary form.
func (m *wasmModule) encode() []byte {
	b := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	if len(m.types) > 0 {
		s := appendULEB(nil, uint64(len(m.types)))
		for _, t := range m.types {
			s = append(s, 0x60)
			s = appendULEB(s, uint64(len(t.params)))
			s = append(s, t.params...)
			s = appendULEB(s, uint64(len(t.results)))
			s = append(s, t.results...)
		}
		b = appendSection(b, 1, s)
	}
	if len(m.imports) > 0 {
		s := appendULEB(nil, uint64(len(m.imports)))
		for _, im := range m.imports {
			s = appendName(s, im.module)
			s = appendName(s, im.name)
			s = append(s, im.kind)
			switch im.kind {
			case externFunc:
				s = appendULEB(s, uint64(im.typeIndex))
			case externMemory:
				s = appendLimits(s, im.memory)
			}
		}
		b = appendSection(b, 2, s)
	}
	if len(m.funcs) > 0 {
		s := appendULEB(nil, uint64(len(m.funcs)))
		for _, f := range m.funcs {
			s = appendULEB(s, uint64(f.typeIndex))
		}
		b = appendSection(b, 3, s)
	}
	if len(m.tables) > 0 {
		s := appendULEB(nil, uint64(len(m.tables)))
		for _, t := range m.tables {
			s = appendLimits(append(s, 0x70), t)
		}
		b = appendSection(b, secTable, s)
	}
	if m.memory != nil {
		s := appendULEB(nil, 1)
		s = appendLimits(s, *m.memory)
		b = appendSection(b, 5, s)
	}
	if len(m.exports) > 0 {
		s := appendULEB(nil, uint64(len(m.exports)))
		for _, e := range m.exports {
			s = appendName(s, e.name)
			s = append(s, e.kind)
			s = appendULEB(s, uint64(e.index))
		}
		b = appendSection(b, 7, s)
	}
	if m.start != nil {
		b = appendSection(b, 8, appendULEB(nil, uint64(*m.start)))
	}
	if len(m.funcs) > 0 {
		s := appendULEB(nil, uint64(len(m.funcs)))
		for _, f := range m.funcs {
			body := appendULEB(nil, uint64(f.nLocals))
			body = append(body, f.locals...)
			body = append(body, f.code...)
			body = append(body, 0x0b) // end
			s = appendULEB(s, uint64(len(body)))
			s = append(s, body...)
		}
		b = appendSection(b, 10, s)
	}
	if len(m.data) > 0 {
		s := appendULEB(nil, uint64(len(m.data)))
		for _, d := range m.data {
			s = append(s, 0x00, 0x41) // active, memory 0, i32.const
			s = appendSLEB(s, int64(int32(d.offset)))
			s = append(s, 0x0b)
			s = appendULEB(s, uint64(len(d.bytes)))
			s = append(s, d.bytes...)
		}
		b = appendSection(b, 11, s)
	}
	return b
}
