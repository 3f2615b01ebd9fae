package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// What the SDKs' workers send, against the OpenAPI document, as
// requests_test.go holds their client methods: a worker's requests are its
// own (the Python and TypeScript workers call the transport, not the
// client's methods, and the Go worker registers through an unexported
// method), so a field or an Idempotency-Key the worker alone gets wrong would
// pass those tests. Each worker (testdata/worker_requests.*, and the Go
// worker here) runs three jobs of tool t@1 against workerRecorder: j1
// waits for its heartbeat and succeeds, j2 fails, j3 succeeds; j1's
// report is held until j2's and j3's are queued behind it (the script
// lowers its reporter's deliveries in flight to one), so they go as one
// batch. Every request is compared as the client methods' are, and the
// worker's routes must all have been called.

// workerRoutes: what a worker run sends, each route at least once.
var workerRoutes = []string{"POST /workers/register", "POST /workers/{workerId}/claim", "POST /jobs/{id}/heartbeat",
	"POST /jobs/{id}/report", "POST /jobs/report"}

// workerRecorder answers a worker as Ratchet would: its registration, one
// claim of the three jobs (none after), heartbeats, and reports (the first
// single report held until /__release); /__state tells the script
// what it has seen.
type workerRecorder struct {
	requestRecorder
	release   chan struct{}
	releaseMu sync.Once
	mu        sync.Mutex
	claimed   bool
	beats     int
	held      int
	reported  map[string]bool
	noHold    bool          // no report is held (the Go worker's run)
	allDone   chan struct{} // closed once the three jobs are reported
}

func newWorkerRecorder() *workerRecorder {
	return &workerRecorder{release: make(chan struct{}), reported: map[string]bool{}, allDone: make(chan struct{})}
}

// workerJob is job id as a claim answers it, in the documented shape.
func workerJob(id string) ratchet.ClaimedJob {
	return ratchet.ClaimedJob{JobID: id, StepID: "s-" + id, RunID: "r", Name: "t", Version: "1", Attempt: 1,
		MaxAttempts: 3, LeaseToken: "lt-" + id, LeaseExpiresAt: time.Now().Add(3 * time.Second), LeaseMs: 3000,
		TimeoutMs: 60_000, IdempotencyKey: "k-" + id, Input: json.RawMessage(`{"job":"` + id + `"}`)}
}

func (r *workerRecorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	answer := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	switch req.URL.Path {
	case "/__state":
		r.mu.Lock()
		defer r.mu.Unlock()
		answer(map[string]int{"heartbeats": r.beats, "held": r.held, "reported": len(r.reported)})
		return
	case "/__release":
		r.releaseMu.Do(func() { close(r.release) })
		answer(map[string]any{})
		return
	}
	last := r.record(req)
	route := strings.Split(strings.TrimPrefix(last.path, "/"), "/")
	result := func(id string) map[string]any {
		r.mu.Lock()
		r.reported[id] = true
		if len(r.reported) == 3 {
			select {
			case <-r.allDone:
			default:
				close(r.allDone)
			}
		}
		r.mu.Unlock()
		return map[string]any{"jobId": id, "status": "SUCCEEDED", "attempt": 1, "nextDueAt": nil, "error": nil}
	}
	switch {
	case last.path == "/workers/register":
		answer(map[string]any{"workerId": "w1"})
	case len(route) == 3 && route[0] == "workers" && route[2] == "claim":
		r.mu.Lock()
		jobs := []ratchet.ClaimedJob{}
		if !r.claimed {
			jobs, r.claimed = []ratchet.ClaimedJob{workerJob("j1"), workerJob("j2"), workerJob("j3")}, true
		}
		r.mu.Unlock()
		answer(map[string]any{"jobs": jobs})
	case len(route) == 3 && route[0] == "jobs" && route[2] == "heartbeat":
		r.mu.Lock()
		r.beats++
		r.mu.Unlock()
		answer(map[string]any{"leaseExpiresAt": time.Now().Add(3 * time.Second), "cancelRequested": false})
	case len(route) == 3 && route[0] == "jobs" && route[2] == "report":
		r.mu.Lock()
		hold := r.held == 0 && !r.noHold
		if hold {
			r.held++
		}
		r.mu.Unlock()
		if hold {
			select {
			case <-r.release:
			case <-req.Context().Done():
				return
			}
		}
		answer(result(route[1]))
	case last.path == "/jobs/report":
		var results []map[string]any
		body, _ := last.body.(map[string]any)
		for _, rep := range anySlice(body["reports"]) {
			id, _ := rep.(map[string]any)["jobId"].(string)
			results = append(results, result(id))
		}
		answer(map[string]any{"results": results})
	default:
		http.NotFound(w, req)
	}
}

// workerRequestDrift is what sdkRequestDrift reports of a worker's requests
// that concerns them (not the routes only client methods call), and each
// route of workerRoutes not called (but those of notCalled).
func workerRequestDrift(t *testing.T, sent []sentRequest, notCalled ...string) []string {
	t.Helper()
	doc := openAPIDoc(t)
	var problems []string
	for _, p := range sdkRequestDrift(t, doc, sent, nil) {
		if !strings.Contains(p, "by no method") {
			problems = append(problems, p)
		}
	}
	called := map[string]bool{}
	for _, s := range sent {
		called[routeOf(t, doc, s.method, s.path)] = true
	}
	for _, r := range workerRoutes {
		if !called[r] && !slices.Contains(notCalled, r) {
			problems = append(problems, r+": not called by the worker's run")
		}
	}
	return problems
}

func TestPythonSDKWorkerRequestsMatchTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	sent := recordSDKRequests(t, newWorkerRecorder(), "testdata", []string{"PYTHONPATH=../" + pythonSDK},
		pythonInterpreter(t), "worker_requests.py")
	require.Empty(t, workerRequestDrift(t, sent), "what the Python SDK's worker sends differs from the OpenAPI document")
}

func TestTypeScriptSDKWorkerRequestsMatchTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	sent := recordSDKRequests(t, newWorkerRecorder(), "testdata", nil, nodeInterpreter(t), "worker_requests.mjs")
	require.Empty(t, workerRequestDrift(t, sent), "what the TypeScript SDK's worker sends differs from the OpenAPI document")
}

// The Go worker's run, in process, without the batch: its reporter's
// deliveries in flight are a constant (reportInFlight), so two reports
// cannot be made to queue behind a held one from here; it sends a batch
// through Client.ReportJobs, which TestGoSDKRequestBodiesMatchTheOpenAPIDocument
// holds, with the JobReport values its single reports send here.
func TestGoSDKWorkerRequestsMatchTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	rec := newWorkerRecorder()
	rec.noHold = true
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c, err := ratchet.NewClient(ratchet.Config{BaseURL: srv.URL, APIKey: "rk_test"})
	require.NoError(t, err)
	w := ratchet.NewWorker(c)
	type input struct {
		Job string `json:"job"`
	}
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[input, map[string]bool]{Name: "t", Version: "1",
		Handler: func(ctx context.Context, in input, _ ratchet.JobContext) (map[string]bool, error) {
			switch in.Job {
			case "j1":
				for { // until its heartbeat is sent
					rec.mu.Lock()
					beats := rec.beats
					rec.mu.Unlock()
					if beats > 0 {
						break
					}
					select {
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-time.After(20 * time.Millisecond):
					}
				}
			case "j2":
				return nil, errors.New("fails")
			}
			return map[string]bool{"ok": true}, nil
		}}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, w.Start(ctx, ratchet.StartOptions{Concurrency: 3, PollInterval: 50 * time.Millisecond}))
	select {
	case <-rec.allDone:
	case <-ctx.Done():
		t.Fatal("the three jobs were not reported")
	}
	require.NoError(t, w.Stop(ctx))
	require.Empty(t, workerRequestDrift(t, rec.requests(), "POST /jobs/report"),
		"what the Go SDK's worker sends differs from the OpenAPI document")
}
