// Package vercel adapts the shared router to Vercel's one-function-per-file
// Go runtime. Each api/**.go file calls Serve with its route pattern.
package vercel

import (
	"log/slog"
	"net/http"

	"github.com/getratchet/ratchet/lib/app"
)

// Serve answers one request for the routes at pattern.
func Serve(w http.ResponseWriter, r *http.Request, pattern string) {
	a, err := app.Default()
	if err != nil {
		// The configuration error names the setting, never its value.
		slog.Error("start-up failed", "err", err.Error())
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":{"code":"internal_error","message":"The service is misconfigured; see the function logs.","detail":{}}}` + "\n"))
		return
	}
	a.Server.ServeRoute(w, r, pattern)
}
