package server

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/wicket-run/wicket/kernel"
)

// A Content-Length that claims more than arrives is a validation error,
// and a large claim is not allocated for before its bytes arrive. The
// body ends as net/http's does when the connection ends short of the
// claim.
func TestReadBodyContentLengthLie(t *testing.T) {
	const limit = 32 << 20
	for _, claim := range []int64{10, presizeBody, limit} {
		r := httptest.NewRequest(http.MethodPost, "/", io.NopCloser(io.MultiReader(strings.NewReader(`{}`), shortBody{})))
		r.ContentLength = claim
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := readBody(httptest.NewRecorder(), r, limit)
		runtime.ReadMemStats(&after)
		var ke *kernel.Error
		if !errors.As(err, &ke) || ke.Code != kernel.CodeValidation {
			t.Fatalf("claim %d: err = %v, want a validation error", claim, err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 2*presizeBody {
			t.Errorf("claim %d: allocated %d bytes for a 2-byte body", claim, got)
		}
	}
}

type shortBody struct{}

func (shortBody) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
