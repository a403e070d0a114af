package server

import (
	"context"
	"io"
	"net/http"

	"github.com/wicket-run/wicket/kernel"
)

// Backuper writes a consistent copy of the kernel's store while it serves
// (store/bbolt's *Store implements it). The copy must be a file the store
// opens as is.
type Backuper interface {
	Backup(ctx context.Context, w io.Writer) (int64, error)
}

// backup streams a hot copy of the store: GET /v0/store/backup (admin).
// A copy that fails once bytes were sent aborts the connection, so the
// client sees a broken transfer rather than a short file.
func (s *Server) backup(c *call) (int, any, error) {
	if s.cfg.Backup == nil {
		return 0, nil, errorf(kernel.CodeUnavailable, "this kernel's store has no hot backup")
	}
	c.w.Header().Set("Content-Type", "application/octet-stream")
	c.w.Header().Set("Content-Disposition", `attachment; filename="wicket.db"`)
	c.w.Header().Set("Cache-Control", "no-store")
	cw := &countingWriter{w: c.w}
	n, err := s.cfg.Backup.Backup(c.ctx, cw)
	if err != nil {
		if cw.n == 0 {
			return 0, nil, err
		}
		s.log.Error("backup failed mid-copy", "err", err, "bytes", n)
		panic(http.ErrAbortHandler)
	}
	s.log.Info("backup sent", "bytes", n, "principal", c.p.String())
	return 0, nil, nil
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
