package reseal_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/reseal"
	"github.com/getratchet/ratchet/lib/seal"
)

// During a rolling deploy an instance still running the settings before a
// rotation (the old key alone) serves a claim of a job an updated instance
// enqueued under the new key. It cannot open the input: it passes over the
// job, saying which job and which key, and leases nothing of it, so the job
// is claimed at once from an instance that has the key, its attempts
// untouched (session 42: the claim leased it, its attempt spent, and a job of
// one attempt failed unrun).
func TestClaimOfAnInputUnderAMissingKeyLeasesNothing(t *testing.T) {
	var logs apitest.LockedBuffer
	lagging := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ws := lagging.Signup()
	updated := instance(t, newKey, oldKey)
	step := enqueueStep(t, updated, ws, "a", 1)
	worker := registerSender(t, lagging, ws)

	r := lagging.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key, map[string]any{"limit": 5})
	require.Empty(t, r.JSON()["jobs"])
	newID := seal.KeyID(bytes.Repeat([]byte{9}, 32))
	require.Contains(t, logs.String(), "claim passed over a job whose input this instance cannot open")
	require.Contains(t, logs.String(), "job_id="+step["jobId"].(string))
	require.Contains(t, logs.String(), "key id "+hex.EncodeToString(newID[:]))
	require.NotContains(t, logs.String(), `"step":"a"`)
	requireUnleased(t, lagging, step["jobId"].(string))

	jobs := updated.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
		map[string]any{"limit": 5}).JSON()["jobs"].([]any)
	require.Len(t, jobs, 1)
	job := jobs[0].(map[string]any)
	require.Equal(t, map[string]any{"step": "a"}, job["input"])
	require.Equal(t, float64(1), job["attempt"])
	require.Equal(t, step["stepId"], job["stepId"])
}

// A job whose input no instance can open (its key removed before the value
// was resealed) no longer holds up the jobs behind it: every claim that
// reaches it passes over it and leases the next ones (session 42: each such
// claim failed with nothing leased, so no job behind it ever ran). The job
// itself stays queued, its attempts untouched, for when the key is back.
func TestAnUnreadableJobDoesNotHoldUpTheQueue(t *testing.T) {
	var logs apitest.LockedBuffer
	env := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ws := env.Signup()
	lost := enqueueStep(t, instance(t, newKey, oldKey), ws, "lost", 1) // newKey: on no instance below
	var behind []any
	for _, k := range []string{"b", "c", "d"} {
		behind = append(behind, enqueueStep(t, env, ws, k, 3)["jobId"])
	}
	worker := registerSender(t, env, ws)

	for range 2 { // a second claim passes over it again
		var got []any
		for _, j := range env.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
			map[string]any{"limit": 2}).JSON()["jobs"].([]any) {
			got = append(got, j.(map[string]any)["jobId"])
		}
		require.Equal(t, behind[:2], got)
		behind = behind[2:]
		if len(behind) == 0 {
			break
		}
		behind = append(behind, enqueueStep(t, env, ws, "e", 3)["jobId"])
	}
	require.Equal(t, 2, strings.Count(logs.String(), "job_id="+lost["jobId"].(string)))
	requireUnleased(t, env, lost["jobId"].(string))

	restored := instance(t, newKey, oldKey)
	jobs := restored.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
		map[string]any{"limit": 5}).JSON()["jobs"].([]any)
	require.Len(t, jobs, 1)
	require.Equal(t, lost["jobId"], jobs[0].(map[string]any)["jobId"])
	require.Equal(t, float64(1), jobs[0].(map[string]any)["attempt"])
}

// A claim passes over what it cannot open for a bounded number of rounds:
// one that meets nothing else fails then, with nothing leased, rather than
// walking a whole queue of jobs sealed under a key it lacks.
func TestAClaimGivesUpAfterItsSkipRounds(t *testing.T) {
	env := fresh(t)
	ws := env.Signup()
	updated := instance(t, newKey, oldKey)
	var lost []string
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		lost = append(lost, enqueueStep(t, updated, ws, k, 1)["jobId"].(string))
	}
	worker := registerSender(t, env, ws)

	requireUnreadableValue(t, env.Do("POST", "/api/v1/workers/"+worker+"/claim", ws.Key, map[string]any{"limit": 1}))
	for _, id := range lost {
		requireUnleased(t, env, id)
	}
	// A limit that reaches past them leases the job behind them.
	readable := enqueueStep(t, env, ws, "f", 1)["jobId"]
	jobs := env.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
		map[string]any{"limit": 3}).JSON()["jobs"].([]any)
	require.Len(t, jobs, 1)
	require.Equal(t, readable, jobs[0].(map[string]any)["jobId"])
}

// A long-polling claim passes over a job it cannot open once, and keeps
// passing over it for the rest of its wait: found again at each poll, it
// was leased and rolled back each time (its endpoint's row locked, its
// rate window counted, for nothing) and logged each time.
func TestALongPollPassesOverAnUnreadableJobOnce(t *testing.T) {
	var logs apitest.LockedBuffer
	env := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ws := env.Signup()
	lost := enqueueStep(t, instance(t, newKey, oldKey), ws, "lost", 1)["jobId"].(string)
	worker := registerSender(t, env, ws)

	r := env.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
		map[string]any{"limit": 1, "waitSeconds": 1}) // polls every 50 ms, then 100, 200…
	require.Empty(t, r.JSON()["jobs"])
	require.Equal(t, 1, strings.Count(logs.String(), "job_id="+lost), "%s", logs.String())
	requireUnleased(t, env, lost)
}

// A claim sent again under its claimId answers the jobs the first leased
// under it, whatever it is told to pass over: an instance that cannot open
// one of them answers 500 at once (the worker's next try may reach one
// that can), not after claiming the same jobs again for every round.
func TestAKeyedClaimsHeldJobItCannotOpenFailsAtOnce(t *testing.T) {
	var logs apitest.LockedBuffer
	lagging := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ws := lagging.Signup()
	updated := instance(t, newKey, oldKey)
	job := enqueueStep(t, updated, ws, "held", 1)["jobId"].(string)
	worker := registerSender(t, lagging, ws)
	claim := map[string]any{"limit": 1, "claimId": "c-1"}
	jobs := updated.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key, claim).JSON()["jobs"].([]any)
	require.Len(t, jobs, 1)

	requireUnreadableValue(t, lagging.Do("POST", "/api/v1/workers/"+worker+"/claim", ws.Key, claim))
	require.Equal(t, 1, strings.Count(logs.String(), "job_id="+job),
		"%s", logs.String())
	again := updated.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key, claim).JSON()["jobs"].([]any)
	require.Equal(t, jobs[0].(map[string]any)["leaseToken"], again[0].(map[string]any)["leaseToken"], "the same lease")
}

// enqueueStep enqueues a send@1 step of its own run through env, its input
// {"step": k}, and answers the enqueue's answer.
func enqueueStep(t *testing.T, env *apitest.Env, ws apitest.Workspace, k string, maxAttempts int) map[string]any {
	t.Helper()
	runID := env.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key, map[string]any{"name": "r"}).JSON()["id"].(string)
	return env.Must(http.StatusCreated, "POST", "/api/v1/runs/"+runID+"/steps", ws.Key, map[string]any{
		"name": "send", "version": "1", "idempotencyKey": "step:" + k, "input": map[string]any{"step": k},
		"maxAttempts": maxAttempts}).JSON()
}

// registerSender registers a worker of send@1 and answers its id.
func registerSender(t *testing.T, env *apitest.Env, ws apitest.Workspace) string {
	t.Helper()
	return env.Must(http.StatusCreated, "POST", "/api/v1/workers/register", ws.Key,
		map[string]any{"tools": []any{map[string]any{"name": "send", "version": "1"}}}).JSON()["workerId"].(string)
}

// requireUnleased asserts the job is queued, never leased: no token, no
// execution, no attempt spent.
func requireUnleased(t *testing.T, env *apitest.Env, jobID string) {
	t.Helper()
	var status, token string
	var attempt, executions int
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT status, coalesce(lease_token, ''), attempt,
	    (SELECT count(*) FROM job_executions x WHERE x.job_id = j.id) FROM jobs j WHERE id = $1`,
		jobID).Scan(&status, &token, &attempt, &executions))
	require.Equal(t, "QUEUED", status)
	require.Empty(t, token)
	require.Zero(t, attempt)
	require.Zero(t, executions)
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
	// Each instance reads the database's clock to within half a round
	// trip (db.Clock), so a job one enqueued may be due a millisecond
	// after the other's next claim: claim until both are in.
	require.Eventually(t, func() bool { claimAll(step2); return len(stepKeys) == 0 }, 5*time.Second, 20*time.Millisecond)
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
