package server

import (
	"net/http"
	"slices"

	"github.com/wicket-run/wicket/server/wire"
)

// whoami answers GET /v0/whoami: the key's role, tenant and principal, and
// the routes of the table its role admits (authorize's own test, applied
// to every route). A client shows or hides what a key may do from this
// list; the routes still decide each request.
func (s *Server) whoami(c *call) (int, any, error) {
	v := wire.Whoami{Role: string(c.p.Kind), Tenant: c.tenant, KeyTenant: c.p.Tenant, KeyID: c.p.KeyID, Principal: c.p.Name, Routes: []string{}}
	for _, rt := range s.table {
		if rt.cl == classOpen || slices.Contains(roles[rt.cl], c.p.Kind) {
			v.Routes = append(v.Routes, rt.method+" "+rt.path)
		}
	}
	return http.StatusOK, v, nil
}

// uiRoute labels the UI's requests in the metrics ("/ui/") and serves them.
func uiRoute(ui http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rec, ok := w.(*recorder); ok {
			rec.route = "/ui/"
		}
		ui.ServeHTTP(w, r)
	})
}
