package httpapi_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// clock is an injectable, advanceable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// jobsEnv is a workspace with an operator, an INGEST and a WORKER key.
type jobsEnv struct {
	*apitest.Env
	ws     apitest.Workspace
	ingest string
	worker string
	clock  *clock
}

func newJobsEnv(t *testing.T, tools ...string) *jobsEnv {
	t.Helper()
	c := newClock()
	env := apitest.Start(t, apitest.WithNow(c.Now))
	ws := env.Signup()
	if tools == nil {
		tools = []string{"send_email@1"}
	}
	return &jobsEnv{
		Env: env, ws: ws, clock: c,
		ingest: env.Key(ws, map[string]any{"name": "producer", "preset": "INGEST"}),
		worker: env.Key(ws, map[string]any{"name": "worker", "preset": "WORKER", "tools": tools}),
	}
}

func (e *jobsEnv) run() string {
	e.T.Helper()
	return e.Must(http.StatusCreated, "POST", "/api/v1/runs", e.ingest, map[string]any{"name": "onboarding"}).JSON()["id"].(string)
}

func (e *jobsEnv) enqueue(runID string, body map[string]any) map[string]any {
	e.T.Helper()
	return e.Must(http.StatusCreated, "POST", "/api/v1/runs/"+runID+"/steps", e.ingest, body).JSON()
}

func (e *jobsEnv) register(tools ...string) string {
	e.T.Helper()
	var ts []map[string]string
	for _, t := range tools {
		var name, version string
		_, _ = fmt.Sscanf(t, "%s", &name)
		for i := range t {
			if t[i] == '@' {
				name, version = t[:i], t[i+1:]
			}
		}
		ts = append(ts, map[string]string{"name": name, "version": version})
	}
	return e.Must(http.StatusCreated, "POST", "/api/v1/workers/register", e.worker,
		map[string]any{"tools": ts}).JSON()["workerId"].(string)
}

func (e *jobsEnv) claim(workerID string, limit int) []map[string]any {
	e.T.Helper()
	r := e.Must(http.StatusOK, "POST", "/api/v1/workers/"+workerID+"/claim", e.worker, map[string]any{"limit": limit})
	var out struct {
		Jobs []map[string]any `json:"jobs"`
	}
	r.Decode(e.T, &out)
	return out.Jobs
}

func (e *jobsEnv) report(job map[string]any, body map[string]any) *apitest.Response {
	e.T.Helper()
	body["leaseToken"] = job["leaseToken"]
	return e.Do("POST", "/api/v1/jobs/"+job["jobId"].(string)+"/report", e.worker, body)
}

func (e *jobsEnv) getRun(runID string) map[string]any {
	e.T.Helper()
	return e.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID, e.ingest, nil).JSON()
}

func step(run map[string]any, i int) map[string]any {
	return run["steps"].([]any)[i].(map[string]any)
}

func durable(run map[string]any, i int) map[string]any {
	return step(run, i)["durableJob"].(map[string]any)
}

func TestJobHappyPath(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	enq := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1",
		"input": map[string]any{"customerId": "cus_secret_77"}, "idempotencyKey": "welcome:cus_2048"})
	require.Equal(t, "QUEUED", enq["status"])
	require.Equal(t, false, enq["deduplicated"])
	require.NotNil(t, enq["dueAt"])

	wid := e.register("send_email@1")
	jobs := e.claim(wid, 10)
	require.Len(t, jobs, 1)
	j := jobs[0]
	require.Equal(t, enq["jobId"], j["jobId"])
	require.EqualValues(t, 1, j["attempt"])
	require.Equal(t, map[string]any{"customerId": "cus_secret_77"}, j["input"])
	require.Equal(t, "welcome:cus_2048", j["idempotencyKey"])
	// Lease = claim time + timeout (30 s default) + grace (10 s).
	require.Equal(t, e.clock.Now().Add(40*time.Second).Format(time.RFC3339Nano), j["leaseExpiresAt"])
	require.Empty(t, e.claim(wid, 10))

	r := e.report(j, map[string]any{"status": "SUCCEEDED", "output": map[string]any{"messageId": "m_1"}})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, "SUCCEEDED", r.JSON()["status"])

	run := e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", e.ingest, nil).JSON()
	require.Equal(t, "SUCCEEDED", run["status"])
	require.Equal(t, true, run["completionRequested"])
	s := step(run, 0)
	require.Equal(t, "SUCCEEDED", s["status"])
	require.Equal(t, map[string]any{"customerId": "<string>"}, s["inputPreview"])
	require.Equal(t, map[string]any{"messageId": "<string>"}, s["outputPreview"])
	require.NotContains(t, string(e.Must(200, "GET", "/api/v1/runs/"+runID, e.ingest, nil).Body), "cus_secret_77")
}
