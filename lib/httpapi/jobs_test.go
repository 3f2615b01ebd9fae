package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/toolname"
)

func newClock() *apitest.Clock {
	return apitest.NewClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
}

// jobsEnv is a workspace with an operator, an INGEST and a WORKER key.
type jobsEnv struct {
	*apitest.Env
	ws     apitest.Workspace
	ingest string
	worker string
	clock  *apitest.Clock
}

func newJobsEnv(t *testing.T, tools ...string) *jobsEnv {
	t.Helper()
	return newJobsEnvWith(t, nil, tools...)
}

// newJobsEnvWith is newJobsEnv started with opts.
func newJobsEnvWith(t *testing.T, opts []apitest.Option, tools ...string) *jobsEnv {
	t.Helper()
	c := newClock()
	env := apitest.Start(t, append([]apitest.Option{apitest.WithNow(c.Now)}, opts...)...)
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
	return e.registerAs(e.worker, tools...)
}

func (e *jobsEnv) registerAs(key string, tools ...string) string {
	e.T.Helper()
	var ts []map[string]string
	for _, t := range tools {
		name, version, _ := strings.Cut(t, "@")
		ts = append(ts, map[string]string{"name": name, "version": version})
	}
	return e.Must(http.StatusCreated, "POST", "/api/v1/workers/register", key,
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

func validationFields(t *testing.T, r *apitest.Response) []string {
	t.Helper()
	require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
	require.Equal(t, "invalid_request", r.ErrorCode())
	var out []string
	for _, v := range r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["validation"].([]any) {
		out = append(out, v.(map[string]any)["field"].(string))
	}
	return out
}

func (e *jobsEnv) endpoint(name string) map[string]any {
	e.T.Helper()
	return e.Must(http.StatusCreated, "POST", "/api/v1/endpoints", e.ws.Key, map[string]any{"name": name}).JSON()
}

func TestEndpointPolicyValidation(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	ep := e.endpoint("Email service")
	require.Equal(t, "STANDARD", ep["policyPreset"])
	require.Nil(t, ep["retryPolicy"])
	require.EqualValues(t, 5, ep["maxAttempts"])
	require.EqualValues(t, 30000, ep["defaultTimeoutMs"])
	require.Nil(t, ep["maxConcurrent"])
	require.Nil(t, ep["rateLimitPerMinute"])
	require.Equal(t, false, ep["paused"])
	require.Equal(t, "closed", ep["circuit"].(map[string]any)["state"])
	// An existing name answers 200, unchanged.
	again := e.Must(http.StatusOK, "POST", "/api/v1/endpoints", e.ws.Key,
		map[string]any{"name": "Email service", "preset": "RELAXED"}).JSON()
	require.Equal(t, ep["id"], again["id"])
	require.Equal(t, "STANDARD", again["policyPreset"])

	path := "/api/v1/endpoints/" + ep["id"].(string) + "/policy"
	put := func(body map[string]any) *apitest.Response { return e.Do("PUT", path, e.ws.Key, body) }
	custom := func(over map[string]any) map[string]any {
		b := map[string]any{"expectedVersion": 1, "preset": "CUSTOM", "maxAttempts": 6, "initialDelayMs": 10000,
			"multiplier": 2, "maxDelayMs": 600000, "jitterPercent": 20, "defaultTimeoutMs": 30000,
			"maxConcurrent": 4, "rateLimitPerMinute": nil}
		for k, v := range over {
			if v == "<omit>" {
				delete(b, k)
			} else {
				b[k] = v
			}
		}
		return b
	}
	for name, tc := range map[string]struct {
		body   map[string]any
		fields []string
	}{
		"unknown field":            {custom(map[string]any{"backoff": "fast"}), []string{"backoff"}},
		"incomplete CUSTOM":        {custom(map[string]any{"multiplier": "<omit>", "jitterPercent": "<omit>"}), []string{"multiplier", "jitterPercent"}},
		"custom field on built-in": {map[string]any{"expectedVersion": 1, "preset": "STANDARD", "initialDelayMs": 1000}, []string{"initialDelayMs"}},
		"attempts on built-in":     {map[string]any{"expectedVersion": 1, "preset": "AGGRESSIVE", "maxAttempts": 3}, []string{"maxAttempts"}},
		"custom field, no preset":  {map[string]any{"expectedVersion": 1, "jitterPercent": 5}, []string{"jitterPercent"}},
		"maxDelayMs < initial":     {custom(map[string]any{"initialDelayMs": 60000, "maxDelayMs": 1000}), []string{"maxDelayMs"}},
		"maxAttempts 0":            {custom(map[string]any{"maxAttempts": 0}), []string{"maxAttempts"}},
		"maxAttempts 11":           {custom(map[string]any{"maxAttempts": 11}), []string{"maxAttempts"}},
		"fractional attempts":      {custom(map[string]any{"maxAttempts": 2.5}), []string{"maxAttempts"}},
		"fractional ms":            {custom(map[string]any{"initialDelayMs": 1000.5}), []string{"initialDelayMs"}},
		"delay beyond 24 h":        {custom(map[string]any{"maxDelayMs": 86400001}), []string{"maxDelayMs"}},
		"multiplier below 1":       {custom(map[string]any{"multiplier": 0.5}), []string{"multiplier"}},
		"jitter over 100":          {custom(map[string]any{"jitterPercent": 101}), []string{"jitterPercent"}},
		"unknown preset":           {map[string]any{"expectedVersion": 1, "preset": "FAST"}, []string{"preset"}},
		// Each rule the body breaks is listed: an unknown preset hid the rest.
		"unknown preset, bad gates": {map[string]any{"expectedVersion": 1, "preset": "FAST", "defaultTimeoutMs": 10,
			"maxConcurrent": 0}, []string{"preset", "defaultTimeoutMs", "maxConcurrent"}},
		"expectedVersion required":   {custom(map[string]any{"expectedVersion": "<omit>"}), []string{"expectedVersion"}},
		"expectedVersion negative":   {custom(map[string]any{"expectedVersion": -1}), []string{"expectedVersion"}},
		"maxConcurrent 0":            {custom(map[string]any{"maxConcurrent": 0}), []string{"maxConcurrent"}},
		"maxConcurrent 1001":         {custom(map[string]any{"maxConcurrent": 1001}), []string{"maxConcurrent"}},
		"rateLimitPerMinute 100001":  {custom(map[string]any{"rateLimitPerMinute": 100001}), []string{"rateLimitPerMinute"}},
		"defaultTimeoutMs too small": {custom(map[string]any{"defaultTimeoutMs": 10}), []string{"defaultTimeoutMs"}},
		"null preset":                {map[string]any{"expectedVersion": 1, "preset": nil}, []string{"preset"}},
	} {
		r := put(tc.body)
		require.Equal(t, tc.fields, validationFields(t, r), name)
	}
	// Nothing changed.
	require.EqualValues(t, 1, e.Must(200, "GET", path, e.ws.Key, nil).JSON()["version"])

	ok := e.Must(http.StatusOK, "PUT", path, e.ws.Key, custom(nil)).JSON()
	require.Equal(t, "CUSTOM", ok["policyPreset"])
	require.EqualValues(t, 2, ok["version"])
	require.EqualValues(t, 6, ok["maxAttempts"])
	require.EqualValues(t, 4, ok["maxConcurrent"])
	require.Equal(t, map[string]any{"preset": "CUSTOM", "maxAttempts": 6.0, "initialDelayMs": 10000.0,
		"multiplier": 2.0, "maxDelayMs": 600000.0, "jitterPercent": 20.0}, ok["retryPolicy"])

	// An update that changes nothing makes no new version (QA).
	same := e.Must(http.StatusOK, "PUT", path, e.ws.Key, custom(map[string]any{"expectedVersion": 2})).JSON()
	require.EqualValues(t, 2, same["version"])
	require.EqualValues(t, 2, e.Must(http.StatusOK, "PUT", path, e.ws.Key,
		map[string]any{"expectedVersion": 2}).JSON()["version"])
	require.Equal(t, ok["updatedAt"], e.Must(200, "GET", path, e.ws.Key, nil).JSON()["updatedAt"])

	// A stale expectedVersion is a conflict, even for an update that
	// would change nothing (API.md §5: it must equal the version).
	require.Equal(t, "version_conflict", put(custom(nil)).ErrorCode())
	stale := put(custom(map[string]any{"maxAttempts": 7}))
	require.Equal(t, http.StatusConflict, stale.Status)
	require.Equal(t, "version_conflict", stale.ErrorCode())
	// In this route's camelCase, as API.md never mixes the two in a route.
	require.Equal(t, map[string]any{"currentVersion": 2.0}, stale.JSON()["error"].(map[string]any)["detail"])

	// An existing CUSTOM policy merges field by field; null clears a gate.
	merged := e.Must(http.StatusOK, "PUT", path, e.ws.Key, map[string]any{"expectedVersion": 2, "maxAttempts": 3,
		"maxConcurrent": nil, "rateLimitPerMinute": 600}).JSON()
	require.EqualValues(t, 3, merged["maxAttempts"])
	require.EqualValues(t, 10000, merged["retryPolicy"].(map[string]any)["initialDelayMs"])
	require.Nil(t, merged["maxConcurrent"])
	require.EqualValues(t, 600, merged["rateLimitPerMinute"])
	back := e.Must(http.StatusOK, "PUT", path, e.ws.Key, map[string]any{"expectedVersion": 3, "preset": "RELAXED"}).JSON()
	require.Nil(t, back["retryPolicy"])
	require.EqualValues(t, 3, back["maxAttempts"])

	list := e.Must(http.StatusOK, "GET", "/api/v1/endpoints?limit=1", e.ingest, nil).JSON()
	require.Len(t, list["data"], 1)
	require.Nil(t, list["nextCursor"])
	// Creating with policy fields validates them too.
	require.Equal(t, []string{"maxDelayMs"}, validationFields(t, e.Do("POST", "/api/v1/endpoints", e.ws.Key,
		map[string]any{"name": "x", "preset": "CUSTOM", "maxAttempts": 2, "initialDelayMs": 5000, "multiplier": 2,
			"maxDelayMs": 10, "jitterPercent": 0})))
	require.Equal(t, []string{"name"}, validationFields(t, e.Do("POST", "/api/v1/endpoints", e.ws.Key, map[string]any{"name": ""})))
}

// An endpoint's name may hold spaces, but no control or format character
// and no white space at either end: look-alike names were separate
// endpoints, each with its own pause, limits and circuit (jobs QA). Neither
// an enqueue nor a create naming one changes anything.
func TestEndpointNamesArePrintable(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1")
	runID := e.run()
	steps := "/api/v1/runs/" + runID + "/steps"
	for i, decoded := range []string{"e\u0007x", "e\u200bx", " ex", "ex ", "e\tx", "\ufeffex",
		"Stripe\u00a0API", "e\u2028x", "e\u3000x", strings.Repeat("é", 201)} {
		require.Equal(t, []string{"endpoint"}, validationFields(t, e.Do("POST", steps, e.ingest, map[string]any{
			"name": "send_email", "version": "1", "endpoint": decoded, "idempotencyKey": fmt.Sprint("k", i)})), "%q", decoded)
		require.Equal(t, []string{"name"}, validationFields(t, e.Do("POST", "/api/v1/endpoints", e.ws.Key,
			map[string]any{"name": decoded})), "%q", decoded)
	}
	require.Empty(t, e.Must(http.StatusOK, "GET", "/api/v1/endpoints", e.ws.Key, nil).JSON()["data"])
	e.Must(http.StatusCreated, "POST", "/api/v1/endpoints", e.ws.Key, map[string]any{"name": "Stripe API"})
	e.Must(http.StatusCreated, "POST", steps, e.ingest, map[string]any{"name": "send_email", "version": "1",
		"endpoint": "Stripe API", "idempotencyKey": "ok"})
	e.Must(http.StatusCreated, "POST", "/api/v1/endpoints", e.ws.Key, map[string]any{"name": strings.Repeat("é", 200)})
}

// An afterStepId that is no step of the run is unknown, whatever its form
// and wherever the step is: 404 (API.md §0), after any validation problem,
// and nothing is enqueued (contract QA: 400 "must be a step id of this
// run").
func TestEnqueueAfterAStepNotOfTheRunIsNotFound(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID, other := e.run(), e.run()
	steps := "/api/v1/runs/" + runID + "/steps"
	otherStep := e.enqueue(other, map[string]any{"name": "send_email", "version": "1"})["stepId"].(string)
	ws2 := e.Signup()
	run2 := e.Must(http.StatusCreated, "POST", "/api/v1/runs", ws2.Key, map[string]any{"name": "x"}).JSON()["id"].(string)
	foreign := e.Must(http.StatusCreated, "POST", "/api/v1/runs/"+run2+"/steps", ws2.Key,
		map[string]any{"name": "send_email", "version": "1"}).JSON()["stepId"].(string)
	for _, id := range []string{"stp_missing", "stp_01m8kjt9g002extbwvcndh4bkd", otherStep, foreign, "run_" + runID[4:]} {
		r := e.Do("POST", steps, e.ingest, map[string]any{"name": "a", "version": "1", "afterStepId": id, "afterStatus": "FAILED"})
		require.Equal(t, http.StatusNotFound, r.Status, "%s: %s", id, r.Body)
		require.Equal(t, "not_found", r.ErrorCode())
		require.Contains(t, string(r.Body), "No such step in this run (afterStepId).")
	}
	r := e.Do("POST", steps, e.ingest, map[string]any{"name": "a", "version": "1", "afterStepId": "stp_missing", "afterStatus": "DONE"})
	require.Equal(t, []string{"afterStatus"}, validationFields(t, r), "a validation problem is answered first")
	// An afterStatus outside its enum is a problem of its own, listed with
	// the missing afterStepId it also calls for (QA: only the latter was).
	r = e.Do("POST", steps, e.ingest, map[string]any{"name": "a", "version": "1", "afterStatus": "DONE"})
	require.Equal(t, []string{"afterStatus", "afterStepId"}, validationFields(t, r))
	run := e.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID, e.ws.Key, nil).JSON()
	require.Empty(t, run["steps"])

	// Whatever its form, it is answered as an id of no step is, in the
	// same order as the run's own checks (review): a finished run's refusal
	// comes first.
	e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", e.ingest, nil)
	for _, id := range []string{"stp_missing", "stp_01m8kjt9g002extbwvcndh4bkd"} {
		r := e.Do("POST", steps, e.ingest, map[string]any{"name": "a", "version": "1", "afterStepId": id, "afterStatus": "FAILED"})
		require.Equal(t, "invalid_state", r.ErrorCode(), "%s: %s", id, r.Body)
	}
}

func TestReportAndEnqueueValidation(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	steps := "/api/v1/runs/" + runID + "/steps"
	for name, tc := range map[string]struct {
		body   map[string]any
		fields []string
	}{
		"missing name and version": {map[string]any{"input": 1}, []string{"name", "version"}},
		"maxAttempts 11":           {map[string]any{"name": "a", "version": "1", "maxAttempts": 11}, []string{"maxAttempts"}},
		"maxAttempts 0":            {map[string]any{"name": "a", "version": "1", "maxAttempts": 0}, []string{"maxAttempts"}},
		"timeoutMs small":          {map[string]any{"name": "a", "version": "1", "timeoutMs": 5}, []string{"timeoutMs"}},
		"afterStatus alone":        {map[string]any{"name": "a", "version": "1", "afterStatus": "FAILED"}, []string{"afterStepId"}},
		"afterStatus bad":          {map[string]any{"name": "a", "version": "1", "afterStepId": "stp_01m8kjt9g002extbwvcndh4bkd", "afterStatus": "DONE"}, []string{"afterStatus"}},
		"afterStepId empty":        {map[string]any{"name": "a", "version": "1", "afterStepId": "", "afterStatus": "FAILED"}, []string{"afterStepId"}},
		"unknown field":            {map[string]any{"name": "a", "version": "1", "priority": 1}, []string{"priority"}},
	} {
		require.Equal(t, tc.fields, validationFields(t, e.Do("POST", steps, e.ingest, tc.body)), name)
	}

	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": 1})
	wid := e.register("send_email@1")
	job := e.claim(wid, 1)[0]
	for name, tc := range map[string]struct {
		body   map[string]any
		fields []string
	}{
		"bad status":                 {map[string]any{"status": "DONE"}, []string{"status"}},
		"retryAfterMs with success":  {map[string]any{"status": "SUCCEEDED", "error": map[string]any{"retryAfterMs": 5000}}, []string{"error.retryAfterMs"}},
		"error with success":         {map[string]any{"status": "SUCCEEDED", "error": map[string]any{"message": "x"}}, []string{"error"}},
		"retryAfterMs not retryable": {map[string]any{"status": "FAILED", "error": map[string]any{"retryable": false, "retryAfterMs": 5000}}, []string{"error.retryAfterMs"}},
		"retryAfterMs too small":     {map[string]any{"status": "FAILED", "error": map[string]any{"retryAfterMs": 999}}, []string{"error.retryAfterMs"}},
		"retryAfterMs too large":     {map[string]any{"status": "FAILED", "error": map[string]any{"retryAfterMs": 86400001}}, []string{"error.retryAfterMs"}},
		"retryAfterMs fractional":    {map[string]any{"status": "FAILED", "error": map[string]any{"retryAfterMs": 1500.5}}, []string{"error.retryAfterMs"}},
		"output with failure":        {map[string]any{"status": "FAILED", "output": map[string]any{"a": 1}}, []string{"output"}},
	} {
		require.Equal(t, tc.fields, validationFields(t, e.report(job, tc.body)), name)
	}
	// Bad reports changed nothing: the attempt is still open.
	r := e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "busy", "retryAfterMs": 60000}})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, "RETRY_SCHEDULED", r.JSON()["status"])
	require.Equal(t, e.clock.Now().Add(time.Minute).Format(time.RFC3339), r.JSON()["nextDueAt"])
	stale := e.report(map[string]any{"jobId": job["jobId"], "leaseToken": "0123"}, map[string]any{"status": "SUCCEEDED"})
	require.Equal(t, http.StatusConflict, stale.Status)
	require.Equal(t, "lease_lost", stale.ErrorCode())
	// A malformed id is 404 without a query.
	require.Equal(t, http.StatusNotFound, e.Do("POST", "/api/v1/jobs/nope/report", e.worker, map[string]any{}).Status)
	require.Equal(t, []string{"limit"}, validationFields(t, e.Do("POST", "/api/v1/workers/"+wid+"/claim", e.worker, map[string]any{"limit": 101})))
	require.Equal(t, []string{"waitSeconds"}, validationFields(t, e.Do("POST", "/api/v1/workers/"+wid+"/claim", e.worker, map[string]any{"waitSeconds": 21})))
}

// A claim sent again with its claimId answers the same jobs and tokens;
// a claimId outside its rule is refused by name.
func TestAKeyedClaimOverHTTP(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1")
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1"})
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": 2}})
	wid := e.register("send_email@1")
	path := "/api/v1/workers/" + wid + "/claim"
	for _, bad := range []any{"", "a b", strings.Repeat("x", 65), 7} {
		require.Equal(t, []string{"claimId"}, validationFields(t, e.Do("POST", path, e.worker,
			map[string]any{"claimId": bad})), "%v", bad)
	}
	body := map[string]any{"limit": 1, "claimId": "w1:poll-0001"}
	first := e.Must(http.StatusOK, "POST", path, e.worker, body).JSON()
	require.Len(t, first["jobs"], 1)
	require.Equal(t, first, e.Must(http.StatusOK, "POST", path, e.worker, body).JSON())
	require.Len(t, e.claim(wid, 10), 1, "the other job is still queued")
}

// The API takes a body nested 10 000 levels deep, so an input of 9 999
// levels, and answers a claim with it as taken, three levels down: the
// answer nests 10 002 levels, as the README says (a reader with Go's
// limit of 10 000 reads it job by job, as the Go SDK does).
func TestAClaimAnswerCarriesAnInputAsDeepAsABodyTakes(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1")
	runID := e.run()
	deep := strings.Repeat("[", 9999) + strings.Repeat("]", 9999)
	for input, status := range map[string]int{deep: http.StatusCreated, "[" + deep + "]": http.StatusBadRequest} {
		r := e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ingest, `{"name":"send_email","version":"1","input":`+input+`}`)
		require.Equal(t, status, r.Status, "%.300s", r.Body)
	}
	wid := e.register("send_email@1")
	// Sent as a worker sends it, not through the conformance check, whose
	// JSON reader stops at 10 000 levels.
	req, err := http.NewRequest("POST", e.Server.URL+"/api/v1/workers/"+wid+"/claim", strings.NewReader(`{"limit":1}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+e.worker)
	req.Header.Set("Content-Type", "application/json")
	res, err := e.Client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	var answer strings.Builder
	_, err = io.Copy(&answer, res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, "%.300s", answer.String())
	require.True(t, strings.HasPrefix(answer.String(), `{"jobs":[{`), "%.100s", answer.String())
	require.Contains(t, answer.String(), `"input":`+deep+`}]}`)
	var whole any
	require.ErrorContains(t, json.Unmarshal([]byte(answer.String()), &whole), "exceeded max depth")
}

// A producer key revoked on one instance enqueues nothing on another whose
// cache still holds it (KEY_CACHE_TTL): 401, and nothing changes: no step
// is added, and the step it named as its dependency is not marked as
// having dependents.
func TestARevokedKeyEnqueuesNothingOnAnotherInstance(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1")
	other := apitest.Start(t, apitest.WithNow(e.clock.Now))
	runID := e.run()
	steps := "/api/v1/runs/" + runID + "/steps"
	step := map[string]any{"name": "send_email", "version": "1"}
	first := other.Must(http.StatusCreated, "POST", steps, e.ingest, step).JSON()["stepId"].(string) // cached there now
	id := e.Must(http.StatusOK, "GET", "/api/v1/keys", e.ws.Key, nil).JSON()
	var producer string
	for _, k := range id["data"].([]any) {
		if k := k.(map[string]any); k["name"] == "producer" {
			producer = k["id"].(string)
		}
	}
	require.NotEmpty(t, producer)
	e.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+producer, e.ws.Key, nil)

	r := other.Do("POST", steps, e.ingest, map[string]any{"name": "send_email", "version": "1", "idempotencyKey": "after",
		"afterStepId": first, "afterStatus": "SUCCEEDED"})
	require.Equal(t, http.StatusUnauthorized, r.Status, "%s", r.Body)
	require.Equal(t, "unauthorized", r.ErrorCode())
	list := e.Must(http.StatusOK, "GET", steps, e.ws.Key, nil).JSON()
	require.Len(t, list["data"], 1, "only the step enqueued before the revocation")
	var hasDependents bool
	require.NoError(t, e.App.Pool.QueryRow(context.Background(),
		`SELECT has_dependents FROM jobs WHERE step_id = $1`, first).Scan(&hasDependents))
	require.False(t, hasDependents, "the refused enqueue marked its dependency")
}

// A worker key revoked on one instance claims nothing on another whose
// cache still holds it, and is told so: 401 on its first look, the job left
// queued (race QA: 200 with no jobs).
func TestARevokedKeyClaimsNothingOnAnotherInstance(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	other := apitest.Start(t, apitest.WithNow(e.clock.Now))
	runID := e.run()
	worker := e.Key(e.ws, map[string]any{"name": "doomed", "preset": "WORKER", "tools": []string{"send_email@1"}})
	wid := e.registerAs(worker, "send_email@1")
	claim := "/api/v1/workers/" + wid + "/claim"
	require.Empty(t, other.Must(http.StatusOK, "POST", claim, worker, nil).JSON()["jobs"]) // cached there now
	keyID := "key_" + strings.SplitN(strings.TrimPrefix(worker, "rk_"), "_", 2)[0]
	e.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+keyID, e.ws.Key, nil)
	enq := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1"})

	r := other.Do("POST", claim, worker, nil)
	require.Equal(t, http.StatusUnauthorized, r.Status, "%s", r.Body)
	require.Equal(t, "unauthorized", r.ErrorCode())
	var status string
	require.NoError(t, e.App.Pool.QueryRow(context.Background(), `SELECT status FROM jobs WHERE id = $1`,
		enq["jobId"]).Scan(&status))
	require.Equal(t, "QUEUED", status)
}

// The other calls that queue a job to run, a tool test and a replay, queue
// nothing for a key revoked on another instance either (review: the tool
// test queued a job there).
func TestARevokedKeyTestsAndReplaysNothingOnAnotherInstance(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1")
	other := apitest.Start(t, apitest.WithNow(e.clock.Now))
	step := e.enqueue(e.run(), map[string]any{"name": "send_email", "version": "1"})["stepId"].(string)
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+step+"/cancel", e.ws.Key, nil)
	ops := e.Key(e.ws, map[string]any{"name": "ops", "scopes": []string{"contracts:write", "steps:replay"}})
	other.Must(http.StatusOK, "GET", "/api/v1/steps/"+step+"/replay", ops, nil) // cached there now
	body, _, _ := strings.Cut(strings.TrimPrefix(ops, "rk_"), "_")
	e.Must(http.StatusOK, "DELETE", "/api/v1/keys/key_"+body, e.ws.Key, nil)

	r := other.Do("POST", "/api/v1/tools/send_email/test", ops, map[string]any{"version": "1", "input": map[string]any{}})
	require.Equal(t, http.StatusUnauthorized, r.Status, "%s", r.Body)
	r = other.Do("POST", "/api/v1/steps/"+step+"/replay", ops,
		map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": 1, "reason": "after revocation"})
	require.Equal(t, http.StatusUnauthorized, r.Status, "%s", r.Body)
	require.Equal(t, "CANCELLED", e.Must(http.StatusOK, "GET", "/api/v1/steps/"+step, e.ws.Key, nil).JSON()["status"])
	var runs int
	require.NoError(t, e.App.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM job_runs WHERE workspace_id = $1`, e.ws.ID).Scan(&runs))
	require.Equal(t, 1, runs, "no synthetic run of a tool test")
}

func TestJobScopesAndTenancy(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1")
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1"})

	// INGEST can enqueue but not claim or register.
	r := e.Do("POST", "/api/v1/workers/register", e.ingest, map[string]any{"tools": []map[string]string{{"name": "send_email", "version": "1"}}})
	require.Equal(t, http.StatusForbidden, r.Status)
	require.Equal(t, []any{"jobs:work"}, r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["required"])
	wid := e.register("send_email@1")
	r = e.Do("POST", "/api/v1/workers/"+wid+"/claim", e.ingest, map[string]any{})
	require.Equal(t, http.StatusForbidden, r.Status)
	// A WORKER key may not enqueue, and may register only its listed pairs.
	require.Equal(t, http.StatusForbidden, e.Do("POST", "/api/v1/runs", e.worker, map[string]any{"name": "x"}).Status)
	r = e.Do("POST", "/api/v1/workers/register", e.worker, map[string]any{"tools": []map[string]string{
		{"name": "send_email", "version": "1"}, {"name": "send_email", "version": "2"}, {"name": "charge", "version": "1"}}})
	require.Equal(t, http.StatusForbidden, r.Status)
	require.Equal(t, []any{"tool:send_email@2", "tool:charge@1"},
		r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["required"])
	// The operator key (no tools list) may register any tool.
	e.Must(http.StatusCreated, "POST", "/api/v1/workers/register", e.ws.Key,
		map[string]any{"tools": []map[string]string{{"name": "anything", "version": "9"}}})

	// Another key's worker id is 404, even in the same workspace.
	other := e.Key(e.ws, map[string]any{"name": "w2", "preset": "WORKER", "tools": []string{"send_email@1"}})
	r = e.Do("POST", "/api/v1/workers/"+wid+"/claim", other, map[string]any{})
	require.Equal(t, http.StatusNotFound, r.Status)
	require.Equal(t, "not_found", r.ErrorCode())

	// Cross-tenant: every id of this workspace is 404 from another one.
	jobs := e.claim(wid, 1)
	require.Len(t, jobs, 1)
	ws2 := e.Signup()
	ingest2 := e.Key(ws2, map[string]any{"name": "p", "preset": "INGEST"})
	worker2 := e.Key(ws2, map[string]any{"name": "w", "preset": "WORKER", "tools": []string{"send_email@1"}})
	require.Equal(t, http.StatusNotFound, e.Do("GET", "/api/v1/runs/"+runID, ingest2, nil).Status)
	require.Equal(t, http.StatusNotFound, e.Do("POST", "/api/v1/runs/"+runID+"/steps", ingest2,
		map[string]any{"name": "send_email", "version": "1"}).Status)
	require.Equal(t, http.StatusNotFound, e.Do("POST", "/api/v1/runs/"+runID+"/finish", ingest2, nil).Status)
	require.Equal(t, http.StatusNotFound, e.Do("POST", "/api/v1/steps/"+jobs[0]["stepId"].(string)+"/cancel", ingest2, nil).Status)
	require.Equal(t, http.StatusNotFound, e.Do("POST", "/api/v1/workers/"+wid+"/claim", worker2, map[string]any{}).Status)
	for p, body := range map[string]map[string]any{
		"report":    {"leaseToken": jobs[0]["leaseToken"], "status": "SUCCEEDED"},
		"heartbeat": {"leaseToken": jobs[0]["leaseToken"]},
	} {
		r := e.Do("POST", "/api/v1/jobs/"+jobs[0]["jobId"].(string)+"/"+p, worker2, body)
		require.Equal(t, http.StatusNotFound, r.Status, p)
	}
	ep := e.Must(200, "GET", "/api/v1/endpoints", e.ws.Key, nil).JSON()["data"].([]any)[0].(map[string]any)
	op2 := ws2.Key
	require.Equal(t, http.StatusNotFound, e.Do("GET", "/api/v1/endpoints/"+ep["id"].(string)+"/policy", op2, nil).Status)
	require.Equal(t, http.StatusNotFound, e.Do("PUT", "/api/v1/endpoints/"+ep["id"].(string)+"/policy", op2,
		map[string]any{"expectedVersion": 1}).Status)
	require.Equal(t, http.StatusNotFound, e.Do("POST", "/api/v1/endpoints/"+ep["id"].(string)+"/pause", op2, nil).Status)
	require.Empty(t, e.Must(200, "GET", "/api/v1/endpoints", op2, nil).JSON()["data"])
	// The job is still ours to finish.
	require.Equal(t, http.StatusOK, e.report(jobs[0], map[string]any{"status": "SUCCEEDED"}).Status)
}

func TestQueueHealthSaysWhenNoWorkerServesAVersion(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1", "send_email@2")
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": 1})
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "2", "input": 2})
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "2", "input": 3})
	wid := e.register("send_email@1")
	require.Empty(t, e.claim(wid, 1)[0]["input"] == nil)
	e.clock.Add(90 * time.Second)
	var h struct {
		Data []struct {
			Name                   string  `json:"name"`
			Version                string  `json:"version"`
			Queued                 int     `json:"queued"`
			OldestQueuedAgeSeconds int     `json:"oldestQueuedAgeSeconds"`
			WorkersSeen            int     `json:"workersSeen"`
			Message                *string `json:"message"`
		} `json:"data"`
	}
	e.Must(http.StatusOK, "GET", "/api/v1/queue/health", e.ws.Key, nil).Decode(t, &h)
	require.Len(t, h.Data, 2)
	// v1's one job was claimed, and its lease (30 s + 10 s grace) lapsed 50 s
	// ago: its worker is gone, so it is waiting again.
	v1 := h.Data[0]
	require.Equal(t, "1", v1.Version)
	require.Equal(t, 1, v1.Queued)
	require.Equal(t, 50, v1.OldestQueuedAgeSeconds)
	require.Equal(t, 1, v1.WorkersSeen)
	v2 := h.Data[1]
	require.Equal(t, "2", v2.Version)
	require.Equal(t, 2, v2.Queued)
	require.Equal(t, 90, v2.OldestQueuedAgeSeconds)
	require.Equal(t, 0, v2.WorkersSeen)
	require.NotNil(t, v2.Message)
	require.Contains(t, *v2.Message, "send_email@2")

	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": 4})
	e.Must(http.StatusOK, "GET", "/api/v1/queue/health", e.ws.Key, nil).Decode(t, &h)
	require.Len(t, h.Data, 2)
	require.Equal(t, 1, h.Data[0].WorkersSeen)
	require.Nil(t, h.Data[0].Message)
	require.Equal(t, 2, h.Data[0].Queued, "v1: the lapsed job and the new one")
	require.Equal(t, 50, h.Data[0].OldestQueuedAgeSeconds)

	// A paused endpoint holds the queue too, and says so.
	var eps struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	e.Must(http.StatusOK, "GET", "/api/v1/endpoints", e.ws.Key, nil).Decode(t, &eps)
	require.Len(t, eps.Data, 1)
	e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+eps.Data[0].ID+"/pause", e.ws.Key, nil)
	held := e.Must(http.StatusOK, "GET", "/api/v1/queue/health", e.ws.Key, nil).JSON()
	v1held := held["data"].([]any)[0].(map[string]any)
	require.Equal(t, []any{"send_email"}, v1held["pausedEndpoints"])
	require.Equal(t, []any{}, v1held["openCircuitEndpoints"])
	require.Contains(t, v1held["message"], "Endpoint send_email is paused")
}

// An endpoint whose every concurrency slot is taken, or whose rate is used
// up this minute, holds its queued jobs by design; queue health names it
// and says so (jobs QA: the message read null, as if nothing held them).
func TestQueueHealthNamesAnEndpointHeldByItsLimits(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	for i := range 3 {
		e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": i})
	}
	wid := e.register("send_email@1")
	ep := e.Must(http.StatusOK, "GET", "/api/v1/endpoints", e.ws.Key, nil).JSON()["data"].([]any)[0].(map[string]any)
	path := "/api/v1/endpoints/" + ep["id"].(string) + "/policy"
	e.Must(http.StatusOK, "PUT", path, e.ws.Key, map[string]any{"expectedVersion": ep["version"], "maxConcurrent": 1})
	health := func() map[string]any {
		return e.Must(http.StatusOK, "GET", "/api/v1/queue/health", e.ws.Key, nil).JSON()["data"].([]any)[0].(map[string]any)
	}
	free := health()
	require.Equal(t, []any{}, free["atConcurrencyLimitEndpoints"])
	require.Equal(t, []any{}, free["rateLimitedEndpoints"])
	require.Nil(t, free["message"], "a slot is free: nothing holds the queue")

	require.Len(t, e.claim(wid, 3), 1)
	full := health()
	require.Equal(t, []any{"send_email"}, full["atConcurrencyLimitEndpoints"])
	require.Contains(t, full["message"], "Endpoint send_email runs as many jobs as its maxConcurrent allows")

	e.Must(http.StatusOK, "PUT", path, e.ws.Key, map[string]any{"expectedVersion": ep["version"].(float64) + 1,
		"maxConcurrent": nil, "rateLimitPerMinute": 2})
	require.Len(t, e.claim(wid, 3), 1, "the minute's second start: the first counted")
	used := health()
	require.Equal(t, []any{}, used["atConcurrencyLimitEndpoints"])
	require.Equal(t, []any{"send_email"}, used["rateLimitedEndpoints"])
	require.Contains(t, used["message"], "Endpoint send_email has started its rateLimitPerMinute this minute")
	e.clock.Add(time.Minute)
	require.Equal(t, []any{}, health()["rateLimitedEndpoints"], "a new minute")
}

// Jobs waiting for their time (a delayed enqueue, a scheduled retry) are
// queued but not due: with no worker about, queue health counts them and
// says none is due yet, then that one is (QA: a retry a day out read as
// jobs waiting).
func TestQueueHealthAlarmsOnlyForDueJobs(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "later@1")
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "later", "version": "1", "input": 1, "delayMs": 3_600_000})
	e.enqueue(runID, map[string]any{"name": "later", "version": "1", "input": 2, "delayMs": 60_000})
	health := func() map[string]any {
		data := e.Must(http.StatusOK, "GET", "/api/v1/queue/health", e.ws.Key, nil).JSON()["data"].([]any)
		require.Len(t, data, 1)
		return data[0].(map[string]any)
	}
	h := health()
	require.EqualValues(t, 2, h["queued"])
	require.EqualValues(t, 0, h["due"])
	require.EqualValues(t, 0, h["oldestQueuedAgeSeconds"])
	require.Contains(t, h["message"], "2 job(s) are queued, none due yet")

	e.clock.Add(90 * time.Second)
	h = health()
	require.EqualValues(t, 2, h["queued"])
	require.EqualValues(t, 1, h["due"])
	require.EqualValues(t, 30, h["oldestQueuedAgeSeconds"])
	require.Contains(t, h["message"], "1 job(s) are due")
}

// Queue health pages like every list: limit rows in name@version order, and
// nextCursor until the last page.
func TestQueueHealthPages(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "a@1", "a@2", "b@1")
	runID := e.run()
	for i, nv := range [][2]string{{"b", "1"}, {"a", "2"}, {"a", "1"}, {"a", "1"}} {
		e.enqueue(runID, map[string]any{"name": nv[0], "version": nv[1], "input": i})
	}
	var got []string
	path := "/api/v1/queue/health?limit=2"
	for pages := 0; path != ""; pages++ {
		require.Less(t, pages, 3)
		page := e.Must(http.StatusOK, "GET", path, e.ws.Key, nil).JSON()
		for _, row := range page["data"].([]any) {
			r := row.(map[string]any)
			got = append(got, fmt.Sprintf("%s@%s:%v", r["name"], r["version"], r["queued"]))
		}
		path = ""
		if next, ok := page["nextCursor"].(string); ok {
			path = "/api/v1/queue/health?limit=2&cursor=" + url.QueryEscape(next)
		}
	}
	require.Equal(t, []string{"a@1:2", "a@2:1", "b@1:1"}, got)
	for _, q := range []string{"limit=0", "limit=201", "cursor=nope", "cursor=a@b@c"} {
		r := e.Do("GET", "/api/v1/queue/health?"+q, e.ws.Key, nil)
		require.Equal(t, http.StatusBadRequest, r.Status, q)
		require.Equal(t, "invalid_request", r.ErrorCode(), q)
	}
}

// A page may end on a tool whose name@version is as long as the rules
// allow (200 and 100 characters, of up to 4 bytes each): its nextCursor is
// taken back (QA: one over 200 bytes was refused, 400, and the queues after
// it could not be listed).
func TestQueueHealthPagesPastTheLongestNames(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("𝄞", toolname.MaxName)
	version := strings.Repeat("é", toolname.MaxVersion)
	e := newJobsEnv(t)
	runID := e.run()
	for _, name := range []string{long, "z"} {
		e.enqueue(runID, map[string]any{"name": name, "version": version})
	}
	var names []string
	path := "/api/v1/queue/health?limit=1"
	for pages := 0; path != ""; pages++ {
		require.Less(t, pages, 2)
		page := e.Must(http.StatusOK, "GET", path, e.ws.Key, nil).JSON()
		for _, row := range page["data"].([]any) {
			names = append(names, row.(map[string]any)["name"].(string))
		}
		path = ""
		if next, ok := page["nextCursor"].(string); ok {
			path = "/api/v1/queue/health?limit=1&cursor=" + url.QueryEscape(next)
		}
	}
	require.ElementsMatch(t, []string{long, "z"}, names)
}

// claimLooks moves the clock past the minute within which a claim leaves
// its worker's last_seen_at as it is, so that the next claim's first look
// marks the worker seen at the time it answers (waitLooked).
func (e *jobsEnv) claimLooks() time.Time {
	e.T.Helper()
	e.clock.Add(2 * time.Minute)
	return e.clock.Now()
}

// waitLooked waits until a claim has marked the worker seen at polled
// (claimLooks): its first look has run.
func (e *jobsEnv) waitLooked(wid string, polled time.Time) {
	e.T.Helper()
	require.Eventually(e.T, func() bool {
		var seen time.Time
		err := e.App.Pool.QueryRow(context.Background(), `SELECT last_seen_at FROM job_workers WHERE id = $1`, wid).Scan(&seen)
		return err == nil && seen.Equal(polled)
	}, 10*time.Second, 10*time.Millisecond)
}

func TestClaimLongPollsUntilAJobArrives(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	wid := e.register("send_email@1")
	polled := e.claimLooks()
	done := make(chan *apitest.Response, 1)
	go func() {
		done <- e.Do("POST", "/api/v1/workers/"+wid+"/claim", e.worker, map[string]any{"limit": 5, "waitSeconds": 20})
	}()
	// The job is queued after the claim's first look found nothing (a
	// fixed sleep here let a late claim find it at once, long poll or not).
	e.waitLooked(wid, polled)
	enq := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": 1})
	r := <-done
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	jobs := r.JSON()["jobs"].([]any)
	require.Len(t, jobs, 1)
	require.Equal(t, enq["jobId"], jobs[0].(map[string]any)["jobId"])
}

// A claim long-polling when its key is revoked leases nothing after the
// revocation, though it was authenticated before it (QA: it leased a job
// queued after the revocation, decrypted input included), and its next look
// answers 401, as README says (race QA: it answered 200 with no jobs, and
// its worker polled on, unaware). The job waits for a worker whose key is
// live.
func TestClaimLeasesNothingOnceItsKeyIsRevoked(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	worker := e.Key(e.ws, map[string]any{"name": "doomed", "preset": "WORKER", "tools": []string{"send_email@1"}})
	wid := e.registerAs(worker, "send_email@1")
	polled := e.claimLooks()
	done := make(chan *apitest.Response, 1)
	go func() {
		done <- e.Do("POST", "/api/v1/workers/"+wid+"/claim", worker, map[string]any{"waitSeconds": 2})
	}()
	e.waitLooked(wid, polled) // its first look found nothing; it waits
	keyID := "key_" + strings.SplitN(strings.TrimPrefix(worker, "rk_"), "_", 2)[0]
	e.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+keyID, e.ws.Key, nil)
	enq := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"card": "secret"}})
	r := <-done // woken by the enqueue, it looks again
	require.Equal(t, http.StatusUnauthorized, r.Status, "%s", r.Body)
	require.Equal(t, "unauthorized", r.JSON()["error"].(map[string]any)["code"])
	live := e.register("send_email@1")
	jobs := e.Must(http.StatusOK, "POST", "/api/v1/workers/"+live+"/claim", e.worker, nil).JSON()["jobs"].([]any)
	require.Len(t, jobs, 1)
	require.Equal(t, enq["jobId"], jobs[0].(map[string]any)["jobId"])
	require.EqualValues(t, 1, jobs[0].(map[string]any)["attempt"])
}

func TestHTTPConcurrentWorkersEachJobOnce(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	const n = 200
	for i := range n {
		e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": i})
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 4 {
		wid := e.register("send_email@1")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				r := e.Do("POST", "/api/v1/workers/"+wid+"/claim", e.worker, map[string]any{"limit": 7})
				var out struct {
					Jobs []map[string]any `json:"jobs"`
				}
				if r.Status != http.StatusOK || json.Unmarshal(r.Body, &out) != nil || len(out.Jobs) == 0 {
					return
				}
				for _, j := range out.Jobs {
					mu.Lock()
					seen[j["jobId"].(string)]++
					mu.Unlock()
					if rr := e.report(j, map[string]any{"status": "SUCCEEDED"}); rr.Status != http.StatusOK {
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, n)
	for id, c := range seen {
		require.Equal(t, 1, c, id)
	}
	run := e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", e.ingest, nil).JSON()
	require.Equal(t, "SUCCEEDED", run["status"])
	require.Len(t, run["steps"], n)
}

func TestBatchReport(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	for i := range 4 {
		e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": i, "maxAttempts": 2})
	}
	wid := e.register("send_email@1")
	js := e.claim(wid, 4)
	require.Len(t, js, 4)
	body := map[string]any{"reports": []map[string]any{
		{"jobId": js[0]["jobId"], "leaseToken": js[0]["leaseToken"], "status": "SUCCEEDED", "output": map[string]any{"id": 1}},
		{"jobId": js[1]["jobId"], "leaseToken": js[1]["leaseToken"], "status": "FAILED", "error": map[string]any{"message": "x", "retryAfterMs": 5000}},
		{"jobId": js[2]["jobId"], "leaseToken": "stale", "status": "SUCCEEDED"},
		{"jobId": js[3]["jobId"], "leaseToken": js[3]["leaseToken"], "status": "FAILED", "error": map[string]any{"retryable": false}},
	}}
	r := e.Must(http.StatusOK, "POST", "/api/v1/jobs/report", e.worker, body)
	var out batchReportAnswer
	r.Decode(t, &out)
	require.Len(t, out.Results, 4)
	require.Equal(t, "SUCCEEDED", out.Results[0].Status)
	require.Equal(t, "RETRY_SCHEDULED", out.Results[1].Status)
	require.Equal(t, "lease_lost", out.Results[2].Error.Code)
	require.Equal(t, "EXHAUSTED", out.Results[3].Status)
	for i, res := range out.Results {
		require.Equal(t, js[i]["jobId"], res.JobID)
	}
	// A recorded slot has the single report's shape: nextDueAt is there,
	// null unless a retry was scheduled.
	slots := r.JSON()["results"].([]any)
	require.Contains(t, slots[0].(map[string]any), "nextDueAt")
	require.Nil(t, slots[0].(map[string]any)["nextDueAt"])
	require.NotNil(t, slots[1].(map[string]any)["nextDueAt"])
	// A refused slot's error is the single report's envelope: detail {}.
	require.Equal(t, map[string]any{}, slots[2].(map[string]any)["error"].(map[string]any)["detail"])
	// Repeating the batch answers the same outcomes (the stale one still lost).
	r2 := e.Must(http.StatusOK, "POST", "/api/v1/jobs/report", e.worker, body)
	require.JSONEq(t, string(r.Body), string(r2.Body))
	// The single report of a batched attempt agrees.
	single := e.report(js[0], map[string]any{"status": "SUCCEEDED", "output": map[string]any{"id": 1}})
	require.Equal(t, "SUCCEEDED", single.JSON()["status"])

	// An item the single route would refuse is refused in its slot, as
	// the single route would answer it, and the others are applied (QA: one
	// malformed item refused the whole batch, finished jobs' reports with it).
	runID2 := e.run()
	e.enqueue(runID2, map[string]any{"name": "send_email", "version": "1", "input": "late"})
	late := e.claim(wid, 1)
	require.Len(t, late, 1)
	mixed := e.Must(http.StatusOK, "POST", "/api/v1/jobs/report", e.worker, map[string]any{"reports": []any{
		map[string]any{"jobId": late[0]["jobId"], "leaseToken": late[0]["leaseToken"], "status": "SUCCEEDED"},
		map[string]any{"jobId": js[0]["jobId"], "leaseToken": "a", "status": "BOGUS"},
		map[string]any{"jobId": late[0]["jobId"], "leaseToken": late[0]["leaseToken"], "status": "SUCCEEDED"},
		map[string]any{"jobId": "not-a-job", "leaseToken": "a", "status": "SUCCEEDED"},
		map[string]any{"jobId": js[1]["jobId"], "leaseToken": "a", "status": "SUCCEEDED", "error": map[string]any{"retryAfterMs": 2000}},
		map[string]any{"leaseToken": "a", "status": "SUCCEEDED"},
		map[string]any{"jobId": nil, "leaseToken": "a", "status": "SUCCEEDED"},
		map[string]any{"jobId": js[1]["jobId"], "leaseToken": nil, "status": "SUCCEEDED"},
		map[string]any{"jobId": js[1]["jobId"], "leaseToken": "a", "status": "FAILED", "error": map[string]any{"message": nil}},
		"not a report",
		map[string]any{"jobId": js[1]["jobId"], "leaseToken": "a", "status": "SUCCEEDED", "output": map[string]any{"text": "a\u0000b"}},
		json.RawMessage(`{"jobId": "` + js[1]["jobId"].(string) + `", "leaseToken": "a", "status": "SUCCEEDED", "status": "FAILED"}`),
		json.RawMessage(`{"jobId": "` + js[1]["jobId"].(string) + `", "leaseToken": "a", "status": "SUCCEEDED", "output": 1e99999}`),
	}}).JSON()["results"].([]any)
	slot := func(i int) map[string]any { return mixed[i].(map[string]any) }
	slotError := func(i int) (string, []string) {
		e := slot(i)["error"].(map[string]any)
		var fields []string
		if v, ok := e["detail"].(map[string]any)["validation"].([]any); ok {
			for _, f := range v {
				fields = append(fields, f.(map[string]any)["field"].(string))
			}
		}
		return e["code"].(string), fields
	}
	require.Equal(t, "SUCCEEDED", slot(0)["status"])
	code, fields := slotError(1)
	require.Equal(t, "invalid_request", code)
	require.Equal(t, []string{"status"}, fields)
	code, fields = slotError(2)
	require.Equal(t, []string{"jobId"}, fields, "the same job twice: the first report is the one applied")
	require.Equal(t, "invalid_request", code)
	code, _ = slotError(3)
	require.Equal(t, "not_found", code)
	_, fields = slotError(4)
	require.Equal(t, []string{"error.retryAfterMs"}, fields)
	code, fields = slotError(5)
	require.Equal(t, "invalid_request", code, "an item without its jobId is malformed, not of an unknown job")
	require.Equal(t, []string{"jobId"}, fields)
	// An item that cannot be read is refused in its slot, named from the
	// item, and the others are applied (review: a null refused the batch).
	// So is one the body's checks refuse (a NUL, a repeated key, a number
	// beyond a float's range), named as the single route names it (review:
	// such an item refused the whole batch).
	for i, want := range map[int]string{6: "jobId", 7: "leaseToken", 8: "error.message", 9: "body",
		10: "output.text", 11: "status", 12: "output"} {
		code, fields = slotError(i)
		require.Equal(t, "invalid_request", code, "slot %d", i)
		require.Equal(t, []string{want}, fields, "slot %d", i)
	}
	require.Equal(t, js[1]["jobId"], slot(7)["jobId"])
	require.Equal(t, "SUCCEEDED", durable(e.getRun(runID2), 0)["status"])
	// A refused item does not take its job: a valid report of it after is applied.
	e.enqueue(runID2, map[string]any{"name": "send_email", "version": "1", "input": "later"})
	later := e.claim(wid, 1)
	require.Len(t, later, 1)
	second := e.Must(http.StatusOK, "POST", "/api/v1/jobs/report", e.worker, map[string]any{"reports": []map[string]any{
		{"jobId": later[0]["jobId"], "leaseToken": later[0]["leaseToken"], "status": "DONE"},
		{"jobId": later[0]["jobId"], "leaseToken": later[0]["leaseToken"], "status": "SUCCEEDED"},
	}}).JSON()["results"].([]any)
	require.Equal(t, "invalid_request", second[0].(map[string]any)["error"].(map[string]any)["code"])
	require.Equal(t, "SUCCEEDED", second[1].(map[string]any)["status"])

	// A batch that is not one is refused whole.
	require.Equal(t, []string{"reports"}, validationFields(t, e.Do("POST", "/api/v1/jobs/report", e.worker,
		map[string]any{"reports": []map[string]any{}})))
}

func TestEnqueueStatusCodesOverHTTP(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	body := map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"customerId": "c1"},
		"idempotencyKey": "welcome:c1", "timeoutMs": 30000, "maxAttempts": 5, "endpoint": "Email service"}
	first := e.Must(http.StatusCreated, "POST", "/api/v1/runs/"+runID+"/steps", e.ingest, body).JSON()
	dup := e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/steps", e.ingest, body).JSON()
	require.Equal(t, true, dup["deduplicated"])
	require.Equal(t, first["stepId"], dup["stepId"])
	body["input"] = map[string]any{"customerId": "c2"}
	r := e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ingest, body)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, "idempotency_key_reuse", r.ErrorCode())
	require.Contains(t, r.JSON()["error"].(map[string]any)["message"], "This idempotency key was used")

	// Without a key of the producer's, the same step with other settings:
	// the message says the key was generated (QA: "this idempotency key"
	// lost a producer that sent none).
	keyless := map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"customerId": "c3"},
		"maxAttempts": 2}
	other := e.run()
	e.Must(http.StatusCreated, "POST", "/api/v1/runs/"+other+"/steps", e.ingest, keyless)
	keyless["maxAttempts"] = 3
	r = e.Do("POST", "/api/v1/runs/"+other+"/steps", e.ingest, keyless)
	require.Equal(t, "idempotency_key_reuse", r.ErrorCode())
	require.Contains(t, r.JSON()["error"].(map[string]any)["message"], "generated idempotency key")

	e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", e.ingest, nil)
	r = e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ingest, map[string]any{"name": "send_email", "version": "1"})
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, "invalid_state", r.ErrorCode())
	require.Equal(t, http.StatusNotFound, e.Do("GET", "/api/v1/runs/run_nope", e.ingest, nil).Status)
	r = e.Do("POST", "/api/v1/runs/"+runID+"/steps", "", map[string]any{"name": "send_email", "version": "1"})
	require.Equal(t, http.StatusUnauthorized, r.Status)
	require.Equal(t, "unauthorized", r.ErrorCode())
	huge := `{"name":"send_email","version":"1","input":"` + strings.Repeat("x", 1<<20) + `"}`
	r = e.Do("POST", "/api/v1/runs/"+e.run()+"/steps", e.ingest, huge)
	require.Equal(t, http.StatusRequestEntityTooLarge, r.Status)
	require.Equal(t, "payload_too_large", r.ErrorCode())

	run := e.getRun(runID)
	require.Equal(t, "Email service", step(run, 0)["endpoint"])
	require.Equal(t, map[string]any{"preset": "STANDARD", "maxAttempts": 5.0, "initialDelayMs": 30000.0,
		"multiplier": 2.0, "maxDelayMs": 900000.0, "jitterPercent": 20.0, "timeoutMs": 30000.0}, durable(run, 0)["policy"])
	require.NotNil(t, durable(run, 0)["dueAt"])

	doc := e.Must(http.StatusOK, "GET", "/api/v1/openapi.json", "", nil).JSON()
	paths := doc["paths"].(map[string]any)
	for _, p := range []string{"/api/v1/runs/{id}/steps", "/api/v1/workers/{workerId}/claim", "/api/v1/jobs/{id}/report",
		"/api/v1/endpoints/{id}/policy", "/api/v1/queue/health", "/api/v1/jobs/report"} {
		require.Contains(t, paths, p)
	}
}

// TestEndpointPolicyTypeErrorsNameWireFields: the policy fields are an
// embedded struct shared by both requests; a mistyped one is still named by
// its wire path, never by the Go struct that holds it.
func TestEndpointPolicyTypeErrorsNameWireFields(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	ep := e.endpoint("Typed service")
	require.Equal(t, []string{"maxConcurrent"}, validationFields(t, e.Do("POST", "/api/v1/endpoints", e.ws.Key,
		map[string]any{"name": "other", "maxConcurrent": "four"})))
	require.Equal(t, []string{"maxAttempts"}, validationFields(t, e.Do("PUT",
		"/api/v1/endpoints/"+ep["id"].(string)+"/policy", e.ws.Key,
		map[string]any{"expectedVersion": 1, "maxAttempts": "six"})))
	require.Equal(t, []string{"expectedVersion"}, validationFields(t, e.Do("PUT",
		"/api/v1/endpoints/"+ep["id"].(string)+"/policy", e.ws.Key, map[string]any{"expectedVersion": "one"})))
}

// Length limits count characters, as their messages say: a name of 200
// "é" (400 bytes) is within "1-200 characters", 201 is not.
func TestLengthLimitsCountCharacters(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1")
	e.Must(http.StatusCreated, "POST", "/api/v1/runs", e.ws.Key, map[string]any{"name": strings.Repeat("é", 200)})
	require.Equal(t, []string{"name"}, validationFields(t, e.Do("POST", "/api/v1/runs", e.ws.Key,
		map[string]any{"name": strings.Repeat("é", 201)})))
	runID := e.run()
	e.Must(http.StatusCreated, "POST", "/api/v1/runs/"+runID+"/steps", e.ingest, map[string]any{"name": "send_email",
		"version": "1", "idempotencyKey": strings.Repeat("ü", 255)})
	// The same rule as the gate's keys: 1-255 printable characters.
	for _, k := range []string{strings.Repeat("ü", 256), "", "a\nb", "\u0001"} {
		require.Equal(t, []string{"idempotencyKey"}, validationFields(t, e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ingest,
			map[string]any{"name": "send_email", "version": "1", "idempotencyKey": k})), "%q", k)
	}
	e.Must(http.StatusCreated, "POST", "/api/v1/keys", e.ws.Key, map[string]any{"name": strings.Repeat("名", 100), "preset": "AGENT"})
	require.Equal(t, []string{"name"}, validationFields(t, e.Do("POST", "/api/v1/keys", e.ws.Key,
		map[string]any{"name": strings.Repeat("名", 101), "preset": "AGENT"})))
}

// GET /api/v1/runs lists runs newest first, by status on request; GET
// /api/v1/runs/{id}/steps pages a run's steps, each as GET /steps/{id}
// reads it.
func TestRunsAndStepsList(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	w := e.register("send_email@1")
	failed := e.run()
	e.enqueue(failed, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": 0}, "maxAttempts": 1})
	job := e.claim(w, 1)[0]
	e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "no", "retryable": false}})
	e.Must(http.StatusOK, "POST", "/api/v1/runs/"+failed+"/finish", e.ingest, nil)
	e.clock.Add(time.Millisecond) // ids order by their millisecond
	running := e.run()
	for n := 1; n <= 5; n++ {
		e.enqueue(running, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": n}})
	}
	e.clock.Add(time.Millisecond)
	third := e.run()

	list := func(q string) map[string]any {
		return e.Must(http.StatusOK, "GET", "/api/v1/runs"+q, e.ingest, nil).JSON()
	}
	ids := func(page map[string]any) []any {
		var out []any
		for _, r := range page["data"].([]any) {
			out = append(out, r.(map[string]any)["id"])
		}
		return out
	}
	first := list("?limit=2")
	require.Equal(t, []any{third, running}, ids(first), "newest first")
	require.NotContains(t, first["data"].([]any)[0], "steps")
	require.Equal(t, []any{failed}, ids(list("?limit=2&cursor="+first["nextCursor"].(string))))
	onlyFailed := list("?status=FAILED")
	require.Equal(t, []any{failed}, ids(onlyFailed))
	require.Equal(t, "FAILED", onlyFailed["data"].([]any)[0].(map[string]any)["status"])
	require.Nil(t, onlyFailed["nextCursor"])
	require.Contains(t, validationFields(t, e.Do("GET", "/api/v1/runs?status=DONE", e.ingest, nil)), "status")

	steps := func(runID, q string) map[string]any {
		return e.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID+"/steps"+q, e.ingest, nil).JSON()
	}
	var seen []map[string]any
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 3)
		page := steps(running, "?limit=2&cursor="+cursor)
		for _, st := range page["data"].([]any) {
			seen = append(seen, st.(map[string]any))
		}
		next, ok := page["nextCursor"].(string)
		if !ok {
			break
		}
		cursor = next
	}
	require.Len(t, seen, 5)
	whole := e.getRun(running)["steps"].([]any)
	for i, st := range seen {
		require.Equal(t, whole[i], st, "as the run reads it")
		require.Equal(t, e.Must(http.StatusOK, "GET", "/api/v1/steps/"+st["id"].(string), e.ingest, nil).JSON(), st)
	}
	exhausted := steps(failed, "?status=EXHAUSTED")["data"].([]any)
	require.Len(t, exhausted, 1)
	require.Len(t, exhausted[0].(map[string]any)["durableJob"].(map[string]any)["attempts"], 1)
	require.Empty(t, steps(failed, "?status=QUEUED")["data"])
	require.Contains(t, validationFields(t, e.Do("GET", "/api/v1/runs/"+failed+"/steps?status=done", e.ingest, nil)), "status")
	require.Contains(t, validationFields(t, e.Do("GET", "/api/v1/runs/"+failed+"/steps?cursor="+failed, e.ingest, nil)), "cursor")
	require.Equal(t, http.StatusNotFound, e.Do("GET", "/api/v1/runs/run_01m8kjt9g002extbwvcndh4bkd/steps", e.ingest, nil).Status)
	other := e.Signup()
	require.Equal(t, http.StatusNotFound, e.Do("GET", "/api/v1/runs/"+running+"/steps", other.Key, nil).Status)
	require.Empty(t, e.Must(http.StatusOK, "GET", "/api/v1/runs", other.Key, nil).JSON()["data"])
}

// A run started under an idempotency key can be started again after a lost
// answer: the same key, name and budget answer the run it started (200,
// deduplicated, with its steps); another name or budget is 409
// idempotency_key_reuse and starts nothing; 50 concurrent starts make one
// run. Keys are per workspace, and a run without one is unchanged.
func TestStartingARunUnderAnIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	body := map[string]any{"name": "onboarding", "budgetMicros": 5_000_000, "idempotencyKey": "onboard:user_42"}
	first := e.Must(http.StatusCreated, "POST", "/api/v1/runs", e.ingest, body).JSON()
	require.Equal(t, false, first["deduplicated"])
	require.Equal(t, "onboard:user_42", first["idempotencyKey"])
	id := first["id"].(string)
	e.enqueue(id, map[string]any{"name": "send_email", "version": "1", "input": 1})

	again := e.Must(http.StatusOK, "POST", "/api/v1/runs", e.ingest, body).JSON()
	require.Equal(t, id, again["id"])
	require.Equal(t, true, again["deduplicated"])
	require.Len(t, again["steps"], 1)
	require.Equal(t, "onboard:user_42", e.Must(http.StatusOK, "GET", "/api/v1/runs/"+id, e.ingest, nil).JSON()["idempotencyKey"])

	for _, other := range []map[string]any{
		{"name": "other", "budgetMicros": 5_000_000, "idempotencyKey": "onboard:user_42"},
		{"name": "onboarding", "idempotencyKey": "onboard:user_42"},
	} {
		r := e.Do("POST", "/api/v1/runs", e.ingest, other)
		require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
		require.Equal(t, "idempotency_key_reuse", r.ErrorCode())
	}
	require.Equal(t, []string{"idempotencyKey"}, validationFields(t, e.Do("POST", "/api/v1/runs", e.ingest,
		map[string]any{"name": "x", "idempotencyKey": ""})))

	// Another workspace has its own keys; no key, a new run each time.
	ws2 := e.Signup()
	ingest2 := e.Key(ws2, map[string]any{"name": "p", "preset": "INGEST"})
	require.NotEqual(t, id, e.Must(http.StatusCreated, "POST", "/api/v1/runs", ingest2, body).JSON()["id"])
	plain := e.Must(http.StatusCreated, "POST", "/api/v1/runs", e.ingest, map[string]any{"name": "onboarding"}).JSON()
	require.Nil(t, plain["idempotencyKey"])
	require.NotEqual(t, plain["id"], e.Must(http.StatusCreated, "POST", "/api/v1/runs", e.ingest,
		map[string]any{"name": "onboarding"}).JSON()["id"])

	const racers = 50
	raced := map[string]any{"name": "raced", "idempotencyKey": "raced"}
	ids, statuses := make([]string, racers), make([]int, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			r := e.Do("POST", "/api/v1/runs", e.ingest, raced)
			statuses[i] = r.Status
			if id, ok := r.JSON()["id"].(string); ok {
				ids[i] = id
			}
		})
	}
	wg.Wait()
	created := 0
	for i := range racers {
		require.Equal(t, ids[0], ids[i])
		if statuses[i] == http.StatusCreated {
			created++
		} else {
			require.Equal(t, http.StatusOK, statuses[i])
		}
	}
	require.Equal(t, 1, created)
}

// A tool's name and version are printable: a control or format character,
// or white space beyond the ASCII one, is refused wherever a tool is named
// (fuzz QA: "a\x01b" was listed as a tool, as an effect type is not).
func TestToolNamesArePrintable(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	for _, name := range []string{"a\x01b", "a\u200bb", "a\u00a0b", "a\u2028b"} {
		require.Equal(t, []string{"name"}, validationFields(t, e.Do("GET",
			"/api/v1/tools/"+url.PathEscape(name)+"/contracts", e.ws.Key, nil)), "%q", name)
		require.Equal(t, []string{"name"}, validationFields(t, e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ws.Key,
			map[string]any{"name": name, "version": "1", "idempotencyKey": "k"})), "%q", name)
		require.Equal(t, []string{"tools.0.version"}, validationFields(t, e.Do("POST", "/api/v1/workers/register",
			e.ws.Key, map[string]any{"tools": []any{map[string]any{"name": "send", "version": name}}})), "%q", name)
		// A key's tools take the same rule (review: its list took them).
		require.Equal(t, []string{"tools.0"}, validationFields(t, e.Do("POST", "/api/v1/keys", e.ws.Key,
			map[string]any{"name": "w", "preset": "WORKER", "tools": []string{name + "@1"}})), "%q", name)
	}
	e.Must(http.StatusOK, "GET", "/api/v1/tools/"+url.PathEscape("émail.send-v2_x")+"/contracts", e.ws.Key, nil)
}

// The document refuses what the job routes' handlers refuse of these
// fields (contract QA): an enqueue's endpoint is held to the rule POST
// /api/v1/endpoints states for the same name (printable), a tool's name
// and version, wherever sent, to toolname's characters (no space, no '@'),
// a replay's expectedHandlerVersion to a handler version's length, and a
// lease token may not be empty; a client generated from the document sent each and
// learnt the rule from a 400. Every body the handler refuses at the field
// the document refuses too, and the bodies it takes the document takes.
func TestJobRequestTagsRefuseWhatTheHandlersRefuse(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	step := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "maxAttempts": 1})
	claimed := e.Must(http.StatusOK, "POST", "/api/v1/workers/"+e.register("send_email@1")+"/claim", e.worker,
		map[string]any{}).JSON()["jobs"].([]any)[0].(map[string]any)
	jobID, token := claimed["jobId"].(string), claimed["leaseToken"].(string)
	stepID := step["stepId"].(string)
	type probe struct {
		pattern, path, key, field string
		body                      map[string]any
	}
	enqueue := func(endpoint string) probe {
		return probe{"/api/v1/runs/{id}/steps", "/api/v1/runs/" + runID + "/steps", e.ingest, "endpoint",
			map[string]any{"name": "send_email", "version": "1", "endpoint": endpoint}}
	}
	replay := func(version string) probe {
		return probe{"/api/v1/steps/{id}/replay", "/api/v1/steps/" + stepID + "/replay", e.ws.Key,
			"expectedHandlerVersion", map[string]any{"acknowledgeDuplicateRisk": true, "expectedHandlerVersion": version}}
	}
	named := func(name, version string) probe {
		field := "name"
		if version != "1" {
			field = "version"
		}
		return probe{"/api/v1/runs/{id}/steps", "/api/v1/runs/" + runID + "/steps", e.ingest, field,
			map[string]any{"name": name, "version": version}}
	}
	refused := []probe{
		enqueue("Stripe\u200bAPI"), enqueue("Stripe\u00a0API"), enqueue("a\x01b"),
		named("send email", "1"), named("send@email", "1"), named("send_email", "1 0"), named("send_email", "v\u200b1"),
		{"/api/v1/workers/register", "/api/v1/workers/register", e.worker, "tools.0.name",
			map[string]any{"tools": []any{map[string]any{"name": "send email", "version": "1"}}}},
		{"/api/v1/tools/{name}/contracts", "/api/v1/tools/send_email/contracts", e.ws.Key, "handlerVersion",
			map[string]any{"handlerVersion": "1@2", "inputSchema": true}},
		{"/api/v1/tools/{name}/test", "/api/v1/tools/send_email/test", e.ws.Key, "version",
			map[string]any{"version": "1\t"}},
		replay("1 0"),
		replay(""), replay(strings.Repeat("1", toolname.MaxVersion+1)),
		{"/api/v1/jobs/{id}/heartbeat", "/api/v1/jobs/" + jobID + "/heartbeat", e.worker, "leaseToken",
			map[string]any{"leaseToken": ""}},
		{"/api/v1/jobs/{id}/report", "/api/v1/jobs/" + jobID + "/report", e.worker, "leaseToken",
			map[string]any{"leaseToken": "", "status": "FAILED"}},
	}
	for _, p := range refused {
		raw, err := json.Marshal(p.body)
		require.NoError(t, err)
		require.Equal(t, []string{p.field}, validationFields(t, e.Do("POST", p.path, p.key, raw)), "%s %s", p.pattern, raw)
		require.False(t, apitest.RequestBodyFits(t, "POST", p.pattern, raw), "%s %s: the document takes it", p.pattern, raw)
	}
	for _, p := range []probe{
		enqueue("Stripe API"), named("émail.send-v2", "1"), named("send_email", "2026-12-07.1"),
		{"/api/v1/jobs/{id}/heartbeat", "/api/v1/jobs/" + jobID + "/heartbeat", e.worker, "",
			map[string]any{"leaseToken": token}},
		{"/api/v1/jobs/{id}/report", "/api/v1/jobs/" + jobID + "/report", e.worker, "",
			map[string]any{"leaseToken": token, "status": "FAILED", "error": map[string]any{"retryable": false}}},
		replay("1"),
	} {
		raw, err := json.Marshal(p.body)
		require.NoError(t, err)
		require.True(t, apitest.RequestBodyFits(t, "POST", p.pattern, raw), "%s %s", p.pattern, raw)
		r := e.Do("POST", p.path, p.key, raw)
		require.Contains(t, []int{http.StatusOK, http.StatusCreated}, r.Status, "%s %s: %s", p.pattern, raw, r.Body)
	}
}

// Walking the runs list and a run's steps a page at a time while runs and
// steps are added, all in one millisecond (the frozen clock: ids then order
// by their random part alone), reads every run and step that existed
// before the walk exactly once and none twice, whatever lands between the
// pages; the walk ends on a null cursor.
func TestListWalksAreStableUnderConcurrentInserts(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	before := map[string]bool{runID: true}
	steps := map[string]bool{}
	for n := range 40 {
		before[e.run()] = true
		steps[e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": n})["stepId"].(string)] = true
	}
	walk := func(path string) []string {
		var seen []string
		cursor := ""
		for pages := 0; ; pages++ {
			require.Less(t, pages, 100)
			page := e.Must(http.StatusOK, "GET", path+"?limit=3&cursor="+cursor, e.ingest, nil).JSON()
			for _, it := range page["data"].([]any) {
				seen = append(seen, it.(map[string]any)["id"].(string))
			}
			next, ok := page["nextCursor"].(string)
			if !ok {
				return seen
			}
			cursor = next
		}
	}
	var runsSeen, stepsSeen []string
	apitest.StartTogether(4, func(i int) {
		switch i {
		case 0:
			runsSeen = walk("/api/v1/runs")
		case 1:
			stepsSeen = walk("/api/v1/runs/" + runID + "/steps")
		case 2:
			for range 20 {
				e.run()
			}
		case 3:
			for n := range 20 {
				e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": 100 + n})
			}
		}
	})
	for what, got := range map[string][]string{"runs": runsSeen, "steps": stepsSeen} {
		want := before
		if what == "steps" {
			want = steps
		}
		counts := map[string]int{}
		for _, id := range got {
			counts[id]++
			require.Equal(t, 1, counts[id], "%s: %s read twice", what, id)
		}
		for id := range want {
			require.Equal(t, 1, counts[id], "%s: %s, there before the walk, not read", what, id)
		}
	}
}
