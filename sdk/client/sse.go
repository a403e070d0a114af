package client

import (
	"bufio"
	"bytes"
	"io"
	"time"
)

// maxSSELine bounds one line of an event stream. An event is one data line
// of JSON; the kernel bounds request bodies at 1 MiB, so events are far
// smaller.
const maxSSELine = 16 << 20

// sseEvent is one dispatched Server-Sent Event.
type sseEvent struct {
	typ   string // "message" when the event names none
	id    string
	hasID bool // the event had an id field
	data  []byte
}

// sseReader parses a text/event-stream as the HTML Living Standard
// (§9.2.6) says: lines end in LF, CRLF or CR; ":" starts a comment; a
// field's value loses one leading space; data lines accumulate joined by
// LF; a blank line dispatches the event; an event left incomplete at the
// end of the stream is discarded.
type sseReader struct {
	sc    *bufio.Scanner
	first bool
}

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxSSELine)
	sc.Split(scanSSELines)
	return &sseReader{sc: sc, first: true}
}

// next returns the next event with data. It returns io.EOF at the end of
// the stream, and the read error if the stream broke.
func (r *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	var data []byte
	hasData := false
	for r.sc.Scan() {
		line := r.sc.Bytes()
		if r.first {
			line = bytes.TrimPrefix(line, []byte("\uFEFF"))
			r.first = false
		}
		if len(line) == 0 {
			if !hasData {
				ev, data = sseEvent{}, data[:0]
				continue
			}
			ev.data = bytes.TrimSuffix(data, []byte("\n"))
			if ev.typ == "" {
				ev.typ = "message"
			}
			return ev, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			ev.typ = string(value)
		case "data":
			data = append(append(data, value...), '\n')
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				ev.id, ev.hasID = string(value), true
			}
		}
		// "retry" and unknown fields are ignored: Watch has its own backoff.
	}
	if err := r.sc.Err(); err != nil {
		return sseEvent{}, err
	}
	return sseEvent{}, io.EOF
}

// scanSSELines is a bufio.SplitFunc for lines ending in LF, CRLF or CR.
func scanSSELines(data []byte, atEOF bool) (int, []byte, error) {
	if atEOF && len(data) == 0 {
		return 0, nil, nil
	}
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		switch {
		case data[i] == '\n':
			return i + 1, data[:i], nil
		case i+1 < len(data):
			if data[i+1] == '\n' {
				return i + 2, data[:i], nil
			}
			return i + 1, data[:i], nil
		case atEOF:
			return i + 1, data[:i], nil
		}
		return 0, nil, nil // a CR at the end: wait to see whether LF follows
	}
	if atEOF {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// idleReader resets t to d after every read that returned data, so that t
// fires only when the stream has been silent for d.
type idleReader struct {
	r io.Reader
	t *time.Timer
	d time.Duration
}

func (i *idleReader) Read(p []byte) (int, error) {
	n, err := i.r.Read(p)
	if n > 0 {
		i.t.Reset(i.d)
	}
	return n, err
}
