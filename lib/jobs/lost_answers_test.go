package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// Job reports whose answers were lost, repeated after the sweeper ran and
// the job moved on (retry QA): each repeat answers what the first did,
// changes nothing, and leases nothing more. Not parallel: the sweep is
// global.
func TestJobReportsRepeatedAfterASweepAnswerTheSame(t *testing.T) {
	b := setup(t)
	runID := b.run(t)
	enq := b.enqueue(t, runID, jobs.EnqueueRequest{TimeoutMs: ptr[int64](5_000)})
	w := b.register(t)

	// A retryable failure, repeated after its retry fell due and a sweep.
	j := b.claimOne(t, w)
	first := b.fail(t, j, &jobs.ReportError{Message: "x"})
	require.Equal(t, "RETRY_SCHEDULED", first.Status)
	b.clock.Add(time.Hour)
	b.sweep(t)
	require.Equal(t, first, b.fail(t, j, &jobs.ReportError{Message: "x"}))
	j2 := b.claimOne(t, w)
	require.Equal(t, 2, j2.Attempt, "the repeat scheduled no second retry")

	// A success that completed the finished run, repeated after a sweep.
	done := b.succeed(t, j2)
	_, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	b.clock.Add(time.Hour)
	b.sweep(t)
	require.Equal(t, done, b.succeed(t, j2))
	run, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err, "a repeated finish answers the run")
	require.Equal(t, "SUCCEEDED", run.Status)
	require.Equal(t, "SUCCEEDED", b.step(t, enq.StepID).Status)

	// A late success (its lease lapsed, nobody claimed the job since),
	// repeated after a sweep: the same answer, and nothing left to claim.
	late := b.enqueue(t, b.run(t), jobs.EnqueueRequest{TimeoutMs: ptr[int64](5_000)})
	j3 := b.claimOne(t, w)
	b.clock.Add(time.Minute)
	b.sweep(t)
	l1 := b.succeed(t, j3)
	b.sweep(t)
	require.Equal(t, l1, b.succeed(t, j3))
	require.Equal(t, "SUCCEEDED", b.step(t, late.StepID).Status)
	require.Empty(t, b.claim(t, w, 5))
	_, err = b.svc.Heartbeat(ctx, b.worker, j3.JobID, jobs.HeartbeatRequest{LeaseToken: j3.LeaseToken})
	require.Equal(t, apierr.CodeInvalidState, code(t, err), "its heartbeat's repeat says the job ended")
}
