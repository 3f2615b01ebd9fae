package httpapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/getratchet/ratchet/lib/apitest"
)

// BenchmarkEnqueueHandler is POST /api/v1/runs/{id}/steps through the whole
// server in process, key check and statement included, as the enqueue
// figure sends it (16 runs, a small input, no key; scripts/benchratchet):
// its allocations are the server's per enqueue (and the test's request and
// recorder), its time mostly the database's.
func BenchmarkEnqueueHandler(b *testing.B) {
	env := apitest.Start(b)
	ws := env.Signup()
	ingest := env.Key(ws, map[string]any{"name": "producer", "preset": "INGEST"})
	runs := make([]string, 16)
	for i := range runs {
		runs[i] = env.Must(http.StatusCreated, "POST", "/api/v1/runs", ingest, map[string]any{"name": "bench"}).
			JSON()["id"].(string)
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			r := httptest.NewRequest("POST", "/api/v1/runs/"+runs[i%int64(len(runs))]+"/steps",
				strings.NewReader(fmt.Sprintf(`{"name":"bench_noop","version":"1","input":{"n":%d}}`, i)))
			r.Header.Set("Authorization", "Bearer "+ingest)
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			env.App.Server.ServeHTTP(w, r)
			if w.Code != http.StatusCreated {
				b.Fatal(w.Code, w.Body.String())
			}
		}
	})
}
