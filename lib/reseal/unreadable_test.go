package reseal_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
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

// An effect's result sealed with a key this instance lacks fails the read
// of that effect (the effect object has no way to say its result is
// missing, and the result is what a reader of one effect asks for) with a
// 500 whose log line names the effect and the key id, never the value;
// the effects list, which shows redacted previews only, still answers it.
func TestAnUnreadableResultFailsItsOwnReadNamingEffectAndKey(t *testing.T) {
	var logs apitest.LockedBuffer
	env := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := context.Background()
	ws := env.Signup()
	id := writeEffect(t, env, ws, "lost:1")
	writeEffect(t, env, ws, "kept:1")
	gone := sealer(t, key(3))
	_, err := env.App.Pool.Exec(ctx, `UPDATE effects SET result = $2 WHERE id = $1`, id,
		gone.Seal([]byte(`{"id":"secret-result"}`), seal.AAD(id, "result")))
	require.NoError(t, err)

	r := env.Do("GET", "/api/v1/effects/"+id, ws.Key, nil)
	require.Equal(t, http.StatusInternalServerError, r.Status, "%s", r.Body)
	goneID := seal.KeyID(bytes.Repeat([]byte{3}, 32))
	require.Contains(t, logs.String(), "open result of effect "+id+": seal: ciphertext sealed with a key that is "+
		"not configured (key id "+hex.EncodeToString(goneID[:])+")")
	require.NotContains(t, logs.String(), "secret-result")

	list := env.Must(http.StatusOK, "GET", "/api/v1/effects", ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, list, 2)
}
