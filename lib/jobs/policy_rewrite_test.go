package jobs_test

import (
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// Seed 000: "jobs snapshot timeout, maximum attempts and retry preset.
// Policy updates do not change those values or previously scheduled due
// times." A CUSTOM policy rewritten in every field leaves each field of a
// job queued before (never claimed) and of one waiting for its retry: their
// snapshots read as before, the retry keeps its dueAt, and each field still
// acts as the snapshot says: the lease is the old timeout's, the next
// delays the old schedule's (no jitter), and the old attempt count
// exhausts the job. A job enqueued after the write takes the new policy
// and version.
func TestAPolicyRewriteLeavesEveryFieldOfExistingJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs.SetJitter(b.svc, 0.5) // factor 1: each delay is the nominal one
	ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "send_email",
		PolicyFields: jobs.PolicyFields{Preset: opt("CUSTOM"), MaxAttempts: opt[int64](3),
			InitialDelayMs: opt[int64](10_000), Multiplier: opt(2.0), MaxDelayMs: opt[int64](600_000),
			JitterPercent: opt(20.0), DefaultTimeoutMs: opt[int64](30_000)}})
	require.NoError(t, err)
	old := jobs.PolicySnapshot{RetryPolicy: jobs.RetryPolicy{Preset: "CUSTOM", MaxAttempts: 3, InitialDelayMs: 10_000,
		Multiplier: 2, MaxDelayMs: 600_000, JitterPercent: 20}, TimeoutMs: 30_000}
	runID := b.run(t)
	retried := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
	w := b.register(t)
	first := b.claimOne(t, w)
	require.Equal(t, retried.JobID, first.JobID)
	due := *b.fail(t, first, nil).NextDueAt
	requireTime(t, b.clock.Now().Add(10*time.Second), due)
	queued := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`)})
	before := map[string]jobs.DurableJob{retried.StepID: b.step(t, retried.StepID).DurableJob,
		queued.StepID: b.step(t, queued.StepID).DurableJob}
	for id, dj := range before {
		require.Equal(t, old, dj.Policy, id)
		require.EqualValues(t, 1, dj.PolicyVersion, id)
		require.Equal(t, 3, dj.MaxAttempts, id)
	}

	updated, err := b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt[int64](1),
		PolicyFields: jobs.PolicyFields{MaxAttempts: opt[int64](6), InitialDelayMs: opt[int64](60_000),
			Multiplier: opt(3.0), MaxDelayMs: opt[int64](900_000), JitterPercent: opt(50.0),
			DefaultTimeoutMs: opt[int64](120_000)}})
	require.NoError(t, err)
	require.EqualValues(t, 2, updated.Version)
	for id, dj := range before {
		require.Equal(t, dj, b.step(t, id).DurableJob, "%s: snapshot, attempts and dueAt as before", id)
	}
	requireTime(t, due, *b.step(t, retried.StepID).DurableJob.DueAt)

	// The queued job: the old timeout's lease, the old first delay.
	now := b.clock.Now()
	j := b.claimOne(t, w)
	require.Equal(t, queued.JobID, j.JobID, "the retry is not due yet")
	require.Equal(t, 3, j.MaxAttempts)
	require.EqualValues(t, 30_000, j.TimeoutMs)
	requireTime(t, now.Add(30*time.Second+time.Duration(j.LeaseMs-30_000)*time.Millisecond), j.LeaseExpiresAt)
	requireTime(t, now.Add(10*time.Second), *b.fail(t, j, nil).NextDueAt)

	// The retried job, at its old dueAt: the second delay doubles (not
	// triples) from 10 s (not 60 s), and the third failure exhausts it.
	b.clock.Set(due)
	j = b.claimOne(t, w)
	require.Equal(t, retried.JobID, j.JobID)
	require.Equal(t, 2, j.Attempt)
	requireTime(t, due.Add(20*time.Second), *b.fail(t, j, nil).NextDueAt)
	b.clock.Add(20 * time.Second)
	var last jobs.ClaimedJob
	for _, c := range b.claim(t, w, 10) {
		if c.JobID == retried.JobID {
			last = c
		}
	}
	require.Equal(t, 3, last.Attempt)
	r := b.fail(t, last, nil)
	require.Equal(t, jobs.StatusExhausted, r.Status, "the old maxAttempts of 3 holds")
	require.Nil(t, r.NextDueAt)

	fresh := b.step(t, b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`3`)}).StepID).DurableJob
	require.Equal(t, jobs.PolicySnapshot{RetryPolicy: jobs.RetryPolicy{Preset: "CUSTOM", MaxAttempts: 6,
		InitialDelayMs: 60_000, Multiplier: 3, MaxDelayMs: 900_000, JitterPercent: 50}, TimeoutMs: 120_000}, fresh.Policy)
	require.EqualValues(t, 2, fresh.PolicyVersion)
}

// Seed 000: "Concurrency and rate gates apply to new claims immediately."
// Lowering maxConcurrent below the jobs running holds every claim until
// reports bring the running below the new limit; lowering
// rateLimitPerMinute below the attempts already started this minute holds
// every claim until the next minute, which starts the new limit afresh.
func TestLoweredLimitsHoldTheNextClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep := b.limitedEndpoint(t, "send_email", 3)
	runID := b.run(t)
	for i := range 8 {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i))})
	}
	w := b.register(t)
	running := b.claim(t, w, 10)
	require.Len(t, running, 3)
	ep, err := b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt(ep.Version),
		PolicyFields: jobs.PolicyFields{MaxConcurrent: opt[int64](1)}})
	require.NoError(t, err)
	require.Empty(t, b.claim(t, w, 10), "3 running, limit 1")
	b.succeed(t, running[0])
	require.Empty(t, b.claim(t, w, 10), "2 running, limit 1")
	b.succeed(t, running[1])
	require.Empty(t, b.claim(t, w, 10), "1 running, limit 1")
	b.succeed(t, running[2])
	next := b.claim(t, w, 10)
	require.Len(t, next, 1, "none running, limit 1")
	b.succeed(t, next[0])

	// 4 attempts started this minute (the clock has not moved): a rate of
	// 10 set now has 6 left, lowered to 5 it has one, to 2 none.
	ep, err = b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt(ep.Version),
		PolicyFields: jobs.PolicyFields{MaxConcurrent: null[int64](), RateLimitPerMinute: opt[int64](10)}})
	require.NoError(t, err)
	ep, err = b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt(ep.Version),
		PolicyFields: jobs.PolicyFields{RateLimitPerMinute: opt[int64](5)}})
	require.NoError(t, err)
	got := b.claim(t, w, 10)
	require.Len(t, got, 1, "5 per minute, 4 started")
	_, err = b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt(ep.Version),
		PolicyFields: jobs.PolicyFields{RateLimitPerMinute: opt[int64](2)}})
	require.NoError(t, err)
	require.Empty(t, b.claim(t, w, 10), "2 per minute, 5 started")
	b.clock.Add(time.Minute)
	require.Len(t, b.claim(t, w, 10), 2, "a new minute: 2 of the 3 left")
	require.Empty(t, b.claim(t, w, 10))
}

// Policy writes racing claims, cancels and reports: a writer sets, lowers,
// raises and removes maxConcurrent while claimers lease jobs, hold them
// across the writes, cancel some while they run (the attempt keeps its slot
// until reported) and report them a round later. The writer's last write
// sets a limit while the claimers still hold jobs, and nothing recounts
// after it: the endpoint's count of running jobs never drifts, so when the
// claimers stop it counts exactly the jobs they still hold, none once they
// are reported, and claims racing on the idle endpoint fill exactly the
// limit.
func TestPolicyWritesRacingClaimsAndReportsKeepTheConcurrencyCount(t *testing.T) {
	t.Parallel()
	const claimers, roundsBeforeStop, roundsAfter = 4, 8, 3
	b := setup(t)
	ep := b.limitedEndpoint(t, "send_email", 3)
	runID := b.run(t)
	b.fill(t, runID, 600)
	wids := make([]string, claimers)
	for i := range wids {
		wids[i] = b.register(t)
	}
	limits := []*int64{ptr[int64](1), nil, ptr[int64](4), ptr[int64](2), nil, ptr[int64](6)}
	// A claimer counts itself ready once it is past roundsBeforeStop and the
	// writer has been through every limit once, so the writer's last write
	// follows all of them whatever the goroutines' pace.
	var ready atomic.Int32
	var writes atomic.Int32
	writerDone := make(chan struct{})
	var heldMu sync.Mutex
	var stillHeld []jobs.ClaimedJob // each claimer's last claim, not reported
	errs := make([]error, claimers+1)
	apitest.StartTogether(claimers+1, func(i int) {
		if i == claimers {
			defer close(writerDone)
			version := ep.Version
			write := func(f jobs.PolicyFields) bool {
				e, err := b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt(version),
					PolicyFields: f})
				errs[i], version = err, e.Version
				writes.Add(1)
				return err == nil
			}
			for n := 0; ready.Load() < claimers; n++ {
				f := jobs.PolicyFields{MaxConcurrent: null[int64]()}
				if l := limits[n%len(limits)]; l != nil {
					f.MaxConcurrent = opt(*l)
				}
				if !write(f) {
					return
				}
			}
			write(jobs.PolicyFields{MaxConcurrent: opt[int64](5)}) // while the claimers hold jobs
			return
		}
		var held []jobs.ClaimedJob
		report := func(js []jobs.ClaimedJob) error {
			for n, j := range js {
				if n%2 == 1 {
					if _, err := b.svc.CancelStep(ctx, b.ws, j.StepID); err != nil {
						return err
					}
				}
				if err := b.reportSucceeded(i, j); err != nil {
					return err
				}
			}
			return nil
		}
		after := -1 // rounds left once the writer is done
		counted := false
		for round := 0; after != 0; round++ {
			limit := 1 + i%3
			c, err := b.svc.Claim(ctx, b.worker, wids[i], jobs.ClaimRequest{Limit: &limit})
			if err == nil {
				err = report(held)
			}
			if err != nil {
				errs[i] = err
				return
			}
			held = c.Jobs
			if !counted && round >= roundsBeforeStop && int(writes.Load()) > len(limits) {
				counted = true
				ready.Add(1)
			}
			select {
			case <-writerDone:
				if after < 0 {
					after = roundsAfter
				}
				after--
			default:
			}
		}
		heldMu.Lock()
		defer heldMu.Unlock()
		stillHeld = append(stillHeld, held...)
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Greater(t, int(writes.Load()), len(limits)+1, "the writer went through every limit, then wrote its last")
	require.Equal(t, 5, *b.endpoint(t, ep.ID).MaxConcurrent)
	// The count is checked while jobs are held: a count that missed some
	// would read as many fewer, and reports clamp it at 0, so once all
	// were reported it would not show.
	running := func() int {
		t.Helper()
		var n int
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE run_id = $1
			AND (status = 'RUNNING' OR slot_attempt IS NOT NULL)`, runID).Scan(&n))
		return n
	}
	require.Equal(t, len(stillHeld), running())
	require.Equal(t, len(stillHeld), b.runningCount(t, "send_email"), "the count the racers kept")
	for _, j := range stillHeld {
		require.NoError(t, b.reportSucceeded(0, j))
	}
	require.Zero(t, running())
	require.Equal(t, 0, b.runningCount(t, "send_email"))
	var mu sync.Mutex
	var leased []jobs.ClaimedJob
	apitest.StartTogether(claimers, func(i int) {
		limit := 2
		c, err := b.svc.Claim(ctx, b.worker, wids[i], jobs.ClaimRequest{Limit: &limit})
		if err != nil {
			errs[i] = err
			return
		}
		mu.Lock()
		defer mu.Unlock()
		leased = append(leased, c.Jobs...)
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, leased, 5, "claims racing on an idle endpoint fill exactly its limit")
	require.Equal(t, 5, b.runningCount(t, "send_email"))
}

// README (Dependencies): a CANCELLED dependency, an operator's decision
// rather than a failure, skips both branches. Cancelled while its attempt
// runs, both its SUCCEEDED and its FAILED branches (and what waits below
// them) are SKIPPED at the cancel, and the attempt's late report, whatever
// its outcome, releases nothing again: the dependents stay SKIPPED, the
// job CANCELLED, the run FAILED. A branch enqueued afterwards is SKIPPED
// too.
func TestACancelledRunningDependencySkipsBothBranchesOnce(t *testing.T) {
	t.Parallel()
	for _, late := range []struct {
		name   string
		report jobs.ReportRequest
	}{
		{"success", jobs.ReportRequest{Status: jobs.StatusSucceeded}},
		{"final failure", jobs.ReportRequest{Status: "FAILED", Error: &jobs.ReportError{Message: "no",
			Retryable: ptr(false)}}},
		{"retryable failure", jobs.ReportRequest{Status: "FAILED", Error: &jobs.ReportError{Message: "again"}}},
	} {
		t.Run(late.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			runID := b.run(t)
			dep := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"dep"`)})
			onSuccess := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"s"`),
				AfterStepID: &dep.StepID, AfterStatus: ptr("SUCCEEDED")})
			onFailure := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"f"`),
				AfterStepID: &dep.StepID, AfterStatus: ptr("FAILED")})
			below := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"b"`),
				AfterStepID: &onFailure.StepID, AfterStatus: ptr("SUCCEEDED")})
			w := b.register(t)
			j := b.claimOne(t, w)
			require.Equal(t, dep.JobID, j.JobID)
			_, err := b.svc.CancelStep(ctx, b.ws, dep.StepID)
			require.NoError(t, err)
			skipped := func(when string) {
				t.Helper()
				for _, id := range []string{onSuccess.StepID, onFailure.StepID, below.StepID} {
					require.Equal(t, jobs.StatusSkipped, b.step(t, id).Status, "%s: %s", when, id)
				}
				require.Equal(t, jobs.StatusCancelled, b.step(t, dep.StepID).Status, when)
				require.Equal(t, "FAILED", b.getRun(t, runID).Status, when)
			}
			skipped("at the cancel")

			late.report.LeaseToken = j.LeaseToken
			_, err = b.svc.Report(ctx, b.worker, j.JobID, late.report)
			require.NoError(t, err)
			skipped("after the late report")
			require.Empty(t, b.claim(t, w, 10), "nothing released")
			require.Equal(t, jobs.StatusSkipped, b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"l"`),
				AfterStepID: &dep.StepID, AfterStatus: ptr("FAILED")}).Status)
			require.Equal(t, []string{"FAILED"}, b.runFinishedEvents(t, runID), "one finish")
		})
	}
}
