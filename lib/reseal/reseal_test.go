package reseal_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"os"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/reseal"
	"github.com/getratchet/ratchet/lib/seal"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// The tests share the package's database and a run covers all of it, so
// they run one after another and each starts from empty tables (the kept
// answers' too: a run re-seals every test's, and one left under another
// key made the next test's count under the old key alone incomplete).
func fresh(t *testing.T, opts ...apitest.Option) *apitest.Env {
	t.Helper()
	env := apitest.Start(t, opts...)
	_, err := env.App.Pool.Exec(context.Background(),
		`TRUNCATE effects, jobs, job_executions, webhooks, idempotent_requests, seal_keys CASCADE`)
	require.NoError(t, err)
	return env
}

func key(b byte) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) }

// oldKey is apitest's key; newKey is the one rotated to.
var oldKey, newKey = key(7), key(9)

func sealer(t *testing.T, current string, older ...string) *seal.Sealer {
	t.Helper()
	s, err := (&config.Config{ResultEncryptionKey: current, ResultEncryptionKeys: older}).Sealer()
	require.NoError(t, err)
	return s
}

// fill writes a value into every sealed column through the API under the
// old key (two rows into each of jobs' and executions' columns), and returns
// the effect whose result and the input of the step left queued that are
// read back after the rotation.
func fill(t *testing.T, env *apitest.Env, ws apitest.Workspace) (effectID string, queued map[string]any) {
	t.Helper()
	r := env.DoWith("POST", "/api/v1/webhooks", ws.Key, http.Header{"Idempotency-Key": {"hook-1"}},
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}})
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	// Rotated: its previous secret is sealed too (kept, expired or not,
	// until the next rotation replaces it).
	env.Must(http.StatusOK, "POST", "/api/v1/webhooks/"+r.JSON()["id"].(string)+"/rotate-secret", ws.Key, nil)
	group := env.Must(http.StatusCreated, "POST", "/api/v1/groups", ws.Key, map[string]any{"name": "g"}).JSON()["id"]
	d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{
		"effect_type": "email.send", "idempotency_key": "welcome:1", "payload": map[string]any{"to": "user_1"},
		"group_id": group, "compensation": map[string]any{"effect_type": "email.retract"},
	}).JSON()
	require.Equal(t, "execute", d["decision"])
	effectID = d["effect_id"].(string)
	env.Must(http.StatusOK, "POST", "/api/v1/effects/"+effectID+"/report", ws.Key,
		map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded", "result": map[string]any{"id": "msg_1"}})

	runID := env.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key, map[string]any{"name": "r"}).JSON()["id"].(string)
	inputs := map[string]bool{"a": true, "b": true, "c": true, "d": true}
	for _, k := range []string{"a", "b", "c", "d"} {
		env.Must(http.StatusCreated, "POST", "/api/v1/runs/"+runID+"/steps", ws.Key, map[string]any{
			"name": "send", "version": "1", "idempotencyKey": "step:" + k, "input": map[string]any{"step": k}})
	}
	worker := env.Must(http.StatusCreated, "POST", "/api/v1/workers/register", ws.Key,
		map[string]any{"tools": []any{map[string]any{"name": "send", "version": "1"}}}).JSON()["workerId"].(string)
	claim := func() map[string]any {
		jobs := env.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
			map[string]any{"limit": 1}).JSON()["jobs"].([]any)
		require.Len(t, jobs, 1)
		job := jobs[0].(map[string]any)
		delete(inputs, job["input"].(map[string]any)["step"].(string))
		return job
	}
	report := func(job map[string]any, body map[string]any) {
		body["leaseToken"] = job["leaseToken"]
		env.Must(http.StatusOK, "POST", "/api/v1/jobs/"+job["jobId"].(string)+"/report", ws.Key, body)
	}
	report(claim(), map[string]any{"status": "FAILED", "error": map[string]any{"message": "boom", "retryable": false}})
	report(claim(), map[string]any{"status": "FAILED", "error": map[string]any{"message": "later", "retryable": true}})
	report(claim(), map[string]any{"status": "SUCCEEDED", "output": map[string]any{"sent": true}})
	report(claim(), map[string]any{"status": "SUCCEEDED", "output": map[string]any{"sent": false}})
	// A fifth step stays queued.
	env.Must(http.StatusCreated, "POST", "/api/v1/runs/"+runID+"/steps", ws.Key, map[string]any{
		"name": "send", "version": "1", "idempotencyKey": "step:e", "input": map[string]any{"step": "e"}})
	return effectID, map[string]any{"step": "e"}
}

// byColumn indexes a report.
func byColumn(rep reseal.Report) map[string]reseal.ColumnReport {
	m := map[string]reseal.ColumnReport{}
	for _, c := range rep.Columns {
		m[c.Column] = c
	}
	return m
}

func TestRotationReachesEveryColumnAndOldKeyCanGo(t *testing.T) {
	ctx := context.Background()
	before := fresh(t)
	ws := before.Signup()
	effectID, queued := fill(t, before, ws)
	pool := before.App.Pool

	// Under the old key alone, everything is current.
	rep, err := reseal.New(pool, sealer(t, oldKey)).Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.Complete)

	// Rotated: the new key seals, the old one still opens. Each of the nine
	// columns holds at least one ciphertext under the old key.
	rotated := sealer(t, newKey, oldKey)
	rep, err = reseal.New(pool, rotated).Check(ctx)
	require.NoError(t, err)
	require.False(t, rep.Complete)
	cols := byColumn(rep)
	require.Len(t, cols, 9)
	for name, c := range cols {
		require.Positive(t, c.Older, name)
		require.Zero(t, c.Current+c.Unknown, name)
	}

	// One row per batch: every column is walked across batch boundaries.
	r := reseal.New(pool, rotated)
	r.SetBatch(1)
	run, err := r.Run(ctx)
	require.NoError(t, err)
	require.True(t, run.Complete)
	for _, c := range run.Columns {
		require.Equal(t, cols[c.Column].Older, c.Resealed, c.Column)
		require.Zero(t, c.Skipped+c.Unknown+c.Corrupt, c.Column)
	}
	rep, err = reseal.New(pool, rotated).Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.Complete)
	for _, c := range rep.Columns {
		require.Equal(t, cols[c.Column].Older, c.Current, c.Column)
	}

	// A second run has nothing to do.
	again, err := reseal.New(pool, rotated).Run(ctx)
	require.NoError(t, err)
	for _, c := range again.Columns {
		require.Zero(t, c.Resealed, c.Column)
	}

	// An instance with only the new key reads what the old key sealed: the
	// effect's result, and the queued step's input when it is claimed.
	after := apitest.Start(t, apitest.WithConfig(func(c *config.Config) {
		c.ResultEncryptionKey, c.ResultEncryptionKeys = newKey, nil
	}))
	e := after.Must(http.StatusOK, "GET", "/api/v1/effects/"+effectID, ws.Key, nil).JSON()
	require.Equal(t, map[string]any{"id": "msg_1"}, e["result"])
	worker := after.Must(http.StatusCreated, "POST", "/api/v1/workers/register", ws.Key,
		map[string]any{"tools": []any{map[string]any{"name": "send", "version": "1"}}}).JSON()["workerId"].(string)
	jobs := after.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", ws.Key,
		map[string]any{"limit": 10}).JSON()["jobs"].([]any)
	require.Len(t, jobs, 1)
	require.Equal(t, queued, jobs[0].(map[string]any)["input"])
	// The webhook create's kept answer is given again under the new key.
	hook := after.DoWith("POST", "/api/v1/webhooks", ws.Key, http.Header{"Idempotency-Key": {"hook-1"}},
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}})
	require.Equal(t, http.StatusCreated, hook.Status, "%s", hook.Body)
	require.Equal(t, "true", hook.Header.Get("Idempotent-Replayed"))
	// The sealed compensation, error and output open under the new key too:
	// Run opened each with its own associated data (Corrupt is zero above)
	// and sealed it again with the same.
}

// A deleted webhook's secrets are erased with it (migration 0065), so a
// reseal has nothing of it to re-seal, and one sealed under a key gone
// since no longer keeps a rotation incomplete: only the live webhook's
// current and previous secrets are walked.
func TestAResealPassesOverADeletedWebhook(t *testing.T) {
	ctx := context.Background()
	env := fresh(t)
	ws := env.Signup()
	pool := env.App.Pool
	hooks := map[string]string{}
	for _, name := range []string{"live", "deleted", "lost"} {
		id := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
			map[string]any{"url": "https://example.com/" + name, "events": []string{"run.finished"}}).JSON()["id"].(string)
		env.Must(http.StatusOK, "POST", "/api/v1/webhooks/"+id+"/rotate-secret", ws.Key, nil)
		hooks[name] = id
	}
	// Sealed under a key no instance has any more.
	_, err := pool.Exec(ctx, `UPDATE webhooks SET secret = $2, previous_secret = $2 WHERE id = $1`, hooks["lost"],
		sealer(t, key(5)).Seal([]byte("whsec_lost"), seal.AAD(hooks["lost"], "secret")))
	require.NoError(t, err)
	for _, name := range []string{"deleted", "lost"} {
		env.Must(http.StatusOK, "DELETE", "/api/v1/webhooks/"+hooks[name], ws.Key, nil)
	}

	rotated := sealer(t, newKey, oldKey)
	run, err := reseal.New(pool, rotated).Run(ctx)
	require.NoError(t, err)
	for _, column := range []string{"webhooks.secret", "webhooks.previous_secret"} {
		c := byColumn(run)[column]
		require.Equal(t, reseal.ColumnReport{Column: column, Resealed: 1, Current: 1}, c, "the live webhook's alone")
	}
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM webhooks WHERE id = ANY ($1)
		AND (secret IS NOT NULL OR previous_secret IS NOT NULL)`, []string{hooks["deleted"], hooks["lost"]}).Scan(&left))
	require.Zero(t, left, "nothing re-sealed into a deleted webhook's row")
}

func TestUnknownKeysAndBusyRowsAreLeftAndReported(t *testing.T) {
	ctx := context.Background()
	env := fresh(t)
	ws := env.Signup()
	effectID, _ := fill(t, env, ws)
	pool := env.App.Pool

	// One effect's payload sealed with a key nobody configured any more,
	// another's garbled under the old key's header.
	lost := sealer(t, key(3))
	_, err := pool.Exec(ctx, `UPDATE effects SET payload = $1 WHERE id = $2`,
		lost.Seal([]byte(`{"to":"user_1"}`), seal.AAD(effectID, "payload")), effectID)
	require.NoError(t, err)
	d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{
		"effect_type": "email.send", "idempotency_key": "welcome:2", "payload": map[string]any{"to": "user_2"}}).JSON()
	garbled := d["effect_id"].(string)
	oldID := seal.KeyID(bytes.Repeat([]byte{7}, 32))
	junk := append(append([]byte{1}, oldID[:]...), bytes.Repeat([]byte{0xee}, 40)...)
	_, err = pool.Exec(ctx, `UPDATE effects SET payload = $1 WHERE id = $2`, junk, garbled)
	require.NoError(t, err)

	// A request holds a job's row while the rotation runs: that row is
	// skipped (never waited for) and left under the old key.
	var busyJob string
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM jobs WHERE workspace_id = $1 AND status = 'QUEUED'`, ws.ID).Scan(&busyJob))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, busyJob)
	require.NoError(t, err)

	rotated := sealer(t, newKey, oldKey)
	run, err := reseal.New(pool, rotated).Run(ctx)
	require.NoError(t, err)
	require.False(t, run.Complete)
	cols := byColumn(run)
	require.Equal(t, int64(1), cols["effects.payload"].Unknown)
	require.Equal(t, int64(1), cols["effects.payload"].Corrupt)
	require.Equal(t, []reseal.DamagedValue{{Table: "effects", Column: "payload", Key: map[string]string{"id": garbled}}},
		run.Damaged, "the garbled one named; the one under an unknown key is no damage")
	require.Equal(t, int64(1), cols["jobs.input_sealed"].Skipped)
	require.Positive(t, cols["jobs.input_sealed"].Resealed)

	// Released, the busy row is resealed by the next run; the two that
	// cannot be opened stay as they were and keep the rotation incomplete.
	require.NoError(t, tx.Rollback(ctx))
	run, err = reseal.New(pool, rotated).Run(ctx)
	require.NoError(t, err)
	cols = byColumn(run)
	require.Equal(t, int64(1), cols["jobs.input_sealed"].Resealed)
	require.Zero(t, cols["jobs.input_sealed"].Skipped)
	require.False(t, run.Complete)
	var payload []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT payload FROM effects WHERE id = $1`, garbled).Scan(&payload))
	require.Equal(t, junk, payload)
	check, err := reseal.New(pool, rotated).Check(ctx)
	require.NoError(t, err)
	require.False(t, check.Complete)
	// Check reads headers only: the garbled one names the old key.
	require.Equal(t, int64(1), byColumn(check)["effects.payload"].Unknown)
	require.Equal(t, int64(1), byColumn(check)["effects.payload"].Older)
}

// TestEveryByteaColumnIsKnown keeps the column list whole: a new bytea
// column is either sealed (and belongs to reseal's list) or a hash.
func TestEveryByteaColumnIsKnown(t *testing.T) {
	env := apitest.Start(t)
	rows, err := env.App.Pool.Query(context.Background(), `
SELECT table_name || '.' || column_name FROM information_schema.columns
WHERE table_schema = current_schema() AND data_type = 'bytea' ORDER BY 1`)
	require.NoError(t, err)
	var all []string
	for rows.Next() {
		var c string
		require.NoError(t, rows.Scan(&c))
		all = append(all, c)
	}
	require.NoError(t, rows.Err())
	hashes := []string{"api_keys.secret_hash", "effects.lease_token_hash", "effect_attempts.lease_token_hash",
		"jobs.request_hash", "idempotent_requests.request_hash"}
	want := append(reseal.SealedColumns(), hashes...)
	sort.Strings(want)
	require.Equal(t, want, all)
}

// A row written between the run's read and its write (a report sealing a
// result under the current key) keeps what was written.
func TestRowChangedMeanwhileKeepsItsNewValue(t *testing.T) {
	ctx := context.Background()
	env := fresh(t)
	ws := env.Signup()
	effectID, _ := fill(t, env, ws)
	pool := env.App.Pool

	rotated := sealer(t, newKey, oldKey)
	written := rotated.Seal([]byte(`{"id":"msg_2"}`), seal.AAD(effectID, "result"))
	r := reseal.New(pool, rotated)
	r.BeforeWrite(func(column string) {
		if column == "effects.result" {
			_, err := pool.Exec(ctx, `UPDATE effects SET result = $1 WHERE id = $2`, written, effectID)
			require.NoError(t, err)
		}
	})
	run, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), byColumn(run)["effects.result"].Skipped)
	require.True(t, run.Complete, "what was written meanwhile is under the current key")
	var result []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT result FROM effects WHERE id = $1`, effectID).Scan(&result))
	require.Equal(t, written, result)
	check, err := reseal.New(pool, rotated).Check(ctx)
	require.NoError(t, err)
	require.True(t, check.Complete)
}

// A ciphertext sealed with the old key behind the walk (an instance still
// running the old settings) keeps the rotation incomplete: the verdict
// comes from a count after the walk, not from what the walk met.
func TestOldKeyWritesBehindTheWalkKeepItIncomplete(t *testing.T) {
	ctx := context.Background()
	env := fresh(t)
	ws := env.Signup()
	fill(t, env, ws)
	pool := env.App.Pool
	lagging, rotated := sealer(t, oldKey), sealer(t, newKey, oldKey)
	r := reseal.New(pool, rotated)
	var late string
	r.BeforeWrite(func(column string) {
		if column != "webhooks.secret" || late != "" {
			return
		}
		d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{
			"effect_type": "email.send", "idempotency_key": "late:1", "payload": map[string]any{"to": "u"}}).JSON()
		late = d["effect_id"].(string)
		_, err := pool.Exec(ctx, `UPDATE effects SET result = $1 WHERE id = $2`,
			lagging.Seal([]byte(`{"id":"late"}`), seal.AAD(late, "result")), late)
		require.NoError(t, err)
	})
	run, err := r.Run(ctx)
	require.NoError(t, err)
	require.False(t, run.Complete)
	require.Equal(t, int64(1), byColumn(run)["effects.result"].Older)
	again, err := reseal.New(pool, rotated).Run(ctx)
	require.NoError(t, err)
	require.True(t, again.Complete)
	require.Equal(t, int64(1), byColumn(again)["effects.result"].Resealed)
}
