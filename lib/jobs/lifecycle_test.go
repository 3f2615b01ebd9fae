package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/canonjson"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/seal"
)

var ctx = context.Background()

func (b *bundle) enqueue(t testing.TB, runID string, req jobs.EnqueueRequest) jobs.EnqueueResult {
	t.Helper()
	if req.Name == "" {
		req.Name, req.Version = "send_email", "1"
	}
	res, err := b.svc.Enqueue(ctx, b.ws, runID, req)
	require.NoError(t, err)
	return res
}

func (b *bundle) claim(t testing.TB, wid string, limit int) []jobs.ClaimedJob {
	t.Helper()
	c, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{Limit: &limit})
	require.NoError(t, err)
	return c.Jobs
}

func (b *bundle) claimOne(t testing.TB, wid string) jobs.ClaimedJob {
	t.Helper()
	js := b.claim(t, wid, 1)
	require.Len(t, js, 1)
	return js[0]
}

// lastAttemptsClaimed enqueues n jobs of one attempt each (1 s timeout) in
// run runID, and claims them all: each lapses on its last attempt once the
// clock passes the lease. It answers their steps and the claims.
func (b *bundle) lastAttemptsClaimed(t testing.TB, runID string, n int) ([]string, []jobs.ClaimedJob) {
	t.Helper()
	stepIDs := make([]string, n)
	for i := range n {
		stepIDs[i] = b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i)),
			MaxAttempts: ptr[int64](1), TimeoutMs: ptr[int64](1_000)}).StepID
	}
	claimed := b.claim(t, b.register(t), n)
	require.Len(t, claimed, n)
	return stepIDs, claimed
}

func (b *bundle) succeed(t testing.TB, j jobs.ClaimedJob) jobs.ReportResult {
	t.Helper()
	r, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "SUCCEEDED"})
	require.NoError(t, err)
	return r
}

func (b *bundle) fail(t testing.TB, j jobs.ClaimedJob, e *jobs.ReportError) jobs.ReportResult {
	t.Helper()
	r, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED", Error: e})
	require.NoError(t, err)
	return r
}

// createEndpoint creates an endpoint of the workspace with the policy fields.
func (b *bundle) createEndpoint(t testing.TB, name string, fields jobs.PolicyFields) {
	t.Helper()
	_, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: name, PolicyFields: fields})
	require.NoError(t, err)
}

func (b *bundle) step(t testing.TB, stepID string) jobs.Step {
	t.Helper()
	st, err := b.svc.GetStep(ctx, b.ws, stepID)
	require.NoError(t, err)
	return st
}

func (b *bundle) getRun(t testing.TB, runID string) jobs.Run {
	t.Helper()
	r, err := b.svc.GetRun(ctx, b.ws, runID)
	require.NoError(t, err)
	return r
}

func (b *bundle) sweep(t testing.TB) {
	t.Helper()
	res := b.env.App.Sweeper.RunOnce(ctx)
	require.NoError(t, res.Error())
}

func code(t testing.TB, err error) string {
	t.Helper()
	e, ok := apierr.As(err)
	require.True(t, ok, "want an API error, got %v", err)
	return e.Code
}

func (b *bundle) executions(t testing.TB, jobID string) []struct {
	Outcome, Warning *string
	Reported         bool
} {
	t.Helper()
	rows, err := b.env.App.Pool.Query(ctx, `SELECT outcome, warning, reported_at IS NOT NULL FROM job_executions
		WHERE job_id = $1 ORDER BY attempt`, jobID)
	require.NoError(t, err)
	defer rows.Close()
	var out []struct {
		Outcome, Warning *string
		Reported         bool
	}
	for rows.Next() {
		var x struct {
			Outcome, Warning *string
			Reported         bool
		}
		require.NoError(t, rows.Scan(&x.Outcome, &x.Warning, &x.Reported))
		out = append(out, x)
	}
	return out
}

func TestKilledWorkerJobIsReclaimedAfterLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	enq := b.enqueue(t, runID, jobs.EnqueueRequest{TimeoutMs: ptr[int64](5_000)})
	w1, w2 := b.register(t), b.register(t)

	require.Nil(t, b.step(t, enq.StepID).DurableJob.LeaseExpiresAt, "no lease yet")
	first := b.claimOne(t, w1)
	requireTime(t, b.clock.Now().Add(15*time.Second), first.LeaseExpiresAt, "timeout 5 s + grace 10 s")
	require.EqualValues(t, 15_000, first.LeaseMs, "the lease's length, for the worker's own clock")
	requireTime(t, first.LeaseExpiresAt, *b.step(t, enq.StepID).DurableJob.LeaseExpiresAt, "the lease held")
	// w1 dies without reporting. Until the lease lapses nobody else gets it.
	b.clock.Add(14 * time.Second)
	require.Empty(t, b.claim(t, w2, 1))
	b.clock.Add(2 * time.Second)
	second := b.claimOne(t, w2)
	require.Equal(t, enq.JobID, second.JobID)
	require.Equal(t, 2, second.Attempt)
	require.NotEqual(t, first.LeaseToken, second.LeaseToken)

	// The dead worker's late report is fenced off.
	_, err := b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken, Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	_, err = b.svc.Heartbeat(ctx, b.worker, first.JobID, jobs.HeartbeatRequest{LeaseToken: first.LeaseToken})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))

	require.Equal(t, "SUCCEEDED", b.succeed(t, second).Status)
	xs := b.executions(t, enq.JobID)
	require.Len(t, xs, 2)
	require.Equal(t, "FAILED", *xs[0].Outcome)
	require.Contains(t, *xs[0].Warning, "side effect")
	require.False(t, xs[0].Reported)
	require.Equal(t, "SUCCEEDED", *xs[1].Outcome)
	require.Nil(t, xs[1].Warning)
	dj := b.step(t, enq.StepID).DurableJob
	require.Equal(t, 2, dj.Attempt)
	require.Nil(t, dj.LeaseExpiresAt, "no lease is held once the job ended")
	require.Len(t, dj.Attempts, 2)
	require.Equal(t, "FAILED", *dj.Attempts[0].Outcome)
	require.Contains(t, *dj.Attempts[0].Warning, "side effect")
	require.Nil(t, dj.Attempts[0].ReportedAt)
	require.Equal(t, "SUCCEEDED", *dj.Attempts[1].Outcome)
	require.Equal(t, w2, dj.Attempts[1].WorkerID)
	run := b.getRun(t, runID)
	require.Equal(t, dj.Attempts, run.Steps[0].DurableJob.Attempts)
}

func TestHeartbeatExtendsLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{TimeoutMs: ptr[int64](5_000)})
	w1, w2 := b.register(t), b.register(t)
	j := b.claimOne(t, w1)
	b.clock.Add(10 * time.Second)
	hb, err := b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
	require.NoError(t, err)
	requireTime(t, b.clock.Now().Add(15*time.Second), *hb.LeaseExpiresAt)
	require.False(t, hb.CancelRequested)
	b.clock.Add(10 * time.Second) // past the original lease, within the extended one
	require.Empty(t, b.claim(t, w2, 1))
	_, err = b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: "nope"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	_, err = b.svc.Heartbeat(ctx, b.worker, "job_01m8kjt9g002extbwvcndh4bkd", jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
	require.Equal(t, apierr.CodeNotFound, code(t, err))
	// A job never claimed has no lease to extend (it answered 500).
	queued := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`{"n":2}`)})
	_, err = b.svc.Heartbeat(ctx, b.worker, queued.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
}

func TestLapsedReportWithCurrentTokenIsAcceptedUntilSuperseded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{TimeoutMs: ptr[int64](5_000)})
	w := b.register(t)
	j := b.claimOne(t, w)
	b.clock.Add(time.Minute) // lapsed, nobody reclaimed
	require.Equal(t, "SUCCEEDED", b.succeed(t, j).Status)
}

func TestRetryScheduleAndRetryAfterFloor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "send_email"})
	require.NoError(t, err)
	_, err = b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt[int64](1), PolicyFields: jobs.PolicyFields{
		Preset: opt("CUSTOM"), MaxAttempts: opt[int64](6), InitialDelayMs: opt[int64](10_000), Multiplier: opt(2.0),
		MaxDelayMs: opt[int64](600_000), JitterPercent: opt(20.0)}})
	require.NoError(t, err)
	runID := b.run(t)
	enq := b.enqueue(t, runID, jobs.EnqueueRequest{})
	w := b.register(t)

	nominal := []time.Duration{10, 20, 40, 80, 160}
	for n := 1; n <= 5; n++ {
		j := b.claimOne(t, w)
		require.Equal(t, n, j.Attempt)
		now := b.clock.Now()
		r := b.fail(t, j, &jobs.ReportError{Message: "provider unavailable"})
		require.Equal(t, "RETRY_SCHEDULED", r.Status)
		wait := r.NextDueAt.Sub(now)
		lo, hi := nominal[n-1]*time.Second*8/10, nominal[n-1]*time.Second*12/10
		require.True(t, wait >= lo && wait <= hi, "failure %d: wait %s outside [%s, %s]", n, wait, lo, hi)
		st := b.step(t, enq.StepID)
		requireTime(t, *r.NextDueAt, *st.DurableJob.DueAt)
		// Not claimable before it is due.
		b.clock.Add(wait - time.Millisecond)
		require.Empty(t, b.claim(t, w, 1))
		b.clock.Add(time.Millisecond)
	}
	j := b.claimOne(t, w)
	require.Equal(t, 6, j.Attempt)
	r := b.fail(t, j, nil)
	require.Equal(t, "EXHAUSTED", r.Status)
	require.Nil(t, r.NextDueAt)

	// retryAfterMs is a floor, without jitter.
	enq2 := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`)})
	j = b.claimOne(t, w)
	require.Equal(t, enq2.JobID, j.JobID)
	now := b.clock.Now()
	r = b.fail(t, j, &jobs.ReportError{Message: "429", RetryAfterMs: ptr[int64](120_000)})
	requireTime(t, now.Add(2*time.Minute), *r.NextDueAt)
	requireTime(t, now.Add(2*time.Minute), *b.step(t, enq2.StepID).DurableJob.DueAt)
}

// A failure reported without a decision is retryable, and its attempt says
// so, as one with an empty error object does (contract QA: without an
// error object it read retryable null while its job was scheduled again).
func TestAFailureWithoutADecisionReadsRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	w := b.register(t)
	for i, e := range []*jobs.ReportError{nil, {}, {Message: "provider unavailable"}} {
		enq := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i))})
		j := b.claimOne(t, w)
		require.Equal(t, enq.JobID, j.JobID)
		require.Equal(t, "RETRY_SCHEDULED", b.fail(t, j, e).Status, "report %d", i)
		st := b.step(t, enq.StepID)
		require.Len(t, st.DurableJob.Attempts, 1)
		require.NotNil(t, st.DurableJob.Attempts[0].Retryable, "report %d", i)
		require.True(t, *st.DurableJob.Attempts[0].Retryable, "report %d", i)
	}
}

func TestNonRetryableFailureExhaustsAtOnceAndRecordsEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	enq := b.enqueue(t, runID, jobs.EnqueueRequest{})
	w := b.register(t)
	j := b.claimOne(t, w)
	r := b.fail(t, j, &jobs.ReportError{Message: "invalid recipient", Retryable: ptr(false)})
	require.Equal(t, "EXHAUSTED", r.Status)
	require.Equal(t, 1, r.Attempt)
	// The operator deciding on a replay reads why it failed (review: the
	// message was stored sealed and never shown); sealed at rest.
	atts := b.step(t, enq.StepID).DurableJob.Attempts
	require.Len(t, atts, 1)
	require.NotNil(t, atts[0].ErrorMessage)
	require.Equal(t, "invalid recipient", *atts[0].ErrorMessage)
	run1, err := b.svc.GetRun(ctx, b.ws, runID)
	require.NoError(t, err)
	require.Equal(t, "invalid recipient", *run1.Steps[0].DurableJob.Attempts[0].ErrorMessage)
	var stored []byte
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT error_sealed FROM job_executions WHERE job_id = $1`,
		j.JobID).Scan(&stored))
	require.NotContains(t, string(stored), "invalid recipient")
	// Sealed for this job's attempt: moved to another attempt, it does not
	// open, and the read says so rather than show someone else's message.
	_, err = b.env.App.Pool.Exec(ctx, `UPDATE job_executions SET error_sealed = $2 WHERE job_id = $1`, enq.JobID,
		b.env.App.Server.Deps.Sealer.Seal([]byte("x"), seal.AAD(enq.JobID, "error/2")))
	require.NoError(t, err)
	moved, err := b.svc.GetStep(ctx, b.ws, enq.StepID)
	require.NoError(t, err)
	require.Nil(t, moved.DurableJob.Attempts[0].ErrorMessage)
	require.True(t, moved.DurableJob.Attempts[0].ErrorMessageUnreadable)
	_, err = b.env.App.Pool.Exec(ctx, `UPDATE job_executions SET error_sealed = $2 WHERE job_id = $1`, enq.JobID, stored)
	require.NoError(t, err)
	var n int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE type = 'step.exhausted'
		AND subject_id = $1 AND data->'leaseLapsed' = 'false'`, enq.StepID).Scan(&n))
	require.Equal(t, 1, n)

	run, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	require.Equal(t, "FAILED", run.Status)
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE type = 'run.finished'
		AND subject_id = $1 AND data->>'status' = 'FAILED'`, runID).Scan(&n))
	require.Equal(t, 1, n)
}

func TestReportRepeatsAndConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	enq := b.enqueue(t, runID, jobs.EnqueueRequest{})
	w := b.register(t)
	j := b.claimOne(t, w)
	first := b.fail(t, j, &jobs.ReportError{Message: "x"})
	again := b.fail(t, j, &jobs.ReportError{Message: "x"})
	require.Equal(t, first, again, "a repeated report answers the same object")
	require.Equal(t, first, b.fail(t, j, &jobs.ReportError{Message: "y", Retryable: ptr(true)}),
		"the same outcome; the first message stands")
	// Whether the failure may be retried is part of the outcome (QA).
	_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED",
		Error: &jobs.ReportError{Message: "x", Retryable: ptr(false)}})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	require.Equal(t, "RETRY_SCHEDULED", b.step(t, enq.StepID).Status)
	// Its heartbeat says the attempt ended, not the job (QA).
	_, err = b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	require.Equal(t, "This attempt already ended; the job is RETRY_SCHEDULED.", err.(*apierr.Error).Message)
	_, err = b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	_, err = b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: "unknown", Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))

	// After the next claim every use of the old attempt's token is
	// lease_lost, its report's repeat included (API.md §5: a superseded
	// token; its answer would say RETRY_SCHEDULED of a job running again).
	b.clock.Add(time.Hour)
	j2 := b.claimOne(t, w)
	require.Equal(t, 2, j2.Attempt)
	for _, status := range []string{"FAILED", "SUCCEEDED"} {
		var failure *jobs.ReportError
		if status == "FAILED" {
			failure = &jobs.ReportError{Message: "x"} // the first report, repeated
		}
		_, err = b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: status,
			Error: failure})
		require.Equal(t, apierr.CodeLeaseLost, code(t, err), status)
		// It says what the attempt was reported as: a worker whose first
		// answer was lost learns that its report landed.
		require.Equal(t, map[string]any{"attempt": 1, "reportedOutcome": "FAILED"}, err.(*apierr.Error).Detail, status)
		res, err := b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: []jobs.BatchReportItem{{
			JobID: j.JobID, LeaseToken: j.LeaseToken, Status: status, Error: failure}}})
		require.NoError(t, err)
		require.NotNil(t, res.Results[0].Error, status)
		require.Equal(t, apierr.CodeLeaseLost, res.Results[0].Error.Code, status)
	}
	_, err = b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	require.Equal(t, "SUCCEEDED", b.succeed(t, j2).Status)
}

func TestLapsedOnLastAttemptIsExhaustedBySweeper(t *testing.T) {
	// Not parallel: the sweep is global, and a parallel test's sweep at its
	// own clock could hold this test's rows (SKIP LOCKED) when it sweeps.
	b := setup(t)
	runID := b.run(t)
	enq := b.enqueue(t, runID, jobs.EnqueueRequest{MaxAttempts: ptr[int64](1), TimeoutMs: ptr[int64](1_000)})
	w := b.register(t)
	j := b.claimOne(t, w)
	b.clock.Add(20 * time.Second)
	b.sweep(t)
	st := b.step(t, enq.StepID)
	require.Equal(t, "EXHAUSTED", st.Status)
	xs := b.executions(t, enq.JobID)
	require.Len(t, xs, 1)
	require.Equal(t, "FAILED", *xs[0].Outcome)
	require.Contains(t, *xs[0].Warning, "side effect")
	// Its step.exhausted says the attempt lapsed (QA: it read as any failure).
	var lapsed string
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT data->>'leaseLapsed' FROM events
		WHERE type = 'step.exhausted' AND subject_id = $1`, enq.StepID).Scan(&lapsed))
	require.Equal(t, "true", lapsed)
	// The sweeper ended the job: the current token's report is refused,
	// saying its own lapse ended it (its outcome is lost, not settled).
	_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	e, _ := apierr.As(err)
	require.Equal(t, true, e.Detail["leaseLapsed"])
	require.Equal(t, "EXHAUSTED", e.Detail["status"])
	b.sweep(t) // idempotent
	require.Equal(t, "EXHAUSTED", b.step(t, enq.StepID).Status)
}

func TestLapsedOnLastAttemptIsExhaustedAtRunRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{MaxAttempts: ptr[int64](1), TimeoutMs: ptr[int64](1_000)})
	w := b.register(t)
	b.claimOne(t, w)
	b.clock.Add(20 * time.Second)
	// Another test's sweep (the sweeper is global, and other tests' clocks
	// run ahead) may hold the lapsed job's row at the instant of the read:
	// the read waits for it and reads again.
	r := b.getRun(t, runID)
	require.Equal(t, "EXHAUSTED", r.Steps[0].Status)
	require.Equal(t, "FAILED", r.Status)

	other := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`), MaxAttempts: ptr[int64](1),
		TimeoutMs: ptr[int64](1_000)})
	b.claimOne(t, w)
	b.clock.Add(20 * time.Second)
	require.Equal(t, "EXHAUSTED", b.step(t, other.StepID).Status, "at step read too")
}

// Reads racing as a last attempt's lease lapses each answer the run and its
// steps as of one moment, and after the lapse: a read whose settling skipped
// the job another read was ending waits for it (race QA: such reads
// answered the run RUNNING beside its EXHAUSTED step, or both RUNNING).
// Not parallel: it counts on no other test's sweep touching its run.
func TestConcurrentRunReadsAtALapseAgree(t *testing.T) {
	b := setup(t)
	runID := b.run(t)
	stepIDs, _ := b.lastAttemptsClaimed(t, runID, 3)
	b.clock.Add(20 * time.Second)
	const readers = 30
	type answer struct {
		run   string // "" for a step read or list
		steps []string
		err   error
	}
	answers := make(chan answer, readers)
	start := make(chan struct{})
	for i := range readers {
		go func() {
			<-start
			var a answer
			var steps []jobs.Step
			switch i % 3 {
			case 0: // the run, as GET /runs/{id}
				r, err := b.svc.GetRun(ctx, b.ws, runID)
				a.run, steps, a.err = r.Status, r.Steps, err
			case 1: // its steps, as GET /runs/{id}/steps
				steps, a.err = b.svc.ListSteps(ctx, b.ws, runID, "", "", 50)
			default: // one step, as GET /steps/{id}
				st, err := b.svc.GetStep(ctx, b.ws, stepIDs[i/3%3])
				steps, a.err = []jobs.Step{st}, err
			}
			for _, st := range steps {
				a.steps = append(a.steps, st.Status)
			}
			answers <- a
		}()
	}
	close(start)
	for i := range readers {
		a := <-answers
		require.NoError(t, a.err)
		if a.run != "" {
			require.Equal(t, "FAILED", a.run)
		}
		for _, status := range a.steps {
			require.Equal(t, "EXHAUSTED", status, "answer %d: %+v", i, a)
		}
		require.NotEmpty(t, a.steps)
	}
}

// A read does not wait for good behind a transaction that holds a lapsed
// job and does not end (a report in progress, say): it waits for the
// holder, then after lapseWait answers what it read, without an error. The
// holder ends only after the read answered, and the read's context has no
// deadline: a wait without its bound hangs. Not parallel: it holds a row
// lock.
func TestAReadGivesUpWaitingForAHeldLapsedJob(t *testing.T) {
	b := setup(t)
	runID := b.run(t)
	enq := b.enqueue(t, runID, jobs.EnqueueRequest{MaxAttempts: ptr[int64](1), TimeoutMs: ptr[int64](1_000)})
	w := b.register(t)
	b.claimOne(t, w)
	b.clock.Add(20 * time.Second)
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT id FROM jobs WHERE step_id = $1 FOR UPDATE`, enq.StepID)
	require.NoError(t, err)

	type read struct {
		st  jobs.Step
		err error
	}
	done := make(chan read, 1)
	go func() {
		st, err := b.svc.GetStep(context.Background(), b.ws, enq.StepID)
		done <- read{st, err}
	}()
	holder := tx.Conn().PgConn().PID()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE $1::int = ANY (pg_blocking_pids(pid)) AND query LIKE '%FOR SHARE%')`, holder).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the read never waited for the holder")
	var r read
	apitest.Returns(t, "the read waited for the holder without a bound", func() { r = <-done })
	require.NoError(t, r.err)
	require.Equal(t, "RUNNING", r.st.Status, "held elsewhere: answered as read")
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, "EXHAUSTED", b.step(t, enq.StepID).Status, "released: the next read ends it")
}

// The bound is the read's, not each held job's: three lapsed jobs held by
// three transactions that end one after another, each within LapseWait of
// the one before, kept a read waiting for all three when a lock_timeout
// bounded each lock (review). It answers within a deadline shorter than
// their sum. Not parallel: it holds row locks.
func TestAReadWaitsOnceForSeveralHeldLapsedJobs(t *testing.T) {
	b := setup(t)
	runID := b.run(t)
	stepIDs, claimed := b.lastAttemptsClaimed(t, runID, 3)
	b.clock.Add(20 * time.Second)
	step := jobs.LapseWait * 3 / 4
	var held sync.WaitGroup
	for i, j := range claimed {
		tx, err := b.env.App.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT id FROM jobs WHERE id = $1 FOR UPDATE`, j.JobID)
		require.NoError(t, err)
		held.Add(1)
		release := time.AfterFunc(time.Duration(i+1)*step, func() { defer held.Done(); _ = tx.Rollback(ctx) })
		t.Cleanup(func() {
			if release.Stop() {
				_ = tx.Rollback(ctx)
				held.Done()
			}
		})
	}

	readCtx, cancel := context.WithTimeout(ctx, 2*jobs.LapseWait) // the three waits, 3 × step, fail here
	defer cancel()
	r, err := b.svc.GetRun(readCtx, b.ws, runID)
	require.NoError(t, err)
	require.Len(t, r.Steps, 3)
	held.Wait()
	for _, id := range stepIDs {
		require.Equal(t, "EXHAUSTED", b.step(t, id).Status, "released: the next read ends it")
	}
}

// A run that has failed goes on reading its other steps' lapses: they keep
// running after the failure (seed 000), and a lease that lapses on a last
// attempt is ended by the run's read as by the step's (§5 QA: the run read
// left it RUNNING once the run had failed).
func TestAFailedRunsReadEndsItsLapsedSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	_, claimed := b.lastAttemptsClaimed(t, runID, 2)
	b.fail(t, claimed[0], &jobs.ReportError{Message: "no", Retryable: ptr(false)})
	require.Equal(t, "FAILED", b.getRun(t, runID).Status)
	b.clock.Add(20 * time.Second)
	r := b.getRun(t, runID)
	require.Equal(t, "FAILED", r.Status)
	for _, st := range r.Steps {
		require.Equal(t, "EXHAUSTED", st.Status, "step %s", st.ID)
	}
}

// A step list filtered by status settles the run's lapsed last attempts
// before it answers, though none of them is on its page until then: the
// EXHAUSTED page lists the job whose lease lapsed.
func TestAStepListSettlesLapsesOffItsPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	stepIDs, _ := b.lastAttemptsClaimed(t, runID, 1)
	b.clock.Add(20 * time.Second)
	steps, err := b.svc.ListSteps(ctx, b.ws, runID, "EXHAUSTED", "", 50)
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, stepIDs[0], steps[0].ID)
}

// A claim that comes before any sweep or read must not take a job whose
// lease lapsed on its last attempt: that would run it past maxAttempts.
func TestLapsedOnLastAttemptIsNotReclaimed(t *testing.T) {
	// Not parallel: the sweep is global, and a parallel test's sweep at its
	// own clock could hold this test's rows (SKIP LOCKED) when it sweeps.
	b := setup(t)
	runID := b.run(t)
	last := b.enqueue(t, runID, jobs.EnqueueRequest{MaxAttempts: ptr[int64](1), TimeoutMs: ptr[int64](1_000)})
	more := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`), MaxAttempts: ptr[int64](2),
		TimeoutMs: ptr[int64](1_000)})
	w := b.register(t)
	first := b.claim(t, w, 10)
	require.Len(t, first, 2)
	b.clock.Add(20 * time.Second)

	again := b.claim(t, b.register(t), 10)
	require.Len(t, again, 1, "only the job with an attempt left is reclaimed")
	require.Equal(t, more.JobID, again[0].JobID)
	require.Equal(t, 2, again[0].Attempt)
	require.Len(t, b.executions(t, last.JobID), 1, "no second attempt of a one-attempt job")

	b.sweep(t)
	require.Equal(t, "EXHAUSTED", b.step(t, last.StepID).Status)
}

// Seed 000: "A failed run does not automatically cancel other in-flight
// steps": once a step is EXHAUSTED the run is FAILED, and its other steps
// still run and report as before.
func TestFailedRunLeavesItsOtherStepsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	doomed := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`), MaxAttempts: ptr[int64](1)})
	inFlight := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`)})
	w := b.register(t)
	claimed := b.claim(t, w, 2)
	require.Len(t, claimed, 2)
	queued := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`3`)})
	_, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)

	for _, j := range claimed {
		if j.JobID == doomed.JobID {
			b.fail(t, j, &jobs.ReportError{Message: "bad request", Retryable: ptr(false)})
		}
	}
	require.Equal(t, "EXHAUSTED", b.step(t, doomed.StepID).Status)
	require.Equal(t, "FAILED", b.getRun(t, runID).Status)
	require.Equal(t, "RUNNING", b.step(t, inFlight.StepID).Status, "not cancelled")
	require.Equal(t, "QUEUED", b.step(t, queued.StepID).Status, "not cancelled")

	for _, j := range claimed {
		if j.JobID == inFlight.JobID {
			require.Equal(t, "SUCCEEDED", b.succeed(t, j).Status)
		}
	}
	require.Equal(t, queued.JobID, b.claimOne(t, w).JobID, "a queued step of a failed run is still claimed")
	require.Equal(t, "FAILED", b.getRun(t, runID).Status)
}

func TestPolicyEditsDoNotChangeExistingJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	old := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
	w := b.register(t)
	j := b.claimOne(t, w)
	r := b.fail(t, j, nil)
	due := *r.NextDueAt
	before := b.step(t, old.StepID)
	require.Equal(t, "STANDARD", before.DurableJob.Policy.Preset)

	eps, err := b.svc.ListEndpoints(ctx, b.ws, "", 10)
	require.NoError(t, err)
	require.Len(t, eps, 1)
	require.Equal(t, "send_email", eps[0].Name)
	_, err = b.svc.UpdatePolicy(ctx, b.ws, eps[0].ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt[int64](1), PolicyFields: jobs.PolicyFields{Preset: opt("RELAXED"), DefaultTimeoutMs: opt[int64](90_000)}})
	require.NoError(t, err)

	after := b.step(t, old.StepID)
	require.Equal(t, before.DurableJob, after.DurableJob, "snapshot and dueAt unchanged")
	requireTime(t, due, *after.DurableJob.DueAt)

	fresh := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`), MaxAttempts: ptr[int64](7)})
	p := b.step(t, fresh.StepID).DurableJob.Policy
	require.Equal(t, jobs.PolicySnapshot{RetryPolicy: jobs.RetryPolicy{Preset: "RELAXED", MaxAttempts: 7,
		InitialDelayMs: 120_000, Multiplier: 2, MaxDelayMs: 1_800_000, JitterPercent: 20}, TimeoutMs: 90_000}, p,
		"the enqueue override changes only the count")
	require.EqualValues(t, 2, b.step(t, fresh.StepID).DurableJob.PolicyVersion)
}

func TestPausedEndpointHoldsJobsWithoutConsumingAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	enq := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("Email service")})
	eps, err := b.svc.ListEndpoints(ctx, b.ws, "", 10)
	require.NoError(t, err)
	ep, err := b.svc.SetPaused(ctx, b.ws, eps[0].ID, true)
	require.NoError(t, err)
	require.True(t, ep.Paused)
	w := b.register(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("Email service"), Input: json.RawMessage(`2`)})
	for range 3 {
		require.Empty(t, b.claim(t, w, 10))
		b.clock.Add(time.Hour)
	}
	st := b.step(t, enq.StepID)
	require.Equal(t, "QUEUED", st.Status)
	require.Equal(t, 0, st.DurableJob.Attempt)
	_, err = b.svc.SetPaused(ctx, b.ws, eps[0].ID, false)
	require.NoError(t, err)
	got := b.claim(t, w, 10)
	require.Len(t, got, 2)
	require.Equal(t, 1, got[0].Attempt)
}

func TestMaxConcurrentAndRateLimitGateClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep, created, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "send_email", PolicyFields: jobs.PolicyFields{MaxConcurrent: opt[int64](2)}})
	require.NoError(t, err)
	require.True(t, created)
	runID := b.run(t)
	for i := range 6 {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage([]byte{byte('0' + i)})})
	}
	w := b.register(t)
	got := b.claim(t, w, 10)
	require.Len(t, got, 2)
	require.Empty(t, b.claim(t, w, 10))
	b.succeed(t, got[0])
	got2 := b.claim(t, w, 10)
	require.Len(t, got2, 1)
	b.succeed(t, got[1])
	b.succeed(t, got2[0])

	// Now a rate limit of 4 per minute and no concurrency limit.
	_, err = b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt[int64](1), PolicyFields: jobs.PolicyFields{RateLimitPerMinute: opt[int64](4)}})
	require.NoError(t, err)
	ep, err = b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt[int64](2), PolicyFields: jobs.PolicyFields{MaxConcurrent: null[int64]()}})
	require.NoError(t, err)
	require.Nil(t, ep.MaxConcurrent)
	require.Equal(t, 4, *ep.RateLimitPerMinute)
	b.clock.Add(time.Minute) // a fresh window
	batch := b.claim(t, w, 10)
	require.Len(t, batch, 3, "the 3 queued jobs, within the rate")
	b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"late"`)})
	b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"later"`)})
	last := b.claim(t, w, 10)
	require.Len(t, last, 1, "the 4th claim of the minute")
	require.Empty(t, b.claim(t, w, 10))
	for _, j := range append(batch, last...) {
		b.succeed(t, j)
	}
	b.clock.Add(time.Minute)
	require.Len(t, b.claim(t, w, 10), 1)
}

// The rate window only moves forward: a claim that computed its window in
// the minute before (it waited for its connection and the endpoint's lock
// across the boundary) counts against the current window instead of
// starting its own, so the boundary grants no second allowance.
func TestRateWindowDoesNotMoveBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEndpoint(t, "send_email", jobs.PolicyFields{RateLimitPerMinute: opt[int64](2)})
	runID := b.run(t)
	for i := range 8 {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage([]byte{byte('0' + i)})})
	}
	w := b.register(t)
	b.clock.Add(time.Minute) // 12:01:00
	require.Len(t, b.claim(t, w, 10), 2)
	b.clock.Add(-time.Second) // a late claim, still in 12:00
	require.Empty(t, b.claim(t, w, 10), "counted against 12:01's window")
	b.clock.Add(31 * time.Second) // 12:01:30
	require.Empty(t, b.claim(t, w, 10), "12:01's allowance is spent")
	b.clock.Add(30 * time.Second) // 12:02:00
	require.Len(t, b.claim(t, w, 10), 2)
}

// A claim skips endpoints that cannot take a job now: a saturated endpoint's
// older backlog does not fill the candidates while other endpoints' jobs
// are due.
func TestSaturatedEndpointDoesNotHoldOthersJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEndpoint(t, "slow", jobs.PolicyFields{MaxConcurrent: opt[int64](1)})
	b.createEndpoint(t, "limited", jobs.PolicyFields{RateLimitPerMinute: opt[int64](1)})
	runID := b.run(t)
	for i := range 6 {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(100 + i)), Endpoint: ptr("slow")})
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(200 + i)), Endpoint: ptr("limited")})
	}
	b.clock.Add(time.Second)
	fast := map[string]bool{}
	for i := range 2 {
		fast[b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(300 + i)), Endpoint: ptr("fast")}).JobID] = true
	}
	w := b.register(t)
	// Saturate both: slow's one slot and limited's one claim this minute.
	// One at a time, since the backlog's jobs share one ready_at and a
	// two-job claim may draw both candidates from the same endpoint (and
	// then grant only one).
	saturated := map[string]bool{}
	for range 2 {
		j := b.claimOne(t, w)
		saturated[b.step(t, j.StepID).Endpoint] = true
	}
	require.Equal(t, map[string]bool{"slow": true, "limited": true}, saturated)
	got := b.claim(t, w, 2)
	require.Len(t, got, 2, "fast's jobs, past the gated backlog")
	for _, j := range got {
		require.True(t, fast[j.JobID])
	}
}

func TestDependencies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`)})
	onOK := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"ok"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	onFail := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"fail"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("FAILED")})
	chained := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"chain"`), AfterStepID: &onFail.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	require.Equal(t, "WAITING", onOK.Status)
	require.Nil(t, onOK.DueAt)
	require.Equal(t, "WAITING", chained.Status)

	w := b.register(t)
	j := b.claimOne(t, w)
	require.Equal(t, a.JobID, j.JobID, "waiting steps are not claimable")
	require.Empty(t, b.claim(t, w, 5))
	b.succeed(t, j)
	require.Equal(t, "QUEUED", b.step(t, onOK.StepID).Status)
	require.Equal(t, "SKIPPED", b.step(t, onFail.StepID).Status)
	require.Equal(t, "SKIPPED", b.step(t, chained.StepID).Status, "skips cascade")

	// A dependency that already ended decides at enqueue.
	late := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"late"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("FAILED")})
	require.Equal(t, "SKIPPED", late.Status)

	run, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	require.Equal(t, "RUNNING", run.Status, "onOK still queued")
	b.succeed(t, b.claimOne(t, w))
	require.Equal(t, "SUCCEEDED", b.getRun(t, runID).Status, "SKIPPED counts as ended well")

	_, err = b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
		AfterStepID: ptr("stp_01m8kjt9g002extbwvcndh4bkd"), AfterStatus: ptr("SUCCEEDED")})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
}

func TestDependencyOnFailureRunsCompensation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`), MaxAttempts: ptr[int64](1)})
	comp := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"c"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("FAILED")})
	w := b.register(t)
	b.fail(t, b.claimOne(t, w), nil)
	require.Equal(t, "QUEUED", b.step(t, comp.StepID).Status)

	// After the dependency ended, an enqueue decides at once.
	late := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"c2"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("FAILED")})
	require.Equal(t, "QUEUED", late.Status)
	require.NotNil(t, late.DueAt)
	skipped := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"ok"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	require.Equal(t, "SKIPPED", skipped.Status)
	require.Nil(t, skipped.DueAt)
	require.NotNil(t, b.step(t, skipped.StepID).FinishedAt)
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	queued := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
	st, err := b.svc.CancelStep(ctx, b.ws, queued.StepID)
	require.NoError(t, err)
	require.Equal(t, "CANCELLED", st.Status)
	again, err := b.svc.CancelStep(ctx, b.ws, queued.StepID)
	require.NoError(t, err, "a repeated cancel is safe")
	require.Equal(t, "CANCELLED", again.Status)

	running := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`)})
	w := b.register(t)
	j := b.claimOne(t, w)
	require.Equal(t, running.JobID, j.JobID)
	_, err = b.svc.CancelStep(ctx, b.ws, running.StepID)
	require.NoError(t, err)
	hb, err := b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
	require.NoError(t, err)
	require.True(t, hb.CancelRequested)
	r, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "SUCCEEDED",
		Output: json.RawMessage(`{"sent":true}`)})
	require.NoError(t, err)
	require.Equal(t, "CANCELLED", r.Status)
	// The output the worker was told was recorded is kept (QA: dropped).
	cancelled := b.step(t, running.StepID)
	require.Equal(t, "CANCELLED", cancelled.Status)
	require.JSONEq(t, `{"sent": "<boolean>"}`, string(cancelled.OutputPreview.(json.RawMessage)), "its redacted preview")

	done := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`3`)})
	b.succeed(t, b.claimOne(t, w))
	_, err = b.svc.CancelStep(ctx, b.ws, done.StepID)
	require.Equal(t, apierr.CodeInvalidState, code(t, err), "a step that ended otherwise cannot be cancelled")

	run, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	require.Equal(t, "FAILED", run.Status)
	_, err = b.svc.CancelStep(ctx, b.ws, "stp_01m8kjt9g002extbwvcndh4bkd")
	require.Equal(t, apierr.CodeNotFound, code(t, err))
}

func TestEnqueueIdempotency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	req := jobs.EnqueueRequest{Name: "send_email", Version: "1", Input: json.RawMessage(`{"b":1,"a":[1,2]}`),
		IdempotencyKey: ptr("welcome:1")}
	first := b.enqueue(t, runID, req)
	require.False(t, first.Deduplicated)
	dup := b.enqueue(t, runID, req)
	require.True(t, dup.Deduplicated)
	require.Equal(t, first.StepID, dup.StepID)
	require.Equal(t, first.JobID, dup.JobID)

	other := req
	other.Input = json.RawMessage(`{"b":2}`)
	_, err := b.svc.Enqueue(ctx, b.ws, runID, other)
	require.Equal(t, apierr.CodeIdempotencyKeyReuse, code(t, err))
	// Explicit keys are unique per workspace, across runs.
	run2 := b.run(t)
	_, err = b.svc.Enqueue(ctx, b.ws, run2, req)
	require.Equal(t, apierr.CodeIdempotencyKeyReuse, code(t, err))

	// Generated keys: the same operation in another key order is a duplicate.
	gen := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`{"x":{"q":1,"p":2},"y":[3,1]}`)})
	require.Len(t, gen.IdempotencyKey, 64)
	same := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`{"y":[3,1],"x":{"p":2,"q":1}}`)})
	require.True(t, same.Deduplicated)
	require.Equal(t, gen.IdempotencyKey, same.IdempotencyKey)
	diff := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`{"y":[1,3],"x":{"p":2,"q":1}}`)})
	require.False(t, diff.Deduplicated, "array order is significant")
	viaEndpoint := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`{"x":{"q":1,"p":2},"y":[3,1]}`),
		Endpoint: ptr("send_email")})
	require.True(t, viaEndpoint.Deduplicated, "the endpoint defaults to the tool name")

	// After finish: an identical enqueue still deduplicates; a new one is refused.
	_, err = b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	again := b.enqueue(t, runID, req)
	require.True(t, again.Deduplicated)
	_, err = b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
		Input: json.RawMessage(`"new"`)})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
}

func TestSweeperReleasesStrandedDependentsAndSettlesRuns(t *testing.T) {
	// Not parallel: the sweep is global, and a parallel test's sweep at its
	// own clock could hold this test's rows (SKIP LOCKED) when it sweeps.
	b := setup(t)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`)})
	dep := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"d"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	// Simulate a transition no request made: end the dependency behind the
	// service's back and request completion directly.
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', due_at = NULL, ready_at = NULL
		WHERE step_id = $1`, a.StepID)
	require.NoError(t, err)
	_, err = b.env.App.Pool.Exec(ctx, `UPDATE job_runs SET completion_requested = true WHERE id = $1`, runID)
	require.NoError(t, err)
	b.sweep(t)
	require.Equal(t, "QUEUED", b.step(t, dep.StepID).Status)
	// Ended behind the service's back too. (Not claimed: the sweep's passes
	// are not per workspace, so a parallel test's sweeper, on its own fake
	// clock, may be the one that released it, due at that clock's time.)
	_, err = b.env.App.Pool.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', due_at = NULL, ready_at = NULL
		WHERE step_id = $1`, dep.StepID)
	require.NoError(t, err)
	b.sweep(t)
	require.Equal(t, "SUCCEEDED", b.getRun(t, runID).Status)
}

func requireTime(t testing.TB, want, got time.Time, msg ...any) {
	t.Helper()
	require.True(t, want.Equal(got), append([]any{"want %s, got %s", want, got}, msg...)...)
}

func TestSettingAConcurrencyLimitCountsJobsAlreadyRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	for i := range 5 {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage([]byte{byte('0' + i)})})
	}
	w := b.register(t)
	running := b.claim(t, w, 3) // unlimited: nothing is counted yet
	require.Len(t, running, 3)
	eps, err := b.svc.ListEndpoints(ctx, b.ws, "", 1)
	require.NoError(t, err)
	_, err = b.svc.UpdatePolicy(ctx, b.ws, eps[0].ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt[int64](1), PolicyFields: jobs.PolicyFields{MaxConcurrent: opt[int64](2)}})
	require.NoError(t, err)
	require.Empty(t, b.claim(t, w, 5), "3 running ≥ limit 2")
	b.succeed(t, running[0])
	require.Empty(t, b.claim(t, w, 5), "2 running = limit 2")
	b.fail(t, running[1], &jobs.ReportError{Retryable: ptr(false)})
	require.Len(t, b.claim(t, w, 5), 1)
	var count int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT running_count FROM job_endpoints WHERE id = $1`,
		eps[0].ID).Scan(&count))
	require.Equal(t, 2, count)
}

func TestCancelWaitingAndRetryScheduledSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`)})
	waiting := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"w"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	after := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"x"`), AfterStepID: &waiting.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	st, err := b.svc.CancelStep(ctx, b.ws, waiting.StepID)
	require.NoError(t, err)
	require.Equal(t, "CANCELLED", st.Status)
	require.Equal(t, "SKIPPED", b.step(t, after.StepID).Status, "a cancelled dependency skips its dependents")

	w := b.register(t)
	j := b.claimOne(t, w)
	require.Equal(t, a.JobID, j.JobID)
	require.Equal(t, "RETRY_SCHEDULED", b.fail(t, j, nil).Status)
	st, err = b.svc.CancelStep(ctx, b.ws, a.StepID)
	require.NoError(t, err)
	require.Equal(t, "CANCELLED", st.Status)
	require.Nil(t, st.DurableJob.DueAt)
	// Its attempt was reported before the cancel: its heartbeat gets no
	// lease back (QA: 200 with the old lease's expiry).
	_, err = b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	require.Equal(t, "This attempt already ended; the job is CANCELLED.", err.(*apierr.Error).Message)
	b.clock.Add(time.Hour)
	require.Empty(t, b.claim(t, w, 5), "a cancelled retry is never claimed")
}

func TestCronSweepRunsTheJobTasks(t *testing.T) {
	// Not parallel: the sweep acts on every workspace of the package database.
	b := setup(t)
	r := b.env.Must(200, "POST", "/api/cron/sweep", "test-cron-secret", nil).JSON()
	changed := r["changed"].(map[string]any)
	for _, task := range []string{"jobs.lapsed_leases", "jobs.dependencies", "jobs.run_completion"} {
		require.Contains(t, changed, task)
	}
	require.Empty(t, r["errors"])
}

func TestInputsAndOutputsAreSealedAndBoundToTheirJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`{"card":"4242-secret"}`)})
	b.clock.Add(time.Millisecond) // claimed in order
	other := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`{"card":"other"}`)})
	w := b.register(t)
	j := b.claimOne(t, w)
	require.Equal(t, a.JobID, j.JobID)
	require.JSONEq(t, `{"card":"4242-secret"}`, string(j.Input))
	_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "SUCCEEDED",
		Output: json.RawMessage(`{"receipt":"r-secret"}`)})
	require.NoError(t, err)

	var in, out []byte
	var preview string
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT input_sealed, output_sealed, input_preview::text
		FROM jobs WHERE id = $1`, a.JobID).Scan(&in, &out, &preview))
	require.NotContains(t, string(in), "4242")
	require.NotContains(t, string(out), "r-secret")
	require.JSONEq(t, `{"card":"<string>"}`, preview)

	// A ciphertext moved to another job's row does not open there: the
	// claim passes over that job, leaving it queued and unleased.
	_, err = b.env.App.Pool.Exec(ctx, `UPDATE jobs SET input_sealed = $1 WHERE id = $2`, in, other.JobID)
	require.NoError(t, err)
	require.Empty(t, b.claim(t, w, 1))
	var status string
	var attempt int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT status, attempt FROM jobs WHERE id = $1`,
		other.JobID).Scan(&status, &attempt))
	require.Equal(t, jobs.StatusQueued, status)
	require.Zero(t, attempt)
}

func TestOnlyExactRegisteredVersionsAreClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t, "send_email@1", "send_email@2")
	runID := b.run(t)
	v2 := b.enqueue(t, runID, jobs.EnqueueRequest{Name: "send_email", Version: "2"})
	w1 := b.register(t, jobs.Tool{Name: "send_email", Version: "1"})
	require.Empty(t, b.claim(t, w1, 10))
	w2 := b.register(t, jobs.Tool{Name: "send_email", Version: "2"})
	require.Equal(t, v2.JobID, b.claimOne(t, w2).JobID)
}

func TestConcurrentSweepsEndEachLapsedJobOnce(t *testing.T) {
	// Not parallel: the sweep is global, and a parallel test's sweep at its
	// own clock could hold this test's rows (SKIP LOCKED) when it sweeps.
	b := setup(t)
	runID := b.run(t)
	b.lastAttemptsClaimed(t, runID, 30)
	_, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	b.clock.Add(time.Minute)
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			b.env.App.Sweeper.RunOnce(ctx)
		}()
	}
	for range 4 {
		<-done
	}
	b.sweep(t)
	var exhausted, events, runEvents int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM jobs WHERE run_id = $1 AND status = 'EXHAUSTED'),
		(SELECT count(*) FROM events e JOIN jobs j ON j.step_id = e.subject_id WHERE j.run_id = $1 AND e.type = 'step.exhausted'),
		(SELECT count(*) FROM events WHERE subject_id = $1 AND type = 'run.finished')`, runID).Scan(&exhausted, &events, &runEvents))
	require.Equal(t, 30, exhausted)
	require.Equal(t, 30, events)
	require.Equal(t, 1, runEvents)
	require.Equal(t, "FAILED", b.getRun(t, runID).Status)
}

// A key restricted to some tools reports and heartbeats only their jobs,
// even holding another tool's lease token: the token is a credential, and
// a leaked one should not let any worker key in the workspace end the job.
func TestRestrictedKeyReportsOnlyItsTools(t *testing.T) {
	t.Parallel()
	b := setup(t, "send_email@1", "charge_card@1")
	runID := b.run(t)
	email := b.enqueue(t, runID, jobs.EnqueueRequest{})
	charge := b.enqueue(t, runID, jobs.EnqueueRequest{Name: "charge_card", Version: "1"})
	w := b.register(t, jobs.Tool{Name: "send_email", Version: "1"}, jobs.Tool{Name: "charge_card", Version: "1"})
	claimed := b.claim(t, w, 2)
	require.Len(t, claimed, 2)
	token, leased := map[string]string{}, map[string]time.Time{}
	for _, j := range claimed {
		token[j.JobID], leased[j.JobID] = j.LeaseToken, j.LeaseExpiresAt
	}

	emailOnly := *b.worker
	emailOnly.Tools = []string{"send_email@1"}
	forbidden := func(err error) {
		t.Helper()
		e, ok := apierr.As(err)
		require.True(t, ok, "%v", err)
		require.Equal(t, apierr.CodeForbidden, e.Code)
		require.Equal(t, []string{"tool:charge_card@1"}, e.Detail["required"])
	}
	before := b.step(t, charge.StepID)

	_, err := b.svc.Heartbeat(ctx, &emailOnly, charge.JobID, jobs.HeartbeatRequest{LeaseToken: token[charge.JobID]})
	forbidden(err)
	_, err = b.svc.Report(ctx, &emailOnly, charge.JobID, jobs.ReportRequest{LeaseToken: token[charge.JobID], Status: "SUCCEEDED"})
	forbidden(err)
	batch, err := b.svc.ReportBatch(ctx, &emailOnly, jobs.BatchReportRequest{Reports: []jobs.BatchReportItem{
		{JobID: charge.JobID, LeaseToken: token[charge.JobID], Status: "SUCCEEDED"},
		{JobID: email.JobID, LeaseToken: token[email.JobID], Status: "SUCCEEDED"},
	}})
	require.NoError(t, err)
	require.Equal(t, apierr.CodeForbidden, batch.Results[0].Error.Code)
	require.Equal(t, []string{"tool:charge_card@1"}, batch.Results[0].Error.Detail["required"],
		"the detail a single report answers")
	require.Nil(t, batch.Results[1].Error)
	require.Equal(t, "SUCCEEDED", batch.Results[1].Status)

	// Nothing changed for the charge: still running under the same lease.
	after := b.step(t, charge.StepID)
	require.Equal(t, "RUNNING", after.Status)
	require.Equal(t, before.DurableJob, after.DurableJob)
	var lease time.Time
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT lease_expires_at FROM jobs WHERE id = $1`, charge.JobID).Scan(&lease))
	requireTime(t, leased[charge.JobID], lease)

	// The key that may work it still can.
	_, err = b.svc.Heartbeat(ctx, b.worker, charge.JobID, jobs.HeartbeatRequest{LeaseToken: token[charge.JobID]})
	require.NoError(t, err)
	b.succeed(t, jobs.ClaimedJob{JobID: charge.JobID, LeaseToken: token[charge.JobID]})
}

// A lapsed lease on an attempt that was not the job's last is reclaimable
// at once by a worker of the job's version; with none left (a retired
// version's crashed worker) it held its endpoint's maxConcurrent slot for
// good. RequeueLapsedAfter past the lapse the sweeper queues the job again,
// freeing the slot; until a new claim, the old token's report is still
// recorded (API.md §5) and the slot count nets out. Not parallel: the sweep
// is global and this test's clock moves minutes past other tests' lapses.
func TestSweeperRequeuesALongLapsedLease(t *testing.T) {
	b := setup(t, "send_email@1", "send_email@2")
	b.createEndpoint(t, "mailer", jobs.PolicyFields{MaxConcurrent: opt[int64](1)})
	runID := b.run(t)
	late := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000)})
	b.clock.Add(time.Millisecond) // claimed in order: equal due times have no order
	reclaimed := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000),
		Input: json.RawMessage(`{"n":2}`)})
	next := b.enqueue(t, runID, jobs.EnqueueRequest{Name: "send_email", Version: "2", Endpoint: ptr("mailer")})
	v1 := b.register(t, jobs.Tool{Name: "send_email", Version: "1"})
	v2 := b.register(t, jobs.Tool{Name: "send_email", Version: "2"})
	running := func() int {
		return b.count(t, `SELECT running_count FROM job_endpoints WHERE workspace_id = $1 AND name = 'mailer'`, b.ws)
	}
	lost := b.claimOne(t, v1) // its worker stalls
	require.Equal(t, late.JobID, lost.JobID)

	// Within the window the lapsed lease keeps its slot and its token
	// still works.
	b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter - time.Second)
	b.sweep(t)
	require.Empty(t, b.claim(t, v2, 1))
	require.Equal(t, "RUNNING", b.step(t, late.StepID).Status)
	_, err := b.svc.Heartbeat(ctx, b.worker, lost.JobID, jobs.HeartbeatRequest{LeaseToken: lost.LeaseToken})
	require.NoError(t, err, "a heartbeat revives a lapsed lease nobody took over")

	b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter + time.Second) // from the heartbeat
	b.sweep(t)
	st := b.step(t, late.StepID)
	require.Equal(t, "QUEUED", st.Status)
	require.Equal(t, 1, st.DurableJob.Attempt)
	xs := b.executions(t, late.JobID)
	require.Len(t, xs, 1)
	require.Equal(t, "FAILED", *xs[0].Outcome)
	require.Contains(t, *xs[0].Warning, "side effect")
	taken := b.claimOne(t, v2)
	require.Equal(t, next.JobID, taken.JobID, "the slot is free")
	require.Equal(t, 1, running())

	// The stalled worker's lease is gone (a heartbeat says so), but no
	// other attempt ran: its report is recorded, and the count nets out.
	_, err = b.svc.Heartbeat(ctx, b.worker, lost.JobID, jobs.HeartbeatRequest{LeaseToken: lost.LeaseToken})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	require.Contains(t, err.Error(), "slot went to another job", "not that another attempt holds it")
	r, err := b.svc.Report(ctx, b.worker, lost.JobID, jobs.ReportRequest{LeaseToken: lost.LeaseToken, Status: "SUCCEEDED"})
	require.NoError(t, err)
	require.Equal(t, "SUCCEEDED", r.Status)
	require.Equal(t, 1, running(), "v2's job still holds the one slot")
	xs = b.executions(t, late.JobID)
	require.Equal(t, "SUCCEEDED", *xs[0].Outcome)
	require.Contains(t, *xs[0].Warning, "queued again")
	b.succeed(t, taken)
	require.Zero(t, running())

	// Requeued and claimed again: the old token is superseded.
	lost = b.claimOne(t, v1)
	require.Equal(t, reclaimed.JobID, lost.JobID)
	b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter + time.Second)
	b.sweep(t)
	again := b.claimOne(t, v1)
	require.Equal(t, reclaimed.JobID, again.JobID)
	require.Equal(t, 2, again.Attempt)
	_, err = b.svc.Report(ctx, b.worker, lost.JobID, jobs.ReportRequest{LeaseToken: lost.LeaseToken, Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	require.Equal(t, "SUCCEEDED", b.succeed(t, again).Status)
	require.Zero(t, running())

	// Requeued, not claimed since, and the slot free: the stalled worker's
	// heartbeat takes the job back (RUNNING, its lease renewed, its attempt
	// open again), and its report ends it as any other.
	stalled := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000),
		Input: json.RawMessage(`{"n":3}`)})
	lost = b.claimOne(t, v1)
	require.Equal(t, stalled.JobID, lost.JobID)
	b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter + time.Second)
	b.sweep(t)
	require.Equal(t, "QUEUED", b.step(t, stalled.StepID).Status)
	require.Zero(t, running())
	hb, err := b.svc.Heartbeat(ctx, b.worker, lost.JobID, jobs.HeartbeatRequest{LeaseToken: lost.LeaseToken})
	require.NoError(t, err)
	requireTime(t, b.clock.Now().Add(11*time.Second), *hb.LeaseExpiresAt)
	require.Equal(t, "RUNNING", b.step(t, stalled.StepID).Status)
	require.Equal(t, 1, running())
	xs = b.executions(t, stalled.JobID)
	require.Len(t, xs, 1)
	require.Nil(t, xs[0].Outcome, "the attempt is open again")
	require.Empty(t, b.claim(t, v1, 1), "held again")
	require.Equal(t, "SUCCEEDED", b.succeed(t, lost).Status)
	require.Zero(t, running())
}

// On an endpoint without a concurrency limit there is no slot to free, but
// a long-lapsed lease is queued again all the same, its attempt failed with
// the side-effect warning, so that a run's read says the job waits for a
// worker (it read RUNNING with an open attempt for good); its report is
// still recorded until a new claim. Not parallel, as above.
func TestSweeperRequeuesLapsedLeasesOfUnlimitedEndpoints(t *testing.T) {
	b := setup(t)
	runID := b.run(t)
	st := b.enqueue(t, runID, jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000)})
	b.clock.Add(time.Millisecond) // claimed in order
	revived := b.enqueue(t, runID, jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000), Input: json.RawMessage(`{"n":2}`)})
	w := b.register(t)
	j := b.claimOne(t, w)
	require.Equal(t, st.JobID, j.JobID)
	stalled := b.claimOne(t, w)
	require.Equal(t, revived.JobID, stalled.JobID)
	running := func() int {
		return b.count(t, `SELECT coalesce(sum(running_count), 0)::int FROM job_endpoints WHERE workspace_id = $1`, b.ws)
	}
	b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter - time.Second)
	b.sweep(t)
	require.Equal(t, "RUNNING", b.step(t, st.StepID).Status, "within the window")
	b.clock.Add(2 * time.Second)
	b.sweep(t)
	step := b.step(t, st.StepID)
	require.Equal(t, "QUEUED", step.Status)
	xs := b.executions(t, j.JobID)
	require.Len(t, xs, 1)
	require.Equal(t, "FAILED", *xs[0].Outcome)
	require.Contains(t, *xs[0].Warning, "side effect")
	require.Equal(t, "SUCCEEDED", b.succeed(t, j).Status, "no claim since: the report is recorded")
	require.Equal(t, "SUCCEEDED", b.step(t, st.StepID).Status)

	// The other's worker heartbeats: the job is its own again (RUNNING, its
	// attempt open), and no slot is counted on an endpoint without a limit.
	require.Equal(t, "QUEUED", b.step(t, revived.StepID).Status)
	_, err := b.svc.Heartbeat(ctx, b.worker, stalled.JobID, jobs.HeartbeatRequest{LeaseToken: stalled.LeaseToken})
	require.NoError(t, err)
	require.Equal(t, "RUNNING", b.step(t, revived.StepID).Status)
	require.Nil(t, b.executions(t, revived.JobID)[0].Outcome, "the attempt is open again")
	require.Empty(t, b.claim(t, w, 1), "held again")
	require.Equal(t, "SUCCEEDED", b.succeed(t, stalled).Status)
	require.Zero(t, running())
}

// Listing runs settles the workspace's leases that lapsed on a last attempt
// first, as a run's read does: a run the read answers FAILED is listed
// FAILED.
func TestRunListSettlesLapsedLastAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000), MaxAttempts: ptr[int64](1)})
	b.claimOne(t, b.register(t)) // its worker dies on the only attempt
	_, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	b.clock.Add(time.Minute)

	failed, err := b.svc.ListRuns(ctx, b.ws, "FAILED", "", 50)
	require.NoError(t, err)
	require.Len(t, failed, 1)
	require.Equal(t, runID, failed[0].ID)
	require.Equal(t, "FAILED", b.getRun(t, runID).Status)
}

func (b *bundle) runFinishedEvents(t testing.TB, runID string) []string {
	t.Helper()
	rows, err := b.env.App.Pool.Query(ctx, `SELECT data->>'status' FROM events WHERE type = 'run.finished'
		AND subject_id = $1 ORDER BY created_at, id`, runID)
	require.NoError(t, err)
	statuses, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return statuses
}

// Seed 000: "An exhausted or cancelled step makes the run FAILED" — at
// once, without waiting for the producer to request completion; the failed
// run still takes its failure branches until it does.
func TestAnExhaustedStepFailsItsRunAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	doomed := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
	other := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`)})
	w := b.register(t)
	claimed := b.claim(t, w, 2)
	require.Len(t, claimed, 2)
	for _, j := range claimed {
		if j.JobID == doomed.JobID {
			require.Equal(t, "EXHAUSTED", b.fail(t, j, notRetryable).Status)
		}
	}
	run := b.getRun(t, runID)
	require.Equal(t, "FAILED", run.Status)
	require.False(t, run.CompletionRequested)
	require.NotNil(t, run.FinishedAt)
	require.Equal(t, []string{"FAILED"}, b.runFinishedEvents(t, runID))
	require.Equal(t, "RUNNING", b.step(t, other.StepID).Status, "a failed run cancels nothing")

	// A failure branch is still enqueued, and runs.
	comp := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"undo"`), AfterStepID: &doomed.StepID,
		AfterStatus: ptr("FAILED")})
	require.Equal(t, "QUEUED", comp.Status)
	b.succeed(t, b.claimOne(t, w))

	// Requesting completion closes it to new steps; it stays FAILED.
	finished, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	require.Equal(t, "FAILED", finished.Status)
	_, err = b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
		Input: json.RawMessage(`3`)})
	require.Equal(t, "invalid_state", code(t, err))
	for _, j := range claimed {
		if j.JobID == other.JobID {
			b.succeed(t, j)
		}
	}
	require.Equal(t, "FAILED", b.getRun(t, runID).Status)
	require.Equal(t, []string{"FAILED"}, b.runFinishedEvents(t, runID), "one finish")
}

func TestACancelledOrLapsedLastStepFailsItsRunAtOnce(t *testing.T) {
	// Not parallel: the sweep is global, and a parallel test's sweep at its
	// own clock could hold this test's rows (SKIP LOCKED) when it sweeps.
	b := setup(t)
	cancelled := b.run(t)
	st := b.enqueue(t, cancelled, jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
	_, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	require.Equal(t, "FAILED", b.getRun(t, cancelled).Status)

	lapsed := b.run(t)
	b.enqueue(t, lapsed, jobs.EnqueueRequest{Input: json.RawMessage(`2`), MaxAttempts: ptr[int64](1)})
	b.claimOne(t, b.register(t))
	b.clock.Add(time.Hour)
	b.sweep(t)
	r, err := b.svc.GetRun(ctx, b.ws, lapsed)
	require.NoError(t, err)
	require.Equal(t, "FAILED", r.Status)
	require.Equal(t, []string{"FAILED"}, b.runFinishedEvents(t, lapsed))
}

// A replay reopens a run its step failed; without a completion request the
// run then stays RUNNING after the step succeeds, and finishes SUCCEEDED once
// requested.
func TestReplayReopensARunItsStepFailedBeforeFinish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	st := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
	w := b.register(t)
	b.fail(t, b.claimOne(t, w), notRetryable)
	require.Equal(t, "FAILED", b.getRun(t, runID).Status)
	b.clock.Add(time.Second) // the events' order
	_, err := b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)
	require.Equal(t, "RUNNING", b.getRun(t, runID).Status)
	b.succeed(t, b.claimOne(t, w))
	require.Equal(t, "RUNNING", b.getRun(t, runID).Status, "completion was never requested")
	run, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	require.Equal(t, "SUCCEEDED", run.Status)
	require.Equal(t, []string{"FAILED", "SUCCEEDED"}, b.runFinishedEvents(t, runID))
}

// A replay runs a step only when its dependency ended the way it waits for:
// once the dependency decided against it, the step would have been skipped.
func TestReplayHonoursTheDependencyRule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`), MaxAttempts: ptr[int64](1)})
	onSuccess := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"s"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	onFailure := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"f"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("FAILED")})
	for _, st := range []jobs.EnqueueResult{onSuccess, onFailure} {
		_, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
		require.NoError(t, err)
	}
	w := b.register(t)
	b.fail(t, b.claimOne(t, w), nil)
	require.Equal(t, "EXHAUSTED", b.step(t, a.StepID).Status)

	replay := func(stepID string) error {
		_, err := b.svc.Replay(ctx, b.worker, stepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
		return err
	}
	preview, err := b.svc.PreviewReplay(ctx, b.ws, onSuccess.StepID)
	require.NoError(t, err)
	require.False(t, preview.Eligible)
	err = replay(onSuccess.StepID)
	require.Equal(t, "invalid_state", code(t, err))
	require.Contains(t, err.Error(), "ended EXHAUSTED, so afterStatus SUCCEEDED will never hold")
	require.Equal(t, "CANCELLED", b.step(t, onSuccess.StepID).Status, "a refused replay changes nothing")

	preview, err = b.svc.PreviewReplay(ctx, b.ws, onFailure.StepID)
	require.NoError(t, err)
	require.True(t, preview.Eligible)
	require.NoError(t, replay(onFailure.StepID))
	require.Equal(t, "QUEUED", b.step(t, onFailure.StepID).Status)

	// Replaying the dependency reopens the question; its success lets the
	// other branch be replayed.
	require.NoError(t, replay(a.StepID))
	err = replay(onSuccess.StepID)
	require.Equal(t, "invalid_state", code(t, err))
	require.Contains(t, err.Error(), "has not ended")
	for _, j := range b.claim(t, w, 10) {
		b.succeed(t, j)
	}
	require.Equal(t, "SUCCEEDED", b.step(t, a.StepID).Status)
	require.NoError(t, replay(onSuccess.StepID))
	require.Equal(t, "QUEUED", b.step(t, onSuccess.StepID).Status)
}

// Queue health counts what a claim can take: a lapsed lease on a job's last
// attempt is not waiting for a worker, it is about to be EXHAUSTED.
func TestQueueHealthLeavesOutLapsedLastAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`), MaxAttempts: ptr[int64](1)})
	b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`)})
	w := b.register(t)
	require.Len(t, b.claim(t, w, 2), 2)
	b.clock.Add(time.Minute)
	health, err := b.svc.QueueHealth(ctx, b.ws, "", 10)
	require.NoError(t, err)
	require.Len(t, health, 1)
	require.Equal(t, int64(1), health[0].Queued, "only the lapsed job with attempts left")
	require.Len(t, b.claim(t, w, 2), 1)
}

// The sweeper's settling backstop takes only runs their steps decide: runs
// still waiting for steps no longer fill its pass (QA: the 500 oldest open
// runs were re-settled every pass and newer ones never reached). Not
// parallel: the backstop sweeps every workspace.
func TestSettleBackstopSkipsRunsStillWaiting(t *testing.T) {
	b := setup(t)
	var waiting []string
	for i := range 3 {
		runID := b.run(t)
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i))})
		_, err := b.svc.FinishRun(ctx, b.ws, runID)
		require.NoError(t, err)
		waiting = append(waiting, runID)
	}
	b.clock.Add(time.Second) // ids follow the clock: the decided run sorts after the waiting ones
	decided := b.run(t)
	st := b.enqueue(t, decided, jobs.EnqueueRequest{Input: json.RawMessage(`"d"`)})
	// Its step ended and its completion was requested behind the service's
	// back, as a crash between the two would leave it.
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', finished_at = now() WHERE step_id = $1`,
		st.StepID)
	require.NoError(t, err)
	_, err = b.env.App.Pool.Exec(ctx, `UPDATE job_runs SET completion_requested = true WHERE id = $1`, decided)
	require.NoError(t, err)

	// One run per pass: each pass settles a decided run until none is left.
	for range 50 {
		n, err := jobs.SettleRuns(b.svc, 1)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	require.Equal(t, "SUCCEEDED", b.getRun(t, decided).Status)
	for _, id := range waiting {
		require.Equal(t, "RUNNING", b.getRun(t, id).Status)
	}
}

// A chain of skips of any depth is decided by the report that starts it
// (QA: levels beyond 32 stayed WAITING until the sweeper ran).
func TestADeepSkipChainIsDecidedInline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	root := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"root"`)})
	prev, steps := root.StepID, []string{}
	for i := range 40 {
		st := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i)), AfterStepID: &prev,
			AfterStatus: ptr("FAILED")})
		require.Equal(t, "WAITING", st.Status)
		prev = st.StepID
		steps = append(steps, st.StepID)
	}
	// A branch that waits for the root's success is queued, not skipped.
	branch := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"b"`), AfterStepID: &root.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	_, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	b.succeed(t, b.claimOne(t, b.register(t)))
	for _, id := range steps {
		require.Equal(t, "SKIPPED", b.step(t, id).Status)
	}
	require.Equal(t, "QUEUED", b.step(t, branch.StepID).Status)
}

// A run's read holds its first 1000 steps and says when there are more;
// ListSteps pages the rest (security review: the read returned every step,
// however many, in one answer).
func TestARunsReadBoundsItsSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	for i := range 1001 {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))})
	}
	r := b.getRun(t, runID)
	require.Len(t, r.Steps, 1000)
	require.True(t, r.StepsTruncated)
	rest, err := b.svc.ListSteps(ctx, b.ws, runID, "", r.Steps[999].ID, 200)
	require.NoError(t, err)
	require.Len(t, rest, 1)
	require.Greater(t, rest[0].ID, r.Steps[999].ID)

	small := b.run(t)
	b.enqueue(t, small, jobs.EnqueueRequest{})
	r = b.getRun(t, small)
	require.Len(t, r.Steps, 1)
	require.False(t, r.StepsTruncated)
}

// A generated key of a run started since migration 0031 is the service's
// keyed hash of the operation: no plain hash of what the step's read shows
// and a guessed input (security review). A run started before keeps the
// plain hash, so that an enqueue retried across the upgrade finds its step.
func TestGeneratedKeysGiveAwayNoInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	input := json.RawMessage(`{"to":"carol@example.com","pin":"4821"}`)
	plain := func(runID string) string {
		canon, err := canonjson.Marshal(map[string]any{"pin": "4821", "to": "carol@example.com"})
		require.NoError(t, err)
		h, err := canonjson.Hash([]any{runID, "send_email", "1", nil, "send_email", nil, nil, canonjson.Canonical(canon)})
		require.NoError(t, err)
		return h
	}

	keyed := b.run(t)
	k := b.enqueue(t, keyed, jobs.EnqueueRequest{Input: input})
	require.Len(t, k.IdempotencyKey, 64)
	require.NotEqual(t, plain(keyed), k.IdempotencyKey)
	again := b.enqueue(t, keyed, jobs.EnqueueRequest{Input: input})
	require.True(t, again.Deduplicated)
	require.Equal(t, k.IdempotencyKey, again.IdempotencyKey)
	require.Equal(t, k.IdempotencyKey, b.step(t, k.StepID).IdempotencyKey)

	old := b.run(t)
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE job_runs SET keyed_step_keys = false WHERE id = $1`, old)
	require.NoError(t, err)
	o := b.enqueue(t, old, jobs.EnqueueRequest{Input: input})
	require.Equal(t, plain(old), o.IdempotencyKey, "a run from before keeps the plain hash")
	oAgain := b.enqueue(t, old, jobs.EnqueueRequest{Input: input})
	require.True(t, oAgain.Deduplicated)
	require.Equal(t, o.StepID, oAgain.StepID)
	_, err = b.svc.Enqueue(ctx, b.ws, old, jobs.EnqueueRequest{Name: "send_email", Version: "1",
		IdempotencyKey: &o.IdempotencyKey, Input: json.RawMessage(`"other"`)})
	require.Equal(t, apierr.CodeIdempotencyKeyReuse, code(t, err))
}

// Every way a run starts marks it for keyed step keys: a plain run, one
// started under a key, and a tool test's synthetic run (review: the last
// took the column's default, so its step got the plain, guessable key).
func TestEveryNewRunTakesKeyedStepKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.run(t)
	_, err := b.svc.CreateRun(ctx, b.ws, jobs.CreateRunRequest{Name: "keyed", IdempotencyKey: ptr("start:1")})
	require.NoError(t, err)
	_, err = b.svc.TestTool(ctx, b.worker, "send_email", jobs.ToolTestRequest{Version: "1"})
	require.NoError(t, err)
	var runs, keyed int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE keyed_step_keys)
		FROM job_runs WHERE workspace_id = $1`, b.ws).Scan(&runs, &keyed))
	require.Equal(t, 3, runs)
	require.Equal(t, runs, keyed)
}

// A job queued under a tool name an earlier release took and this one
// refuses ("..", white space or a control character in its name or
// version) is still a queue health row, and its cursor pages on (reviews:
// the cursor was checked by the rule that admits names).
func TestQueueHealthPagesPastALegacyToolName(t *testing.T) {
	b := setup(t)
	runID := b.run(t)
	res := b.enqueue(t, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1"})
	b.enqueue(t, runID, jobs.EnqueueRequest{Name: "zzz", Version: "1"})
	for _, legacy := range [][2]string{{"..", "1"}, {"send email", "1 beta"}, {"a\x01b", "1"}} {
		_, err := b.env.App.Pool.Exec(ctx, `UPDATE jobs SET name = $2, version = $3 WHERE step_id = $1`,
			res.StepID, legacy[0], legacy[1])
		require.NoError(t, err)
		page, err := b.svc.QueueHealth(ctx, b.ws, "", 1)
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, legacy[0], page[0].Name)
		next, err := b.svc.QueueHealth(ctx, b.ws, page[0].HealthCursor(), 1)
		require.NoError(t, err, "the cursor %q the first page answered", page[0].HealthCursor())
		require.Len(t, next, 1)
		require.Equal(t, "zzz", next[0].Name)
	}
}

// A heartbeat never shortens a job's lease, as a gate heartbeat never does:
// one that carries an older clock reading than a heartbeat already recorded
// (it waited for a connection or the job's row behind it, its client gave
// up and sent another, or its instance's clock is behind) leaves the later
// expiry, and no other worker takes the job before it (time QA: the stale
// heartbeat moved the lease back, and the job went to a second worker while
// the first, told the later expiry, still ran it).
func TestALateJobHeartbeatNeverShortensTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	enq := b.enqueue(t, runID, jobs.EnqueueRequest{TimeoutMs: ptr[int64](5_000)})
	w1, w2 := b.register(t), b.register(t)
	t0 := b.clock.Now()
	j := b.claimOne(t, w1)
	heartbeat := func() time.Time {
		t.Helper()
		hb, err := b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
		require.NoError(t, err)
		return *hb.LeaseExpiresAt
	}
	b.clock.Set(t0.Add(10 * time.Second))
	want := t0.Add(25 * time.Second) // 5 s timeout + 10 s grace from the heartbeat
	requireTime(t, want, heartbeat())
	b.clock.Set(t0.Add(2 * time.Second)) // the late heartbeat's reading
	requireTime(t, want, heartbeat())
	b.clock.Set(t0.Add(20 * time.Second)) // past what the late one would have left
	require.Empty(t, b.claim(t, w2, 1), "the lease the first heartbeat gave still holds")
	dj := b.step(t, enq.StepID).DurableJob
	requireTime(t, want, *dj.LeaseExpiresAt)
	requireTime(t, want, dj.Attempts[0].LeaseExpiresAt)
	b.clock.Set(t0.Add(25 * time.Second))
	require.Len(t, b.claim(t, w2, 1), 1, "and lapses when it said")
}
