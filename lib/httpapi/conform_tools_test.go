package httpapi_test

import (
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
)

// README, "Keys, scopes and limits": a key's tools list restricts what it
// may work with jobs:work. On every route of the table that jobs:work opens
// (a new one fails here until it has a case), a key restricted to a@1, and
// one whose list is empty (a worker key for no tool, not for any), is
// refused another tool's job, even holding that job's worker id or current
// lease token (a credential that leaked), and the job stays as its own
// worker left it (security review: the service tests hold the rule, none
// held it route by route over HTTP).
func TestEveryJobsWorkRouteHoldsAKeyToItsTools(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "a@1", "b@1")
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "a", "version": "1", "input": map[string]any{}})
	e.enqueue(runID, map[string]any{"name": "b", "version": "1", "input": map[string]any{}})
	wide := e.register("a@1", "b@1")
	jobs := e.claim(wide, 2)
	require.Len(t, jobs, 2)
	byTool := map[string]map[string]any{}
	for _, j := range jobs {
		byTool[j["name"].(string)] = j
	}
	b := byTool["b"]
	// Queued b jobs for a narrow worker's claim to pass over.
	e.enqueue(runID, map[string]any{"name": "b", "version": "1", "input": map[string]any{"n": 2}})

	narrow := e.Key(e.ws, map[string]any{"name": "a only", "scopes": []string{"jobs:work"}, "tools": []string{"a@1"}})
	none := e.Key(e.ws, map[string]any{"name": "no tool", "scopes": []string{"jobs:work"}, "tools": []string{}})
	narrowWorker := e.registerAs(narrow, "a@1")
	before := string(e.Must(http.StatusOK, "GET", "/api/v1/steps/"+b["stepId"].(string), e.ws.Key, nil).Body)

	forbidden := func(r *apitest.Response, tool string) {
		t.Helper()
		require.Equal(t, http.StatusForbidden, r.Status, "%s", r.Body)
		require.Equal(t, apierr.CodeForbidden, r.ErrorCode())
		require.Equal(t, []string{"tool:" + tool}, requiredOf(r))
	}
	registerB := map[string]any{"tools": []map[string]string{{"name": "b", "version": "1"}}}
	heartbeatB := map[string]any{"leaseToken": b["leaseToken"]}
	reportB := map[string]any{"leaseToken": b["leaseToken"], "status": "SUCCEEDED", "output": map[string]any{}}
	batchB := map[string]any{"reports": []map[string]any{{"jobId": b["jobId"], "leaseToken": b["leaseToken"],
		"status": "SUCCEEDED", "output": map[string]any{}}}}
	cases := map[string]func(key string){
		"workers.register": func(key string) {
			forbidden(e.Do("POST", "/api/v1/workers/register", key, registerB), "b@1")
		},
		"workers.claim": func(key string) {
			// Another key's worker, registered for b, is unknown to it.
			r := e.Do("POST", "/api/v1/workers/"+wide+"/claim", key, map[string]any{"limit": 10})
			require.Equal(t, http.StatusNotFound, r.Status, "%s", r.Body)
			if key != narrow {
				return
			}
			// Its own worker, for a, passes over the queued b job.
			r = e.Must(http.StatusOK, "POST", "/api/v1/workers/"+narrowWorker+"/claim", key, map[string]any{"limit": 10})
			for _, j := range r.JSON()["jobs"].([]any) {
				require.Equal(t, "a", j.(map[string]any)["name"], "%s", r.Body)
			}
		},
		"jobs.heartbeat": func(key string) {
			forbidden(e.Do("POST", "/api/v1/jobs/"+b["jobId"].(string)+"/heartbeat", key, heartbeatB), "b@1")
		},
		"jobs.report": func(key string) {
			forbidden(e.Do("POST", "/api/v1/jobs/"+b["jobId"].(string)+"/report", key, reportB), "b@1")
		},
		"jobs.report.batch": func(key string) {
			r := e.Must(http.StatusOK, "POST", "/api/v1/jobs/report", key, batchB)
			res := r.JSON()["results"].([]any)[0].(map[string]any)
			require.Equal(t, apierr.CodeForbidden, res["error"].(map[string]any)["code"], "%s", r.Body)
			require.Equal(t, []any{"tool:b@1"}, res["error"].(map[string]any)["detail"].(map[string]any)["required"])
		},
	}
	checked := 0
	for _, r := range httpapi.Routes() {
		if !slices.Contains(r.Scopes, "jobs:work") {
			continue
		}
		check, ok := cases[r.Name]
		require.True(t, ok, "%s %s: no case for a key restricted to other tools", r.Method, r.Pattern)
		for _, key := range []string{narrow, none} {
			check(key)
		}
		checked++
	}
	require.Equal(t, len(cases), checked)

	// The b job is as its worker left it, and its token still holds.
	require.Equal(t, before, string(e.Must(http.StatusOK, "GET", "/api/v1/steps/"+b["stepId"].(string), e.ws.Key, nil).Body))
	require.Equal(t, http.StatusOK, e.report(b, map[string]any{"status": "SUCCEEDED", "output": map[string]any{}}).Status)
}
