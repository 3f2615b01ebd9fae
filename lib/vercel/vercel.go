// Package vercel adapts the shared router to Vercel's one-function-per-file
// Go runtime. Each api/**.go file calls Serve with its route pattern.
package vercel

import (
	"log/slog"
	"net/http"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/httpapi"
)

// Serve answers one request for the routes at pattern.
func Serve(w http.ResponseWriter, r *http.Request, pattern string) {
	a, err := app.Default()
	if err != nil {
		startFailed(w, err)
		return
	}
	a.Server.ServeRoute(w, r, pattern)
}

// startFailed answers a request the instance could not start for: 503
// database_unavailable when the database was out of reach (the next request
// tries again), else 500 for a configuration to fix. The error names the
// setting, never its value.
func startFailed(w http.ResponseWriter, err error) {
	slog.Error("start-up failed", "err", err.Error())
	e := apierr.New(http.StatusInternalServerError, apierr.CodeInternal,
		"The service is misconfigured; see the function logs.")
	if db.IsUnavailable(err) {
		e = apierr.DatabaseUnavailable(err)
	}
	httpapi.WriteOutsideError(w, e)
}
