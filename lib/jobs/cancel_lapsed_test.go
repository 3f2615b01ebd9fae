package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// A cancel of a step whose last attempt's lease lapsed finds it ended, as
// any read of it would: the lapse ends it EXHAUSTED first (its
// step.exhausted saying the attempt lapsed, so its side effect may have
// happened), and the cancel is refused as of an ended step (jobs QA: with
// no read before it, the cancel made it CANCELLED and no step.exhausted
// went out, while a GET just before would have read EXHAUSTED and turned
// the same cancel down).
func TestACancelFindsALapsedLastAttemptEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.run(t)
	st := b.enqueue(t, run, jobs.EnqueueRequest{MaxAttempts: ptr[int64](1)})
	b.claimOne(t, b.register(t))
	b.clock.Add(time.Hour) // past the lease

	_, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	require.Contains(t, err.Error(), "EXHAUSTED")
	require.Equal(t, jobs.StatusExhausted, b.step(t, st.StepID).Status)
	var lapsed string
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT data->>'leaseLapsed' FROM events
		WHERE type = 'step.exhausted' AND subject_id = $1`, st.StepID).Scan(&lapsed))
	require.Equal(t, "true", lapsed)

	// An attempt that is not the last, lapsed, is still cancelled: the job
	// has not ended (a claim may take it again).
	again := b.enqueue(t, b.run(t), jobs.EnqueueRequest{MaxAttempts: ptr[int64](2)})
	b.claimOne(t, b.register(t))
	b.clock.Add(time.Hour)
	got, err := b.svc.CancelStep(ctx, b.ws, again.StepID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCancelled, got.Status)
}
