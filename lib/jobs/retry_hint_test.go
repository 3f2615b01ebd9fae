package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// Seed 000: "Gates can defer execution further; retry hints never bypass an
// open circuit, a pause, or an attempt limit." (and seed 001: "An open
// circuit, pause, concurrency gate or attempt limit is never bypassed"). A
// worker's retryAfterMs only sets the earliest next attempt; these tests hold
// each gate against a hinted failure.

var hinted = &jobs.ReportError{Message: "provider rate limited", Retryable: ptr(true), RetryAfterMs: ptr[int64](60_000)}

// failHinted enqueues a step as req asks, registers a worker, and fails the
// step's first attempt with the hinted failure: its retry is due a minute
// later, the hint being the floor over STANDARD's 24-36 s.
func (b *bundle) failHinted(t *testing.T, req jobs.EnqueueRequest) (jobs.EnqueueResult, string) {
	t.Helper()
	enq := b.enqueue(t, b.run(t), req)
	w := b.register(t)
	j := b.claimOne(t, w)
	now := b.clock.Now()
	r := b.fail(t, j, hinted)
	require.Equal(t, "RETRY_SCHEDULED", r.Status)
	requireTime(t, now.Add(time.Minute), *r.NextDueAt)
	return enq, w
}

// On its last attempt a hinted retryable failure ends the job: the hint asks
// for a later attempt, never for one beyond the ceiling.
func TestARetryHintNeverBypassesTheAttemptLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enq, w := b.failHinted(t, jobs.EnqueueRequest{MaxAttempts: ptr[int64](2)})

	b.clock.Add(time.Minute)
	j := b.claimOne(t, w)
	require.Equal(t, 2, j.Attempt)
	r := b.fail(t, j, hinted)
	require.Equal(t, "EXHAUSTED", r.Status, "the last attempt's hint schedules nothing")
	require.Nil(t, r.NextDueAt)
	st := b.step(t, enq.StepID)
	require.Equal(t, "EXHAUSTED", st.Status)
	require.Nil(t, st.DurableJob.DueAt)
	b.clock.Add(2 * time.Minute)
	require.Empty(t, b.claim(t, w, 10))
	require.Equal(t, 2, b.step(t, enq.StepID).DurableJob.Attempt)
}

// A job whose hint has come due stays held while its endpoint is paused,
// consuming no attempt, and runs once the endpoint resumes.
func TestARetryHintNeverBypassesAPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enq, w := b.failHinted(t, jobs.EnqueueRequest{Endpoint: ptr("Email service")})

	jobID := b.step(t, enq.StepID).DurableJob.ID
	eps, err := b.svc.ListEndpoints(ctx, b.ws, "", 10)
	require.NoError(t, err)
	require.Len(t, eps, 1)
	_, err = b.svc.SetPaused(ctx, b.ws, eps[0].ID, true)
	require.NoError(t, err)
	b.clock.Add(time.Hour)
	require.Empty(t, b.claim(t, w, 10), "due by its hint, held by the pause")
	st := b.step(t, enq.StepID)
	require.Equal(t, "RETRY_SCHEDULED", st.Status)
	require.Equal(t, 1, st.DurableJob.Attempt, "a pause consumes no attempt")

	_, err = b.svc.SetPaused(ctx, b.ws, eps[0].ID, false)
	require.NoError(t, err)
	j := b.claimOne(t, w)
	require.Equal(t, jobID, j.JobID)
	require.Equal(t, 2, j.Attempt)
}

// A job whose hint has come due waits for its endpoint's open circuit: no
// claim takes it before the breaker's probe time.
func TestARetryHintNeverBypassesAnOpenCircuit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep := b.circuitEndpoint(t, 1, 300_000)
	failed := b.clock.Now()
	enq, w := b.failHinted(t, jobs.EnqueueRequest{})
	ep = b.endpoint(t, ep.ID)
	require.Equal(t, jobs.CircuitOpen, ep.Circuit.State, "one failure opens a threshold of 1")
	requireTime(t, failed.Add(5*time.Minute), *ep.Circuit.ProbeAt)

	b.clock.Add(time.Minute)
	require.Empty(t, b.claim(t, w, 10), "due by its hint, held by the open circuit")
	b.clock.Add(4*time.Minute - time.Millisecond)
	require.Empty(t, b.claim(t, w, 10))
	st := b.step(t, enq.StepID)
	require.Equal(t, "RETRY_SCHEDULED", st.Status)
	require.Equal(t, 1, st.DurableJob.Attempt, "an open circuit consumes no attempt")

	b.clock.Add(time.Millisecond)
	j := b.claimOne(t, w)
	require.Equal(t, 2, j.Attempt, "the probe, at the breaker's time")
}

// A repeated FAILED report is the same report only with the same
// retryAfterMs, which decided its retry's dueAt: a repeat with another
// hint, or without the first's, or with one the first did not send, is
// 409 invalid_state naming the first's (QA: it answered 200 with the
// first's nextDueAt, as if its own hint had been applied). The same hint
// answers the same object, in a batch too.
func TestARepeatedFailureWithAnotherRetryHintIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enq := b.enqueue(t, b.run(t), jobs.EnqueueRequest{})
	j := b.claimOne(t, b.register(t))
	first := b.fail(t, j, hinted)
	require.Equal(t, first, b.fail(t, j, &jobs.ReportError{Message: "another message", RetryAfterMs: ptr[int64](60_000)}),
		"the same hint: the same report, the first message standing")
	report := func(e *jobs.ReportError) error {
		_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED",
			Error: e})
		return err
	}
	for _, e := range []*jobs.ReportError{
		{Message: "x", RetryAfterMs: ptr[int64](120_000)},
		{Message: "x"},
		nil,
	} {
		err := report(e)
		require.Equal(t, apierr.CodeInvalidState, code(t, err))
		require.Equal(t, "This attempt was already reported as FAILED with retryAfterMs 60000.", err.(*apierr.Error).Message)
	}
	res, err := b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: []jobs.BatchReportItem{{
		JobID: j.JobID, LeaseToken: j.LeaseToken, Status: "FAILED", Error: &jobs.ReportError{Message: "x",
			RetryAfterMs: ptr[int64](1_000)}}}})
	require.NoError(t, err)
	require.NotNil(t, res.Results[0].Error)
	require.Equal(t, apierr.CodeInvalidState, res.Results[0].Error.Code)
	st := b.step(t, enq.StepID)
	requireTime(t, *first.NextDueAt, *st.DurableJob.DueAt, "the first report's schedule stands")

	// A first report without a hint: a repeat with one is refused too.
	b.clock.Add(time.Minute)
	j2 := b.claimOne(t, b.register(t))
	require.Equal(t, 2, j2.Attempt)
	second := b.fail(t, j2, &jobs.ReportError{Message: "y"})
	_, err = b.svc.Report(ctx, b.worker, j2.JobID, jobs.ReportRequest{LeaseToken: j2.LeaseToken, Status: "FAILED",
		Error: &jobs.ReportError{Message: "y", RetryAfterMs: ptr[int64](5_000)}})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	require.Equal(t, "This attempt was already reported as FAILED without retryAfterMs.", err.(*apierr.Error).Message)
	require.Equal(t, second, b.fail(t, j2, nil), "no error object: no hint, retryable, the same report")
}
