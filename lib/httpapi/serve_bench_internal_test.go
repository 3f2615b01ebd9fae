package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jobs"
)

// BenchmarkServeEnqueueShaped is the router's own work for an enqueue,
// without its key's check and its statement: the request id, the
// parameter checks, the body read and strictly decoded, the answer
// encoded, the request logged (as JSON, as the functions log). The route
// is public so that no database is needed; an enqueue's key check and
// query checks are BenchmarkEnqueueRequestChecks.
func BenchmarkServeEnqueueShaped(b *testing.B) {
	due := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	res := jobs.EnqueueResult{StepID: ids.New(ids.Step), JobID: ids.New(ids.Job), Status: "QUEUED", DueAt: &due,
		IdempotencyKey: strings.Repeat("ab", 32)}
	s := newWithRoutes(Deps{Config: &config.Config{}, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))},
		func(*Server) []Route {
			return []Route{{Method: "POST", Pattern: "/api/v1/runs/{id}/steps", Name: "runs.enqueue", Auth: AuthNone, Request: jobs.EnqueueRequest{},
				Status: 201, Handle: func(_ context.Context, c *Call) (any, error) {
					if _, err := c.PathID("id", ids.Run); err != nil {
						return nil, err
					}
					var req jobs.EnqueueRequest
					if err := c.Decode(&req); err != nil {
						return nil, err
					}
					return res, nil
				}}}
		})
	path := "/api/v1/runs/" + ids.New(ids.Run) + "/steps"
	const body = `{"input":{"n":1234},"name":"bench_noop","version":"1"}`
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest("POST", path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatal(w.Code, w.Body.String())
		}
	}
}

// BenchmarkEnqueueRequestChecks is what run checks of an enqueue's
// request before its handler, its key aside: path and query parameters.
func BenchmarkEnqueueRequestChecks(b *testing.B) {
	var route *Route
	for _, r := range (&Server{}).routes() {
		if r.Name == "runs.enqueue" {
			route = &r
		}
	}
	r := httptest.NewRequest("POST", "/api/v1/runs/x/steps", strings.NewReader("{}"))
	r.SetPathValue("id", ids.New(ids.Run))
	b.ReportAllocs()
	for b.Loop() {
		if err := textParams(r, route.Pattern, route.PathParams()); err != nil {
			b.Fatal(err)
		}
		if err := knownQuery(r, route); err != nil {
			b.Fatal(err)
		}
	}
}
