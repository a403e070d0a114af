package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/wicket-run/wicket/server/wire"
)

// whoami is GET /v0/whoami's answer.
type whoami = wire.Whoami

// apiError is a non-2xx answer of the API.
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// capture is the http.ResponseWriter of an in-process API call.
type capture struct {
	h      http.Header
	status int
	buf    bytes.Buffer
}

func (c *capture) Header() http.Header { return c.h }
func (c *capture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}
func (c *capture) Write(b []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	return c.buf.Write(b)
}

// apiRequest builds the in-process API request of q: path (with its query)
// under q's tenant, the session's key as the bearer, nothing of the
// browser's credentials.
func (c *Console) apiRequest(q *req, method, path string, body io.Reader) (*http.Request, error) {
	u, err := url.Parse(path)
	if err != nil {
		return nil, err
	}
	if t := q.r.URL.Query().Get("tenant"); t != "" {
		v := u.Query()
		if v.Get("tenant") == "" {
			v.Set("tenant", t)
		}
		u.RawQuery = v.Encode()
	}
	ar, err := http.NewRequestWithContext(q.r.Context(), method, u.String(), body)
	if err != nil {
		return nil, err
	}
	ar.RemoteAddr = q.r.RemoteAddr
	ar.Host = q.r.Host
	if body != nil {
		ar.Header.Set("Content-Type", "application/json")
	}
	if q.s.key != "" {
		ar.Header.Set("Authorization", "Bearer "+q.s.key)
	}
	return ar, nil
}

// call calls the API in process as q's key and decodes the answer into
// out (nil: ignored). A non-2xx answer is an *apiError.
func (c *Console) call(q *req, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ar, err := c.apiRequest(q, method, path, rd)
	if err != nil {
		return err
	}
	cw := &capture{h: http.Header{}}
	c.api.ServeHTTP(cw, ar)
	if cw.status == 0 {
		cw.status = http.StatusOK
	}
	if cw.status/100 != 2 {
		var eb wire.ErrorBody
		_ = json.Unmarshal(cw.buf.Bytes(), &eb)
		if eb.Message == "" {
			eb.Message = strings.TrimSpace(cw.buf.String())
		}
		return &apiError{Status: cw.status, Code: eb.Code, Message: eb.Message}
	}
	if out != nil && cw.buf.Len() > 0 {
		if err := json.Unmarshal(cw.buf.Bytes(), out); err != nil {
			return fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	}
	return nil
}

// executionStream relays GET /v0/executions/{id}/stream, called as the
// session's key, to the browser's EventSource. The event names are dropped
// so that every event reaches the page's one message handler (each event's
// data names its type); ids, data and heartbeats pass as they are. The
// stream ends when the API's does: at the execution's end, or when the key
// is revoked.
func (c *Console) executionStream(q *req) {
	path := "/v0/executions/" + url.PathEscape(q.r.PathValue("id")) + "/stream"
	if a := q.r.URL.Query().Get("after_seq"); a != "" {
		path += "?after_seq=" + url.QueryEscape(a)
	}
	ar, err := c.apiRequest(q, "GET", path, nil)
	if err != nil {
		c.fail(q.w, q.r, q, http.StatusBadRequest, err.Error())
		return
	}
	if lei := q.r.Header.Get("Last-Event-ID"); lei != "" {
		ar.Header.Set("Last-Event-ID", lei)
	}
	c.api.ServeHTTP(&sseFilter{ResponseWriter: q.w}, ar)
}

// sseFilter drops the "event:" lines of an event stream written through it.
type sseFilter struct {
	http.ResponseWriter
	line []byte // a line not yet ended
}

func (f *sseFilter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			f.line = append(f.line, b...)
			break
		}
		f.line = append(f.line, b[:i+1]...)
		b = b[i+1:]
		if !bytes.HasPrefix(f.line, []byte("event:")) {
			if _, err := f.ResponseWriter.Write(f.line); err != nil {
				return 0, err
			}
		}
		f.line = f.line[:0]
	}
	return n, nil
}

// Unwrap lets http.ResponseController reach the connection (flushes and
// write deadlines).
func (f *sseFilter) Unwrap() http.ResponseWriter { return f.ResponseWriter }

// Flush flushes the browser's stream.
func (f *sseFilter) Flush() { _ = http.NewResponseController(f.ResponseWriter).Flush() }
