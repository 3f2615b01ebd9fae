package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// At most one attempt of a step runs at a time (migration 0060). A step
// cancelled while it ran and replayed before its attempt ended is QUEUED at
// once, but no claim takes it while that attempt may still run: until its
// worker reports, or its lease expires. It was claimable at once (except on
// an endpoint with maxConcurrent), while the cancelled attempt's worker,
// told to stop only at its next heartbeat, could still be calling the
// service (replay QA).

// On an endpoint without limits: a heartbeat telling the worker to stop
// does not end the attempt (the worker is still at work: it heartbeats);
// its report does, and the next claim takes the job.
func TestAReplayedStepWaitsForItsCancelledAttemptsReport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000)})
	wid := b.register(t)
	first := b.claimOne(t, wid)
	b.cancelAndReplay(t, st.StepID)
	require.Equal(t, "QUEUED", b.step(t, st.StepID).Status)
	require.Empty(t, b.claim(t, wid, 5), "the cancelled attempt may still run")

	hb, err := b.svc.Heartbeat(ctx, b.worker, first.JobID, jobs.HeartbeatRequest{LeaseToken: first.LeaseToken})
	require.NoError(t, err)
	require.True(t, hb.CancelRequested)
	b.clock.Add(first.LeaseExpiresAt.Sub(b.clock.Now()) - time.Millisecond) // the last moment of its lease
	require.Empty(t, b.claim(t, wid, 5), "told to stop, its worker may still be at work")
	h := b.health(t)
	require.Equal(t, int64(1), h.Queued)
	require.Zero(t, h.Due, "due at the attempt's lease expiry")
	require.NotNil(t, h.Message)
	require.Equal(t, "On endpoint send_email, a replayed job waits for its cancelled attempt, which may still be "+
		"running, to report or its lease to expire.", *h.Message)

	r, err := b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken, Status: "FAILED",
		Error: &jobs.ReportError{Message: "stopped: cancelled"}})
	require.NoError(t, err)
	require.Equal(t, "QUEUED", r.Status)
	require.Nil(t, b.health(t).Message, "nothing holds it now")
	again := b.claimOne(t, wid)
	require.Equal(t, st.JobID, again.JobID)
	require.Equal(t, 2, again.Attempt)
	xs := b.executions(t, st.JobID)
	require.Len(t, xs, 2)
	require.Equal(t, "FAILED", *xs[0].Outcome)
	require.True(t, xs[0].Reported, "its own outcome, not a lapse")
	require.Nil(t, xs[0].Warning)
}

// A cancelled attempt whose lease ran out unreported, failed as lapsed by
// the sweeper, still reports until the step is replayed; after the replay
// its token is lease_lost, and stays so when the step is cancelled again
// (model QA: that report was then recorded, replacing the ended attempt's
// outcome and putting its output on the step, while the same token's
// heartbeat answered lease_lost).
//
// Not parallel: the sweeper acts on every workspace at this test's clock.
func TestALapsedCancelledAttemptReplayedAndCancelledAgainIsLeaseLost(t *testing.T) {
	b := setup(t)
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000), MaxAttempts: ptr[int64](3)})
	first := b.claimOne(t, b.register(t))
	_, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	b.clock.Add(first.LeaseExpiresAt.Sub(b.clock.Now()))
	require.NoError(t, b.env.App.Sweeper.RunOnce(ctx).Error())
	xs := b.executions(t, st.JobID)
	require.Equal(t, "FAILED", *xs[0].Outcome, "failed as lapsed")
	require.False(t, xs[0].Reported)

	_, err = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)
	report := jobs.ReportRequest{LeaseToken: first.LeaseToken, Status: "SUCCEEDED", Output: json.RawMessage(`{"late":true}`)}
	_, err = b.svc.Report(ctx, b.worker, first.JobID, report)
	require.Equal(t, apierr.CodeLeaseLost, code(t, err), "replayed: the next claim supersedes it")

	_, err = b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	_, err = b.svc.Heartbeat(ctx, b.worker, first.JobID, jobs.HeartbeatRequest{LeaseToken: first.LeaseToken})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	_, err = b.svc.Report(ctx, b.worker, first.JobID, report)
	require.Equal(t, apierr.CodeLeaseLost, code(t, err), "cancelled again: still not its attempt's to report")
	xs = b.executions(t, st.JobID)
	require.False(t, xs[0].Reported, "the lapse stands")
	require.Nil(t, b.step(t, st.StepID).OutputPreview)
}

// dueAt is the step's durable job's due time as its read shows it, and
// readyAt the claim index's (jobs.ready_at, which claims read in order).
func (b *bundle) dueTimes(t *testing.T, stepID string) (dueAt, readyAt *time.Time) {
	t.Helper()
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT ready_at FROM jobs WHERE step_id = $1`, stepID).Scan(&readyAt))
	return b.step(t, stepID).DurableJob.DueAt, readyAt
}

// requireDue checks that the step is due at want, in its read and in the
// claim index.
func (b *bundle) requireDue(t *testing.T, stepID string, want time.Time, why string) {
	t.Helper()
	dueAt, readyAt := b.dueTimes(t, stepID)
	require.NotNil(t, dueAt, why)
	require.NotNil(t, readyAt, why)
	require.WithinDuration(t, want, *dueAt, 0, "dueAt: %s", why)
	require.WithinDuration(t, want, *readyAt, 0, "ready_at: %s", why)
}

// A replayed step waiting for its cancelled attempt is due at that
// attempt's lease expiry, not at once: in the claim index's ready_at order
// it is then behind the jobs a claim can take, and no claim reads it. Left
// due at once, 20 000 such jobs after a mass cancel and replay made every
// claim of their version read and pass over all 20 000 until their leases
// expired (replay QA). The attempt's report makes it due then; cancelled
// again meanwhile, the report leaves it with no due time. Queue health
// counts it queued and not due, and says what holds it.
func TestAReplayedStepIsDueWhenItsCancelledAttemptEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{TimeoutMs: ptr[int64](60_000)})
	wid := b.register(t)
	first := b.claimOne(t, wid)
	b.clock.Add(time.Second)
	b.cancelAndReplay(t, st.StepID)
	b.requireDue(t, st.StepID, first.LeaseExpiresAt, "replayed: due when the cancelled attempt's lease expires")
	require.Equal(t, first.LeaseExpiresAt, *b.step(t, st.StepID).DurableJob.LeaseExpiresAt)
	h := b.health(t)
	require.Equal(t, int64(1), h.Queued)
	require.Zero(t, h.Due)
	require.NotNil(t, h.Message)
	require.Equal(t, "On endpoint send_email, a replayed job waits for its cancelled attempt, which may still be "+
		"running, to report or its lease to expire.", *h.Message)

	b.clock.Add(time.Second)
	reported := b.clock.Now()
	_, err := b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken, Status: "FAILED",
		Error: &jobs.ReportError{Message: "stopped: cancelled"}})
	require.NoError(t, err)
	b.requireDue(t, st.StepID, reported, "its attempt reported: due at the report")
	h = b.health(t)
	require.Equal(t, int64(1), h.Due)
	require.Nil(t, h.Message)
	second := b.claimOne(t, wid)
	require.Equal(t, 2, second.Attempt)

	// Cancelled again while it waits: the report leaves it CANCELLED, due
	// at no time; replayed once more, with no attempt left to wait for,
	// it is due at once.
	b.clock.Add(time.Second)
	b.cancelAndReplay(t, st.StepID)
	b.requireDue(t, st.StepID, second.LeaseExpiresAt, "replayed again while the second attempt may run")
	_, err = b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	r, err := b.svc.Report(ctx, b.worker, second.JobID, jobs.ReportRequest{LeaseToken: second.LeaseToken,
		Status: "SUCCEEDED"})
	require.NoError(t, err)
	require.Equal(t, "CANCELLED", r.Status)
	dueAt, readyAt := b.dueTimes(t, st.StepID)
	require.Nil(t, dueAt, "a cancelled step is due at no time")
	require.Nil(t, readyAt)
	b.clock.Add(time.Second)
	_, err = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)
	b.requireDue(t, st.StepID, b.clock.Now(), "no attempt to wait for")

	// Replayed once its cancelled attempt's lease expired: due at once.
	third := b.claimOne(t, wid)
	_, err = b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	b.clock.Add(third.LeaseExpiresAt.Sub(b.clock.Now()) + time.Second)
	_, err = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)
	b.requireDue(t, st.StepID, b.clock.Now(), "the attempt's lease expired")
	require.Equal(t, 4, b.claimOne(t, wid).Attempt)
}

// Its worker gone, the cancelled attempt ends when its lease expires: the
// next claim takes the job at that moment, as it takes any lapsed job,
// without waiting for the sweeper (none runs here). On an endpoint with
// maxConcurrent the new attempt takes over the slot the cancelled one held
// (the count stays exact), and the cancelled attempt is failed with the
// lapse warning; its token is superseded.
func TestAReplayedStepIsClaimedWhenItsCancelledAttemptsLeaseExpires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.limitedEndpoint(t, "mailer", 1)
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000)})
	wid := b.register(t)
	first := b.claimOne(t, wid)
	b.cancelAndReplay(t, st.StepID)
	b.requireRunningCount(t, "mailer", 1)
	b.clock.Add(first.LeaseExpiresAt.Sub(b.clock.Now()) - time.Millisecond)
	require.Empty(t, b.claim(t, wid, 5))
	require.Empty(t, b.health(t).AtLimitEndpoints, "the job has a slot of its own: the limit does not hold it")

	b.clock.Add(time.Millisecond)
	require.Nil(t, b.health(t).Message, "its lease expired: nothing holds the job")
	again := b.claimOne(t, wid)
	require.Equal(t, st.JobID, again.JobID)
	require.Equal(t, 2, again.Attempt)
	b.requireRunningCount(t, "mailer", 1)
	xs := b.executions(t, st.JobID)
	require.Len(t, xs, 2)
	require.Equal(t, "FAILED", *xs[0].Outcome)
	require.Equal(t, jobs.LapseWarning, *xs[0].Warning)
	require.False(t, xs[0].Reported)

	_, err := b.svc.Heartbeat(ctx, b.worker, first.JobID, jobs.HeartbeatRequest{LeaseToken: first.LeaseToken})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	_, err = b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken, Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	b.succeed(t, again)
	b.requireRunningCount(t, "mailer", 0)
	require.Equal(t, "SUCCEEDED", b.step(t, st.StepID).Status)
}

// Many claimers, claiming over and over while a replayed step's cancelled
// attempt still holds an unexpired lease, never lease that step: they work
// the other jobs queued behind it. Once the attempt reports, one claim
// takes it, once.
func TestConcurrentClaimsNeverLeaseAStepBesideItsCancelledAttempt(t *testing.T) {
	t.Parallel()
	const claimers, others, rounds = 8, 40, 12
	b := setup(t)
	runID := b.run(t)
	st := b.enqueue(t, runID, jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000), Input: json.RawMessage(`"held"`)})
	first := b.claimOne(t, b.register(t))
	b.cancelAndReplay(t, st.StepID)
	b.clock.Add(time.Millisecond) // the replayed job is the first in line
	for i := range others {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))})
	}
	wids := make([]string, claimers)
	for i := range wids {
		wids[i] = b.register(t)
	}
	var mu sync.Mutex
	var took []jobs.ClaimedJob
	var wg sync.WaitGroup
	for _, wid := range wids {
		wg.Go(func() {
			for range rounds {
				c, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{Limit: ptr(2)})
				if err != nil {
					t.Error(err)
					return
				}
				for _, j := range c.Jobs {
					if j.JobID == st.JobID {
						mu.Lock()
						took = append(took, j)
						mu.Unlock()
						continue
					}
					if _, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
						Status: "SUCCEEDED"}); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, took, "no claim may lease the step while its cancelled attempt's lease is live")
	for { // the others the concurrent claims left, one claim at a time
		c := b.claim(t, wids[0], 10)
		if len(c) == 0 {
			break
		}
		for _, j := range c {
			require.NotEqual(t, st.JobID, j.JobID)
			b.succeed(t, j)
		}
	}

	_, err := b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken, Status: "FAILED",
		Error: &jobs.ReportError{Message: "stopped: cancelled"}})
	require.NoError(t, err)
	for _, wid := range wids {
		wg.Go(func() {
			c, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{Limit: ptr(2)})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			took = append(took, c.Jobs...)
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Len(t, took, 1, "one claim takes it once its attempt reported")
	require.Equal(t, st.JobID, took[0].JobID)
	require.Equal(t, 2, took[0].Attempt)
}

// A replay and the cancelled attempt's report, at the same moment, while
// claimers poll: whichever commits first, no claim takes the job before the
// report, so the report is always recorded on its attempt (a claim between
// the replay and the report superseded the attempt, and the report, whose
// worker had been running beside the new attempt, was lease_lost), and one
// claim takes the job after it. The report and the replay both lock the
// job's row, and a claim decides on the row it locked.
func TestAReplayRacingTheCancelledAttemptsReportNeverOverlapsAttempts(t *testing.T) {
	t.Parallel()
	const claimers, iterations = 4, 25
	b := setup(t)
	runID := b.run(t)
	owner := b.register(t)
	wids := make([]string, claimers)
	for i := range wids {
		wids[i] = b.register(t)
	}
	for i := range iterations {
		st := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))})
		first := b.claimOne(t, owner)
		require.Equal(t, st.JobID, first.JobID)
		_, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
		require.NoError(t, err)

		// The claimers poll until one of them takes the job.
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		var stop atomic.Bool
		got := make(chan jobs.ClaimedJob, claimers)
		var polls sync.WaitGroup
		for _, wid := range wids {
			polls.Go(func() {
				for !stop.Load() && pctx.Err() == nil {
					c, err := b.svc.Claim(pctx, b.worker, wid, jobs.ClaimRequest{Limit: ptr(1)})
					if err != nil {
						if pctx.Err() == nil {
							t.Error(err)
						}
						return
					}
					for _, j := range c.Jobs {
						got <- j
						stop.Store(true)
					}
				}
			})
		}
		// The replay and the report start at the same moment; the test
		// fails only once the pollers are done.
		start := make(chan struct{})
		var both sync.WaitGroup
		var replayErr, reportErr error
		both.Go(func() {
			<-start
			_, replayErr = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
		})
		both.Go(func() {
			<-start
			_, reportErr = b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken,
				Status: "FAILED", Error: &jobs.ReportError{Message: "stopped: cancelled"}})
		})
		close(start)
		both.Wait()
		polls.Wait()
		cancel()
		close(got)
		require.NoError(t, replayErr, "iteration %d", i)
		require.NoError(t, reportErr, "iteration %d: the cancelled attempt's report", i)
		var taken []jobs.ClaimedJob
		for j := range got {
			taken = append(taken, j)
		}
		require.Len(t, taken, 1, "iteration %d: one claim takes the job once its attempt reported", i)
		require.Equal(t, st.JobID, taken[0].JobID)
		require.Equal(t, 2, taken[0].Attempt)
		xs := b.executions(t, st.JobID)
		require.True(t, xs[0].Reported, "iteration %d", i)
		require.Nil(t, xs[0].Warning, "iteration %d: ended by its report, not superseded", i)
		b.succeed(t, taken[0])
	}
}
