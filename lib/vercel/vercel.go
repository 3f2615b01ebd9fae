// Package vercel adapts the shared router to Vercel's one-function-per-file
// Go runtime. Each api/**.go file calls Serve with its route pattern.
package vercel

import (
	"net/http"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/httpapi"
)

// Serve answers one request for the routes at pattern.
func Serve(w http.ResponseWriter, r *http.Request, pattern string) {
	a, err := app.Default()
	if err != nil {
		httpapi.StartFailed(err).ServeHTTP(w, r)
		return
	}
	a.Server.ServeRoute(w, r, pattern)
}
