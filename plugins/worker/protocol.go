package worker

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/wicket-run/wicket/kernel/policy"
	"github.com/wicket-run/wicket/plugins/bundle"
)

// The kernel and a worker exchange frames over the worker's stdin and
// stdout: a 4-byte big-endian length, then that many bytes of JSON. The
// kernel sends requests; the worker answers each with a response carrying
// the same id, in any order.

// Operations of a request.
const (
	opInit    = "init"    // first request: limits and memory
	opCompile = "compile" // Files → a compiled bundle, named by the request id
	opEval    = "eval"    // Bundle, Input → Decision
	opClose   = "close"   // Bundle is released
)

// Frame size caps. A request carries at most a bundle (bundle.MaxTotalSize,
// base64-encoded); a response at most a decision or an error text.
const (
	maxRequest  = 2*bundle.MaxTotalSize + 1<<20
	maxResponse = 2 << 20
)

type request struct {
	ID     uint64            `json:"id"`
	Op     string            `json:"op"`
	Limits *bundle.Limits    `json:"limits,omitempty"`
	Memory int64             `json:"memory,omitempty"`
	Files  map[string][]byte `json:"files,omitempty"`
	Name   string            `json:"name,omitempty"` // of a bundle without bundle.yaml
	Bundle uint64            `json:"bundle,omitempty"`
	Input  json.RawMessage   `json:"input,omitempty"`
}

type response struct {
	ID       uint64         `json:"id"`
	Error    string         `json:"error,omitempty"`
	Decision *policy.Answer `json:"decision,omitempty"`
}

// writeFrame writes v as one frame.
func writeFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeRaw(w, b)
}

// writeRaw writes JSON b as one frame.
func writeRaw(w io.Writer, b []byte) error {
	hdr := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	_, err := w.Write(append(hdr, b...))
	return err
}

// errFrameTooLarge: a frame announces more bytes than its reader accepts.
var errFrameTooLarge = errors.New("frame too large")

// readFrame reads one frame of at most max bytes into v.
func readFrame(r io.Reader, max int, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if int64(n) > int64(max) {
		return fmt.Errorf("%w: %d bytes (at most %d)", errFrameTooLarge, n, max)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
