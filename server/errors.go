package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// statuses maps every error code to its HTTP status: the one table of the
// server (docs/protocol.md). A code missing here is answered as internal.
var statuses = map[string]int{
	kernel.CodeValidation:       http.StatusBadRequest,
	kernel.CodeUnauthenticated:  http.StatusUnauthorized,
	kernel.CodeForbidden:        http.StatusForbidden,
	kernel.CodeNotFound:         http.StatusNotFound,
	kernel.CodeConflict:         http.StatusConflict,
	kernel.CodeLeaseSuperseded:  http.StatusConflict,
	kernel.CodeStepIDDivergence: http.StatusConflict,
	kernel.CodeExecutionLeased:  http.StatusConflict,
	kernel.CodeTooLarge:         http.StatusRequestEntityTooLarge,
	kernel.CodeRateLimited:      http.StatusTooManyRequests,
	kernel.CodeInternal:         http.StatusInternalServerError,
	kernel.CodeUnavailable:      http.StatusServiceUnavailable,
}

// statusOf returns the HTTP status of an error code (500 for unknown codes).
func statusOf(code string) int {
	if st, ok := statuses[code]; ok {
		return st
	}
	return http.StatusInternalServerError
}

// errorBody turns err into the envelope it is answered with. Internal errors
// (and codes the table does not know) are answered "internal error"; their
// text is only logged.
func errorBody(err error) (int, wire.ErrorBody, bool) {
	var ke *kernel.Error
	if !errors.As(err, &ke) {
		return http.StatusInternalServerError, wire.ErrorBody{Code: wire.CodeInternal, Message: "internal error"}, true
	}
	st, known := statuses[ke.Code]
	if !known || ke.Code == kernel.CodeInternal {
		return http.StatusInternalServerError, wire.ErrorBody{Code: wire.CodeInternal, Message: "internal error"}, true
	}
	return st, wire.ErrorBody{Code: ke.Code, Message: ke.Message, Details: ke.Details}, false
}

// writeError answers err as an error envelope; internal errors are logged.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	st, body, internal := errorBody(err)
	if internal {
		if r.Context().Err() != nil {
			s.log.Debug("request ended by the client", "method", r.Method, "path", r.URL.Path, "err", err)
		} else {
			s.log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		}
	}
	if st == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="wicket"`)
	}
	s.writeJSON(w, st, body)
}

// writeJSON answers v as JSON with status st. The step answers
// (appendAnswer) are encoded by hand, everything else by encoding/json.
func (s *Server) writeJSON(w http.ResponseWriter, st int, v any) {
	buf := answerBufs.Get().(*[]byte)
	pool := true
	defer func() {
		if pool && cap(*buf) <= maxPooledAnswer {
			answerBufs.Put(buf)
		}
	}()
	b, ok := appendAnswer((*buf)[:0], v)
	if ok {
		b = append(b, '\n')
		*buf = b // io.Writer: Write does not keep b
	} else {
		var err error
		if b, err = json.Marshal(v); err != nil {
			s.log.Error("encode response", "err", err)
			st = http.StatusInternalServerError
			b = []byte(`{"code":"internal","message":"internal error"}`)
		}
		b = append(b, '\n')
	}
	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	if len(b) > autoContentLength {
		h["Content-Length"] = []string{strconv.Itoa(len(b))}
	}
	w.WriteHeader(st)
	if _, err := w.Write(b); err != nil && ok {
		// A Write that failed may not be done with b: net/http's HTTP/2
		// server returns as soon as the client resets the stream, while
		// its frame writer may still hold the bytes. The buffer is left
		// to the garbage collector rather than handed to another answer.
		pool = false
	}
}

// autoContentLength is the largest answer writeJSON leaves net/http to
// give its Content-Length: an answer that fits the response's buffer
// (2 KiB in net/http, 4 KiB in its HTTP/2 server) is still there when the
// handler returns, and net/http then sends its length itself, formatted
// into a buffer of its own. Setting the header costs an allocation for
// the value, one for its slice, a map entry that WriteHeader parses back
// and copies, and a line of the sorted header write: on every step's two
// answers. A larger answer gets its Content-Length from writeJSON, so
// that no answer is sent chunked (TestAnswerContentLength).
const autoContentLength = 2048

// answerBufs holds buffers for hand-encoded answers: net/http copies an
// answer into the connection's buffer, so the bytes are free again once
// Write returns without an error (writeJSON keeps a buffer whose Write
// failed out of the pool).
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// maxPooledAnswer is the largest buffer answerBufs keeps.
const maxPooledAnswer = 64 << 10

// contentTypeJSON is the Content-Type of every JSON answer, set without
// Header.Set's canonicalisation and allocation. net/http only reads it.
var contentTypeJSON = []string{"application/json"}

// errorf is a shorthand for a *kernel.Error with a formatted message.
func errorf(code, format string, args ...any) error {
	return &kernel.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// readBody reads the whole body, at most limit bytes; more is too_large.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	if r.ContentLength > 0 && r.ContentLength <= presizeBody {
		// net/http holds the body to its Content-Length: read it into a
		// buffer of that size (io.ReadAll would start at 512 bytes). Only
		// for a small one: the header is the caller's word, and a buffer
		// of a claimed limit would be held before a byte of it arrived.
		b := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, b); err != nil {
			return nil, errorf(kernel.CodeValidation, "cannot read request body: %v", err)
		}
		return b, nil
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge(limit)
		}
		return nil, errorf(kernel.CodeValidation, "cannot read request body: %v", err)
	}
	return b, nil
}

// presizeBody is the largest Content-Length readBody allocates for up
// front; a larger body grows as it arrives.
const presizeBody = 64 << 10

func tooLarge(limit int64) error {
	return (&kernel.Error{Code: kernel.CodeTooLarge, Message: fmt.Sprintf("request body is larger than %d bytes", limit)}).
		WithDetails(map[string]any{"limit_bytes": limit})
}
