//go:build wasip1

package policy

import "unsafe"

// inBuf is the region wicket_alloc hands to the host; outBuf is the last
// output. Both are package variables so the garbage collector keeps them
// alive (and, being non-moving, in place) while the host uses them.
var inBuf, outBuf []byte

//go:wasmexport wicket_abi_version
func wicketABIVersion() int32 { return ABIVersion }

//go:wasmexport wicket_alloc
func wicketAlloc(size int32) int32 {
	if size <= 0 {
		return 0
	}
	if cap(inBuf) < int(size) {
		inBuf = make([]byte, size)
	}
	inBuf = inBuf[:size]
	return int32(uintptr(unsafe.Pointer(&inBuf[0])))
}

//go:wasmexport wicket_evaluate
func wicketEvaluate(ptr, length int32) int64 {
	var out []byte
	switch {
	case len(inBuf) == 0 || ptr != int32(uintptr(unsafe.Pointer(&inBuf[0]))) || length < 0 || int(length) > len(inBuf):
		out = []byte(`{"error":"wicket_evaluate: pointer was not returned by wicket_alloc"}`)
	default:
		out = Evaluate(inBuf[:length])
	}
	outBuf = append(outBuf[:0], out...)
	if len(outBuf) == 0 {
		return 0
	}
	return int64(uintptr(unsafe.Pointer(&outBuf[0])))<<32 | int64(len(outBuf))
}

//lint:file-ignore U1000 the functions above are exported to the host through //go:wasmexport, which staticcheck does not see
