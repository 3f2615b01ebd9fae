package jobs_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
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

// A cancel that waits for its job's row while the last attempt's lease
// lapses finds it ended all the same: it decides at the clock reading it
// records as the step's end, not at the one its first look read (QA: the
// look before the lock saw the lease held, and the cancel, granted the row
// after the expiry, made the lapsed job CANCELLED without its
// step.exhausted). Under an Idempotency-Key too, where the request's
// transaction has begun by the time the cancel finds the lapse: the end
// commits on its own, and the 409 answered rolls back none of it.
func TestACancelWaitingWhileTheLastLeaseLapsesFindsItEnded(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%t", keyed), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			run := b.run(t)
			st := b.enqueue(t, run, jobs.EnqueueRequest{MaxAttempts: ptr[int64](1), TimeoutMs: ptr[int64](1_000)})
			j := b.claimOne(t, b.register(t))

			got := b.lapseWhileWaiting(t, j.JobID, func() string {
				if keyed {
					return answerOf(b.env.DoWith("POST", "/api/v1/steps/"+st.StepID+"/cancel", b.op,
						http.Header{"Idempotency-Key": {"cancel-" + st.StepID}}, nil))
				}
				cancelled, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
				if err != nil {
					return code(t, err)
				}
				return cancelled.Status
			})
			require.Equal(t, apierr.CodeInvalidState, got, "the cancel finds the step ended")
			require.Equal(t, jobs.StatusExhausted, b.storedStatus(t, j.JobID), "ended by the cancel's look")
			require.Equal(t, "true", b.exhaustedLapsed(t, st.StepID))
			require.Equal(t, []string{"FAILED"}, b.runFinishedEvents(t, run))
		})
	}
}

// lapseWhileWaiting holds job jobID's row in a transaction of its own (as a
// report, or a read ending the job, would), sends a request that waits for
// it (send, in the background: its first look sees the job as it is), and
// once it waits moves the clock an hour on, past any lease, and lets it
// have the row. It answers what send answered.
func (b *bundle) lapseWhileWaiting(t *testing.T, jobID string, send func() string) string {
	t.Helper()
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, jobID)
	require.NoError(t, err)
	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, tx))
	sent, answer := make(chan struct{}), make(chan string, 1)
	go func() {
		defer close(sent)
		answer <- send()
	}()
	waits.Waiting(sent, "the request waits for the job's row")
	b.clock.Add(time.Hour) // the lease lapses while it waits
	require.NoError(t, tx.Commit(ctx))
	return <-answer
}

// answerOf is an HTTP answer's error code, or its status field.
func answerOf(r *apitest.Response) string {
	if c := r.ErrorCode(); c != "" {
		return c
	}
	return fmt.Sprint(r.JSON()["status"])
}

// storedStatus is job jobID's status as stored, not through a read of its
// step, which would end a lapsed job itself.
func (b *bundle) storedStatus(t *testing.T, jobID string) string {
	t.Helper()
	var status string
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT status FROM jobs WHERE id = $1`, jobID).Scan(&status))
	return status
}

// exhaustedLapsed is the leaseLapsed of step stepID's step.exhausted.
func (b *bundle) exhaustedLapsed(t *testing.T, stepID string) string {
	t.Helper()
	var lapsed string
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT data->>'leaseLapsed' FROM events
		WHERE type = 'step.exhausted' AND subject_id = $1`, stepID).Scan(&lapsed))
	return lapsed
}
