package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getratchet/ratchet/lib/apitest"
)

// BenchmarkClaimReportHandler is the work figure's server side in process
// (scripts/benchratchet's ratchet.jobs.work): a worker's claim of 100 jobs
// under a claim id, then one batch report of the 100, each through the whole
// server, key checks and statements included. One op is one job worked
// (claim and report per 100, fewer for the last): allocs/op are the server's per job worked
// (and the test's share of its requests); the enqueues that queue the jobs
// are outside the timer.
func BenchmarkClaimReportHandler(b *testing.B) {
	const batch = 100
	env := apitest.Start(b)
	ws := env.Signup()
	ingest := env.Key(ws, map[string]any{"name": "producer", "preset": "INGEST"})
	worker := env.Key(ws, map[string]any{"name": "worker", "preset": "WORKER", "tools": []string{"bench_noop@1"}})
	run := env.Must(http.StatusCreated, "POST", "/api/v1/runs", ingest, map[string]any{"name": "bench"}).JSON()["id"].(string)
	workerID := env.Must(http.StatusCreated, "POST", "/api/v1/workers/register", worker,
		map[string]any{"tools": []map[string]string{{"name": "bench_noop", "version": "1"}}}).JSON()["workerId"].(string)
	serve := func(path, key, body string, want int) []byte {
		r := httptest.NewRequest("POST", path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+key)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		env.App.Server.ServeHTTP(w, r)
		if w.Code != want {
			b.Fatal(path, w.Code, w.Body.String())
		}
		return w.Body.Bytes()
	}
	var n, claims int
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		k := min(batch, b.N-done)
		done += k
		b.StopTimer()
		for range k {
			n++
			serve("/api/v1/runs/"+run+"/steps", ingest, fmt.Sprintf(`{"name":"bench_noop","version":"1","input":{"n":%d}}`, n),
				http.StatusCreated)
		}
		claims++
		b.StartTimer()
		var claimed struct {
			Jobs []struct {
				JobID      string `json:"jobId"`
				LeaseToken string `json:"leaseToken"`
			} `json:"jobs"`
		}
		body := serve("/api/v1/workers/"+workerID+"/claim", worker,
			fmt.Sprintf(`{"limit":%d,"waitSeconds":0,"claimId":"bench-%d"}`, k, claims), http.StatusOK)
		if err := json.Unmarshal(body, &claimed); err != nil || len(claimed.Jobs) != k {
			b.Fatal(err, len(claimed.Jobs), string(body))
		}
		var reports bytes.Buffer
		reports.WriteString(`{"reports":[`)
		for i, j := range claimed.Jobs {
			if i > 0 {
				reports.WriteByte(',')
			}
			fmt.Fprintf(&reports, `{"jobId":%q,"leaseToken":%q,"status":"SUCCEEDED","output":{"ok":true}}`, j.JobID, j.LeaseToken)
		}
		reports.WriteString(`]}`)
		body = serve("/api/v1/jobs/report", worker, reports.String(), http.StatusOK)
		if bytes.Contains(body, []byte(`"error"`)) {
			b.Fatal(string(body))
		}
	}
}
