package jobs_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
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

// A claim answers every job's input whole, and serverless platforms refuse
// an answer over a few megabytes (losing the claim with its leases): a
// claim stops adding jobs before their sealed inputs pass the budget, but
// always answers one, and grants endpoint slots only to what it answers.
func TestAClaimStopsBeforeItsInputsPassTheBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEndpoint(t, "mailer", jobs.PolicyFields{MaxConcurrent: opt[int64](10)})
	runID := b.run(t)
	var steps []string
	for i := range 5 {
		input := json.RawMessage(fmt.Sprintf(`{"n":%d,"body":%q}`, i, strings.Repeat("x", 1000)))
		steps = append(steps, b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: input}).StepID)
		b.clock.Add(time.Millisecond) // claims take them in this order
	}
	var size int64
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT octet_length(input_sealed) FROM jobs WHERE step_id = $1`,
		steps[0]).Scan(&size))
	running := func() (n int) {
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT running_count FROM job_endpoints
			WHERE workspace_id = $1 AND name = 'mailer'`, b.ws).Scan(&n))
		return n
	}

	jobs.SetClaimInputBudget(b.svc, 2*size+size/2)
	w := b.register(t)
	first := b.claim(t, w, 10)
	require.Len(t, first, 2)
	require.Equal(t, []string{steps[0], steps[1]}, []string{first[0].StepID, first[1].StepID})
	require.Equal(t, 2, running(), "slots go only to the jobs answered")

	jobs.SetClaimInputBudget(b.svc, 1) // less than any input: still one job
	require.Len(t, b.claim(t, w, 10), 1)
	require.Equal(t, 3, running())

	jobs.SetClaimInputBudget(b.svc, jobs.ClaimInputBudget)
	require.Len(t, b.claim(t, w, 10), 2, "the rest")
	require.Equal(t, 5, running())
}
