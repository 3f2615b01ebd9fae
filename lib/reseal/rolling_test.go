package reseal_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/reseal"
	"github.com/getratchet/ratchet/lib/seal"
)

// During a rolling deploy an instance still running the settings before a
// rotation (the old key alone) serves a claim of a job an updated instance
// enqueued under the new key. It cannot open the input: the claim fails,
// saying which job and which key, and leases nothing, so the job is claimed
// at once from an instance that has the key, its attempts untouched (it
// was leased, its attempt spent, and a job of one attempt failed unrun).
func TestClaimOfAnInputUnderAMissingKeyLeasesNothing(t *testing.T) {
	ctx := context.Background()
	var logs apitest.LockedBuffer
	lagging := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ws := lagging.Signup()
	updated := apitest.Start(t, apitest.WithConfig(func(c *config.Config) {
		c.ResultEncryptionKey, c.ResultEncryptionKeys = newKey, []string{oldKey}
	}))
	runID := updated.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key, map[string]any{"name": "r"}).JSON()["id"].(string)
	step := updated.Must(http.StatusCreated, "POST", "/api/v1/runs/"+runID+"/steps", ws.Key, map[string]any{
		"name": "send", "version": "1", "idempotencyKey": "step:a", "input": map[string]any{"step": "a"},
		"maxAttempts": 1}).JSON()
	worker := lagging.Must(http.StatusCreated, "POST", "/api/v1/workers/register", ws.Key,
		map[string]any{"tools": []any{map[string]any{"name": "send", "version": "1"}}}).JSON()["workerId"].(string)

	r := lagging.Do("POST", "/api/v1/workers/"+worker+"/claim", ws.Key, map[string]any{"limit": 5})
	require.Equal(t, http.StatusInternalServerError, r.Status, "%s", r.Body)
	newID := seal.KeyID(bytes.Repeat([]byte{9}, 32))
	require.Contains(t, logs.String(), "open input of job ")
	require.Contains(t, logs.String(), "key id "+hex.EncodeToString(newID[:]))

	var status, token string
	var executions int
	require.NoError(t, lagging.App.Pool.QueryRow(ctx, `SELECT status, coalesce(lease_token, ''),
	    (SELECT count(*) FROM job_executions x WHERE x.job_id = j.id) FROM jobs j WHERE workspace_id = $1`,
		ws.ID).Scan(&status, &token, &executions))
	require.Equal(t, "QUEUED", status)
	require.Empty(t, token)
	require.Zero(t, executions)

	jobs := updated.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
		map[string]any{"limit": 5}).JSON()["jobs"].([]any)
	require.Len(t, jobs, 1)
	job := jobs[0].(map[string]any)
	require.Equal(t, map[string]any{"step": "a"}, job["input"])
	require.Equal(t, float64(1), job["attempt"])
	require.Equal(t, step["stepId"], job["stepId"])
}

// instance starts a service instance over the package database with the
// given keys, as one deployment of a rotation's steps runs.
func instance(t *testing.T, current string, others ...string) *apitest.Env {
	t.Helper()
	return apitest.Start(t, apitest.WithConfig(func(c *config.Config) {
		c.ResultEncryptionKey, c.ResultEncryptionKeys = current, others
	}))
}

// effectResult begins and reports an effect through one instance and
// reads it back through others.
func writeEffect(t *testing.T, env *apitest.Env, ws apitest.Workspace, key string) string {
	t.Helper()
	d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{
		"effect_type": "email.send", "idempotency_key": key, "payload": map[string]any{"to": key}}).JSON()
	require.Equal(t, "execute", d["decision"])
	id := d["effect_id"].(string)
	env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/report", ws.Key,
		map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded", "result": map[string]any{"id": key}})
	return id
}

// The README's rotation, step by step, with each step's deploy overlapping
// the one before it (a rolling restart): at every point every instance
// reads what any other wrote, claims what any other enqueued, and answers
// a duplicate begin with the stored result.
func TestTheDocumentedRotationKeepsEverythingReadable(t *testing.T) {
	ctx := context.Background()
	before := fresh(t)
	ws := before.Signup()
	effectID, queued := fill(t, before, ws)
	known := map[string]string{effectID: "msg_1"}

	step1 := instance(t, oldKey, newKey) // the new key known, not sealing
	step2 := instance(t, newKey, oldKey) // the new key sealing
	step4 := instance(t, newKey)         // the old key removed

	stepKeys := map[string]int{}
	enqueue := func(env *apitest.Env, k string) {
		runID := env.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key, map[string]any{"name": "r"}).JSON()["id"].(string)
		env.Must(http.StatusCreated, "POST", "/api/v1/runs/"+runID+"/steps", ws.Key, map[string]any{
			"name": "send", "version": "1", "idempotencyKey": "rot:" + k, "input": map[string]any{"step": k}})
		stepKeys[k] = 0
	}
	worker := before.Must(http.StatusCreated, "POST", "/api/v1/workers/register", ws.Key,
		map[string]any{"tools": []any{map[string]any{"name": "send", "version": "1"}}}).JSON()["workerId"].(string)
	claimAll := func(env *apitest.Env) {
		t.Helper()
		jobs := env.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
			map[string]any{"limit": 50}).JSON()["jobs"].([]any)
		for _, j := range jobs {
			job := j.(map[string]any)
			step := job["input"].(map[string]any)["step"].(string)
			if step == queued["step"] {
				delete(queued, "step")
			} else {
				delete(stepKeys, step)
			}
			env.Must(http.StatusOK, "POST", "/api/v1/jobs/"+job["jobId"].(string)+"/report", ws.Key, map[string]any{
				"leaseToken": job["leaseToken"], "status": "SUCCEEDED", "output": map[string]any{"step": step}})
		}
	}
	readAll := func(envs ...*apitest.Env) {
		t.Helper()
		for _, env := range envs {
			for id, want := range known {
				e := env.Must(http.StatusOK, "GET", "/api/v1/effects/"+id, ws.Key, nil).JSON()
				require.Equal(t, map[string]any{"id": want}, e["result"])
			}
		}
	}

	// Step 1 rolls out beside the instances before it.
	known[writeEffect(t, step1, ws, "s1")] = "s1"
	enqueue(step1, "s1")
	readAll(before, step1)
	// Step 2 rolls out beside step 1's instances: each reads and claims
	// what the other wrote.
	known[writeEffect(t, step2, ws, "s2")] = "s2"
	enqueue(step2, "s2")
	readAll(step1, step2)
	claimAll(step1)
	require.Empty(t, stepKeys)
	enqueue(step2, "s2b")
	enqueue(step1, "s1b")
	claimAll(step2)
	require.Empty(t, stepKeys)
	dup := step1.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{
		"effect_type": "email.send", "idempotency_key": "s2", "payload": map[string]any{"to": "s2"}}).JSON()
	require.Equal(t, "duplicate", dup["decision"])

	// Step 4's settings checked too early: what the old key sealed is
	// counted under an unknown key.
	early, err := reseal.New(before.App.Pool, sealer(t, newKey)).Check(ctx)
	require.NoError(t, err)
	require.False(t, early.Complete)
	require.Positive(t, byColumn(early)["effects.result"].Unknown)

	// Step 3: reseal until complete.
	rep, err := reseal.New(before.App.Pool, sealer(t, newKey, oldKey)).Run(ctx)
	require.NoError(t, err)
	require.True(t, rep.Complete, "%+v", rep)

	// Step 4: checked with its settings first, then the old key gone,
	// everything still opens.
	ready, err := reseal.New(before.App.Pool, sealer(t, newKey)).Check(ctx)
	require.NoError(t, err)
	require.True(t, ready.Complete)
	failed, err := reseal.Unopenable(ctx, before.App.Pool, sealer(t, newKey))
	require.NoError(t, err)
	require.Empty(t, failed)
	readAll(step2, step4)
	claimAll(step4)
	require.Empty(t, queued, "the step fill left queued was claimed")
	hook := step4.DoWith("POST", "/api/v1/webhooks", ws.Key, http.Header{"Idempotency-Key": {"hook-1"}},
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}})
	require.Equal(t, http.StatusCreated, hook.Status, "%s", hook.Body)
	require.Equal(t, "true", hook.Header.Get("Idempotent-Replayed"))
}

// Two runs at once (an operator's and a retried Lambda invocation, say)
// never overwrite each other's work or leave anything unopenable: the run
// that lost a row to the other counts it skipped, and both end complete.
func TestTwoRunsAtOnce(t *testing.T) {
	ctx := context.Background()
	env := fresh(t)
	ws := env.Signup()
	fill(t, env, ws)
	pool := env.App.Pool
	rotated := sealer(t, newKey, oldKey)
	before, err := reseal.New(pool, rotated).Check(ctx)
	require.NoError(t, err)

	first, second := reseal.New(pool, rotated), reseal.New(pool, rotated)
	first.SetBatch(1)
	var inner reseal.Report
	first.BeforeWrite(func(column string) {
		if column != "jobs.input_sealed" || inner.CurrentKeyID != "" {
			return
		}
		// The second run takes every row, the one the first is about
		// to write included.
		inner, err = second.Run(ctx)
		require.NoError(t, err)
	})
	outer, err := first.Run(ctx)
	require.NoError(t, err)
	require.True(t, outer.Complete)
	require.True(t, inner.Complete)
	b, o, i := byColumn(before), byColumn(outer), byColumn(inner)
	for name, c := range b {
		require.Equal(t, c.Older, o[name].Resealed+i[name].Resealed, name)
		require.Zero(t, o[name].Corrupt+i[name].Corrupt, name)
	}
	require.Equal(t, int64(1), o["jobs.input_sealed"].Skipped)
	// Everything opens with the new key alone.
	failed, err := reseal.Unopenable(ctx, pool, sealer(t, newKey))
	require.NoError(t, err)
	require.Empty(t, failed)
	total := int64(0)
	for _, c := range outer.Columns {
		total += c.Current
	}
	failed, err = reseal.Unopenable(ctx, pool, sealer(t, oldKey))
	require.NoError(t, err)
	require.Len(t, failed, int(total), "the old key alone opens none of it")
}
