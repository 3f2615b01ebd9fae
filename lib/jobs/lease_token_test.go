package jobs_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// storedTokens reads the lease token a job and its current attempt keep.
func (b *bundle) storedTokens(t *testing.T, jobID string) (onJob, onAttempt string) {
	t.Helper()
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `
SELECT j.lease_token, x.lease_token FROM jobs j
JOIN job_executions x ON x.job_id = j.id AND x.attempt = j.attempt WHERE j.id = $1`, jobID).Scan(&onJob, &onAttempt))
	return onJob, onAttempt
}

// storedForm is how a lease token is kept since migration 0032: its
// SHA-256, in hex.
func storedForm(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// A claim answers its lease token but the database keeps only the token's
// SHA-256 (migration 0032), and presenting what is kept proves nothing: a
// database reader cannot heartbeat or report another worker's job.
func TestJobLeaseTokensAreStoredHashed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, b.run(t), jobs.EnqueueRequest{})
	j := b.claimOne(t, b.register(t))
	hashed := storedForm(j.LeaseToken)
	onJob, onAttempt := b.storedTokens(t, j.JobID)
	require.Equal(t, hashed, onJob)
	require.Equal(t, hashed, onAttempt)

	_, err := b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: hashed})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	_, err = b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: hashed, Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	require.Equal(t, "RUNNING", b.step(t, j.StepID).Status)

	_, err = b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
	require.NoError(t, err)
	require.Equal(t, "SUCCEEDED", b.succeed(t, j).Status)
	require.Equal(t, "SUCCEEDED", b.succeed(t, j).Status, "a repeated report answers the same")
}

// legacyClaim claims one job as the previous release does during a deploy:
// through jobs_claim, which 0032 keeps and which stores the token in clear.
func (b *bundle) legacyClaim(t *testing.T, workerID string) jobs.ClaimedJob {
	t.Helper()
	now := b.clock.Now()
	var j jobs.ClaimedJob
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `
SELECT id, step_id, lease_token FROM jobs_claim($1, $2, $3, $4, 1, 10000, $5, 'lapsed')`,
		workerID, b.ws, now, b.worker.KeyID, now.Truncate(time.Minute)).Scan(&j.JobID, &j.StepID, &j.LeaseToken))
	return j
}

// Tokens stored in clear, by claims made before the upgrade or by the
// previous release while a deploy replaces it, keep working: heartbeats,
// reports and their repeats, and the cancelled attempt's heartbeat.
func TestLeaseTokensStoredInClearStillWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`{"n":1}`)})
	b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`{"n":2}`)})
	w := b.register(t)

	done := b.legacyClaim(t, w)
	onJob, onAttempt := b.storedTokens(t, done.JobID)
	require.Equal(t, done.LeaseToken, onJob, "the previous release's claim keeps the token in clear")
	require.Equal(t, done.LeaseToken, onAttempt)
	_, err := b.svc.Heartbeat(ctx, b.worker, done.JobID, jobs.HeartbeatRequest{LeaseToken: done.LeaseToken})
	require.NoError(t, err)
	require.Equal(t, "SUCCEEDED", b.succeed(t, done).Status)
	require.Equal(t, "SUCCEEDED", b.succeed(t, done).Status, "a repeated report answers the same")

	cancelled := b.legacyClaim(t, w)
	_, err = b.svc.CancelStep(ctx, b.ws, cancelled.StepID)
	require.NoError(t, err)
	hb, err := b.svc.Heartbeat(ctx, b.worker, cancelled.JobID, jobs.HeartbeatRequest{LeaseToken: cancelled.LeaseToken})
	require.NoError(t, err)
	require.True(t, hb.CancelRequested)
	_, err = b.svc.Heartbeat(ctx, b.worker, cancelled.JobID, jobs.HeartbeatRequest{LeaseToken: "nope"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	require.Equal(t, "CANCELLED", b.fail(t, cancelled, &jobs.ReportError{Message: "stopped"}).Status)
}
