package httpapi_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
)

// These pin, over HTTP, rules of API.md §3 and §5 that lib/jobs tests only
// through the service: dependencies, run completion, cancel, heartbeats and
// a report after an inline lapse.

// stepByID is the step of run whose id is id.
func stepByID(t *testing.T, run map[string]any, id string) map[string]any {
	t.Helper()
	for _, s := range run["steps"].([]any) {
		if s := s.(map[string]any); s["id"] == id {
			return s
		}
	}
	require.FailNow(t, "no such step in the run", id)
	return nil
}

// §3: a step with afterStepId/afterStatus is WAITING until its dependency
// ends, then QUEUED, or SKIPPED when it ended the other way, decided at the
// report that ends the dependency; §5: a SKIPPED step counts as ended well,
// so the run SUCCEEDED at the report of its last step, no sweeper involved.
func TestConformanceDependenciesAndRunCompletion(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	a := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"s": "a"}})
	onSuccess := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"s": "b"},
		"afterStepId": a["stepId"], "afterStatus": "SUCCEEDED"})
	onFailure := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"s": "c"},
		"afterStepId": a["stepId"], "afterStatus": "FAILED"})
	for _, s := range []map[string]any{onSuccess, onFailure} {
		require.Equal(t, "WAITING", s["status"])
		require.Nil(t, s["dueAt"])
	}
	finished := e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", e.ingest, nil).JSON()
	require.Equal(t, "RUNNING", finished["status"])
	require.Equal(t, true, finished["completionRequested"])

	w := e.register("send_email@1")
	claimed := e.claim(w, 10)
	require.Len(t, claimed, 1, "waiting steps are not claimable")
	require.Equal(t, a["jobId"], claimed[0]["jobId"])
	e.Must(http.StatusOK, "POST", "/api/v1/jobs/"+claimed[0]["jobId"].(string)+"/report", e.worker,
		map[string]any{"leaseToken": claimed[0]["leaseToken"], "status": "SUCCEEDED", "output": map[string]any{}})

	run := e.getRun(runID)
	require.Equal(t, "RUNNING", run["status"])
	released := stepByID(t, run, onSuccess["stepId"].(string))
	require.Equal(t, "QUEUED", released["status"])
	require.Equal(t, "QUEUED", released["durableJob"].(map[string]any)["status"])
	skipped := stepByID(t, run, onFailure["stepId"].(string))
	require.Equal(t, "SKIPPED", skipped["status"])
	require.Equal(t, "SKIPPED", skipped["durableJob"].(map[string]any)["status"])

	next := e.claim(w, 10)
	require.Len(t, next, 1)
	require.Equal(t, onSuccess["jobId"], next[0]["jobId"])
	e.Must(http.StatusOK, "POST", "/api/v1/jobs/"+next[0]["jobId"].(string)+"/report", e.worker,
		map[string]any{"leaseToken": next[0]["leaseToken"], "status": "SUCCEEDED", "output": map[string]any{}})
	run = e.getRun(runID)
	require.Equal(t, "SUCCEEDED", run["status"], "a SKIPPED step counts as ended well")
	require.NotNil(t, run["finishedAt"])
}

// §3: a run is FAILED when any step is EXHAUSTED or CANCELLED. §5: cancel
// answers 200 (the cancelled step); cancelling it again answers the same,
// and a step that ended otherwise is 409 invalid_state.
func TestConformanceExhaustedOrCancelledStepFailsTheRun(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	w := e.register("send_email@1")

	exhaustedRun := e.run()
	e.enqueue(exhaustedRun, map[string]any{"name": "send_email", "version": "1", "maxAttempts": 1})
	j := e.claim(w, 1)[0]
	rep := e.report(j, map[string]any{"status": "FAILED", "error": map[string]any{"message": "x", "retryable": true}})
	require.Equal(t, http.StatusOK, rep.Status, "%s", rep.Body)
	require.Equal(t, "EXHAUSTED", rep.JSON()["status"])
	require.Nil(t, rep.JSON()["nextDueAt"])
	require.Equal(t, "FAILED", e.getRun(exhaustedRun)["status"])

	cancelledRun := e.run()
	done := e.enqueue(cancelledRun, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": 1}})
	// Due after done: the test's clock stands still, and jobs due at the same
	// instant are claimed in no particular order (a CI run claimed queued).
	e.clock.Add(time.Millisecond)
	queued := e.enqueue(cancelledRun, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": 2}})
	j = e.claim(w, 1)[0]
	require.Equal(t, done["jobId"], j["jobId"])
	require.Equal(t, http.StatusOK, e.report(j, map[string]any{"status": "SUCCEEDED", "output": map[string]any{}}).Status)

	cancel := "/api/v1/steps/" + queued["stepId"].(string) + "/cancel"
	cancelled := e.Must(http.StatusOK, "POST", cancel, e.ws.Key, nil).JSON()
	require.Equal(t, queued["stepId"], cancelled["id"])
	require.Equal(t, "CANCELLED", cancelled["status"])
	require.Equal(t, "CANCELLED", cancelled["durableJob"].(map[string]any)["status"])
	require.Equal(t, "CANCELLED", e.Must(http.StatusOK, "POST", cancel, e.ws.Key, nil).JSON()["status"], "a retried cancel")
	require.Equal(t, "FAILED", e.getRun(cancelledRun)["status"])
	ended := e.Do("POST", "/api/v1/steps/"+done["stepId"].(string)+"/cancel", e.ws.Key, nil)
	require.Equal(t, http.StatusConflict, ended.Status, "%s", ended.Body)
	require.Equal(t, apierr.CodeInvalidState, ended.ErrorCode())
	require.Empty(t, e.claim(w, 10), "a cancelled job is not claimed")
}

// §5 job leases: leaseExpiresAt is the claim time + timeoutMs + the 10 s
// grace, and each heartbeat extends it by the same length from now.
func TestConformanceJobHeartbeatExtendsByTheLeaseLength(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	e.enqueue(e.run(), map[string]any{"name": "send_email", "version": "1", "timeoutMs": 2000})
	w := e.register("send_email@1")
	j := e.claim(w, 1)[0]
	lease := 12 * time.Second // 2 s timeout + 10 s grace
	require.Equal(t, e.clock.Now().Add(lease).Format(time.RFC3339Nano), j["leaseExpiresAt"])

	heartbeat := "/api/v1/jobs/" + j["jobId"].(string) + "/heartbeat"
	for range 2 {
		e.clock.Add(7 * time.Second)
		hb := e.Must(http.StatusOK, "POST", heartbeat, e.worker, map[string]any{"leaseToken": j["leaseToken"]}).JSON()
		require.Equal(t, e.clock.Now().Add(lease).Format(time.RFC3339Nano), hb["leaseExpiresAt"])
		require.Equal(t, false, hb["cancelRequested"])
	}
	// 14 s after the claim, past its first lease, the job is still held.
	require.Empty(t, e.claim(e.register("send_email@1"), 1))
}

// §5 job leases: a lapse a request decides (here a run read, no sweeper)
// that ends the job's last attempt makes the job EXHAUSTED at once; a
// report with the lapsed attempt's token is then 409 invalid_state.
func TestConformanceReportAfterTheLapseEndedTheJob(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	st := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "timeoutMs": 1000, "maxAttempts": 1})
	j := e.claim(e.register("send_email@1"), 1)[0]
	e.clock.Add(12 * time.Second) // past the 11 s lease

	run := e.getRun(runID)
	s := stepByID(t, run, st["stepId"].(string))
	require.Equal(t, "EXHAUSTED", s["status"], "the lapse is read at once")
	require.Equal(t, "FAILED", run["status"])
	attempts := s["durableJob"].(map[string]any)["attempts"].([]any)
	require.Len(t, attempts, 1)
	require.Equal(t, "FAILED", attempts[0].(map[string]any)["outcome"])
	require.NotEmpty(t, attempts[0].(map[string]any)["warning"], "a side effect may have happened")

	late := e.report(j, map[string]any{"status": "SUCCEEDED", "output": map[string]any{}})
	require.Equal(t, http.StatusConflict, late.Status, "%s", late.Body)
	require.Equal(t, apierr.CodeInvalidState, late.ErrorCode())
}

// §3.1: only exact registered name@version jobs are claimed, and a lapsed
// lease lets another worker with the same handler version reclaim the job,
// never a worker of another version.
func TestConformanceClaimsTakeOnlyTheExactRegisteredVersion(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1", "send_email@2")
	runID := e.run()
	v1 := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "timeoutMs": 1000})
	v2 := e.enqueue(runID, map[string]any{"name": "send_email", "version": "2", "timeoutMs": 1000})
	e.enqueue(runID, map[string]any{"name": "send_sms", "version": "1"})

	first := e.register("send_email@1")
	claimed := e.claim(first, 10)
	require.Len(t, claimed, 1)
	require.Equal(t, v1["jobId"], claimed[0]["jobId"])
	require.Equal(t, "1", claimed[0]["version"])

	e.clock.Add(12 * time.Second) // v1's lease (1 s + 10 s grace) lapsed
	other := e.register("send_email@2")
	claimed = e.claim(other, 10)
	require.Len(t, claimed, 1, "a worker of another version does not reclaim the lapsed v1 job")
	require.Equal(t, v2["jobId"], claimed[0]["jobId"])
	same := e.register("send_email@1")
	claimed = e.claim(same, 10)
	require.Len(t, claimed, 1)
	require.Equal(t, v1["jobId"], claimed[0]["jobId"], "the same version reclaims it at once")
	require.EqualValues(t, 2, claimed[0]["attempt"])
}

// §3.2 / seed 000: a paused endpoint accepts new jobs but they are not
// claimed, and no attempt is consumed, until it is resumed. §5: the
// endpoint limits' bounds are inclusive (maxConcurrent 1–1000,
// rateLimitPerMinute 1–100 000) and null clears them.
func TestConformancePausedEndpointHoldsItsJobs(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	ep := e.endpoint("mailer")
	id := ep["id"].(string)
	policy := "/api/v1/endpoints/" + id + "/policy"
	version := ep["version"]
	for _, limits := range []map[string]any{
		{"maxConcurrent": 1000, "rateLimitPerMinute": 100_000},
		{"maxConcurrent": 1, "rateLimitPerMinute": 1},
		{"maxConcurrent": nil, "rateLimitPerMinute": nil},
	} {
		body := map[string]any{"expectedVersion": version}
		for k, v := range limits {
			body[k] = v
		}
		got := e.Must(http.StatusOK, "PUT", policy, e.ws.Key, body).JSON()
		for k, v := range limits {
			require.EqualValues(t, v, got[k], k)
		}
		version = got["version"]
	}

	require.Equal(t, true, e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+id+"/pause", e.ws.Key, nil).JSON()["paused"])
	runID := e.run()
	st := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "endpoint": "mailer"})
	require.Equal(t, "QUEUED", st["status"], "a paused endpoint accepts new jobs")
	w := e.register("send_email@1")
	require.Empty(t, e.claim(w, 10), "but does not let them be claimed")
	e.clock.Add(time.Hour)
	require.Empty(t, e.claim(w, 10))
	require.EqualValues(t, 0, durable(e.getRun(runID), 0)["attempt"], "holding consumes no attempt")

	require.Equal(t, false, e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+id+"/resume", e.ws.Key, nil).JSON()["paused"])
	claimed := e.claim(w, 10)
	require.Len(t, claimed, 1)
	require.Equal(t, st["jobId"], claimed[0]["jobId"])
	require.EqualValues(t, 1, claimed[0]["attempt"])
}

// §5 rules: repeating a job report with the same token and outcome answers
// 200 with the same object; another outcome on the reported attempt is
// 409 invalid_state.
func TestConformanceARepeatedJobReportAnswersTheSame(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	e.enqueue(e.run(), map[string]any{"name": "send_email", "version": "1"})
	j := e.claim(e.register("send_email@1"), 1)[0]
	failed := map[string]any{"status": "FAILED", "error": map[string]any{"message": "busy", "retryable": true}}
	first := e.report(j, failed)
	require.Equal(t, http.StatusOK, first.Status, "%s", first.Body)
	require.Equal(t, "RETRY_SCHEDULED", first.JSON()["status"])
	again := e.report(j, failed)
	require.Equal(t, http.StatusOK, again.Status, "%s", again.Body)
	require.Equal(t, first.JSON(), again.JSON())
	other := e.report(j, map[string]any{"status": "SUCCEEDED", "output": map[string]any{}})
	require.Equal(t, http.StatusConflict, other.Status, "%s", other.Body)
	require.Equal(t, apierr.CodeInvalidState, other.ErrorCode())
}

// §5: a retry is claimable at its dueAt, inline (no sweeper runs here);
// seed 000: the due time is now + max(jittered policy delay, retryAfterMs).
func TestConformanceARetryIsClaimableAtItsDueAt(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1"})
	w := e.register("send_email@1")
	j := e.claim(w, 1)[0]
	// STANDARD waits 30 s ± 20% first: the 60 s floor decides.
	r := e.report(j, map[string]any{"status": "FAILED",
		"error": map[string]any{"message": "busy", "retryable": true, "retryAfterMs": 60_000}})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	due := e.clock.Now().Add(time.Minute).Format(time.RFC3339Nano)
	require.Equal(t, "RETRY_SCHEDULED", r.JSON()["status"])
	require.Equal(t, due, r.JSON()["nextDueAt"])
	dj := durable(e.getRun(runID), 0)
	require.Equal(t, "RETRY_SCHEDULED", dj["status"])
	require.Equal(t, due, dj["dueAt"])

	e.clock.Add(time.Minute - time.Millisecond)
	require.Empty(t, e.claim(w, 1), "not before its dueAt")
	e.clock.Add(time.Millisecond)
	again := e.claim(w, 1)
	require.Len(t, again, 1, "claimable at its dueAt")
	require.Equal(t, j["jobId"], again[0]["jobId"])
	require.EqualValues(t, 2, again[0]["attempt"])
}
