package jobs_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// Enqueues racing under one explicit key with different inputs: one
// operation wins the key, every answer that succeeds names its one step
// (exactly one of them not deduplicated, and only requests of that very
// operation succeed), and every other is 409 idempotency_key_reuse. Half
// the racers send the same input, so the winner may have company.
func TestConcurrentEnqueuesOfOneKeyWithOtherInputsOneWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, b.run(t), jobs.EnqueueRequest{}) // the endpoint exists
	for round := range 5 {
		runID := b.run(t)
		const n = 24
		inputs := make([]string, n)
		res := make([]jobs.EnqueueResult, n)
		errs := make([]error, n)
		for i := range n {
			inputs[i] = `{"shared":true}`
			if i%2 == 1 {
				inputs[i] = fmt.Sprintf(`{"own":%d}`, i)
			}
		}
		key := fmt.Sprintf("hammer-%d", round)
		apitest.StartTogether(n, func(i int) {
			res[i], errs[i] = b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
				IdempotencyKey: ptr(key), Input: json.RawMessage(inputs[i])})
		})
		var jobID, winner string
		created := 0
		for i := range n {
			if errs[i] != nil {
				require.Equal(t, apierr.CodeIdempotencyKeyReuse, code(t, errs[i]), "racer %d", i)
				continue
			}
			if jobID == "" {
				jobID, winner = res[i].JobID, inputs[i]
			}
			require.Equal(t, jobID, res[i].JobID, "racer %d", i)
			require.Equal(t, winner, inputs[i], "racer %d succeeded with another operation", i)
			if !res[i].Deduplicated {
				created++
			}
		}
		require.Equal(t, 1, created, "exactly one answer created the step")
		for i := range n {
			if inputs[i] == winner {
				require.NoError(t, errs[i], "racer %d sent the winning operation", i)
			}
		}
		var steps int
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE run_id = $1`, runID).Scan(&steps))
		require.Equal(t, 1, steps)
	}
}

// claimUntilEmpty has worker wid claim, limit jobs at a time, until a
// claim answers nothing, handing each claim's jobs to onJobs; an error ends
// it.
func (b *bundle) claimUntilEmpty(wid string, limit int, onJobs func([]jobs.ClaimedJob)) error {
	for {
		c, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{Limit: &limit})
		if err != nil || len(c.Jobs) == 0 {
			return err
		}
		onJobs(c.Jobs)
	}
}

// claimers runs n workers, each claiming (limit 1 to 5) until a claim
// answers nothing; onClaim sees every job leased and its worker. Any claim
// error fails the test.
func (b *bundle) claimers(t *testing.T, n int, onClaim func(worker int, j jobs.ClaimedJob)) {
	t.Helper()
	wids := make([]string, n)
	for i := range n {
		wids[i] = b.register(t)
	}
	errs := make([]error, n)
	apitest.StartTogether(n, func(i int) {
		errs[i] = b.claimUntilEmpty(wids[i], 1+i%5, func(js []jobs.ClaimedJob) {
			for _, j := range js {
				onClaim(i, j)
			}
		})
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// Claims racing on an endpoint with rateLimitPerMinute lease exactly that
// many jobs in the minute, however many are due and however the claims
// interleave, and as many again in the next minute.
func TestConcurrentClaimsNeverPassTheRateLimit(t *testing.T) {
	t.Parallel()
	const rate, queued = 7, 200
	b := setup(t)
	b.createEndpoint(t, "send_email", jobs.PolicyFields{RateLimitPerMinute: opt[int64](rate)})
	runID := b.run(t)
	b.fill(t, runID, queued)
	for minute := range 3 {
		var leased atomic.Int64
		b.claimers(t, 8, func(int, jobs.ClaimedJob) { leased.Add(1) })
		require.EqualValues(t, rate, leased.Load(), "minute %d", minute)
		var started int
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM job_executions x JOIN jobs j ON j.id = x.job_id
			WHERE j.run_id = $1`, runID).Scan(&started))
		require.Equal(t, rate*(minute+1), started)
		b.clock.Add(time.Minute)
	}
}

// Claims racing on a paused endpoint lease nothing and consume no attempt;
// claims racing the pause itself lease nothing once the pause has
// answered.
func TestConcurrentClaimsOnAPausedEndpointLeaseNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "send_email"})
	require.NoError(t, err)
	runID := b.run(t)
	b.fill(t, runID, 400)
	_, err = b.svc.SetPaused(ctx, b.ws, ep.ID, true)
	require.NoError(t, err)
	var leasedPaused atomic.Int64
	b.claimers(t, 8, func(int, jobs.ClaimedJob) { leasedPaused.Add(1) })
	require.Zero(t, leasedPaused.Load(), "jobs leased while paused")
	var attempts int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT coalesce(sum(attempt), 0) FROM jobs WHERE run_id = $1`,
		runID).Scan(&attempts))
	require.Zero(t, attempts, "a paused endpoint's jobs consumed attempts")

	_, err = b.svc.SetPaused(ctx, b.ws, ep.ID, false)
	require.NoError(t, err)
	var paused atomic.Bool
	var afterPause atomic.Int64
	wids := make([]string, 8)
	for i := range wids {
		wids[i] = b.register(t)
	}
	errs := make([]error, len(wids)+1)
	apitest.StartTogether(len(wids)+1, func(i int) {
		if i == len(wids) {
			_, errs[i] = b.svc.SetPaused(ctx, b.ws, ep.ID, true)
			paused.Store(true)
			return
		}
		for range 20 {
			pausedBefore := paused.Load()
			c, err := b.svc.Claim(ctx, b.worker, wids[i], jobs.ClaimRequest{Limit: ptr(1)})
			if err != nil {
				errs[i] = err
				return
			}
			if pausedBefore {
				afterPause.Add(int64(len(c.Jobs)))
			}
		}
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.True(t, paused.Load())
	require.Zero(t, afterPause.Load(), "a claim begun after the pause answered leased a job")
}

// Claimers racing while dependencies end never lease a dependent before its
// dependency has ended: when a claim answers a dependent, its dependency's
// ending has committed. Each dependency is reported by the claimer that
// leased it, concurrently with the other claims.
func TestConcurrentClaimsNeverLeaseADependentBeforeItsDependency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	const chains = 40
	dependencyOf := map[string]string{} // dependent's job → dependency's job
	for i := range chains {
		first := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))})
		second := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(-i - 1)),
			AfterStepID: ptr(first.StepID), AfterStatus: ptr("SUCCEEDED")})
		dependencyOf[second.JobID] = first.JobID
	}
	var mu sync.Mutex
	claimed := map[string]int{}
	b.claimers(t, 6, func(_ int, j jobs.ClaimedJob) {
		if dep, ok := dependencyOf[j.JobID]; ok {
			var status string
			if err := b.env.App.Pool.QueryRow(ctx, `SELECT status FROM jobs WHERE id = $1`, dep).Scan(&status); err != nil {
				t.Errorf("read dependency: %v", err)
			}
			if status != jobs.StatusSucceeded {
				t.Errorf("dependent %s leased while its dependency was %s", j.JobID, status)
			}
		}
		mu.Lock()
		claimed[j.JobID]++
		mu.Unlock()
		if _, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
			Status: jobs.StatusSucceeded}); err != nil {
			t.Errorf("report %s: %v", j.JobID, err)
		}
	})
	// A claimer may stop while the last dependents are released by reports
	// still in flight: claim what is left.
	for _, j := range b.claim(t, b.register(t), 100) {
		claimed[j.JobID]++
		require.Contains(t, dependencyOf, j.JobID)
		b.succeed(t, j)
	}
	require.Len(t, claimed, 2*chains)
	for id, n := range claimed {
		require.Equal(t, 1, n, "job %s leased %d times", id, n)
	}
}

// outcome reads a job's status and its attempts' outcomes, oldest first
// ("" for an attempt with none yet).
func (b *bundle) outcome(t *testing.T, jobID string) (string, []string) {
	t.Helper()
	var status string
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT status FROM jobs WHERE id = $1`, jobID).Scan(&status))
	var outcomes []string
	for _, x := range b.executions(t, jobID) {
		o := ""
		if x.Outcome != nil {
			o = *x.Outcome
		}
		outcomes = append(outcomes, o)
	}
	return status, outcomes
}

// claimAll enqueues n jobs with the request's fields (distinct inputs) and
// claims them all with one worker.
func (b *bundle) claimAll(t *testing.T, n int, req jobs.EnqueueRequest) []jobs.ClaimedJob {
	t.Helper()
	runID := b.run(t)
	for i := range n {
		req.Input = json.RawMessage(fmt.Sprint(i))
		b.enqueue(t, runID, req)
	}
	claimed := b.claim(t, b.register(t), n)
	require.Len(t, claimed, n)
	return claimed
}

// reportSucceeded reports job j succeeded with its lease token, for
// racePairs (i is unused).
func (b *bundle) reportSucceeded(_ int, j jobs.ClaimedJob) error {
	_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
		Status: jobs.StatusSucceeded})
	return err
}

// bystanders is how many jobs stay leased beside the jobs of a test that
// counts slots: a slot freed twice takes one of theirs (the count never
// goes below zero, so without them a double free would not show).
const bystanders = 3

// claimBesideBystanders claims n jobs of the endpoint send_email, given a
// concurrency limit, and bystanders more that stay leased.
func (b *bundle) claimBesideBystanders(t *testing.T, n int) []jobs.ClaimedJob {
	t.Helper()
	b.limitedEndpoint(t, "send_email", 1000)
	return b.claimAll(t, n+bystanders, jobs.EnqueueRequest{})[:n]
}

// racePairs starts first(i, j) and second(i, j) for every claimed job j (its
// index i) at one start, and answers their errors in the jobs' order.
func racePairs(claimed []jobs.ClaimedJob, first, second func(i int, j jobs.ClaimedJob) error) ([]error, []error) {
	a, b := make([]error, len(claimed)), make([]error, len(claimed))
	apitest.StartTogether(2*len(claimed), func(k int) {
		i := k / 2
		if k%2 == 0 {
			a[i] = first(i, claimed[i])
		} else {
			b[i] = second(i, claimed[i])
		}
	})
	return a, b
}

// Two reports with one lease token and different outcomes, at the same
// moment: one is recorded, and the other is 409 invalid_state (a different
// outcome on a reported attempt), whichever commits first. The job and its
// one attempt say the winner's outcome.
func TestTwoReportsOfOneTokenWithOtherOutcomesRecordOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claimed := b.claimBesideBystanders(t, 40)
	succeeded, failed := racePairs(claimed, b.reportSucceeded, func(_ int, j jobs.ClaimedJob) error {
		_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
			Status: "FAILED", Error: &jobs.ReportError{Message: "no", Retryable: ptr(false)}})
		return err
	})
	for i, j := range claimed {
		status, outcomes := b.outcome(t, j.JobID)
		switch {
		case succeeded[i] == nil && failed[i] != nil:
			require.Equal(t, apierr.CodeInvalidState, code(t, failed[i]))
			require.Equal(t, jobs.StatusSucceeded, status)
			require.Equal(t, []string{"SUCCEEDED"}, outcomes)
		case failed[i] == nil && succeeded[i] != nil:
			require.Equal(t, apierr.CodeInvalidState, code(t, succeeded[i]))
			require.Equal(t, jobs.StatusExhausted, status)
			require.Equal(t, []string{"FAILED"}, outcomes)
		default:
			t.Fatalf("job %s: success answered %v, failure %v: want exactly one recorded", j.JobID, succeeded[i], failed[i])
		}
	}
	require.Equal(t, bystanders, b.runningCount(t, "send_email"), "every slot freed once")
}

// Two FAILED reports with one lease token and different retryAfterMs, at
// the same moment: one is recorded, and the other is 409 invalid_state (a
// repeat that disagrees), whichever commits first; the attempt keeps the
// winner's hint, and the retry is due by it.
func TestTwoFailuresOfOneTokenWithOtherRetryHintsRecordOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claimed := b.claimBesideBystanders(t, 40)
	failing := func(ms int64) func(int, jobs.ClaimedJob) error {
		return func(_ int, j jobs.ClaimedJob) error {
			_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
				Status: "FAILED", Error: &jobs.ReportError{Message: "later", RetryAfterMs: &ms}})
			return err
		}
	}
	minute, hour := racePairs(claimed, failing(60_000), failing(3_600_000))
	now := b.clock.Now()
	for i, j := range claimed {
		var hint int64
		var due time.Time
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT x.retry_after_ms, j.due_at FROM jobs j
			JOIN job_executions x ON x.job_id = j.id AND x.attempt = j.attempt WHERE j.id = $1`, j.JobID).Scan(&hint, &due))
		switch {
		case minute[i] == nil && hour[i] != nil:
			require.Equal(t, apierr.CodeInvalidState, code(t, hour[i]))
			require.EqualValues(t, 60_000, hint)
			require.True(t, due.Before(now.Add(time.Hour)), "due by the minute's hint")
		case hour[i] == nil && minute[i] != nil:
			require.Equal(t, apierr.CodeInvalidState, code(t, minute[i]))
			require.EqualValues(t, 3_600_000, hint)
			require.False(t, due.Before(now.Add(time.Hour)), "due by the hour's hint")
		default:
			t.Fatalf("job %s: a minute answered %v, an hour %v: want exactly one recorded", j.JobID, minute[i], hour[i])
		}
	}
	require.Equal(t, bystanders, b.runningCount(t, "send_email"), "every slot freed once")
}

// A report and a heartbeat with one token, at the same moment: the report
// is always recorded; the heartbeat extends the lease (it came first) or
// is 409 invalid_state (the attempt ended), and never takes the job back.
func TestAReportRacingAHeartbeatOfItsToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claimed := b.claimBesideBystanders(t, 40)
	reports, beats := racePairs(claimed, b.reportSucceeded, func(_ int, j jobs.ClaimedJob) error {
		_, err := b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
		return err
	})
	for i, j := range claimed {
		require.NoError(t, reports[i], j.JobID)
		if beats[i] != nil {
			require.Equal(t, apierr.CodeInvalidState, code(t, beats[i]), j.JobID)
		}
		status, outcomes := b.outcome(t, j.JobID)
		require.Equal(t, jobs.StatusSucceeded, status)
		require.Equal(t, []string{"SUCCEEDED"}, outcomes)
	}
	require.Equal(t, bystanders, b.runningCount(t, "send_email"), "every slot freed once")
}

// A batch report and single reports of the same jobs, at the same moment:
// with the same outcome both answer it; with different outcomes one is
// recorded and the other refused invalid_state (in its slot, for the
// batch). Each attempt has one outcome, the job's status that outcome's.
func TestABatchReportRacingSingleReportsOfItsJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 40
	claimed := b.claimBesideBystanders(t, n)
	var batch jobs.BatchReportRequest
	for _, j := range claimed {
		batch.Reports = append(batch.Reports, jobs.BatchReportItem{JobID: j.JobID, LeaseToken: j.LeaseToken,
			Status: jobs.StatusSucceeded})
	}
	singles := make([]error, n)
	var batchRes jobs.BatchReportResponse
	var batchErr error
	apitest.StartTogether(n+1, func(i int) {
		if i == n {
			batchRes, batchErr = b.svc.ReportBatch(ctx, b.worker, batch)
			return
		}
		j := claimed[i]
		req := jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: jobs.StatusSucceeded}
		if i%2 == 1 { // the other outcome
			req = jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED",
				Error: &jobs.ReportError{Message: "no", Retryable: ptr(false)}}
		}
		_, singles[i] = b.svc.Report(ctx, b.worker, j.JobID, req)
	})
	require.NoError(t, batchErr)
	require.Len(t, batchRes.Results, n)
	for i, j := range claimed {
		slot := batchRes.Results[i]
		require.Equal(t, j.JobID, slot.JobID)
		status, outcomes := b.outcome(t, j.JobID)
		if i%2 == 0 {
			require.NoError(t, singles[i], j.JobID)
			require.Nil(t, slot.Error, j.JobID)
			require.Equal(t, jobs.StatusSucceeded, slot.Status)
			require.Equal(t, jobs.StatusSucceeded, status)
			require.Equal(t, []string{"SUCCEEDED"}, outcomes)
			continue
		}
		if slot.Error == nil {
			require.Error(t, singles[i], "job %s: both outcomes accepted", j.JobID)
			require.Equal(t, apierr.CodeInvalidState, code(t, singles[i]))
			require.Equal(t, jobs.StatusSucceeded, status)
			require.Equal(t, []string{"SUCCEEDED"}, outcomes)
		} else {
			require.NoError(t, singles[i], "job %s: both outcomes refused", j.JobID)
			require.Equal(t, apierr.CodeInvalidState, slot.Error.Code)
			require.Equal(t, jobs.StatusExhausted, status)
			require.Equal(t, []string{"FAILED"}, outcomes)
		}
	}
	require.Equal(t, bystanders, b.runningCount(t, "send_email"), "every slot freed once")
}

// runningCount reads the running_count of the workspace's endpoint name.
func (b *bundle) runningCount(t *testing.T, name string) int {
	t.Helper()
	var n int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT running_count FROM job_endpoints
		WHERE workspace_id = $1 AND name = $2`, b.ws, name).Scan(&n))
	return n
}

// A cancel racing the report of the running attempt: the report is always
// recorded on the attempt; the cancel is answered (the job stays CANCELLED,
// whatever the report said) or, when the report ended the job first, 409
// invalid_state (the job SUCCEEDED). The slot the attempt held is freed
// once either way.
func TestACancelRacingTheReportOfItsRunningAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 40
	claimed := b.claimBesideBystanders(t, n)
	reports := make([]jobs.ReportResult, n)
	reportErrs, cancels := racePairs(claimed, func(i int, j jobs.ClaimedJob) (err error) {
		reports[i], err = b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
			Status: jobs.StatusSucceeded})
		return err
	}, func(_ int, j jobs.ClaimedJob) error {
		_, err := b.svc.CancelStep(ctx, b.ws, j.StepID)
		return err
	})
	won := 0
	for i, j := range claimed {
		require.NoError(t, reportErrs[i], j.JobID)
		status, outcomes := b.outcome(t, j.JobID)
		require.Equal(t, []string{"SUCCEEDED"}, outcomes, j.JobID)
		if cancels[i] == nil {
			won++
			require.Equal(t, jobs.StatusCancelled, status, "job %s: cancel answered, job not cancelled", j.JobID)
			require.Equal(t, jobs.StatusCancelled, reports[i].Status, j.JobID)
		} else {
			require.Equal(t, apierr.CodeInvalidState, code(t, cancels[i]), j.JobID)
			require.Equal(t, jobs.StatusSucceeded, status, j.JobID)
			require.Equal(t, jobs.StatusSucceeded, reports[i].Status, j.JobID)
		}
	}
	require.Equal(t, bystanders, b.runningCount(t, "send_email"), "every slot freed once")
	t.Logf("%d of %d cancels came first", won, n)
}

// Cancels racing claims of their queued jobs: every cancel is answered and
// every job ends CANCELLED. A job a claim leased first has one attempt,
// told to stop at its heartbeat, holding its slot until it reports; a job
// cancelled first is never leased (no attempt).
func TestCancelsRacingClaimsOfTheirJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEndpoint(t, "send_email", jobs.PolicyFields{MaxConcurrent: opt[int64](100)})
	runID := b.run(t)
	const n, claimers = 60, 4
	var steps []jobs.EnqueueResult
	for i := range n {
		steps = append(steps, b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))}))
	}
	wids := make([]string, claimers)
	for i := range wids {
		wids[i] = b.register(t)
	}
	var mu sync.Mutex
	leased := map[string]jobs.ClaimedJob{}
	errs := make([]error, n+claimers)
	apitest.StartTogether(n+claimers, func(i int) {
		if i < n {
			_, errs[i] = b.svc.CancelStep(ctx, b.ws, steps[i].StepID)
			return
		}
		errs[i] = b.claimUntilEmpty(wids[i-n], 3, func(js []jobs.ClaimedJob) {
			mu.Lock()
			defer mu.Unlock()
			for _, j := range js {
				if _, dup := leased[j.JobID]; dup {
					t.Errorf("job %s leased twice", j.JobID)
				}
				leased[j.JobID] = j
			}
		})
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	for _, e := range steps {
		status, outcomes := b.outcome(t, e.JobID)
		require.Equal(t, jobs.StatusCancelled, status, e.JobID)
		j, ok := leased[e.JobID]
		if !ok {
			require.Empty(t, outcomes, "job %s has an attempt no claim answered", e.JobID)
			continue
		}
		require.Equal(t, []string{""}, outcomes, e.JobID)
		hb, err := b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
		require.NoError(t, err)
		require.True(t, hb.CancelRequested, e.JobID)
	}
	require.Equal(t, len(leased), b.runningCount(t, "send_email"), "each leased, cancelled attempt holds its slot")
	var held int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE run_id = $1 AND slot_attempt IS NOT NULL`,
		runID).Scan(&held))
	require.Equal(t, len(leased), held, "the count is the held slots', which the sweeper frees at their leases' expiry")
	for _, j := range leased {
		b.succeed(t, j)
	}
	require.Zero(t, b.runningCount(t, "send_email"))
	t.Logf("%d of %d jobs leased before their cancel", len(leased), n)
}

// Claims racing over jobs whose leases keep lapsing (workers that vanish),
// while late reports of the lapsed attempts fail some of them (retryable)
// at the same moment: no job ever has more attempts than its maxAttempts,
// each lapse counting as one, and no attempt number is used twice. Once
// the clock passes the last leases, every job has used exactly its
// maxAttempts and reads EXHAUSTED.
func TestAttemptsNeverPassMaxAttemptsUnderClaimAndLapseChurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEndpoint(t, "send_email", jobs.PolicyFields{Preset: opt("CUSTOM"), MaxAttempts: opt[int64](3),
		InitialDelayMs: opt[int64](1000), Multiplier: opt[float64](1), MaxDelayMs: opt[int64](1000),
		JitterPercent: opt[float64](0)})
	runID := b.run(t)
	const n, claimers = 30, 5
	for i := range n {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i)), TimeoutMs: ptr[int64](1_000)})
	}
	wids := make([]string, claimers)
	for i := range wids {
		wids[i] = b.register(t)
	}
	var lapsed []jobs.ClaimedJob // the previous round's leases, lapsed now
	for round := range 8 {
		var mu sync.Mutex
		var leased []jobs.ClaimedJob
		errs := make([]error, claimers)
		apitest.StartTogether(claimers+len(lapsed), func(i int) {
			if i >= claimers { // a late report: the worker came back with a failure
				j := lapsed[i-claimers]
				if j.Attempt%2 == 0 {
					_, _ = b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
						Status: "FAILED", Error: &jobs.ReportError{Message: "late"}})
				}
				return
			}
			errs[i] = b.claimUntilEmpty(wids[i], 4, func(js []jobs.ClaimedJob) {
				mu.Lock()
				defer mu.Unlock()
				leased = append(leased, js...)
			})
		})
		for _, err := range errs {
			require.NoError(t, err)
		}
		for _, j := range leased {
			require.LessOrEqual(t, j.Attempt, 3, "round %d: job %s claimed for attempt %d", round, j.JobID, j.Attempt)
		}
		lapsed = leased
		b.clock.Add(15 * time.Second) // past every lease (1 s + 10 s grace) and retry delay
	}
	b.getRun(t, runID) // settles the lapsed last attempts
	rows, err := b.env.App.Pool.Query(ctx, `SELECT j.id, j.status, j.attempt, count(x.*), count(DISTINCT x.attempt),
		coalesce(max(x.attempt), 0) FROM jobs j LEFT JOIN job_executions x ON x.job_id = j.id
		WHERE j.run_id = $1 GROUP BY j.id`, runID)
	require.NoError(t, err)
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var id, status string
		var attempt, executions, distinct, maxAttempt int
		require.NoError(t, rows.Scan(&id, &status, &attempt, &executions, &distinct, &maxAttempt))
		seen++
		require.Equal(t, jobs.StatusExhausted, status, id)
		require.Equal(t, 3, attempt, id)
		require.Equal(t, 3, executions, id)
		require.Equal(t, 3, distinct, id)
		require.Equal(t, 3, maxAttempt, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, n, seen)
}

// A replay racing the late report of the attempt it replaces (a last
// attempt whose lease lapsed, no read or sweep having ended it yet): the
// report is recorded (the job SUCCEEDED) and the replay refused
// invalid_state, or the replay ends the lapsed attempt (FAILED, with the
// warning) and queues the job again, and the report is refused. Never both:
// a replay of a job whose outcome was recorded would run it again, and a
// success recorded on a job queued again would be run over.
func TestAReplayRacingTheLateReportOfTheAttemptItReplaces(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 30
	claimed := b.claimAll(t, n, jobs.EnqueueRequest{MaxAttempts: ptr[int64](1), TimeoutMs: ptr[int64](1_000)})
	b.clock.Add(time.Minute) // every last attempt's lease lapsed
	reports, replays := racePairs(claimed, func(i int, j jobs.ClaimedJob) error {
		// A replay does more before it takes the job's row than a report:
		// staggered, the reports let some replays in first.
		time.Sleep(time.Duration(i%10) * time.Millisecond)
		_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
			Status: jobs.StatusSucceeded})
		return err
	}, func(_ int, j jobs.ClaimedJob) error {
		_, err := b.svc.Replay(ctx, b.worker, j.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
		return err
	})
	replayed := 0
	for i, j := range claimed {
		status, outcomes := b.outcome(t, j.JobID)
		if replays[i] == nil {
			replayed++
			require.Error(t, reports[i], "job %s: replayed and its report recorded", j.JobID)
			// Refused as lapsed if it came between the replay's settling of
			// the lapse and its queueing, else as superseded.
			if code(t, reports[i]) != apierr.CodeLeaseLost {
				require.Equal(t, apierr.CodeInvalidState, code(t, reports[i]))
				require.Equal(t, true, reports[i].(*apierr.Error).Detail["leaseLapsed"])
			}
			require.Equal(t, jobs.StatusQueued, status, j.JobID)
			require.Equal(t, []string{"FAILED"}, outcomes, j.JobID)
			continue
		}
		require.Equal(t, apierr.CodeInvalidState, code(t, replays[i]), j.JobID)
		require.NoError(t, reports[i], j.JobID)
		require.Equal(t, jobs.StatusSucceeded, status, j.JobID)
		require.Equal(t, []string{"SUCCEEDED"}, outcomes, j.JobID)
	}
	t.Logf("%d of %d replays came first", replayed, n)
}

// Over jobs the sweeper requeued (their leases lapsed long ago), a late
// report, a heartbeat that would take the job back, and claims, all with
// one start: a job a claim takes has its old token lease_lost for both
// the report and the heartbeat; a job no claim takes has the report
// recorded (SUCCEEDED, its one attempt's outcome), and its heartbeat took
// it back first or is told the attempt ended (invalid_state). The slots
// net out to the reclaimed jobs'. Not parallel: the sweep is global.
func TestALateReportHeartbeatAndClaimsRacingOverRequeuedJobs(t *testing.T) {
	b := setup(t)
	b.limitedEndpoint(t, "mailer", 100)
	const n, claimers = 30, 3
	claimed := b.requeued(t, n, "mailer")
	require.Zero(t, b.runningCount(t, "mailer"))
	wids := make([]string, claimers)
	for i := range wids {
		wids[i] = b.register(t)
	}
	reports := make([]error, n)
	beats := make([]error, n)
	var mu sync.Mutex
	reclaimed := map[string]int{}
	claimErrs := make([]error, claimers)
	apitest.StartTogether(2*n+claimers, func(i int) {
		switch {
		case i >= 2*n:
			claimErrs[i-2*n] = b.claimUntilEmpty(wids[i-2*n], 3, func(js []jobs.ClaimedJob) {
				mu.Lock()
				defer mu.Unlock()
				for _, j := range js {
					reclaimed[j.JobID]++
				}
			})
		case i%2 == 0:
			j := claimed[i/2]
			_, reports[i/2] = b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
				Status: jobs.StatusSucceeded})
		default:
			j := claimed[i/2]
			_, beats[i/2] = b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
		}
	})
	for _, err := range claimErrs {
		require.NoError(t, err)
	}
	for i, j := range claimed {
		status, outcomes := b.outcome(t, j.JobID)
		switch reclaimed[j.JobID] {
		case 0:
			require.NoError(t, reports[i], j.JobID)
			if beats[i] != nil {
				require.Equal(t, apierr.CodeInvalidState, code(t, beats[i]), j.JobID)
			}
			require.Equal(t, jobs.StatusSucceeded, status, j.JobID)
			require.Equal(t, []string{"SUCCEEDED"}, outcomes, j.JobID)
		case 1:
			require.Error(t, reports[i], "job %s: reclaimed and its late report recorded", j.JobID)
			require.Equal(t, apierr.CodeLeaseLost, code(t, reports[i]), j.JobID)
			require.Error(t, beats[i], "job %s: reclaimed and taken back by its old token", j.JobID)
			require.Equal(t, apierr.CodeLeaseLost, code(t, beats[i]), j.JobID)
			require.Equal(t, jobs.StatusRunning, status, j.JobID)
			require.Equal(t, []string{"FAILED", ""}, outcomes, j.JobID)
		default:
			t.Fatalf("job %s reclaimed %d times", j.JobID, reclaimed[j.JobID])
		}
	}
	require.Equal(t, len(reclaimed), b.runningCount(t, "mailer"), "one slot per reclaimed job, none for the rest")
	t.Logf("%d of %d jobs reclaimed", len(reclaimed), n)
}

// raceReclaims claims n jobs of three attempts, lets every lease lapse, and
// starts old(j) for each claimed job together with claimers that may
// reclaim them. It answers the jobs, old's answers and how many times a
// claim took each job.
func (b *bundle) raceReclaims(t *testing.T, n, claimers int, old func(j jobs.ClaimedJob) error) (
	[]jobs.ClaimedJob, []error, map[string]int) {
	t.Helper()
	claimed := b.claimAll(t, n, jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000), MaxAttempts: ptr[int64](3)})
	b.clock.Add(time.Minute) // every lease lapsed
	wids := make([]string, claimers)
	for i := range wids {
		wids[i] = b.register(t)
	}
	olds := make([]error, n)
	var mu sync.Mutex
	reclaimed := map[string]int{}
	claimErrs := make([]error, claimers)
	apitest.StartTogether(n+claimers, func(i int) {
		if i < n {
			olds[i] = old(claimed[i])
			return
		}
		c, err := b.svc.Claim(ctx, b.worker, wids[i-n], jobs.ClaimRequest{Limit: ptr(n / claimers)})
		claimErrs[i-n] = err
		mu.Lock()
		defer mu.Unlock()
		for _, j := range c.Jobs {
			reclaimed[j.JobID]++
		}
	})
	for _, err := range claimErrs {
		require.NoError(t, err)
	}
	return claimed, olds, reclaimed
}

// A report with a lapsed lease's token racing claims that reclaim the job:
// either the report is recorded and no claim takes the job, or a claim
// takes it (failing the lapsed attempt with the warning) and the report is
// 409 lease_lost. Never both: one outcome per attempt.
func TestAReportRacingTheReclaimOfItsLapsedLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claimed, reports, reclaimed := b.raceReclaims(t, 48, 4, func(j jobs.ClaimedJob) error {
		return b.reportSucceeded(0, j)
	})
	for i, j := range claimed {
		status, outcomes := b.outcome(t, j.JobID)
		switch reclaimed[j.JobID] {
		case 0:
			require.NoError(t, reports[i], j.JobID)
			require.Equal(t, jobs.StatusSucceeded, status)
			require.Equal(t, []string{"SUCCEEDED"}, outcomes)
		case 1:
			require.Error(t, reports[i], "job %s: its report was recorded and it was reclaimed", j.JobID)
			require.Equal(t, apierr.CodeLeaseLost, code(t, reports[i]))
			require.Equal(t, jobs.StatusRunning, status)
			require.Equal(t, []string{"FAILED", ""}, outcomes)
		default:
			t.Fatalf("job %s reclaimed %d times", j.JobID, reclaimed[j.JobID])
		}
	}
	t.Logf("%d of %d jobs reclaimed", len(reclaimed), len(claimed))
}

// A heartbeat with a lapsed lease's token racing claims that would reclaim
// the job: either the heartbeat renews the lease and no claim takes the
// job, or a claim takes it and the heartbeat is 409 lease_lost. Never both:
// two workers would run the job at once.
func TestAHeartbeatRacingTheReclaimOfItsLapsedLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claimed, beats, reclaimed := b.raceReclaims(t, 48, 4, func(j jobs.ClaimedJob) error {
		_, err := b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
		return err
	})
	for i, j := range claimed {
		_, outcomes := b.outcome(t, j.JobID)
		switch reclaimed[j.JobID] {
		case 0:
			require.NoError(t, beats[i], j.JobID)
			require.Equal(t, []string{""}, outcomes, j.JobID)
		case 1:
			require.Error(t, beats[i], "job %s: its lease renewed and the job reclaimed", j.JobID)
			require.Equal(t, apierr.CodeLeaseLost, code(t, beats[i]))
			require.Equal(t, []string{"FAILED", ""}, outcomes, j.JobID)
		default:
			t.Fatalf("job %s reclaimed %d times", j.JobID, reclaimed[j.JobID])
		}
	}
	t.Logf("%d of %d leases renewed first", len(claimed)-len(reclaimed), len(claimed))
	// The renewed leases hold: no claim takes those jobs now.
	require.Empty(t, b.claim(t, b.register(t), len(claimed)))
}

// Claims racing on an endpoint with maxConcurrent, while reports of the
// jobs leased before free slots at the same moment: once the round's claims
// are done (a last claim picks up slots freed after a claimer stopped) the
// jobs leased and not reported exactly fill the limit, the endpoint's count
// and its RUNNING jobs agreeing. Only the test reports, so a slot granted
// twice at any moment would still be leased at the round's end.
func TestConcurrentClaimsAndReportsNeverPassMaxConcurrent(t *testing.T) {
	t.Parallel()
	const limit, claimers = 5, 6
	b := setup(t)
	b.limitedEndpoint(t, "send_email", limit)
	runID := b.run(t)
	b.fill(t, runID, 200)
	wids := make([]string, claimers)
	for i := range wids {
		wids[i] = b.register(t)
	}
	var open []jobs.ClaimedJob // leased, not reported
	for round := range 6 {
		var mu sync.Mutex
		var leased []jobs.ClaimedJob
		toReport := open[:len(open)/2+round%2] // some rounds free more slots than others
		errs := make([]error, claimers+len(toReport))
		apitest.StartTogether(claimers+len(toReport), func(i int) {
			if i >= claimers {
				errs[i] = b.reportSucceeded(0, toReport[i-claimers])
				return
			}
			errs[i] = b.claimUntilEmpty(wids[i], 1+i%3, func(js []jobs.ClaimedJob) {
				mu.Lock()
				defer mu.Unlock()
				leased = append(leased, js...)
			})
		})
		for _, err := range errs {
			require.NoError(t, err)
		}
		leased = append(leased, b.claim(t, wids[0], limit)...)
		open = append(open[len(toReport):], leased...)
		require.Equal(t, limit, len(open), "round %d: the limit exactly filled", round)
		require.Equal(t, limit, b.runningCount(t, "send_email"), "round %d", round)
		var runningJobs int
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE run_id = $1 AND status = 'RUNNING'`,
			runID).Scan(&runningJobs))
		require.Equal(t, limit, runningJobs, "round %d", round)
	}
}

// requeued claims n jobs of three attempts on endpoint ep, lets their
// leases lapse for good and sweeps: the sweeper requeues them all.
func (b *bundle) requeued(t *testing.T, n int, ep string) []jobs.ClaimedJob {
	t.Helper()
	claimed := b.claimAll(t, n, jobs.EnqueueRequest{Endpoint: ptr(ep), TimeoutMs: ptr[int64](1_000),
		MaxAttempts: ptr[int64](3)})
	b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter + time.Second)
	b.sweep(t)
	for _, j := range claimed {
		status, _ := b.outcome(t, j.JobID)
		require.Equal(t, jobs.StatusQueued, status, "requeued by the sweep")
	}
	return claimed
}

// Over jobs the sweeper requeued, a cancel and a heartbeat that would take
// the job back, at one start: every cancel is answered and every job ends
// CANCELLED; the heartbeat took the job back first (its attempt then
// holds its slot, cancelled while running) or is told to stop. The slots
// held are exactly the jobs taken back, and their reports free them.
// Not parallel: the sweep is global.
func TestCancelsRacingHeartbeatsOverRequeuedJobs(t *testing.T) {
	b := setup(t)
	b.limitedEndpoint(t, "mailer", 100)
	claimed := b.requeued(t, 30, "mailer")
	var mu sync.Mutex
	beats := map[string]jobs.HeartbeatResult{}
	cancels, beatErrs := racePairs(claimed, func(i int, j jobs.ClaimedJob) error {
		// A heartbeat reads twice before it takes a job back, each read
		// queued for one of the pool's few connections: staggered, the
		// cancels let some heartbeats in first.
		time.Sleep(time.Duration(i%6) * 30 * time.Millisecond)
		_, err := b.svc.CancelStep(ctx, b.ws, j.StepID)
		return err
	}, func(_ int, j jobs.ClaimedJob) error {
		hb, err := b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
		mu.Lock()
		defer mu.Unlock()
		beats[j.JobID] = hb
		return err
	})
	revived := 0
	for i, j := range claimed {
		require.NoError(t, cancels[i], j.JobID)
		require.NoError(t, beatErrs[i], j.JobID)
		status, outcomes := b.outcome(t, j.JobID)
		require.Equal(t, jobs.StatusCancelled, status, j.JobID)
		if beats[j.JobID].CancelRequested {
			require.Equal(t, []string{"FAILED"}, outcomes, "job %s: told to stop, not taken back", j.JobID)
			continue
		}
		revived++
		require.Equal(t, []string{""}, outcomes, "job %s: taken back, its attempt open again", j.JobID)
	}
	require.Equal(t, revived, b.runningCount(t, "mailer"), "a slot held by each attempt taken back, none by the others")
	for _, j := range claimed {
		require.NoError(t, b.reportSucceeded(0, j))
	}
	require.Zero(t, b.runningCount(t, "mailer"))
	t.Logf("%d of %d jobs taken back before their cancel", revived, len(claimed))
}
