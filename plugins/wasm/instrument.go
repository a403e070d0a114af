package wasm

import (
	"errors"
	"fmt"
)

// The deadline of an OPA-ABI evaluation without wazero's per-loop check.
//
// wazero's WithCloseOnContextDone makes compiled code call into Go at every
// loop iteration to see whether the module was closed: about 0.1 µs each,
// which made OPA-compiled policies 2-3x slower than OPA's own evaluator.
// instrumentFuel rewrites an OPA module instead so that it counts: every
// loop iteration and every function entry decrements a fuel global the
// module cannot see, and when the fuel runs out, a function appended to
// the module calls the host (env.opa_builtin0 with the reserved id
// fuelCheckID), which checks the deadline and refills. That is a few
// instructions per iteration and one call into Go every fuelPerCheck.
//
// Any execution that does not end visits loop headers or function entries
// without bound (recursion without loops ends in a stack overflow), so the
// host sees it and stops it at the deadline. Between two checks the code
// runs at most fuelPerCheck iterations of straight-line code.

// fuelPerCheck is how many loop iterations and calls run between two
// deadline checks: about 10-100 µs of work.
const fuelPerCheck = 1 << 14

// fuelCheckID is the builtin id the appended function passes to
// opa_builtin0: -1, which no builtin of OPA's compiler uses (they count up
// from 0).
const fuelCheckID = 0xFFFFFFFF

// Section ids.
const (
	secCustom   = 0
	secType     = 1
	secImport   = 2
	secFunction = 3
	secGlobal   = 6
	secCode     = 10
)

// errNoFuelImport means the module does not import env.opa_builtin0, so it
// cannot be instrumented; it runs with wazero's check instead.
var errNoFuelImport = errors.New("module does not import env.opa_builtin0")

// instrumentFuel returns bin with fuel counting added (see above). bin
// must be a module wazero has validated.
func instrumentFuel(bin []byte) ([]byte, error) {
	secs, err := readSections(bin)
	if err != nil {
		return nil, err
	}
	var (
		nTypes, nImportedFuncs, nImportedGlobals, nFuncs, nGlobals uint32
		builtin0                                                   = int64(-1)
		hasGlobal                                                  bool
	)
	for _, s := range secs {
		r := &reader{b: s.content}
		switch s.id {
		case secType:
			if nTypes, err = r.u32(); err != nil {
				return nil, err
			}
		case secImport:
			if nImportedFuncs, nImportedGlobals, builtin0, err = readImports(r); err != nil {
				return nil, fmt.Errorf("import section: %w", err)
			}
		case secFunction:
			if nFuncs, err = r.u32(); err != nil {
				return nil, err
			}
		case secGlobal:
			hasGlobal = true
			if nGlobals, err = r.u32(); err != nil {
				return nil, err
			}
		}
	}
	if builtin0 < 0 {
		return nil, errNoFuelImport
	}
	fuel := nImportedGlobals + nGlobals // the new global's index
	refuel := nImportedFuncs + nFuncs   // the new function's index
	check := checkCode(fuel, refuel)

	out := append([]byte(nil), wasmMagic...)
	for _, s := range secs {
		if !hasGlobal && s.id != secCustom && sectionOrder(s.id) > sectionOrder(secGlobal) {
			out = appendSection(out, secGlobal, append(appendULEB(nil, 1), fuelGlobal()...))
			hasGlobal = true
		}
		switch s.id {
		case secType: // + func() -> ()
			out = appendSection(out, s.id, appendVecItem(s.content, []byte{0x60, 0x00, 0x00}))
		case secFunction: // + the refuel function
			out = appendSection(out, s.id, appendVecItem(s.content, appendULEB(nil, uint64(nTypes))))
		case secGlobal:
			out = appendSection(out, s.id, appendVecItem(s.content, fuelGlobal()))
		case secCode:
			code, err := instrumentCode(s.content, check, refuelBody(uint32(builtin0), fuel), fuel, refuel)
			if err != nil {
				return nil, fmt.Errorf("code section: %w", err)
			}
			out = appendSection(out, s.id, code)
		default:
			out = appendSection(out, s.id, s.content)
		}
	}
	return out, nil
}

// sectionOrder is the position a known section must take in a module.
func sectionOrder(id byte) int {
	// type, import, function, table, memory, tag, global, export, start,
	// element, data count, code, data.
	order := map[byte]int{1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 13: 6, 6: 7, 7: 8, 8: 9, 9: 10, 12: 11, 10: 12, 11: 13}
	return order[id]
}

// readImports counts imported functions and globals and finds the index
// of env.opa_builtin0 (-1 if not imported).
func readImports(r *reader) (funcs, globals uint32, builtin0 int64, err error) {
	builtin0 = -1
	n, err := r.u32()
	if err != nil {
		return 0, 0, 0, err
	}
	for range n {
		mod, err := r.name()
		if err != nil {
			return 0, 0, 0, err
		}
		name, err := r.name()
		if err != nil {
			return 0, 0, 0, err
		}
		kind, err := r.byte()
		if err != nil {
			return 0, 0, 0, err
		}
		switch kind {
		case 0x00: // function: type index
			if _, err := r.u32(); err != nil {
				return 0, 0, 0, err
			}
			if mod == "env" && name == "opa_builtin0" {
				builtin0 = int64(funcs)
			}
			funcs++
		case 0x01: // table: reftype, limits
			if _, err := r.byte(); err != nil {
				return 0, 0, 0, err
			}
			if err := r.limits(); err != nil {
				return 0, 0, 0, err
			}
		case 0x02: // memory: limits
			if err := r.limits(); err != nil {
				return 0, 0, 0, err
			}
		case 0x03: // global: valtype, mutability
			if err := r.skip(2); err != nil {
				return 0, 0, 0, err
			}
			globals++
		default:
			return 0, 0, 0, fmt.Errorf("unsupported import kind 0x%02x", kind)
		}
	}
	return funcs, globals, builtin0, nil
}

func (r *reader) name() (string, error) {
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	start := r.i
	if err := r.skip(uint64(n)); err != nil {
		return "", err
	}
	return string(r.b[start:r.i]), nil
}

func (r *reader) limits() error {
	flags, err := r.byte()
	if err != nil {
		return err
	}
	if flags > 0x07 {
		return fmt.Errorf("unsupported limits flags 0x%02x", flags)
	}
	is64 := flags&0x04 != 0
	bits := uint(32)
	if is64 {
		bits = 64
	}
	if _, err := r.uleb(bits); err != nil {
		return err
	}
	if flags&0x01 != 0 {
		if _, err := r.uleb(bits); err != nil {
			return err
		}
	}
	return nil
}

// appendVecItem adds one encoded item to a section made of one vector.
func appendVecItem(vec []byte, item []byte) []byte {
	r := &reader{b: vec}
	n, err := r.u32()
	if err != nil {
		n, r.i = 0, len(vec) // an empty section
	}
	out := appendULEB(nil, uint64(n)+1)
	out = append(out, vec[r.i:]...)
	return append(out, item...)
}

// fuelGlobal encodes the fuel global: a mutable i32 starting full.
func fuelGlobal() []byte {
	g := []byte{valI32, 0x01, 0x41}
	g = appendSLEB(g, fuelPerCheck)
	return append(g, 0x0b)
}

// checkCode is what runs at every function entry and loop iteration:
//
//	global.get $fuel; i32.eqz; if; call $refuel; end
//	global.get $fuel; i32.const 1; i32.sub; global.set $fuel
func checkCode(fuel, refuel uint32) []byte {
	b := append([]byte{0x23}, appendULEB(nil, uint64(fuel))...)
	b = append(b, 0x45, 0x04, 0x40, 0x10)
	b = appendULEB(b, uint64(refuel))
	b = append(b, 0x0b, 0x23)
	b = appendULEB(b, uint64(fuel))
	b = append(b, 0x41, 0x01, 0x6b, 0x24)
	return appendULEB(b, uint64(fuel))
}

// refuelBody encodes the appended function: it asks the host to check the
// deadline (opa_builtin0(fuelCheckID, 0)) and refills the fuel.
func refuelBody(builtin0, fuel uint32) []byte {
	b := []byte{0x00} // no locals
	b = append(b, 0x41)
	b = appendSLEB(b, -1) // fuelCheckID
	b = append(b, 0x41, 0x00, 0x10)
	b = appendULEB(b, uint64(builtin0))
	b = append(b, 0x1a, 0x41) // drop; i32.const
	b = appendSLEB(b, fuelPerCheck)
	b = append(b, 0x24)
	b = appendULEB(b, uint64(fuel))
	b = append(b, 0x0b)
	return append(appendULEB(nil, uint64(len(b))), b...)
}

// instrumentCode rewrites the code section: check goes at the start of
// every function and of every loop body; refuel is appended. fuel and
// refuelIndex are the indices the new global and function take.
func instrumentCode(sec, check, refuel []byte, fuel, refuelIndex uint32) ([]byte, error) {
	r := &reader{b: sec}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	out := appendULEB(nil, uint64(n)+1)
	var body []byte
	for i := range n {
		size, err := r.u32()
		if err != nil {
			return nil, err
		}
		start := r.i
		if err := r.skip(uint64(size)); err != nil {
			return nil, err
		}
		body, err = instrumentBody(body[:0], sec[start:r.i], check, fuel, refuelIndex)
		if err != nil {
			return nil, fmt.Errorf("function %d: %w", i, err)
		}
		out = appendULEB(out, uint64(len(body)))
		out = append(out, body...)
	}
	if r.i != len(sec) {
		return nil, errors.New("trailing bytes")
	}
	return append(out, refuel...), nil
}

// instrumentBody copies one function body into out with check inserted
// after the local declarations and after every loop's block type.
//
// The module has not been validated yet (wazero validates the instrumented
// one), so code that names a global or function the module does not define
// is refused here: the fuel global and the refuel function would otherwise
// give it one, and code that sets the fuel (global.set $fuel in its loop)
// would never reach a check and run past its deadline forever.
func instrumentBody(out, body, check []byte, fuel, refuel uint32) ([]byte, error) {
	r := &reader{b: body}
	groups, err := r.u32()
	if err != nil {
		return nil, err
	}
	for range groups {
		if _, err := r.u32(); err != nil {
			return nil, err
		}
		if _, err := r.byte(); err != nil {
			return nil, err
		}
	}
	out = append(out, body[:r.i]...)
	out = append(out, check...)
	from := r.i
	for r.i < len(body) {
		op, err := r.byte()
		if err != nil {
			return nil, err
		}
		at := r.i
		if err := r.immediates(op); err != nil {
			return nil, fmt.Errorf("opcode 0x%02x at %d: %w", op, r.i, err)
		}
		switch op {
		case 0x23, 0x24: // global.get, global.set
			if idx, _ := (&reader{b: body, i: at}).u32(); idx >= fuel {
				return nil, fmt.Errorf("opcode 0x%02x at %d: global %d is not defined by the module", op, at, idx)
			}
		case 0x10, 0xd2: // call, ref.func
			if idx, _ := (&reader{b: body, i: at}).u32(); idx >= refuel {
				return nil, fmt.Errorf("opcode 0x%02x at %d: function %d is not defined by the module", op, at, idx)
			}
		}
		if op == 0x03 { // loop
			out = append(out, body[from:r.i]...)
			out = append(out, check...)
			from = r.i
		}
	}
	return append(out, body[from:]...), nil
}

// immediates skips the immediates of opcode op. It knows WebAssembly 1.0
// and the extensions wazero enables by default (sign extension,
// non-trapping conversions, bulk memory, reference types, multi-value);
// anything else (SIMD, threads, exceptions, tail calls) is an error, and
// the module keeps wazero's own deadline check.
func (r *reader) immediates(op byte) error {
	var err error
	switch {
	case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if
		err = r.blockType()
	case op == 0x0c || op == 0x0d: // br, br_if
		_, err = r.u32()
	case op == 0x0e: // br_table
		var n uint32
		if n, err = r.u32(); err == nil {
			for i := uint32(0); i <= n && err == nil; i++ {
				_, err = r.u32()
			}
		}
	case op == 0x10: // call
		_, err = r.u32()
	case op == 0x11: // call_indirect
		if _, err = r.u32(); err == nil {
			_, err = r.u32()
		}
	case op == 0x1c: // select t*
		var n uint32
		if n, err = r.u32(); err == nil {
			err = r.skip(uint64(n))
		}
	case op >= 0x20 && op <= 0x26: // local.*, global.*, table.get/set
		_, err = r.u32()
	case op >= 0x28 && op <= 0x3e: // loads and stores: memarg
		err = r.memarg()
	case op == 0x3f || op == 0x40: // memory.size, memory.grow
		_, err = r.u32()
	case op == 0x41:
		_, err = r.sleb(32)
	case op == 0x42:
		_, err = r.sleb(64)
	case op == 0x43:
		err = r.skip(4)
	case op == 0x44:
		err = r.skip(8)
	case op == 0x00 || op == 0x01 || op == 0x05 || op == 0x0b || op == 0x0f || op == 0x1a || op == 0x1b:
	case op >= 0x45 && op <= 0xc4: // numeric, sign extension
	case op == 0xd0: // ref.null t
		_, err = r.byte()
	case op == 0xd1: // ref.is_null
	case op == 0xd2: // ref.func
		_, err = r.u32()
	case op == 0xfc:
		err = r.prefixedFC()
	default:
		err = errors.New("unsupported opcode")
	}
	return err
}

func (r *reader) blockType() error {
	if r.i >= len(r.b) {
		return errTruncated
	}
	switch r.b[r.i] {
	case 0x40, 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		r.i++
		return nil
	}
	_, err := r.sleb(33) // a type index
	return err
}

func (r *reader) memarg() error {
	align, err := r.u32()
	if err != nil {
		return err
	}
	if align&0x40 != 0 { // multi-memory: a memory index follows
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	_, err = r.uleb(64)
	return err
}

// prefixedFC skips a 0xfc instruction: saturating conversions, bulk memory
// and table operations.
func (r *reader) prefixedFC() error {
	sub, err := r.u32()
	if err != nil {
		return err
	}
	n := 0
	switch {
	case sub <= 7: // trunc_sat
	case sub == 8, sub == 10, sub == 12, sub == 14: // memory.init, memory.copy, table.init, table.copy
		n = 2
	case sub == 9, sub == 11, sub == 13, sub == 15, sub == 16, sub == 17: // data.drop, memory.fill, elem.drop, table.grow/size/fill
		n = 1
	default:
		return fmt.Errorf("unsupported 0xfc %d", sub)
	}
	for range n {
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	return nil
}
