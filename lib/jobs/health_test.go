package jobs_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

func (b *bundle) health(t *testing.T) jobs.QueueHealth {
	t.Helper()
	h, err := b.svc.QueueHealth(ctx, b.ws, "", 10)
	require.NoError(t, err)
	require.Len(t, h, 1)
	return h[0]
}

// A lapsed job keeps its own concurrency slot and a claim takes it back
// past the limit (jobs_claim_keyed): its endpoint does not hold it, and
// queue health does not say so (QA: it blamed maxConcurrent for a job the
// next claim took at once). A job that would need a new slot is held.
func TestQueueHealthDoesNotBlameTheLimitForALapsedJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.limitedEndpoint(t, "mailer", 1)
	runID := b.run(t)
	st := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000),
		Input: json.RawMessage(`1`)})
	wid := b.register(t)
	first := b.claimOne(t, wid)
	b.clock.Add(11500 * time.Millisecond) // past the timeout and the grace

	h := b.health(t)
	require.Equal(t, int64(1), h.Queued)
	require.Equal(t, int64(1), h.Due)
	require.Empty(t, h.AtLimitEndpoints, "the lapsed job holds the slot itself")
	require.Nil(t, h.Message, "nothing holds the queue")

	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`2`)})
	h = b.health(t)
	require.Equal(t, int64(2), h.Queued)
	require.Equal(t, []string{"mailer"}, h.AtLimitEndpoints, "the new job waits for the slot")
	require.Contains(t, *h.Message, "Endpoint mailer runs as many jobs as its maxConcurrent allows")

	again := b.claim(t, wid, 2)
	require.Len(t, again, 1, "the lapsed job only: the other waits for its slot")
	require.Equal(t, first.JobID, again[0].JobID)
	require.Equal(t, st.JobID, again[0].JobID)
	require.Equal(t, 2, again[0].Attempt)
}

// Several endpoints at their limits are named in one sentence whose
// grammar fits a list (QA: "Endpoint a, b runs … its maxConcurrent").
func TestQueueHealthNamesSeveralEndpointsAtTheirLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	for _, ep := range []string{"a", "b"} {
		b.limitedEndpoint(t, ep, 1)
		b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(ep), Input: json.RawMessage(`"` + ep + `1"`)})
	}
	b.clock.Add(time.Millisecond) // the first two are claimed first
	for _, ep := range []string{"a", "b"} {
		b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(ep), Input: json.RawMessage(`"` + ep + `2"`)})
	}
	require.Len(t, b.claim(t, b.register(t), 4), 2, "one per endpoint")

	h := b.health(t)
	require.Equal(t, []string{"a", "b"}, h.AtLimitEndpoints)
	require.Equal(t, "Endpoints a, b each run as many jobs as their maxConcurrent allows: the others wait for one "+
		"to end (raise the limits if the services can take more).", *h.Message)
}

// The limits hold only jobs that are due: a job waiting for its time (a
// delayed enqueue, a retry) is not held by a full endpoint or this minute's
// used-up rate, which may be over when it comes due, and queue health does
// not name them for it (QA: a job due tomorrow read as held by the limit).
func TestQueueHealthNamesTheLimitsOnlyForDueJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "mailer",
		PolicyFields: jobs.PolicyFields{MaxConcurrent: opt[int64](1), RateLimitPerMinute: opt[int64](1)}})
	require.NoError(t, err)
	require.Equal(t, "mailer", e.Name)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`1`),
		TimeoutMs: ptr[int64](600_000)})
	b.claimOne(t, b.register(t))
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`2`),
		DelayMs: ptr[int64](120_000)})

	h := b.health(t)
	require.Equal(t, int64(1), h.Queued)
	require.Equal(t, int64(0), h.Due)
	require.Empty(t, h.AtLimitEndpoints, "the delayed job is not due: no slot holds it")
	require.Empty(t, h.RateLimitedEndpoints, "nor this minute's rate")
	require.Nil(t, h.Message, "nothing holds the queue")

	b.clock.Add(2 * time.Minute) // due now, the first still running; a new minute
	h = b.health(t)
	require.Equal(t, int64(1), h.Due)
	require.Equal(t, []string{"mailer"}, h.AtLimitEndpoints, "the due job waits for the slot")
	require.Empty(t, h.RateLimitedEndpoints, "a new minute's allowance is unused")
}

// A worker whose key was revoked never claims again (401), so queue health
// does not count it as serving its version, however recently it polled,
// and says plainly that none does (jobs QA: it counted for two minutes
// after the revoke, message null, while nothing could take the jobs).
func TestQueueHealthDoesNotCountTheWorkersOfARevokedKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, b.run(t), jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
	b.register(t) // seen as it registers
	h := b.health(t)
	require.Equal(t, int64(1), h.WorkersSeen)
	require.Nil(t, h.Message)

	_, err := b.env.App.Pool.Exec(ctx, `UPDATE api_keys SET revoked_at = $2 WHERE id = $1`, b.worker.KeyID,
		b.clock.Now())
	require.NoError(t, err)
	h = b.health(t)
	require.Zero(t, h.WorkersSeen, "its worker polled a moment ago, but can never claim again")
	require.NotNil(t, h.Message)
	require.Contains(t, *h.Message, "No worker serving send_email@1 has polled in the last 2 minutes under a key "+
		"that is not revoked")
}
