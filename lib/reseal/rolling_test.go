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
