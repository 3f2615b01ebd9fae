package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

// A step's durableJob.dueAt is when a QUEUED or RETRY_SCHEDULED job is due
// and null in every other status. While RUNNING it is null too: the column
// keeps the due time the job was claimed at (a lapsed attempt reclaimed at
// once, the earlier attempt's), which a running step read as due in the
// past (QA). Its run's read and an enqueue deduplicated onto it say the
// same.
func TestARunningStepHasNoDueTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	req := jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000)}
	enq := b.enqueue(t, runID, req)
	require.NotNil(t, enq.DueAt)
	w := b.register(t)

	requireDue := func(status string, due *time.Time) {
		t.Helper()
		st := b.step(t, enq.StepID)
		require.Equal(t, status, st.DurableJob.Status)
		run := b.getRun(t, runID)
		require.Len(t, run.Steps, 1)
		again := b.enqueue(t, runID, req)
		require.True(t, again.Deduplicated)
		require.Equal(t, status, again.Status)
		if due == nil {
			require.Nil(t, st.DurableJob.DueAt, "%s: the step's read", status)
			require.Nil(t, run.Steps[0].DurableJob.DueAt, "%s: the run's read", status)
			require.Nil(t, again.DueAt, "%s: the deduplicated enqueue's answer", status)
			return
		}
		requireTime(t, *due, *st.DurableJob.DueAt)
		requireTime(t, *due, *run.Steps[0].DurableJob.DueAt)
		requireTime(t, *due, *again.DueAt)
	}
	requireDue(jobs.StatusQueued, enq.DueAt)

	j := b.claimOne(t, w)
	requireDue(jobs.StatusRunning, nil)
	r := b.fail(t, j, &jobs.ReportError{Message: "provider unavailable"})
	requireDue(jobs.StatusRetryScheduled, r.NextDueAt)

	b.clock.Add(r.NextDueAt.Sub(b.clock.Now()))
	j = b.claimOne(t, w)
	require.Equal(t, 2, j.Attempt)
	requireDue(jobs.StatusRunning, nil)

	// Its lease lapses and a claim takes the job again at once, RUNNING
	// throughout.
	b.clock.Add(j.LeaseExpiresAt.Sub(b.clock.Now()) + time.Millisecond)
	j = b.claimOne(t, w)
	require.Equal(t, 3, j.Attempt)
	requireDue(jobs.StatusRunning, nil)

	b.succeed(t, j)
	requireDue(jobs.StatusSucceeded, nil)
}
