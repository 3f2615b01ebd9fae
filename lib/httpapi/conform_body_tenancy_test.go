package httpapi_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/ids"
)

// API.md §0 for the ids a body names (TestConformanceAnotherWorkspacesIDIs
// AnUnknownIDOnEveryRoute holds the path's): another workspace's record
// named in a request body is unknown, answered as an id that names nothing,
// and left as it was; a batch report of another workspace's job, even with
// its current lease token, is not_found in its slot, and a reconciliation
// matches only its own workspace's effects, never resolving another's
// (security review: the batch report and reconcile were held by no test).
func TestABodyNamingAnotherWorkspacesRecordIsUnknown(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "t@1")
	a := e.ws.Key
	b := e.Signup().Key

	// Workspace a's records: a running job, a run, a group with a step,
	// and an effect whose lease lapsed (indeterminate).
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "t", "version": "1", "input": map[string]any{}})
	job := e.claim(e.register("t@1"), 1)[0]
	group := e.Must(http.StatusCreated, "POST", "/api/v1/groups", a, map[string]any{"name": "g"}).JSON()["id"].(string)
	step := e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", a, map[string]any{"effect_type": "t.x",
		"idempotency_key": "step", "group_id": group,
		"compensation": map[string]any{"effect_type": "t.undo", "payload": map[string]any{}}}).JSON()
	e.Must(http.StatusOK, "POST", "/api/v1/effects/"+step["effect_id"].(string)+"/report", a,
		map[string]any{"lease_token": step["lease_token"], "outcome": "succeeded"})
	lapsed := e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", a, map[string]any{"effect_type": "t.x",
		"idempotency_key": "lapsed", "lease_seconds": 5}).JSON()["effect_id"].(string)
	e.clock.Add(10 * time.Second)
	reads := func() map[string]string {
		out := map[string]string{}
		for _, path := range []string{"/api/v1/runs/" + runID, "/api/v1/groups/" + group, "/api/v1/effects/" + lapsed} {
			out[path] = string(e.Must(http.StatusOK, "GET", path, a, nil).Body)
		}
		return out
	}
	before := reads()
	require.Contains(t, before["/api/v1/effects/"+lapsed], `"state":"indeterminate"`)

	// begin's ids: its own workspace's unknown id answers the same.
	for field, theirs := range map[string]string{
		"group_id": group, "run_id": runID, "compensates_effect_id": step["effect_id"].(string),
	} {
		body := func(id string) map[string]any {
			b := map[string]any{"effect_type": "t.undo", "idempotency_key": field + ":" + id, "payload": map[string]any{}}
			b[field] = id
			return b
		}
		cross := e.Do("POST", "/api/v1/effects/begin", b, body(theirs))
		require.Equal(t, http.StatusNotFound, cross.Status, "%s: %s", field, cross.Body)
		unknown := e.Do("POST", "/api/v1/effects/begin", b, body(ids.New(theirs[:3])))
		require.Equal(t, unknown.JSON()["error"], cross.JSON()["error"], "%s: answered as an unknown id", field)
	}

	// The batch report: their job, with its current token, is not found.
	batch := e.Must(http.StatusOK, "POST", "/api/v1/jobs/report", b, map[string]any{"reports": []map[string]any{{
		"jobId": job["jobId"], "leaseToken": job["leaseToken"], "status": "SUCCEEDED", "output": map[string]any{}}}})
	slot := batch.JSON()["results"].([]any)[0].(map[string]any)
	require.Equal(t, apierr.CodeNotFound, slot["error"].(map[string]any)["code"], "%s", batch.Body)

	// Reconciling: their effect's key is unknown to this workspace, and
	// its indeterminate effect stays indeterminate, whether the window
	// holds it or a record alone names it.
	now := e.clock.Now()
	for _, from := range []time.Time{now.Add(-time.Hour), now.Add(time.Hour)} {
		rec := e.Must(http.StatusOK, "POST", "/api/v1/reconcile", b, map[string]any{"effect_type": "t.x",
			"from": from.Format(time.RFC3339), "to": from.Add(2 * time.Hour).Format(time.RFC3339),
			"records": []map[string]any{{"idempotency_key": "lapsed", "status": "failed", "amount_micros": nil}}}).JSON()
		require.Len(t, rec["unknown_to_ratchet"], 1, "%v", rec)
		require.Empty(t, rec["resolved"])
	}

	require.Equal(t, before, reads(), "workspace a's records are as they were")
	// Its worker's token still holds.
	require.Equal(t, http.StatusOK, e.report(job, map[string]any{"status": "SUCCEEDED", "output": map[string]any{}}).Status)
}
