package jobs_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// A RUNNING job that is cancelled keeps its endpoint's concurrency slot
// while its worker may still be running it (migration 0023): freed at the
// cancel, maxConcurrent + 1 calls ran at once.

// cancelledHolder claims a job on an endpoint limited to one concurrent
// job, queues a second, and cancels the first while it runs.
func (b *bundle) cancelledHolder(t *testing.T) (held jobs.ClaimedJob, heldStep string, next jobs.EnqueueResult, wid string) {
	t.Helper()
	b.limitedEndpoint(t, "mailer", 1)
	runID := b.run(t)
	first := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000),
		Input: json.RawMessage(`1`)})
	b.clock.Add(time.Millisecond) // claimed in order
	next = b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`2`)})
	wid = b.register(t)
	held = b.claimOne(t, wid)
	require.Equal(t, first.JobID, held.JobID)
	st, err := b.svc.CancelStep(ctx, b.ws, first.StepID)
	require.NoError(t, err)
	require.Equal(t, "CANCELLED", st.Status)
	require.Empty(t, b.claim(t, wid, 5), "the cancelled attempt still holds the only slot")
	b.requireRunningCount(t, "mailer", 1)
	return held, first.StepID, next, wid
}

// cancelAndReplay cancels a step and replays it at once.
func (b *bundle) cancelAndReplay(t *testing.T, stepID string) {
	t.Helper()
	_, err := b.svc.CancelStep(ctx, b.ws, stepID)
	require.NoError(t, err)
	_, err = b.svc.Replay(ctx, b.worker, stepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)
}

func (b *bundle) requireRunningCount(t *testing.T, endpoint string, want int) {
	t.Helper()
	require.Equal(t, want, b.count(t, `SELECT running_count FROM job_endpoints WHERE workspace_id = $1 AND name = $2`,
		b.ws, endpoint), "running_count")
	require.Equal(t, want, b.count(t, `SELECT
		(SELECT count(*) FROM jobs j WHERE j.endpoint_id = e.id AND j.status = 'RUNNING')
		+ (SELECT count(*) FROM jobs j WHERE j.endpoint_id = e.id AND j.slot_attempt IS NOT NULL)
		FROM job_endpoints e WHERE e.workspace_id = $1 AND e.name = $2`, b.ws, endpoint), "running and held attempts")
}

func TestCancelledAttemptHoldsItsSlotUntilReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	held, _, next, wid := b.cancelledHolder(t)

	hb, err := b.svc.Heartbeat(ctx, b.worker, held.JobID, jobs.HeartbeatRequest{LeaseToken: held.LeaseToken})
	require.NoError(t, err)
	require.True(t, hb.CancelRequested)
	require.Empty(t, b.claim(t, wid, 5), "a heartbeat does not free it")

	r, err := b.svc.Report(ctx, b.worker, held.JobID, jobs.ReportRequest{LeaseToken: held.LeaseToken, Status: "FAILED",
		Error: &jobs.ReportError{Message: "stopped: cancelled"}})
	require.NoError(t, err)
	require.Equal(t, "CANCELLED", r.Status)
	b.requireRunningCount(t, "mailer", 0)
	require.Equal(t, next.JobID, b.claimOne(t, wid).JobID, "the report freed the slot")
	b.requireRunningCount(t, "mailer", 1)

	// A repeated report answers the same and frees nothing more.
	_, err = b.svc.Report(ctx, b.worker, held.JobID, jobs.ReportRequest{LeaseToken: held.LeaseToken, Status: "FAILED",
		Error: &jobs.ReportError{Message: "stopped: cancelled"}})
	require.NoError(t, err)
	b.requireRunningCount(t, "mailer", 1)
}

// Its worker gone, the cancelled attempt's slot is freed by the sweeper once
// its lease expires, and its execution fails with the lapse warning. Not
// parallel: the sweep is global and the clock moves past other tests' leases.
// A heartbeat of a cancelled attempt tells its worker to stop and does not
// extend its lease (QA asked whether that was meant): were it extended, a
// worker that kept heartbeating after the cancel would hold its endpoint's
// slot for as long as it liked. Its answer is the lease it holds, in UTC as
// every lease the API answers.
func TestACancelledAttemptsHeartbeatDoesNotExtendItsLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	held, _, _, _ := b.cancelledHolder(t)

	b.clock.Add(3 * time.Second)
	hb, err := b.svc.Heartbeat(ctx, b.worker, held.JobID, jobs.HeartbeatRequest{LeaseToken: held.LeaseToken})
	require.NoError(t, err)
	require.True(t, hb.CancelRequested)
	require.NotNil(t, hb.LeaseExpiresAt)
	require.True(t, hb.LeaseExpiresAt.Equal(held.LeaseExpiresAt), "the lease the claim gave, not now plus its length: %s, claimed %s",
		hb.LeaseExpiresAt, held.LeaseExpiresAt)
	require.Equal(t, time.UTC, hb.LeaseExpiresAt.Location())

	// The job's own lease is unchanged too: the sweeper frees the slot at it.
	var lease time.Time
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT lease_expires_at FROM jobs WHERE id = $1`, held.JobID).Scan(&lease))
	require.True(t, lease.Equal(held.LeaseExpiresAt))
}

func TestCancelledAttemptSlotFreedWhenItsLeaseExpires(t *testing.T) {
	b := setup(t)
	held, _, next, wid := b.cancelledHolder(t)

	b.clock.Add(5 * time.Second) // within timeout + grace
	b.sweep(t)
	require.Empty(t, b.claim(t, wid, 5))

	b.clock.Add(30 * time.Second)
	b.sweep(t)
	b.requireRunningCount(t, "mailer", 0)
	xs := b.executions(t, held.JobID)
	require.Len(t, xs, 1)
	require.Equal(t, "FAILED", *xs[0].Outcome)
	require.Equal(t, jobs.LapseWarning, *xs[0].Warning)
	require.False(t, xs[0].Reported)
	require.Equal(t, next.JobID, b.claimOne(t, wid).JobID)

	// Its worker, still at work, is told to stop, not that its attempt
	// ended (review: the lapse's outcome read as a report).
	hb, err := b.svc.Heartbeat(ctx, b.worker, held.JobID, jobs.HeartbeatRequest{LeaseToken: held.LeaseToken})
	require.NoError(t, err)
	require.True(t, hb.CancelRequested)

	// The worker's report, late, is still recorded; the slot stays freed once.
	r, err := b.svc.Report(ctx, b.worker, held.JobID, jobs.ReportRequest{LeaseToken: held.LeaseToken, Status: "SUCCEEDED"})
	require.NoError(t, err)
	require.Equal(t, "CANCELLED", r.Status)
	b.requireRunningCount(t, "mailer", 1)
	// The attempt reads what its worker reported, and no longer that its
	// lease expired without a report (contract QA).
	xs = b.executions(t, held.JobID)
	require.Len(t, xs, 1)
	require.Equal(t, "SUCCEEDED", *xs[0].Outcome)
	require.True(t, xs[0].Reported)
	require.NotNil(t, xs[0].Warning)
	require.NotEqual(t, jobs.LapseWarning, *xs[0].Warning)
	require.Contains(t, *xs[0].Warning, "Reported after its lease lapsed")
}

// A replay keeps the slot of the cancelled attempt it follows, which may
// still be running: the replayed job waits for it. That attempt's worker is
// told to stop, and its report is recorded on the attempt and frees the
// slot (QA: it was refused as superseded though nothing had claimed the
// job since, the worker's success was lost and the slot held until the
// lease expired). Not parallel (sweeps).
func TestReplayWaitsForTheCancelledAttemptsSlot(t *testing.T) {
	b := setup(t)
	held, heldStep, next, wid := b.cancelledHolder(t)
	_, err := b.svc.CancelStep(ctx, b.ws, next.StepID) // queued: leaves the slot to the replay
	require.NoError(t, err)
	_, err = b.svc.Replay(ctx, b.worker, heldStep, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)
	require.Empty(t, b.claim(t, wid, 5), "the old attempt still holds the slot")
	hb, err := b.svc.Heartbeat(ctx, b.worker, held.JobID, jobs.HeartbeatRequest{LeaseToken: held.LeaseToken})
	require.NoError(t, err)
	require.True(t, hb.CancelRequested, "its worker is told to stop")
	b.clock.Add(5 * time.Second) // within timeout + grace
	b.sweep(t)
	require.Empty(t, b.claim(t, wid, 5), "a heartbeat does not free the slot")

	report := jobs.ReportRequest{LeaseToken: held.LeaseToken, Status: "SUCCEEDED", Output: json.RawMessage(`{"sent":true}`)}
	r, err := b.svc.Report(ctx, b.worker, held.JobID, report)
	require.NoError(t, err)
	require.Equal(t, "QUEUED", r.Status, "the replay still runs the job")
	require.Equal(t, 1, r.Attempt)
	b.requireRunningCount(t, "mailer", 0)
	xs := b.executions(t, held.JobID)
	require.Len(t, xs, 1)
	require.Equal(t, "SUCCEEDED", *xs[0].Outcome)
	require.True(t, xs[0].Reported)
	st := b.step(t, heldStep)
	require.Equal(t, "QUEUED", st.Status)
	require.JSONEq(t, `{"sent":"<boolean>"}`, string(st.OutputPreview.(json.RawMessage)), "the reported output is kept")

	again := b.claimOne(t, wid)
	require.Equal(t, held.JobID, again.JobID)
	require.Equal(t, 2, again.Attempt)
	b.requireRunningCount(t, "mailer", 1)
	// The old attempt's token is superseded now that a claim took the
	// job: its report's repeat and its heartbeat are lease_lost.
	_, err = b.svc.Report(ctx, b.worker, held.JobID, report)
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	_, err = b.svc.Heartbeat(ctx, b.worker, held.JobID, jobs.HeartbeatRequest{LeaseToken: held.LeaseToken})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))

	// Cancelled again while the new attempt runs: it holds the slot now.
	_, err = b.svc.CancelStep(ctx, b.ws, heldStep)
	require.NoError(t, err)
	b.requireRunningCount(t, "mailer", 1)
	b.succeed(t, again)
	b.requireRunningCount(t, "mailer", 0)
}

// replayedWhileRunning is a job claimed once, then cancelled and replayed
// while that attempt (first) still runs, with no limit on its endpoint.
func replayedWhileRunning(t *testing.T) (*bundle, jobs.EnqueueResult, string, jobs.ClaimedJob) {
	t.Helper()
	b := setup(t)
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{})
	wid := b.register(t)
	first := b.claimOne(t, wid)
	b.cancelAndReplay(t, st.StepID)
	return b, st, wid, first
}

// Without a concurrency limit too, the replayed job is claimed only once
// the cancelled attempt has ended (migration 0060); until a claim
// supersedes it, that attempt's report is recorded. Replayed again while
// its new attempt runs, the job is claimed once that attempt's lease
// expires: the claim supersedes it, failing it with the lapse warning (the
// sweeper has not passed), and its late report is lease_lost.
func TestReplayedJobsCancelledAttemptReportsUntilTheNextClaim(t *testing.T) {
	t.Parallel()
	b, st, wid, first := replayedWhileRunning(t)
	r, err := b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken, Status: "FAILED",
		Error: &jobs.ReportError{Message: "stopped: cancelled"}})
	require.NoError(t, err)
	require.Equal(t, "QUEUED", r.Status)
	require.Equal(t, "FAILED", *b.executions(t, first.JobID)[0].Outcome)

	second := b.claimOne(t, wid)
	require.Equal(t, 2, second.Attempt)
	b.cancelAndReplay(t, st.StepID)
	require.Empty(t, b.claim(t, wid, 5), "the second attempt may still run")
	b.clock.Add(second.LeaseExpiresAt.Sub(b.clock.Now()))
	third := b.claimOne(t, wid)
	require.Equal(t, 3, third.Attempt)
	_, err = b.svc.Report(ctx, b.worker, second.JobID, jobs.ReportRequest{LeaseToken: second.LeaseToken, Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	xs := b.executions(t, second.JobID)
	require.Len(t, xs, 3)
	require.Equal(t, "FAILED", *xs[1].Outcome)
	require.Equal(t, jobs.LapseWarning, *xs[1].Warning)
	require.False(t, xs[1].Reported)
	require.Equal(t, "RUNNING", b.step(t, st.StepID).Status)
	require.Zero(t, b.count(t, `SELECT count(*) FROM jobs WHERE id = $1 AND slot_attempt IS NOT NULL`, st.JobID))
}

// Replayed while its cancelled attempt ran, then reported by that attempt,
// the job waits for a claim: the attempt's heartbeat is invalid_state, as
// any ended attempt's is, not lease_lost, which said a later attempt held
// the job when none did (QA). Once a claim supersedes it, lease_lost.
func TestReplayedThenReportedAttemptsHeartbeatSaysItEnded(t *testing.T) {
	t.Parallel()
	b, _, wid, first := replayedWhileRunning(t)
	r, err := b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken,
		Status: "SUCCEEDED", Output: json.RawMessage(`{"x":1}`)})
	require.NoError(t, err)
	require.Equal(t, "QUEUED", r.Status)

	_, err = b.svc.Heartbeat(ctx, b.worker, first.JobID, jobs.HeartbeatRequest{LeaseToken: first.LeaseToken})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	require.ErrorContains(t, err, "This attempt already ended; the job is QUEUED.")

	second := b.claimOne(t, wid)
	require.Equal(t, 2, second.Attempt)
	_, err = b.svc.Heartbeat(ctx, b.worker, first.JobID, jobs.HeartbeatRequest{LeaseToken: first.LeaseToken})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err), "superseded by the claim")
}

// Replayed after its attempt lapsed unreported, the job is the next
// claim's: the lapsed attempt's late report is superseded by the replay.
// Not parallel (sweeps).
func TestReplayAfterTheCancelledAttemptLapsedSupersedesIt(t *testing.T) {
	b := setup(t)
	held, heldStep, next, wid := b.cancelledHolder(t)
	_, err := b.svc.CancelStep(ctx, b.ws, next.StepID)
	require.NoError(t, err)
	b.clock.Add(40 * time.Second)
	b.sweep(t)
	b.requireRunningCount(t, "mailer", 0)
	_, err = b.svc.Replay(ctx, b.worker, heldStep, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)
	_, err = b.svc.Heartbeat(ctx, b.worker, held.JobID, jobs.HeartbeatRequest{LeaseToken: held.LeaseToken})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	_, err = b.svc.Report(ctx, b.worker, held.JobID, jobs.ReportRequest{LeaseToken: held.LeaseToken, Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	again := b.claimOne(t, wid)
	require.Equal(t, 2, again.Attempt)
}

// On an endpoint with maxConcurrent, a replayed job whose cancelled attempt
// still holds its slot is not claimed until that attempt ends, though the
// endpoint has room: a job holds one slot, and claimed beside its earlier
// attempt, then cancelled again, its new attempt's slot was freed at once
// while its worker might still run, and the endpoint ran maxConcurrent + 1
// (endpoint QA; migration 0052). Once the earlier attempt reports, the
// replay is claimed, and cancelled again, its attempt holds the slot.
func TestCancelAgainWhileAnEarlierAttemptHoldsItsSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.limitedEndpoint(t, "mailer", 2)
	runID := b.run(t)
	st := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`1`)})
	b.clock.Add(time.Millisecond) // claimed in order
	other := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`2`)})
	wid := b.register(t)
	first := b.claimOne(t, wid)
	require.Equal(t, st.JobID, first.JobID)
	b.cancelAndReplay(t, st.StepID)
	b.requireRunningCount(t, "mailer", 1)
	got := b.claim(t, wid, 5)
	require.Len(t, got, 1, "the replay waits for its held attempt; the other job takes the room")
	require.Equal(t, other.JobID, got[0].JobID)
	b.requireRunningCount(t, "mailer", 2)
	b.succeed(t, got[0])
	require.Empty(t, b.claim(t, wid, 5), "room again, but the held attempt has not ended")
	health, err := b.svc.QueueHealth(ctx, b.ws, "", 10)
	require.NoError(t, err)
	require.Len(t, health, 1)
	require.Empty(t, health[0].AtLimitEndpoints)
	require.NotNil(t, health[0].Message, "queue health says what holds the due job")
	require.Equal(t, "On endpoint mailer, a replayed job waits for its cancelled attempt, which may still be "+
		"running, to report or its lease to expire.", *health[0].Message)

	r, err := b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken, Status: "SUCCEEDED"})
	require.NoError(t, err)
	require.Equal(t, "QUEUED", r.Status)
	b.requireRunningCount(t, "mailer", 0)
	second := b.claimOne(t, wid)
	require.Equal(t, 2, second.Attempt)
	_, err = b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	b.requireRunningCount(t, "mailer", 1) // the cancelled attempt keeps its slot
}

// A policy write recounts the held attempts with the RUNNING jobs.
func TestPolicyRecountKeepsHeldSlots(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep := b.limitedEndpoint(t, "mailer", 3)
	runID := b.run(t)
	st := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`1`)})
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`2`)})
	wid := b.register(t)
	b.claimOne(t, wid)
	_, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	_, err = b.env.App.Pool.Exec(ctx, `UPDATE job_endpoints SET running_count = 0 WHERE id = $1`, ep.ID)
	require.NoError(t, err)
	_, err = b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt[int64](1),
		PolicyFields: jobs.PolicyFields{MaxConcurrent: opt[int64](1)}})
	require.NoError(t, err)
	b.requireRunningCount(t, "mailer", 1)
	require.Empty(t, b.claim(t, wid, 5))
}

// Cancelled again after the replay, before any claim, the open attempt is
// still told to stop and its report still recorded (review: its heartbeat
// answered lease_lost though no claim superseded it).
func TestReplayedThenCancelledAgainStillTellsTheOpenAttemptToStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{})
	first := b.claimOne(t, b.register(t))
	b.cancelAndReplay(t, st.StepID)
	_, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	hb, err := b.svc.Heartbeat(ctx, b.worker, first.JobID, jobs.HeartbeatRequest{LeaseToken: first.LeaseToken})
	require.NoError(t, err)
	require.True(t, hb.CancelRequested)
	requireTime(t, first.LeaseExpiresAt, *b.step(t, st.StepID).DurableJob.LeaseExpiresAt, "the open attempt's lease")
	r, err := b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken, Status: "SUCCEEDED"})
	require.NoError(t, err)
	require.Equal(t, "CANCELLED", r.Status)
	require.Nil(t, b.step(t, st.StepID).DurableJob.LeaseExpiresAt, "reported: no lease is held")
}

// durableJob.leaseExpiresAt is the lease an attempt holds: shown while a
// cancelled attempt has not reported, replayed since or not; null once it
// reported, and for a job cancelled while it waited for its retry (review:
// it went by cancelRequested, which every cancel sets).
func TestALeaseIsShownWhileAnAttemptHoldsIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wid := b.register(t)
	running := b.enqueue(t, b.run(t), jobs.EnqueueRequest{})
	held := b.claimOne(t, wid)
	_, err := b.svc.CancelStep(ctx, b.ws, running.StepID)
	require.NoError(t, err)
	requireTime(t, held.LeaseExpiresAt, *b.step(t, running.StepID).DurableJob.LeaseExpiresAt, "cancelled, not reported")
	b.cancelAndReplay(t, running.StepID) // cancelling a cancelled step answers it; the replay queues it
	requireTime(t, held.LeaseExpiresAt, *b.step(t, running.StepID).DurableJob.LeaseExpiresAt, "replayed, still open")

	retrying := b.enqueue(t, b.run(t), jobs.EnqueueRequest{})
	x := b.claimOne(t, wid)
	for x.JobID != retrying.JobID { // the replayed job may come first
		b.succeed(t, x)
		x = b.claimOne(t, wid)
	}
	_, err = b.svc.Report(ctx, b.worker, x.JobID, jobs.ReportRequest{LeaseToken: x.LeaseToken, Status: "FAILED",
		Error: &jobs.ReportError{Message: "try later"}})
	require.NoError(t, err)
	require.Equal(t, "RETRY_SCHEDULED", b.step(t, retrying.StepID).Status)
	_, err = b.svc.CancelStep(ctx, b.ws, retrying.StepID)
	require.NoError(t, err)
	require.Nil(t, b.step(t, retrying.StepID).DurableJob.LeaseExpiresAt)
}
