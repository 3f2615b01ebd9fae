package reseal_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/seal"
)

// An attempt's error message sealed with a key this instance lacks (removed
// before a reseal reached it) reads as errorMessageUnreadable, its message
// null, and every read that lists it answers the rest: the run, its steps'
// page, the step, the endpoint's attempts (seal QA: the one message failed
// each of them with 500, so an operator could not see the run at all). The
// read logs the job, the attempt and the key id, never the message; an
// instance configured with the key reads the message again.
func TestAnUnreadableErrorMessageLeavesTheRestReadable(t *testing.T) {
	var logs apitest.LockedBuffer
	env := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := context.Background()
	ws := env.Signup()
	runID := env.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key, map[string]any{"name": "r"}).JSON()["id"].(string)
	steps := map[string]map[string]any{}
	for _, k := range []string{"a", "b"} {
		steps[k] = env.Must(http.StatusCreated, "POST", "/api/v1/runs/"+runID+"/steps", ws.Key, map[string]any{
			"name": "send", "version": "1", "idempotencyKey": "step:" + k, "input": map[string]any{"step": k},
			"maxAttempts": 1}).JSON()
	}
	worker := registerSender(t, env, ws)
	jobs := env.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
		map[string]any{"limit": 2}).JSON()["jobs"].([]any)
	require.Len(t, jobs, 2)
	for _, j := range jobs {
		j := j.(map[string]any)
		env.Must(http.StatusOK, "POST", "/api/v1/jobs/"+j["jobId"].(string)+"/report", ws.Key, map[string]any{
			"leaseToken": j["leaseToken"], "status": "FAILED",
			"error": map[string]any{"message": "boom " + j["input"].(map[string]any)["step"].(string), "retryable": false}})
	}
	lostJob := steps["a"]["jobId"].(string)
	gone := sealer(t, key(3))
	_, err := env.App.Pool.Exec(ctx, `UPDATE job_executions SET error_sealed = $2 WHERE job_id = $1 AND attempt = 1`,
		lostJob, gone.Seal([]byte("boom a"), seal.AAD(lostJob, "error/1")))
	require.NoError(t, err)

	// attempts finds each step's first attempt in a list of steps.
	attempts := func(list []any) map[string]map[string]any {
		out := map[string]map[string]any{}
		for _, s := range list {
			s := s.(map[string]any)
			out[s["id"].(string)] = s["durableJob"].(map[string]any)["attempts"].([]any)[0].(map[string]any)
		}
		return out
	}
	requireRead := func(got map[string]map[string]any, lost bool) {
		t.Helper()
		a, b := got[steps["a"]["stepId"].(string)], got[steps["b"]["stepId"].(string)]
		if lost {
			require.Nil(t, a["errorMessage"])
			require.Equal(t, true, a["errorMessageUnreadable"])
		} else {
			require.Equal(t, "boom a", a["errorMessage"])
			require.Equal(t, false, a["errorMessageUnreadable"])
		}
		require.Equal(t, "FAILED", a["outcome"], "the rest of the attempt reads")
		require.Equal(t, "boom b", b["errorMessage"])
		require.Equal(t, false, b["errorMessageUnreadable"])
	}
	run := env.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID, ws.Key, nil).JSON()
	require.Equal(t, "FAILED", run["status"])
	requireRead(attempts(run["steps"].([]any)), true)
	page := env.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID+"/steps", ws.Key, nil).JSON()
	requireRead(attempts(page["data"].([]any)), true)
	step := env.Must(http.StatusOK, "GET", "/api/v1/steps/"+steps["a"]["stepId"].(string), ws.Key, nil).JSON()
	require.Equal(t, true, attempts([]any{step})[steps["a"]["stepId"].(string)]["errorMessageUnreadable"])
	endpoint := env.Must(http.StatusOK, "GET", "/api/v1/endpoints", ws.Key, nil).JSON()["data"].([]any)[0].(map[string]any)
	listed := env.Must(http.StatusOK, "GET", "/api/v1/endpoints/"+endpoint["id"].(string)+"/attempts", ws.Key, nil).JSON()
	byStep := map[string]map[string]any{}
	for _, a := range listed["data"].([]any) {
		byStep[a.(map[string]any)["stepId"].(string)] = a.(map[string]any)
	}
	requireRead(byStep, true)

	goneID := seal.KeyID(bytes.Repeat([]byte{3}, 32))
	line := "attempts' error messages this instance cannot open"
	require.Equal(t, 4, strings.Count(logs.String(), line), "once a read: %s", logs.String())
	require.Contains(t, logs.String(), "job_id="+lostJob+" attempt=1 key_id="+hex.EncodeToString(goneID[:]))
	require.NotContains(t, logs.String(), "boom")

	withKey := instance(t, oldKey, key(3))
	run = withKey.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID, ws.Key, nil).JSON()
	requireRead(attempts(run["steps"].([]any)), false)
}

// goneKeyID is the hex id of key(3), the key the tests seal values with
// that no instance but those they start with it is configured with.
func goneKeyID() string {
	id := seal.KeyID(bytes.Repeat([]byte{3}, 32))
	return hex.EncodeToString(id[:])
}

// requireUnreadableValue asserts r is the 500 of a request that had to use
// a value this instance cannot open: internal_error saying so, its detail
// the request id alone.
func requireUnreadableValue(t *testing.T, r *apitest.Response) {
	t.Helper()
	require.Equal(t, http.StatusInternalServerError, r.Status, "%s", r.Body)
	e := r.JSON()["error"].(map[string]any)
	require.Equal(t, "internal_error", e["code"])
	require.Contains(t, e["message"], "encrypted with a key this server is not configured with")
	require.Equal(t, []string{"request_id"}, slices.Collect(maps.Keys(e["detail"].(map[string]any))))
}

// An effect's result sealed with a key this instance lacks reads null with
// result_unreadable, the rest of the effect as ever, on its own read as in
// the list (seal QA: the read of the effect answered 500, its operator
// unable to see its state or attempts at all). The read logs the effect
// and the key id, never the value. A begin on its key, which would hand the
// result over as a duplicate's, answers 500 saying a stored value is
// unreadable instead of a duplicate without its result; an instance
// configured with the key reads and answers the result again.
func TestAnUnreadableResultReadsAsResultUnreadable(t *testing.T) {
	var logs apitest.LockedBuffer
	env := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := context.Background()
	ws := env.Signup()
	id := writeEffect(t, env, ws, "lost:1")
	kept := writeEffect(t, env, ws, "kept:1")
	gone := sealer(t, key(3))
	_, err := env.App.Pool.Exec(ctx, `UPDATE effects SET result = $2 WHERE id = $1`, id,
		gone.Seal([]byte(`{"id":"secret-result"}`), seal.AAD(id, "result")))
	require.NoError(t, err)

	e := env.Must(http.StatusOK, "GET", "/api/v1/effects/"+id, ws.Key, nil).JSON()
	require.Nil(t, e["result"])
	require.Equal(t, true, e["result_unreadable"])
	require.Equal(t, "succeeded", e["state"], "the rest of the effect reads")
	require.Len(t, e["attempts"], 1)
	k := env.Must(http.StatusOK, "GET", "/api/v1/effects/"+kept, ws.Key, nil).JSON()
	require.Equal(t, map[string]any{"id": "kept:1"}, k["result"])
	require.Equal(t, false, k["result_unreadable"])
	listed := map[string]any{}
	for _, l := range env.Must(http.StatusOK, "GET", "/api/v1/effects", ws.Key, nil).JSON()["data"].([]any) {
		listed[l.(map[string]any)["id"].(string)] = l.(map[string]any)["result_unreadable"]
	}
	require.Equal(t, map[string]any{id: true, kept: false}, listed)
	require.Contains(t, logs.String(), `effect result this instance cannot open reads as result_unreadable" `+
		"effect_id="+id+" key_id="+goneKeyID())
	require.Contains(t, logs.String(), `effect results this instance cannot open read as result_unreadable" `+
		"count=1 effect_id="+id+" key_id="+goneKeyID())

	again := map[string]any{"effect_type": "email.send", "idempotency_key": "lost:1", "payload": map[string]any{"to": "lost:1"}}
	requireUnreadableValue(t, env.Do("POST", "/api/v1/effects/begin", ws.Key, again))
	require.Contains(t, logs.String(), "open result of effect "+id+": seal: ciphertext sealed with a key that is "+
		"not configured (key id "+goneKeyID()+")")
	require.NotContains(t, logs.String(), "secret-result")

	withKey := instance(t, oldKey, key(3))
	e = withKey.Must(http.StatusOK, "GET", "/api/v1/effects/"+id, ws.Key, nil).JSON()
	require.Equal(t, map[string]any{"id": "secret-result"}, e["result"])
	require.Equal(t, false, e["result_unreadable"])
	d := withKey.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, again).JSON()
	require.Equal(t, "duplicate", d["decision"])
	require.Equal(t, map[string]any{"id": "secret-result"}, d["result"])
}

// A group step's compensation sealed with a key this instance lacks fails
// what must use it, each changing nothing, with a 500 saying a stored value
// is unreadable (seal QA: a bare 500 internal_error, nothing telling the
// caller or its operator why): the unwind, whose plan would otherwise
// offer the steps behind it first, or that compensation without its
// payload; the begin sent again for that step, which compares the
// compensation it declares with the stored one; and a compensating begin,
// checked against it. The group stays open, and an instance with the key
// plans, and compensates, as ever.
func TestAnUnreadableCompensationFailsWhatMustUseIt(t *testing.T) {
	var logs apitest.LockedBuffer
	env := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := context.Background()
	ws := env.Signup()
	group := env.Must(http.StatusCreated, "POST", "/api/v1/groups", ws.Key, map[string]any{"name": "g"}).JSON()["id"].(string)
	begins := map[string]map[string]any{}
	steps := map[string]string{}
	for _, k := range []string{"a", "b"} {
		begins[k] = map[string]any{"effect_type": "email.send", "idempotency_key": "step:" + k,
			"payload": map[string]any{"to": k}, "group_id": group,
			"compensation": map[string]any{"effect_type": "email.retract", "payload": map[string]any{"secret": "undo-" + k}}}
		d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, begins[k]).JSON()
		require.Equal(t, "execute", d["decision"])
		steps[k] = d["effect_id"].(string)
		env.Must(http.StatusOK, "POST", "/api/v1/effects/"+steps[k]+"/report", ws.Key,
			map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded"})
	}
	gone := sealer(t, key(3))
	_, err := env.App.Pool.Exec(ctx, `UPDATE effects SET compensation = $2 WHERE id = $1`, steps["a"],
		gone.Seal([]byte(`{"effect_type":"email.retract","payload":{"secret":"undo-a"}}`), seal.AAD(steps["a"], "compensation")))
	require.NoError(t, err)
	compensate := map[string]any{"effect_type": "email.retract", "idempotency_key": "compensate:" + steps["a"],
		"payload": map[string]any{"secret": "undo-a"}, "compensates_effect_id": steps["a"]}

	requireUnreadableValue(t, env.Do("POST", "/api/v1/effects/begin", ws.Key, begins["a"]))
	requireUnreadableValue(t, env.Do("POST", "/api/v1/groups/"+group+"/unwind", ws.Key, nil))
	g := env.Must(http.StatusOK, "GET", "/api/v1/groups/"+group, ws.Key, nil).JSON()
	require.Equal(t, "open", g["state"], "the refused unwind changed nothing")
	require.Nil(t, g["unwind_started_at"])
	require.Contains(t, logs.String(), "open compensation of effect "+steps["a"]+": seal: ciphertext sealed with a key "+
		"that is not configured (key id "+goneKeyID()+")")
	require.NotContains(t, logs.String(), "undo-a")

	withKey := instance(t, oldKey, key(3))
	u := withKey.Must(http.StatusOK, "POST", "/api/v1/groups/"+group+"/unwind", ws.Key, nil).JSON()
	require.Equal(t, "unwinding", u["state"])
	plan := map[string]any{}
	for _, item := range u["plan"].([]any) {
		plan[item.(map[string]any)["effect_id"].(string)] = item.(map[string]any)["compensation"]
	}
	require.Equal(t, map[string]any{"effect_type": "email.retract", "payload": map[string]any{"secret": "undo-a"}},
		plan[steps["a"]])
	require.Len(t, plan, 2)
	requireUnreadableValue(t, env.Do("POST", "/api/v1/effects/begin", ws.Key, compensate))
	require.Equal(t, "execute", withKey.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		compensate).JSON()["decision"])
}

// A step whose saved input is sealed with a key this instance lacks still
// previews its replay, with inputUnreadable and no upgrade shown to fit
// (seal QA: the preview answered 500, eligibility and all); a replay onto
// another contract, which must validate that input, answers 500 saying a
// stored value is unreadable and leaves the step as it was. The run and
// step reads, which never open inputs or outputs, answer as ever. An
// instance with the key previews the upgrade as fitting.
func TestAnUnreadableInputStillPreviewsItsReplay(t *testing.T) {
	var logs apitest.LockedBuffer
	env := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := context.Background()
	ws := env.Signup()
	env.Must(http.StatusCreated, "POST", "/api/v1/tools/send/contracts", ws.Key, map[string]any{
		"handlerVersion": "2", "inputSchema": map[string]any{"type": "object"}, "outputSchema": map[string]any{}})
	step := enqueueStep(t, env, ws, "a", 1)
	jobID, stepID := step["jobId"].(string), step["stepId"].(string)
	worker := registerSender(t, env, ws)
	jobs := env.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
		map[string]any{"limit": 1}).JSON()["jobs"].([]any)
	require.Len(t, jobs, 1)
	env.Must(http.StatusOK, "POST", "/api/v1/jobs/"+jobID+"/report", ws.Key, map[string]any{
		"leaseToken": jobs[0].(map[string]any)["leaseToken"], "status": "FAILED",
		"error": map[string]any{"message": "boom", "retryable": false}})
	gone := sealer(t, key(3))
	_, err := env.App.Pool.Exec(ctx, `UPDATE jobs SET input_sealed = $2, output_sealed = $3 WHERE id = $1`, jobID,
		gone.Seal([]byte(`{"step":"secret-input"}`), seal.AAD(jobID, "input")),
		gone.Seal([]byte(`{"sent":"secret-output"}`), seal.AAD(jobID, "output")))
	require.NoError(t, err)

	p := env.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID+"/replay", ws.Key, nil).JSON()
	require.Equal(t, true, p["inputUnreadable"])
	require.Equal(t, true, p["eligible"])
	require.Equal(t, []any{map[string]any{"contractVersion": float64(1), "handlerVersion": "2", "status": "ACTIVE",
		"compatible": false, "forbidden": false, "checked": false, "validation": []any{}}}, p["upgrades"])
	require.Contains(t, logs.String(), "job_id="+jobID+" key_id="+goneKeyID())
	requireUnreadableValue(t, env.Do("POST", "/api/v1/steps/"+stepID+"/replay", ws.Key, map[string]any{
		"acknowledgeDuplicateRisk": true, "targetContractVersion": 1, "expectedHandlerVersion": "1",
		"acknowledgeVersionChange": true}))
	s := env.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID, ws.Key, nil).JSON()
	require.Equal(t, "EXHAUSTED", s["status"], "the refused replay changed nothing")
	require.Equal(t, "1", s["version"])
	env.Must(http.StatusOK, "GET", "/api/v1/runs/"+s["runId"].(string), ws.Key, nil)
	require.NotContains(t, logs.String(), "secret-input")

	p = instance(t, oldKey, key(3)).Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID+"/replay", ws.Key, nil).JSON()
	require.Equal(t, false, p["inputUnreadable"])
	require.Equal(t, true, p["upgrades"].([]any)[0].(map[string]any)["compatible"])
	require.Equal(t, true, p["upgrades"].([]any)[0].(map[string]any)["checked"])
}

// A create sent again under its Idempotency-Key, whose kept answer is
// sealed with a key this instance lacks, is refused with the 500 that says
// a stored value is unreadable, and is not carried out again: the same
// request through an instance with the key answers the kept answer.
func TestAnUnreadableKeptAnswerIsNotActedOnAgain(t *testing.T) {
	env := fresh(t)
	ctx := context.Background()
	ws := env.Signup()
	create := func(env *apitest.Env) *apitest.Response {
		return env.DoWith("POST", "/api/v1/webhooks", ws.Key, http.Header{"Idempotency-Key": {"hook-1"}},
			map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}})
	}
	first := create(env)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	// The row of this request (others' keys used hook-1 before).
	requestID := first.Header.Get("X-Request-Id")
	var keyID string
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT key_id FROM idempotent_requests WHERE request_id = $1`,
		requestID).Scan(&keyID))
	_, err := env.App.Pool.Exec(ctx, `UPDATE idempotent_requests SET answer = $2 WHERE request_id = $1`, requestID,
		sealer(t, key(3)).Seal(first.Body, idempotency.AnswerAAD(keyID, "hook-1")))
	require.NoError(t, err)

	requireUnreadableValue(t, create(env))
	var hooks int
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM webhooks WHERE workspace_id = $1`, ws.ID).
		Scan(&hooks))
	require.Equal(t, 1, hooks, "not created again")
	again := create(instance(t, oldKey, key(3)))
	require.Equal(t, http.StatusCreated, again.Status, "%s", again.Body)
	require.Equal(t, first.JSON()["id"], again.JSON()["id"])
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
}

// A same-version replay of a step whose saved input this instance cannot
// open is refused as a replay onto another contract is, changing nothing
// (seal QA: it was queued, every claim then leased the job, failed to open
// it, rolled back and passed over it, logging so each time, while the run
// read RUNNING again and step.replayed went out for a step no claim could
// hand over). A missing key answers the 500 that says so, under an
// Idempotency-Key too, and the same request through an instance with the
// key replays the step, whose claim hands the input over. An input damaged
// under a key the instance has, which no key mends, is refused with a bare
// 500 and changes nothing either; both previews read inputUnreadable.
func TestASameVersionReplayOfAnUnreadableInputChangesNothing(t *testing.T) {
	var logs apitest.LockedBuffer
	env := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := context.Background()
	ws := env.Signup()
	worker := registerSender(t, env, ws)
	// failed enqueues a step of one attempt and fails it, unretryably.
	failed := func(k string) (jobID, stepID string) {
		step := enqueueStep(t, env, ws, k, 1)
		jobs := env.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
			map[string]any{"limit": 1}).JSON()["jobs"].([]any)
		require.Len(t, jobs, 1)
		jobID, stepID = step["jobId"].(string), step["stepId"].(string)
		require.Equal(t, jobID, jobs[0].(map[string]any)["jobId"])
		env.Must(http.StatusOK, "POST", "/api/v1/jobs/"+jobID+"/report", ws.Key, map[string]any{
			"leaseToken": jobs[0].(map[string]any)["leaseToken"], "status": "FAILED",
			"error": map[string]any{"message": "boom", "retryable": false}})
		return jobID, stepID
	}
	// state is what a replay changes: the job, its run, its audit and events.
	state := func(jobID, stepID string) []any {
		var job, run string
		var attempt, maxAttempts, replays, replayed int
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT j.status, j.attempt, j.max_attempts, r.status,
		    (SELECT count(*) FROM job_replays x WHERE x.job_id = j.id),
		    (SELECT count(*) FROM events e WHERE e.type = 'step.replayed' AND e.subject_id = $2)
		    FROM jobs j JOIN job_runs r ON r.id = j.run_id WHERE j.id = $1`, jobID, stepID).
			Scan(&job, &attempt, &maxAttempts, &run, &replays, &replayed))
		return []any{job, attempt, maxAttempts, run, replays, replayed}
	}
	replay := func(env *apitest.Env, stepID string) *apitest.Response {
		return env.DoWith("POST", "/api/v1/steps/"+stepID+"/replay", ws.Key,
			http.Header{"Idempotency-Key": {"replay:" + stepID}},
			map[string]any{"acknowledgeDuplicateRisk": true, "expectedAttempt": 1, "expectedHandlerVersion": "1"})
	}

	lostJob, lostStep := failed("lost")
	_, err := env.App.Pool.Exec(ctx, `UPDATE jobs SET input_sealed = $2 WHERE id = $1`, lostJob,
		sealer(t, key(3)).Seal([]byte(`{"step":"secret-input"}`), seal.AAD(lostJob, "input")))
	require.NoError(t, err)
	before := state(lostJob, lostStep)
	require.Equal(t, []any{"EXHAUSTED", 1, 1, "FAILED", 0, 0}, before)
	p := env.Must(http.StatusOK, "GET", "/api/v1/steps/"+lostStep+"/replay", ws.Key, nil).JSON()
	require.Equal(t, true, p["inputUnreadable"])
	requireUnreadableValue(t, replay(env, lostStep))
	requireUnreadableValue(t, replay(env, lostStep)) // sent again: refused again, not a kept answer
	require.Equal(t, before, state(lostJob, lostStep), "the refused replay changed nothing")
	require.Contains(t, logs.String(), "open input of job "+lostJob+": seal: ciphertext sealed with a key that is "+
		"not configured (key id "+goneKeyID()+")")
	require.NotContains(t, logs.String(), "secret-input")

	withKey := instance(t, oldKey, key(3))
	r := replay(withKey, lostStep)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, "QUEUED", r.JSON()["status"])
	require.Equal(t, []any{"QUEUED", 1, 2, "RUNNING", 1, 1}, state(lostJob, lostStep))
	jobs := withKey.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
		map[string]any{"limit": 1}).JSON()["jobs"].([]any)
	require.Len(t, jobs, 1)
	require.Equal(t, map[string]any{"step": "secret-input"}, jobs[0].(map[string]any)["input"])

	// Damaged under the key this instance seals with: its tag no longer checks.
	damagedJob, damagedStep := failed("damaged")
	var sealed []byte
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT input_sealed FROM jobs WHERE id = $1`, damagedJob).
		Scan(&sealed))
	sealed[len(sealed)-1] ^= 1
	_, err = env.App.Pool.Exec(ctx, `UPDATE jobs SET input_sealed = $2 WHERE id = $1`, damagedJob, sealed)
	require.NoError(t, err)
	before = state(damagedJob, damagedStep)
	p = env.Must(http.StatusOK, "GET", "/api/v1/steps/"+damagedStep+"/replay", ws.Key, nil).JSON()
	require.Equal(t, true, p["inputUnreadable"])
	require.Equal(t, true, p["eligible"], "what its state allows")
	d := replay(env, damagedStep)
	require.Equal(t, http.StatusInternalServerError, d.Status, "%s", d.Body)
	require.Equal(t, "internal_error", d.ErrorCode())
	require.NotContains(t, d.JSON()["error"].(map[string]any)["message"], "not configured with",
		"no key mends it: not the message that asks for one")
	require.Equal(t, before, state(damagedJob, damagedStep), "the refused replay changed nothing")
	require.Contains(t, logs.String(), "open input of job "+damagedJob+": seal: ciphertext failed authentication")
}
