package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// exhausted enqueues one send_email@1 step with maxAttempts attempts, fails
// every one of them non-retryably on the last, and requests run completion,
// so the run ends FAILED. It answers the run and step ids.
func (e *jobsEnv) exhausted(wid string, input any, maxAttempts int) (string, string) {
	e.T.Helper()
	runID := e.run()
	enq := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": input, "maxAttempts": maxAttempts})
	for i := range maxAttempts {
		if i > 0 {
			e.clock.Add(time.Hour) // beyond any backoff these tests use
		}
		job := e.claim(wid, 1)[0]
		require.Equal(e.T, enq["jobId"], job["jobId"])
		e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "provider down"}})
	}
	e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", e.ingest, nil)
	require.Equal(e.T, "FAILED", e.getRun(runID)["status"])
	return runID, enq["stepId"].(string)
}

func (e *jobsEnv) replay(stepID string, body map[string]any) *apitest.Response {
	e.T.Helper()
	return e.Do("POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, body)
}

func (e *jobsEnv) preview(stepID string) map[string]any {
	e.T.Helper()
	return e.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, nil).JSON()
}

func (e *jobsEnv) count(sql string, args ...any) int {
	e.T.Helper()
	var n int
	require.NoError(e.T, e.App.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

var ack = map[string]any{"acknowledgeDuplicateRisk": true}

func TestReplaySameVersion(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	runID, stepID := e.exhausted(wid, map[string]any{"customerId": "cus_secret_77"}, 2)

	p := e.preview(stepID)
	require.Equal(t, true, p["eligible"])
	require.Nil(t, p["ineligibleReason"])
	require.Contains(t, p, "ineligibleReason")
	require.Equal(t, "EXHAUSTED", p["status"])
	require.Equal(t, "1", p["handlerVersion"])
	require.EqualValues(t, 2, p["attempt"])
	require.Empty(t, p["upgrades"])

	// acknowledgeDuplicateRisk is required, maxAttempts is 1-10.
	require.Equal(t, []string{"acknowledgeDuplicateRisk"}, validationFields(t, e.replay(stepID, map[string]any{})))
	require.Equal(t, []string{"acknowledgeDuplicateRisk"}, validationFields(t, e.replay(stepID,
		map[string]any{"acknowledgeDuplicateRisk": false})))
	require.Equal(t, []string{"maxAttempts"}, validationFields(t, e.replay(stepID,
		map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": 11})))
	require.Equal(t, []string{"maxAttempts"}, validationFields(t, e.replay(stepID,
		map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": 0})))
	// A stale expectedHandlerVersion is refused even on a same-version replay.
	r := e.replay(stepID, map[string]any{"acknowledgeDuplicateRisk": true, "expectedHandlerVersion": "0"})
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, "version_conflict", r.ErrorCode())

	before := durable(e.getRun(runID), 0)
	require.Equal(t, []any{}, before["replays"])
	res := e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key,
		map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": 2, "reason": "provider fixed"}).JSON()
	require.Equal(t, map[string]any{"stepId": stepID, "jobId": before["id"], "status": "QUEUED", "attempt": 2.0,
		"maxAttempts": 4.0, "handlerVersion": "1"}, res)

	run := e.getRun(runID)
	require.Equal(t, "RUNNING", run["status"], "the run reflects the replayed step")
	require.Nil(t, run["finishedAt"])
	dj := durable(run, 0)
	require.Equal(t, "QUEUED", dj["status"])
	require.EqualValues(t, 4, dj["maxAttempts"], "lifetime ceiling = prior attempts + maxAttempts")
	require.Equal(t, before["policy"], dj["policy"], "a same-version replay keeps its policy snapshot")
	require.Len(t, dj["attempts"], 2)
	require.Equal(t, before["attempts"], dj["attempts"], "previous executions are unchanged")
	// Only once: a queued job is not eligible.
	r = e.replay(stepID, ack)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, "invalid_state", r.ErrorCode())
	queued := e.preview(stepID)
	require.Equal(t, false, queued["eligible"])
	// The preview says why, as the refusal does (agent QA: eligible false
	// with nothing saying why).
	require.Equal(t, "Only an EXHAUSTED or CANCELLED step can be replayed; this one is QUEUED.", queued["ineligibleReason"])
	require.Equal(t, queued["ineligibleReason"], r.JSON()["error"].(map[string]any)["message"])

	job := e.claim(wid, 1)[0]
	require.EqualValues(t, 3, job["attempt"])
	require.Equal(t, map[string]any{"customerId": "cus_secret_77"}, job["input"], "the original input is kept")
	require.Equal(t, "SUCCEEDED", e.report(job, map[string]any{"status": "SUCCEEDED"}).JSON()["status"])
	run = e.getRun(runID)
	require.Equal(t, "SUCCEEDED", run["status"])
	require.Len(t, durable(run, 0)["attempts"], 3)
	require.Equal(t, 2, e.count(`SELECT count(*) FROM events WHERE subject_id = $1 AND type = 'run.finished'`, runID),
		"each finish records its event")

	// The audit row and the replay event carry the actor key and versions.
	var keyID, reason, oldV, newV string
	require.NoError(t, e.App.Pool.QueryRow(context.Background(), `SELECT key_id, reason, old_handler_version,
		new_handler_version FROM job_replays WHERE step_id = $1`, stepID).Scan(&keyID, &reason, &oldV, &newV))
	require.Contains(t, keyID, "key_")
	require.Equal(t, "provider fixed", reason)
	require.Equal(t, []string{"1", "1"}, []string{oldV, newV})
	require.Equal(t, 1, e.count(`SELECT count(*) FROM events WHERE subject_id = $1 AND type = 'step.replayed'
		AND data->>'keyId' = $2 AND data->>'oldHandlerVersion' = '1'`, stepID, keyID))
	// Both step reads show the audit.
	step := e.stepOf(stepID)
	replays := step["durableJob"].(map[string]any)["replays"].([]any)
	require.Len(t, replays, 1)
	require.Equal(t, replays, durable(e.getRun(runID), 0)["replays"])
	got := replays[0].(map[string]any)
	require.NotEmpty(t, got["id"])
	require.NotEmpty(t, got["createdAt"])
	delete(got, "id")
	delete(got, "createdAt")
	require.Equal(t, map[string]any{"keyId": keyID, "reason": "provider fixed", "priorStatus": "EXHAUSTED",
		"priorAttempt": 2.0, "additionalAttempts": 2.0, "maxAttempts": 4.0, "oldHandlerVersion": "1",
		"newHandlerVersion": "1", "oldContractVersion": nil, "newContractVersion": nil}, got)
	// A succeeded step is not replayable either.
	r = e.replay(stepID, ack)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, "invalid_state", r.ErrorCode())
}

func TestReplayKeepsRunFailedWhileAnotherStepFailed(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	runID := e.run()
	var steps []string
	for _, in := range []string{"a", "b"} {
		steps = append(steps, e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": in,
			"maxAttempts": 1})["stepId"].(string))
	}
	for _, j := range e.claim(wid, 2) {
		e.report(j, map[string]any{"status": "FAILED", "error": map[string]any{"message": "x", "retryable": false}})
	}
	e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", e.ingest, nil)
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+steps[0]+"/replay", e.ws.Key, ack)
	require.Equal(t, "FAILED", e.getRun(runID)["status"], "the other exhausted step still decides the run")
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+steps[1]+"/replay", e.ws.Key, ack)
	require.Equal(t, "RUNNING", e.getRun(runID)["status"])
	for _, j := range e.claim(wid, 2) {
		e.report(j, map[string]any{"status": "SUCCEEDED"})
	}
	require.Equal(t, "SUCCEEDED", e.getRun(runID)["status"])
}

func TestReplayCancelledStepAndPausedEndpoint(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	runID := e.run()
	enq := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": 1})
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+enq["stepId"].(string)+"/cancel", e.ingest, nil)
	ep := e.Must(http.StatusOK, "GET", "/api/v1/endpoints", e.ws.Key, nil).JSON()["data"].([]any)[0].(map[string]any)
	e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+ep["id"].(string)+"/pause", e.ws.Key, nil)
	require.Equal(t, true, e.preview(enq["stepId"].(string))["endpointPaused"])
	res := e.Must(http.StatusOK, "POST", "/api/v1/steps/"+enq["stepId"].(string)+"/replay", e.ws.Key, ack).JSON()
	require.EqualValues(t, 0, res["attempt"])
	require.EqualValues(t, 1, res["maxAttempts"])
	require.Empty(t, e.claim(wid, 1), "a paused endpoint holds the replay")
	e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+ep["id"].(string)+"/resume", e.ws.Key, nil)
	job := e.claim(wid, 1)[0]
	require.EqualValues(t, 1, job["attempt"])
	require.Equal(t, false, e.Must(http.StatusOK, "POST", "/api/v1/jobs/"+job["jobId"].(string)+"/heartbeat", e.worker,
		map[string]any{"leaseToken": job["leaseToken"]}).JSON()["cancelRequested"], "the replay clears the cancel flag")
}

func TestReplayUpgrade(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1", "send_email@2")
	e.publish("send_email", contractBody("1", nil)) // 1: current
	e.publish("send_email", contractBody("2", map[string]any{"timeoutMs": 9000, "retryPreset": "CUSTOM",
		"retryPolicy": map[string]any{"maxAttempts": 3, "initialDelayMs": 1000, "multiplier": 2, "maxDelayMs": 4000,
			"jitterPercent": 0}})) // 2: compatible
	e.publish("send_email", contractBody("3", map[string]any{"status": "FORBIDDEN"})) // 3: forbidden
	e.publish("send_email", contractBody("4", map[string]any{"inputSchema": map[string]any{"type": "object",
		"required": []string{"email"}}})) // 4: incompatible
	w1 := e.register("send_email@1")
	secret := "cus_secret_4242"
	runID, stepID := e.exhausted(w1, map[string]any{"customerId": secret}, 1)

	pr := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, nil)
	require.NotContains(t, string(pr.Body), secret, "the preview never returns the saved input")
	p := pr.JSON()
	require.Equal(t, "1", p["handlerVersion"])
	require.EqualValues(t, 1, p["contractVersion"])
	ups := map[float64]map[string]any{}
	for _, u := range p["upgrades"].([]any) {
		m := u.(map[string]any)
		ups[m["contractVersion"].(float64)] = m
	}
	require.Len(t, ups, 3, "every other contract of the tool")
	require.Equal(t, true, ups[2]["compatible"])
	require.Equal(t, false, ups[2]["forbidden"])
	require.Equal(t, "2", ups[2]["handlerVersion"])
	require.Equal(t, true, ups[3]["forbidden"])
	require.Equal(t, false, ups[4]["compatible"])
	for _, u := range ups {
		require.Equal(t, true, u["checked"], "each is checked, so compatible says whether it fits")
	}
	require.Equal(t, "input.email", ups[4]["validation"].([]any)[0].(map[string]any)["field"])

	up := func(extra map[string]any) map[string]any {
		b := map[string]any{"acknowledgeDuplicateRisk": true, "targetContractVersion": 2,
			"expectedHandlerVersion": "1", "acknowledgeVersionChange": true}
		for k, v := range extra {
			if v == nil {
				delete(b, k)
			} else {
				b[k] = v
			}
		}
		return b
	}
	require.Equal(t, []string{"acknowledgeVersionChange"}, validationFields(t, e.replay(stepID,
		up(map[string]any{"acknowledgeVersionChange": nil}))))
	require.Equal(t, []string{"acknowledgeVersionChange"}, validationFields(t, e.replay(stepID,
		up(map[string]any{"acknowledgeVersionChange": false}))))
	require.Equal(t, []string{"expectedHandlerVersion"}, validationFields(t, e.replay(stepID,
		up(map[string]any{"expectedHandlerVersion": nil}))))
	require.Equal(t, []string{"targetContractVersion"}, validationFields(t, e.replay(stepID,
		up(map[string]any{"targetContractVersion": 99}))))
	// An acknowledged upgrade without its target is not a same-version replay.
	require.Equal(t, []string{"targetContractVersion"}, validationFields(t, e.replay(stepID,
		up(map[string]any{"targetContractVersion": nil}))))
	require.Equal(t, []string{"targetContractVersion"}, validationFields(t, e.replay(stepID,
		up(map[string]any{"targetContractVersion": int64(1) << 31}))))
	r := e.replay(stepID, up(map[string]any{"expectedHandlerVersion": "2"}))
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, "version_conflict", r.ErrorCode())
	require.Equal(t, "1", errorDetail(r)["currentHandlerVersion"])
	for _, target := range []int{3, 4} {
		r := e.replay(stepID, up(map[string]any{"targetContractVersion": target}))
		require.Equal(t, http.StatusConflict, r.Status, "target %d: %s", target, r.Body)
		require.Equal(t, "invalid_state", r.ErrorCode())
		require.NotContains(t, string(r.Body), secret)
	}
	require.Equal(t, "EXHAUSTED", e.stepOf(stepID)["status"], "refused replays change nothing")
	require.Equal(t, 0, e.count(`SELECT count(*) FROM job_replays WHERE step_id = $1`, stepID))

	res := e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, up(map[string]any{"maxAttempts": 2})).JSON()
	require.Equal(t, "2", res["handlerVersion"])
	require.EqualValues(t, 1, res["attempt"])
	require.EqualValues(t, 3, res["maxAttempts"])
	st := e.stepOf(stepID)
	require.Equal(t, "2", st["version"])
	require.EqualValues(t, 2, st["contractVersion"])
	audit := st["durableJob"].(map[string]any)["replays"].([]any)
	require.Len(t, audit, 1)
	for k, want := range map[string]any{"oldHandlerVersion": "1", "newHandlerVersion": "2", "oldContractVersion": 1.0,
		"newContractVersion": 2.0, "reason": nil} {
		require.Equal(t, want, audit[0].(map[string]any)[k], k)
	}
	dj := st["durableJob"].(map[string]any)
	require.EqualValues(t, 3, dj["maxAttempts"])
	require.Equal(t, map[string]any{"preset": "CUSTOM", "maxAttempts": 3.0, "initialDelayMs": 1000.0,
		"multiplier": 2.0, "maxDelayMs": 4000.0, "jitterPercent": 0.0, "timeoutMs": 9000.0}, dj["policy"],
		"the target contract's timeout and complete retry policy")
	require.Equal(t, "RUNNING", e.getRun(runID)["status"])
	var oldC, newC *int
	require.NoError(t, e.App.Pool.QueryRow(context.Background(), `SELECT old_contract_version, new_contract_version
		FROM job_replays WHERE step_id = $1`, stepID).Scan(&oldC, &newC))
	require.Equal(t, 1, *oldC)
	require.Equal(t, 2, *newC)

	// Only a worker registered for the target version claims it.
	require.Empty(t, e.claim(w1, 1), "the old version's worker does not get the upgraded job")
	w2 := e.register("send_email@2")
	job := e.claim(w2, 1)[0]
	require.Equal(t, "2", job["version"])
	require.EqualValues(t, 2, job["attempt"])
	require.EqualValues(t, 9000, job["timeoutMs"])
	require.Equal(t, map[string]any{"customerId": secret}, job["input"])
	// Its output is checked against the target contract; backoff uses the
	// lifetime attempt number under the new policy (1000 * 2^(2-1)).
	r = e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "again"}})
	require.Equal(t, "RETRY_SCHEDULED", r.JSON()["status"])
	due, err := time.Parse(time.RFC3339Nano, e.stepOf(stepID)["durableJob"].(map[string]any)["dueAt"].(string))
	require.NoError(t, err)
	require.True(t, e.clock.Now().Add(2*time.Second).Equal(due), "due %s", due)
	e.clock.Add(2 * time.Second)
	job = e.claim(w2, 1)[0]
	require.EqualValues(t, 3, job["attempt"])
	require.Equal(t, "SUCCEEDED", e.report(job, map[string]any{"status": "SUCCEEDED",
		"output": map[string]any{"messageId": "m"}}).JSON()["status"])
	require.Equal(t, "SUCCEEDED", e.getRun(runID)["status"])

	// The endpoint's attempts each name the handler version that ran them
	// (console QA: every one read the job's version after the upgrade, 2).
	eps := e.Must(http.StatusOK, "GET", "/api/v1/endpoints", e.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, eps, 1)
	attempts := e.Must(http.StatusOK, "GET", "/api/v1/endpoints/"+eps[0].(map[string]any)["id"].(string)+"/attempts",
		e.ingest, nil).JSON()["data"].([]any)
	ran := map[float64]any{}
	for _, a := range attempts {
		ran[a.(map[string]any)["attempt"].(float64)] = a.(map[string]any)["version"]
	}
	require.Equal(t, map[float64]any{1: "1", 2: "2", 3: "2"}, ran)
}

func TestReplayUpgradePolicyCountIsCappedAtTen(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1", "send_email@2")
	e.publish("send_email", contractBody("2", nil))
	wid := e.register("send_email@1")
	_, stepID := e.exhausted(wid, map[string]any{"customerId": "cus_1"}, 1)
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key,
		map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": 10})
	st := e.stepOf(stepID)
	require.EqualValues(t, 1, st["durableJob"].(map[string]any)["policy"].(map[string]any)["maxAttempts"],
		"same version: the original snapshot's count")
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/cancel", e.ingest, nil)
	res := e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, map[string]any{
		"acknowledgeDuplicateRisk": true, "maxAttempts": 10, "targetContractVersion": 1,
		"expectedHandlerVersion": "1", "acknowledgeVersionChange": true}).JSON()
	require.EqualValues(t, 11, res["maxAttempts"])
	dj := e.stepOf(stepID)["durableJob"].(map[string]any)
	require.EqualValues(t, 11, dj["maxAttempts"], "the job's ceiling stays authoritative")
	require.EqualValues(t, 10, dj["policy"].(map[string]any)["maxAttempts"], "the upgraded policy's count caps at 10")
	require.Equal(t, "STANDARD", dj["policy"].(map[string]any)["preset"])
	// The old handler version is now stale for another replay.
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/cancel", e.ingest, nil)
	r := e.replay(stepID, map[string]any{"acknowledgeDuplicateRisk": true, "expectedHandlerVersion": "1"})
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, "version_conflict", r.ErrorCode())
}

func TestReplayScopesAndTenancy(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	_, stepID := e.exhausted(wid, 1, 1)
	for _, m := range []string{"GET", "POST"} {
		var body any = ack
		if m == "GET" {
			body = nil // the preview reads no body: a field there is refused
		}
		r := e.Do(m, "/api/v1/steps/"+stepID+"/replay", e.ingest, body)
		require.Equal(t, http.StatusForbidden, r.Status)
		require.Equal(t, []any{"steps:replay"}, errorDetail(r)["required"])
		ws2 := e.Signup()
		r = e.Do(m, "/api/v1/steps/"+stepID+"/replay", ws2.Key, body)
		require.Equal(t, http.StatusNotFound, r.Status, m)
		require.Equal(t, "not_found", r.ErrorCode())
		require.Equal(t, http.StatusNotFound, e.Do(m, "/api/v1/steps/stp_nope/replay", e.ws.Key, body).Status)
	}
	replayer := e.Key(e.ws, map[string]any{"name": "ops", "scopes": []string{"steps:replay"}})
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/replay", replayer, ack)
}

func TestConcurrentReplaysReplayOnce(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	_, stepID := e.exhausted(wid, 1, 2)
	const n = 6
	statuses := make(chan int, n)
	for range n {
		go func() {
			statuses <- e.replay(stepID, map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": 3}).Status
		}()
	}
	got := map[int]int{}
	for range n {
		got[<-statuses]++
	}
	require.Equal(t, map[int]int{http.StatusOK: 1, http.StatusConflict: n - 1}, got, "the job row lock admits one replay")
	require.EqualValues(t, 5, e.stepOf(stepID)["durableJob"].(map[string]any)["maxAttempts"])
	require.Equal(t, 1, e.count(`SELECT count(*) FROM job_replays WHERE step_id = $1`, stepID))
}

func TestReplayOfAJobWhoseLastLeaseLapsed(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	runID := e.run()
	enq := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": 1, "maxAttempts": 1,
		"timeoutMs": 5000})
	e.claim(wid, 1) // the worker dies with the job
	e.clock.Add(time.Minute)
	require.Equal(t, true, e.preview(enq["stepId"].(string))["eligible"], "a lapsed last attempt ends the job at read")
	res := e.Must(http.StatusOK, "POST", "/api/v1/steps/"+enq["stepId"].(string)+"/replay", e.ws.Key, ack).JSON()
	require.EqualValues(t, 1, res["attempt"])
	require.EqualValues(t, 2, e.claim(wid, 1)[0]["attempt"])
	att := e.stepOf(enq["stepId"].(string))["durableJob"].(map[string]any)["attempts"].([]any)
	require.Len(t, att, 2)
	require.NotNil(t, att[0].(map[string]any)["warning"], "the lapsed execution keeps its side-effect warning")
}

func TestReplayWaitsForTheDependency(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	runID := e.run()
	a := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": "a"})
	b := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": "b",
		"afterStepId": a["stepId"], "afterStatus": "SUCCEEDED"})
	require.Equal(t, "WAITING", b["status"])
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+b["stepId"].(string)+"/cancel", e.ingest, nil)
	waiting := e.preview(b["stepId"].(string))
	require.Equal(t, false, waiting["eligible"])
	require.Equal(t, "The step this one depends on (afterStepId) has not ended; replay after it.", waiting["ineligibleReason"],
		"a CANCELLED step's preview says why it may not be replayed yet")
	r := e.replay(b["stepId"].(string), ack)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, "invalid_state", r.ErrorCode())
	job := e.claim(wid, 1)[0]
	require.Equal(t, a["jobId"], job["jobId"])
	e.report(job, map[string]any{"status": "SUCCEEDED"})
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+b["stepId"].(string)+"/replay", e.ws.Key, ack)
	require.Equal(t, b["jobId"], e.claim(wid, 1)[0]["jobId"])
}

// A replay puts back to WAITING the steps its step's end skipped, down the
// chain: when the replay succeeds they run, and the run finishes only then.
// (They stayed SKIPPED, and the run finished SUCCEEDED without them.)
func TestReplayRevivesTheStepsItsEndSkipped(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	runID := e.run()
	a := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": "a", "maxAttempts": 1})
	b := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": "b",
		"afterStepId": a["stepId"], "afterStatus": "SUCCEEDED"})
	c := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": "c",
		"afterStepId": b["stepId"], "afterStatus": "SUCCEEDED"})
	e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", e.ingest, nil)
	job := e.claim(wid, 1)[0]
	require.Equal(t, a["jobId"], job["jobId"])
	e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "down", "retryable": false}})
	status := func(stepID any) string {
		return e.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID.(string), e.ws.Key, nil).JSON()["status"].(string)
	}
	require.Equal(t, "SKIPPED", status(b["stepId"]))
	require.Equal(t, "SKIPPED", status(c["stepId"]))
	require.Equal(t, "FAILED", e.getRun(runID)["status"])

	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+a["stepId"].(string)+"/replay", e.ws.Key, ack)
	require.Equal(t, "WAITING", status(b["stepId"]))
	require.Equal(t, "WAITING", status(c["stepId"]))
	for _, want := range []map[string]any{a, b, c} {
		job := e.claim(wid, 1)[0]
		require.Equal(t, want["jobId"], job["jobId"])
		require.Equal(t, "RUNNING", e.getRun(runID)["status"], "the run waits for its revived steps")
		e.report(job, map[string]any{"status": "SUCCEEDED"})
	}
	require.Equal(t, "SUCCEEDED", e.getRun(runID)["status"])
}

// A replay naming the attempt its preview showed is not run twice by a
// retry: once the replayed attempt has run, the same request is refused
// (retry-safety QA: the repeat replayed the step again, one more real
// execution).
func TestAReplayExpectingAnAttemptRunsOnce(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	runID, stepID := e.exhausted(wid, map[string]any{"n": 1}, 2)
	body := map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": 1, "expectedAttempt": 2}
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, body)
	job := e.claim(wid, 1)[0]
	e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "x", "retryable": false}})
	require.Equal(t, "EXHAUSTED", durable(e.getRun(runID), 0)["status"])

	again := e.replay(stepID, body)
	require.Equal(t, http.StatusConflict, again.Status, "%s", again.Body)
	require.Equal(t, "invalid_state", again.ErrorCode())
	require.EqualValues(t, 3, again.JSON()["error"].(map[string]any)["detail"].(map[string]any)["attempt"])
	require.Contains(t, again.JSON()["error"].(map[string]any)["message"], "has run since the attempt expected (2)")
	// An attempt the step has not reached is refused as that (QA: it was
	// told the step had run since).
	ahead := e.replay(stepID, map[string]any{"acknowledgeDuplicateRisk": true, "expectedAttempt": 4})
	require.Equal(t, http.StatusConflict, ahead.Status, "%s", ahead.Body)
	require.Contains(t, ahead.JSON()["error"].(map[string]any)["message"], "has not reached the attempt expected (4)")
	require.Len(t, durable(e.getRun(runID), 0)["replays"], 1)
	require.Equal(t, []string{"expectedAttempt"}, validationFields(t, e.replay(stepID,
		map[string]any{"acknowledgeDuplicateRisk": true, "expectedAttempt": -1})))
	body["expectedAttempt"] = 3
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, body)
}

// A replay sent again under its Idempotency-Key, after the replayed job ran
// and failed once more, answers the first replay instead of replaying again
// (without the header or expectedAttempt it replayed again).
func TestAReplayUnderAnIdempotencyKeyRunsOnce(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	runID, stepID := e.exhausted(wid, map[string]any{"n": 1}, 1)
	body := map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": 1}
	key := http.Header{"Idempotency-Key": {"replay:" + stepID}}
	first := e.DoWith("POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, key, body)
	require.Equal(t, http.StatusOK, first.Status, "%s", first.Body)
	job := e.claim(wid, 1)[0]
	e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "x", "retryable": false}})
	require.Equal(t, "EXHAUSTED", durable(e.getRun(runID), 0)["status"])

	again := e.DoWith("POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, key, body)
	require.Equal(t, http.StatusOK, again.Status)
	require.Equal(t, string(first.Body), string(again.Body))
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, "EXHAUSTED", durable(e.getRun(runID), 0)["status"], "not queued again")
	require.Len(t, durable(e.getRun(runID), 0)["replays"], 1)
}

// A step cancelled while it ran and replayed onto another contract before
// that attempt ended is due (dueAt) at the attempt's lease expiry, the
// lease the old contract's timeout gave it, and no claim of the new
// version takes it; the attempt's report makes it due at once, and the new
// version's worker claims it (replay QA: it read due at the replay, and
// every claim of the version read and passed over it until the lease
// expired).
func TestAStepReplayedOntoAnotherContractWhileItRanIsDueWhenItsAttemptEnds(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1", "send_email@2")
	e.publish("send_email", contractBody("1", nil))
	e.publish("send_email", contractBody("2", map[string]any{"timeoutMs": 9000}))
	w1, w2 := e.register("send_email@1"), e.register("send_email@2")
	enq := e.enqueue(e.run(), map[string]any{"name": "send_email", "version": "1",
		"input": map[string]any{"customerId": "cus_1"}})
	stepID := enq["stepId"].(string)
	job := e.claim(w1, 1)[0]
	at := func(v any) time.Time {
		t.Helper()
		s, ok := v.(string)
		require.True(t, ok, "a time, not %v", v)
		tm, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return tm
	}
	lease := at(job["leaseExpiresAt"])
	e.clock.Add(time.Second)
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/cancel", e.ingest, nil)
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, map[string]any{
		"acknowledgeDuplicateRisk": true, "targetContractVersion": 2, "expectedHandlerVersion": "1",
		"acknowledgeVersionChange": true})
	dj := e.stepOf(stepID)["durableJob"].(map[string]any)
	require.Equal(t, "QUEUED", dj["status"])
	require.WithinDuration(t, lease, at(dj["dueAt"]), 0, "due when the cancelled attempt's lease expires")
	require.WithinDuration(t, lease, at(dj["leaseExpiresAt"]), 0)
	require.Empty(t, e.claim(w2, 5), "the cancelled attempt may still run")

	e.clock.Add(time.Second)
	r := e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "stopped: cancelled"}})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	dj = e.stepOf(stepID)["durableJob"].(map[string]any)
	require.WithinDuration(t, e.clock.Now(), at(dj["dueAt"]), 0, "due at the attempt's report")
	require.Nil(t, dj["leaseExpiresAt"])
	again := e.claim(w2, 5)
	require.Len(t, again, 1)
	require.Equal(t, enq["jobId"], again[0]["jobId"])
	require.Equal(t, "2", again[0]["version"])
	require.EqualValues(t, 2, again[0]["attempt"])
}

// TestAReplayPreviewChecksItsTargetsWithinOneBudget: the preview checks the
// saved input against each target within one budget for them all (that of
// one enqueue's check, jobs.MaxCheckEvaluations), not one each (QA: a
// 450 kB input and 3 contracts answered after 27 s, 12 s past the
// request's deadline; 100 contracts would have held a core for minutes).
// A target the budget does not reach reads not checked, not compatible,
// and counts toward eligible as one that may fit; a replay onto it checks
// it.
func TestAReplayPreviewChecksItsTargetsWithinOneBudget(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1", "send_email@2")
	// Each item of the input is checked against 25 branches: one check of
	// the whole input counts a little over half the budget.
	branches := make([]any, 25)
	for i := range branches {
		branches[i] = map[string]any{}
	}
	items := jobs.MaxCheckEvaluations/2/(len(branches)+1) + 1
	heavy := func(extra map[string]any) map[string]any {
		s := map[string]any{"type": "array", "items": map[string]any{"anyOf": branches}}
		for k, v := range extra {
			s[k] = v
		}
		return s
	}
	w1 := e.register("send_email@1")
	_, stepID := e.exhausted(w1, make([]int, items), 1)
	// Handler 1 is wholly FORBIDDEN: only an upgrade may run the step.
	e.publish("send_email", contractBody("1", map[string]any{"inputSchema": true, "status": "FORBIDDEN"}))
	e.publish("send_email", contractBody("2", map[string]any{"inputSchema": heavy(nil)}))                           // fits
	e.publish("send_email", contractBody("2", map[string]any{"inputSchema": heavy(map[string]any{"maxItems": 1})})) // does not

	p := e.preview(stepID)
	require.Equal(t, true, p["handlerVersionForbidden"])
	ups := p["upgrades"].([]any)
	require.Len(t, ups, 3)
	newest, fits := ups[0].(map[string]any), ups[1].(map[string]any)
	require.EqualValues(t, 3, newest["contractVersion"])
	require.Equal(t, false, newest["compatible"], "checked: it spent more than half the budget")
	require.Equal(t, true, newest["checked"], "it does not fit")
	require.Equal(t, "input", newest["validation"].([]any)[0].(map[string]any)["field"])
	require.NotContains(t, newest["validation"].([]any)[0].(map[string]any)["message"], "not checked")
	require.EqualValues(t, 2, fits["contractVersion"])
	require.Equal(t, false, fits["compatible"], "not checked: the budget left could not cover it")
	require.Equal(t, false, fits["checked"], "said without parsing a message")
	require.Len(t, fits["validation"], 1)
	notChecked := fits["validation"].([]any)[0].(map[string]any)
	require.Equal(t, "input", notChecked["field"])
	require.Contains(t, notChecked["message"], "was not checked")
	require.Equal(t, true, p["eligible"], "a target not checked may take the step, %v", p["ineligibleReason"])

	// A replay onto it checks it, within an enqueue's budget.
	res := e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, map[string]any{
		"acknowledgeDuplicateRisk": true, "targetContractVersion": 2, "expectedHandlerVersion": "1",
		"acknowledgeVersionChange": true}).JSON()
	require.Equal(t, "2", res["handlerVersion"])
}

// TestAReplayPreviewStaysWithinOneAnswer: the preview cuts its upgrades'
// validations (each to its first problems, as many as fit) to stay within
// one answer, keeping every upgrade and its compatible flag (QA: 100
// contracts refusing an input's 20 keys of 1 000 control characters, each
// path escaped six times over, answered 12 MB, more than the serverless
// platforms deliver). Here the budget holds about half the whole answer.
func TestAReplayPreviewStaysWithinOneAnswer(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	input := map[string]any{}
	for i := range 5 {
		input[fmt.Sprintf("%s%d", strings.Repeat("\u0001", 1000), i)] = i
	}
	enq := e.enqueue(e.run(), map[string]any{"name": "send_email", "version": "1", "input": input})
	stepID := enq["stepId"].(string)
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/cancel", e.ws.Key, nil)
	for range 3 {
		e.publish("send_email", map[string]any{"handlerVersion": "2",
			"inputSchema": map[string]any{"type": "object", "additionalProperties": false}})
	}
	whole := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, nil)
	for _, u := range whole.JSON()["upgrades"].([]any) {
		require.Len(t, u.(map[string]any)["validation"], 5)
	}
	budget := len(whole.Body) / 2
	r := withBudget(t, e.Env, budget).Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, nil)
	require.LessOrEqual(t, len(bytes.TrimSpace(r.Body)), budget)
	p := r.JSON()
	require.Equal(t, true, p["eligible"])
	ups := p["upgrades"].([]any)
	require.Len(t, ups, 3, "every upgrade is kept")
	for _, u := range ups {
		u := u.(map[string]any)
		require.Equal(t, false, u["compatible"])
		v := u["validation"].([]any)
		require.NotEmpty(t, v, "each keeps its first problems")
		require.Less(t, len(v), 5)
		require.Equal(t, whole.JSON()["upgrades"].([]any)[0].(map[string]any)["validation"].([]any)[0], v[0])
	}
}

// A page of a step's replays after a cursor naming none of its replays
// (another step's replay) is refused, 400 naming cursor, as a cursor not
// from the list is: it read after nothing and answered an empty last page,
// so a walk handed the wrong cursor ended there with the step's replays
// unread (QA). The step's own last replay still ends the walk, empty.
func TestAStepsReplaysRefuseAnotherStepsReplayAsCursor(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	_, first := e.exhausted(wid, 1, 1)
	_, second := e.exhausted(wid, 2, 1)
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+first+"/replay", e.ws.Key, ack)
	e.Must(http.StatusOK, "POST", "/api/v1/steps/"+second+"/replay", e.ws.Key, ack)
	replayOf := func(stepID string) string {
		data := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID+"/replays", e.ingest, nil).JSON()["data"].([]any)
		require.Len(t, data, 1)
		return data[0].(map[string]any)["id"].(string)
	}
	own, others := replayOf(first), replayOf(second)

	end := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+first+"/replays?cursor="+own, e.ingest, nil).JSON()
	require.Empty(t, end["data"])
	require.Nil(t, end["nextCursor"])
	r := e.Do("GET", "/api/v1/steps/"+first+"/replays?cursor="+others, e.ingest, nil)
	require.Equal(t, []string{"cursor"}, validationFields(t, r), "%s", r.Body)
	require.Equal(t, "The request is invalid: cursor is not a cursor from this API.",
		r.JSON()["error"].(map[string]any)["message"])
	// Another workspace's step is still not found, whatever the cursor.
	stranger := e.Signup()
	require.Equal(t, http.StatusNotFound, e.Do("GET", "/api/v1/steps/"+first+"/replays?cursor="+others, stranger.Key,
		nil).Status)
}
