package server

import (
	"context"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/wicket-run/wicket/kernel"
	"github.com/wicket-run/wicket/server/wire"
)

// unwritableStore is the real store with its writes failing on demand, as
// a read-only or full file system fails them.
type unwritableStore struct {
	kernel.Store
	broken atomic.Bool
}

func (s *unwritableStore) Update(ctx context.Context, fn func(kernel.Tx) error) error {
	if s.broken.Load() {
		return &kernel.Error{Code: kernel.CodeInternal, Message: "commit", Err: syscall.EROFS}
	}
	return s.Store.Update(ctx, fn)
}

// TestReadyFailsWhenTheStoreCannotWrite: /v0/ready answers 503 while the
// store cannot commit (it answered 200 from the flag alone), and 200 again
// once it can; /v0/health stays 200 (the process is alive).
func TestReadyFailsWhenTheStoreCannotWrite(t *testing.T) {
	var us *unwritableStore
	e := newEnv(t, func(o *envOpts) {
		o.store = func(st kernel.Store) kernel.Store { us = &unwritableStore{Store: st}; return us }
	})
	e.do("GET", "/v0/ready", nil, nil).want(t, http.StatusOK)
	us.broken.Store(true)
	waitReady := func(want int) resp {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			r := e.do("GET", "/v0/ready", nil, nil)
			if r.status == want || time.Now().After(deadline) {
				return r.want(t, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	r := waitReady(http.StatusServiceUnavailable)
	if body := r.err(t); body.Code != wire.CodeUnavailable {
		t.Fatalf("not ready answer %+v", body)
	}
	e.do("GET", "/v0/health", nil, nil).want(t, http.StatusOK)
	us.broken.Store(false)
	waitReady(http.StatusOK)
}
