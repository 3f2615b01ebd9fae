package reseal_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/reseal"
)

// A value that fails to open under the key it names (damaged at rest, copied
// from another row or column, or no ciphertext at all) is named by its
// table, primary key and column: the run counted it corrupt and never
// reported complete, and nothing said which row it was, so the old key
// could never go (review). Nulled as README's rotation steps say (or its
// row deleted), the rotation completes.
func TestDamagedValuesAreNamed(t *testing.T) {
	ctx := context.Background()
	env := fresh(t)
	ws := env.Signup()
	effectID, _ := fill(t, env, ws)
	pool := env.App.Pool
	idemKey := "damaged-" + ids.New(ids.Request)
	created := env.DoWith("POST", "/api/v1/webhooks", ws.Key, http.Header{"Idempotency-Key": {idemKey}},
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}})
	require.Equal(t, http.StatusCreated, created.Status, "%s", created.Body)
	var apiKeyID string
	require.NoError(t, pool.QueryRow(ctx, `SELECT key_id FROM idempotent_requests WHERE request_id = $1`,
		created.Header.Get("X-Request-Id")).Scan(&apiKeyID))
	hookID := created.JSON()["id"].(string)

	// An effect's payload copied into its result; one attempt's error copied
	// into another job's; a kept answer with a byte flipped; a previous
	// secret that is no ciphertext.
	_, err := pool.Exec(ctx, `UPDATE effects SET result = payload WHERE id = $1`, effectID)
	require.NoError(t, err)
	var jobs []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(job_id ORDER BY job_id) FROM job_executions
		WHERE error_sealed IS NOT NULL AND attempt = 1`).Scan(&jobs))
	require.Len(t, jobs, 2)
	_, err = pool.Exec(ctx, `UPDATE job_executions SET error_sealed = (SELECT error_sealed FROM job_executions
		WHERE job_id = $2 AND attempt = 1) WHERE job_id = $1 AND attempt = 1`, jobs[0], jobs[1])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE idempotent_requests
		SET answer = set_byte(answer, length(answer) - 1, get_byte(answer, length(answer) - 1) # 1)
		WHERE key_id = $1 AND idempotency_key = $2`, apiKeyID, idemKey)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE webhooks SET previous_secret = '\x01'::bytea,
		previous_secret_expires_at = now() + interval '1 day' WHERE id = $1`, hookID)
	require.NoError(t, err)
	want := []reseal.DamagedValue{
		{Table: "effects", Column: "result", Key: map[string]string{"id": effectID}},
		{Table: "job_executions", Column: "error_sealed", Key: map[string]string{"job_id": jobs[0], "attempt": "1"}},
		{Table: "webhooks", Column: "previous_secret", Key: map[string]string{"id": hookID}},
		{Table: "idempotent_requests", Column: "answer",
			Key: map[string]string{"key_id": apiKeyID, "idempotency_key": idemKey}},
	}

	rotated := sealer(t, newKey, oldKey)
	// Bounded: the first two named, all four counted.
	r := reseal.New(pool, rotated)
	r.SetMaxDamaged(2)
	run, err := r.Run(ctx)
	require.NoError(t, err)
	require.False(t, run.Complete)
	require.Equal(t, want[:2], run.Damaged, "in column order")
	var corrupt int64
	for _, c := range run.Columns {
		corrupt += c.Corrupt
	}
	require.Equal(t, int64(4), corrupt)
	require.Equal(t, `job_executions.error_sealed attempt="1" job_id="`+jobs[0]+`"`, run.Damaged[1].String())

	run, err = reseal.New(pool, rotated).Run(ctx)
	require.NoError(t, err)
	require.False(t, run.Complete)
	require.Equal(t, want, run.Damaged, "named again: nothing mends them")
	check, err := reseal.New(pool, rotated).Check(ctx)
	require.NoError(t, err)
	require.NotNil(t, check.Damaged, "a count names none, as [] in JSON")
	require.Empty(t, check.Damaged)

	// The remedies README gives, then the rotation completes.
	_, err = pool.Exec(ctx, `UPDATE effects SET result = NULL WHERE id = $1`, effectID)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE job_executions SET error_sealed = NULL WHERE job_id = $1 AND attempt = 1`, jobs[0])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE webhooks SET previous_secret = NULL, previous_secret_expires_at = NULL
		WHERE id = $1`, hookID)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE idempotent_requests SET answer = NULL, status = 404
		WHERE key_id = $1 AND idempotency_key = $2`, apiKeyID, idemKey)
	require.NoError(t, err)
	run, err = reseal.New(pool, rotated).Run(ctx)
	require.NoError(t, err)
	require.True(t, run.Complete, "%+v", run)
	require.Empty(t, run.Damaged)
	// The nulled result reads as none (README says so: a duplicate's caller
	// would take it for the recorded result).
	effect := env.Must(http.StatusOK, "GET", "/api/v1/effects/"+effectID, ws.Key, nil).JSON()
	require.Nil(t, effect["result"])
	require.Equal(t, false, effect["result_unreadable"])
	// The create sent again is answered as an erased answer is, not acted on.
	again := env.DoWith("POST", "/api/v1/webhooks", ws.Key, http.Header{"Idempotency-Key": {idemKey}},
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}})
	require.Equal(t, http.StatusNotFound, again.Status, "%s", again.Body)
}
