package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/sweep"
	"github.com/getratchet/ratchet/lib/testpg"
)

// Retention purges across workspaces, so these tests do not run in
// parallel: while they run, no parallel test of the package has made a run.

func (b *bundle) count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, query, args...).Scan(&n))
	return n
}

// A finished run whose steps all ended before the cut-off goes, with its
// jobs and executions; a FAILED run whose other step still runs, a run
// finished within the period and a run never finished stay.
func TestRetentionPurgesFinishedRunsWhole(t *testing.T) {
	b := setup(t)
	w := b.register(t)

	done := b.run(t)
	step := b.enqueue(t, done, jobs.EnqueueRequest{IdempotencyKey: ptr("welcome:1")})
	b.succeed(t, b.claimOne(t, w))
	_, err := b.svc.FinishRun(ctx, b.ws, done)
	require.NoError(t, err)

	failed := b.run(t)
	doomed := b.enqueue(t, failed, jobs.EnqueueRequest{Input: json.RawMessage(`1`), MaxAttempts: ptr[int64](1)})
	// Its last attempt: once its lease lapses it is not claimed again, and
	// it stays RUNNING (no sweep here ends it).
	b.enqueue(t, failed, jobs.EnqueueRequest{Input: json.RawMessage(`2`), MaxAttempts: ptr[int64](1)})
	claimed := b.claim(t, w, 2)
	require.Len(t, claimed, 2)
	for _, j := range claimed {
		if j.JobID == doomed.JobID {
			b.fail(t, j, &jobs.ReportError{Message: "bad request", Retryable: ptr(false)})
		}
	}
	_, err = b.svc.FinishRun(ctx, b.ws, failed)
	require.NoError(t, err)
	require.Equal(t, "FAILED", b.getRun(t, failed).Status)

	open := b.run(t)
	b.enqueue(t, open, jobs.EnqueueRequest{Input: json.RawMessage(`3`)})
	b.succeed(t, b.claimOne(t, w))

	b.clock.Add(89 * 24 * time.Hour)
	recent := b.run(t)
	b.enqueue(t, recent, jobs.EnqueueRequest{Input: json.RawMessage(`4`)})
	b.succeed(t, b.claimOne(t, w))
	_, err = b.svc.FinishRun(ctx, b.ws, recent)
	require.NoError(t, err)

	b.clock.Add(2 * 24 * time.Hour) // 91 days after the first runs ended
	cutoff := b.clock.Now().AddDate(0, 0, -90)
	_, err = b.svc.PurgeRetired(ctx, cutoff, 100)
	require.NoError(t, err)

	_, err = b.svc.GetRun(ctx, b.ws, done)
	require.Equal(t, apierr.CodeNotFound, code(t, err))
	require.Zero(t, b.count(t, `SELECT count(*) FROM jobs WHERE run_id = $1`, done))
	require.Zero(t, b.count(t, `SELECT count(*) FROM job_executions WHERE job_id = $1`, step.JobID))
	for _, kept := range []string{failed, open, recent} {
		b.getRun(t, kept)
	}
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM jobs WHERE run_id = $1`, failed))

	// The purged step's key is new again.
	again := b.enqueue(t, b.run(t), jobs.EnqueueRequest{IdempotencyKey: ptr("welcome:1")})
	require.False(t, again.Deduplicated)
	require.NotEqual(t, step.StepID, again.StepID)
}

// A run one of whose jobs a request holds is skipped whole, never waited
// for, and purged by a later pass.
func TestRetentionSkipsARunARequestHolds(t *testing.T) {
	b := setup(t)
	w := b.register(t)
	runID := b.run(t)
	first := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
	b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`)})
	for range 2 {
		b.succeed(t, b.claimOne(t, w))
	}
	_, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	b.clock.Add(91 * 24 * time.Hour)
	cutoff := b.clock.Now().AddDate(0, 0, -90)

	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, first.JobID)
	require.NoError(t, err)
	_, err = b.svc.PurgeRetired(ctx, cutoff, 100)
	require.NoError(t, err)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM jobs WHERE run_id = $1`, runID), "not half a run")
	b.getRun(t, runID)

	require.NoError(t, tx.Rollback(ctx))
	_, err = b.svc.PurgeRetired(ctx, cutoff, 100)
	require.NoError(t, err)
	_, err = b.svc.GetRun(ctx, b.ws, runID)
	require.Equal(t, apierr.CodeNotFound, code(t, err))
}

// A replay reopens a run: it is kept for the whole period after the
// replayed step ends again.
func TestRetentionCountsFromTheLastStepToEnd(t *testing.T) {
	b := setup(t)
	w := b.register(t)
	runID := b.run(t)
	st := b.enqueue(t, runID, jobs.EnqueueRequest{MaxAttempts: ptr[int64](1)})
	b.fail(t, b.claimOne(t, w), &jobs.ReportError{Message: "bad", Retryable: ptr(false)})
	_, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)

	b.clock.Add(60 * 24 * time.Hour)
	_, err = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
		MaxAttempts: ptr[int64](1), Reason: ptr("vendor fixed")})
	require.NoError(t, err)
	b.succeed(t, b.claimOne(t, w))
	require.Equal(t, "SUCCEEDED", b.getRun(t, runID).Status)

	b.clock.Add(60 * 24 * time.Hour) // 120 days after the first end, 60 after the last
	_, err = b.svc.PurgeRetired(ctx, b.clock.Now().AddDate(0, 0, -90), 100)
	require.NoError(t, err)
	b.getRun(t, runID)
}

// A pass deletes whole runs up to its budget of steps (one larger run goes
// alone); the next pass takes the rest.
func TestRetentionPassesAreBoundedBySteps(t *testing.T) {
	b := setup(t)
	w := b.register(t)
	var runs []string
	for i := range 3 {
		runID := b.run(t)
		for k := range 2 {
			b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(10*i + k))})
			b.succeed(t, b.claimOne(t, w))
		}
		_, err := b.svc.FinishRun(ctx, b.ws, runID)
		require.NoError(t, err)
		runs = append(runs, runID)
		b.clock.Add(time.Second) // finished in this order
	}
	b.clock.Add(91 * 24 * time.Hour)
	cutoff := b.clock.Now().AddDate(0, 0, -90)
	left := func() int {
		return b.count(t, `SELECT count(*) FROM job_runs WHERE id = ANY($1)`, runs)
	}
	jobs.SetPurgeSteps(b.svc, 3)
	_, err := b.svc.PurgeRetired(ctx, cutoff, 100)
	require.NoError(t, err)
	require.Equal(t, 2, left(), "two steps fit, four do not")
	jobs.SetPurgeSteps(b.svc, 1)
	_, err = b.svc.PurgeRetired(ctx, cutoff, 100)
	require.NoError(t, err)
	require.Equal(t, 1, left(), "a run larger than the budget goes alone")
	jobs.SetPurgeSteps(b.svc, 5000)
	_, err = b.svc.PurgeRetired(ctx, cutoff, 100)
	require.NoError(t, err)
	require.Zero(t, left())
}

// Retention counts the jobs it locked once, by run, not by reading all of
// them again for each run: that made a pass's work grow with the square of
// its batch (scale QA: 1,000 runs of 5 steps spent 300 ms there). A run
// with no step, which has no locked job to count, still goes.
func TestRetentionCountsLockedJobsOnce(t *testing.T) {
	b := setup(t)
	rescans, err := testpg.RescansCTE(ctx, b.env.App.Pool, "locked", jobs.SQLLockRetiredJobs,
		[]string{"run_a", "run_b"}, b.clock.Now())
	require.NoError(t, err)
	require.False(t, rescans, "the locked jobs are read again for each run")

	empty := b.run(t)
	_, err = b.svc.FinishRun(ctx, b.ws, empty)
	require.NoError(t, err)
	b.clock.Add(91 * 24 * time.Hour)
	_, err = b.svc.PurgeRetired(ctx, b.clock.Now().AddDate(0, 0, -90), 100)
	require.NoError(t, err)
	require.Zero(t, b.count(t, `SELECT count(*) FROM job_runs WHERE id = $1`, empty), "a finished run with no step goes")
}

// A worker busy with long jobs does not claim, but its heartbeats count as
// seen: retention does not take a live worker's registration.
func TestRetentionKeepsABusyWorker(t *testing.T) {
	b := setup(t)
	w := b.register(t)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`), TimeoutMs: ptr[int64](86_400_000)})
	j := b.claimOne(t, w)
	for range 6 { // three days of heartbeats every 12 h
		b.clock.Add(12 * time.Hour)
		_, err := b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
		require.NoError(t, err)
	}
	_, err := b.svc.PurgeRetired(ctx, b.clock.Now().AddDate(0, 0, -1), 100)
	require.NoError(t, err)
	b.succeed(t, j)
	_, err = b.svc.Claim(ctx, b.worker, w, jobs.ClaimRequest{Limit: ptr(1)})
	require.NoError(t, err, "the live worker claims on")
}

// A claim marks its worker seen at most once a minute, and a look that
// finds nothing then writes nothing: a worker long-polling an empty queue
// looks once a second, and every look updated its row (migration 0058).
// The mark never moves back, under an instance whose clock is behind.
func TestAClaimMarksItsWorkerSeenOnceAMinute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.register(t)
	registered := b.clock.Now()
	row := func() (seen time.Time, version string) {
		t.Helper()
		require.NoError(t, b.env.App.Pool.QueryRow(ctx,
			`SELECT last_seen_at, xmin::text FROM job_workers WHERE id = $1`, w).Scan(&seen, &version))
		return seen, version
	}
	claim := func() {
		t.Helper()
		res, err := b.svc.Claim(ctx, b.worker, w, jobs.ClaimRequest{})
		require.NoError(t, err)
		require.Empty(t, res.Jobs)
	}
	_, version := row()

	b.clock.Add(59 * time.Second)
	claim()
	seen, after := row()
	require.True(t, seen.Equal(registered), "seen %s within the minute", seen)
	require.Equal(t, version, after, "the empty look left the row as it was")

	b.clock.Add(2 * time.Second)
	claim()
	seen, _ = row()
	require.True(t, seen.Equal(b.clock.Now()), "seen %s, a minute on", seen)

	marked := seen
	b.clock.Add(-10 * time.Minute)
	claim()
	seen, _ = row()
	require.True(t, seen.Equal(marked), "seen %s: never back", seen)
}

// Idle registrations go from every workspace, oldest first within each,
// up to the pass's limit; a worker seen since the cut-off stays. Counted
// over the whole table: no parallel test runs meanwhile, and another
// test's idle workers count as due too.
func TestRetentionDeletesIdleWorkersOfEveryWorkspaceInBatches(t *testing.T) {
	b := setup(t)
	live, idle := b.register(t), []string{b.register(t), b.register(t)}
	other := b.env.Signup()
	p, err := b.env.App.Server.Auth.Authenticate(ctx, b.env.Key(other, map[string]any{
		"name": "worker", "preset": "WORKER", "tools": []string{"send_email@1"}}))
	require.NoError(t, err)
	r, err := b.svc.RegisterWorker(ctx, p, jobs.RegisterRequest{Tools: []jobs.Tool{{Name: "send_email", Version: "1"}}})
	require.NoError(t, err)
	idle = append(idle, r.WorkerID)

	b.clock.Add(91 * 24 * time.Hour)
	_, err = b.svc.Claim(ctx, b.worker, live, jobs.ClaimRequest{}) // seen, with nothing to claim
	require.NoError(t, err)
	cutoff := b.clock.Now().AddDate(0, 0, -90)
	due := func() int {
		return b.count(t, `SELECT count(*) FROM job_workers WHERE last_seen_at < $1`, cutoff)
	}
	before := due()
	require.GreaterOrEqual(t, before, len(idle))
	_, err = b.svc.PurgeRetired(ctx, cutoff, 2)
	require.NoError(t, err)
	require.Equal(t, before-2, due(), "two a pass")
	for range before {
		if due() == 0 {
			break
		}
		_, err = b.svc.PurgeRetired(ctx, cutoff, 2)
		require.NoError(t, err)
	}
	require.Zero(t, due())
	require.Zero(t, b.count(t, `SELECT count(*) FROM job_workers WHERE id = ANY($1)`, idle), "both workspaces' idle workers")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM job_workers WHERE id = $1`, live), "the live worker stays")
}

// A run whose cancelled attempt still holds its endpoint's slot is kept
// until the slot is given back (its report, or its lease's end): deleted
// first, the endpoint's running count never came down, and an endpoint
// limited to one job took none again (retention QA).
func TestRetentionKeepsARunWhileItsCancelledAttemptHoldsASlot(t *testing.T) {
	b := setup(t)
	b.limitedEndpoint(t, "mailer", 1)
	runID := b.run(t)
	step := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`1`)})
	w := b.register(t)
	held := b.claimOne(t, w)
	_, err := b.svc.CancelStep(ctx, b.ws, step.StepID)
	require.NoError(t, err)
	require.Equal(t, "FAILED", b.getRun(t, runID).Status)
	b.requireRunningCount(t, "mailer", 1)

	cutoff := b.clock.Now().Add(time.Second) // the run ended before it
	_, err = b.svc.PurgeRetired(ctx, cutoff, 100)
	require.NoError(t, err)
	b.getRun(t, runID)

	b.fail(t, held, &jobs.ReportError{Message: "stopped", Retryable: ptr(false)}) // gives the slot back
	b.requireRunningCount(t, "mailer", 0)
	_, err = b.svc.PurgeRetired(ctx, cutoff, 100)
	require.NoError(t, err)
	_, err = b.svc.GetRun(ctx, b.ws, runID)
	require.Equal(t, apierr.CodeNotFound, code(t, err))
	b.requireRunningCount(t, "mailer", 0)
}

// A run whose purge fails holds no run after it: the batch is purged again
// run by run, the failing run is put off (purge_after) and its error
// answered, and the next pass reads past it; once it is due again it is
// tried again (sweeper review: the batch reads the oldest runs first, so
// a run failing on every pass, a statement timeout over a run of many
// steps say, kept every later run for good). Not parallel: retention
// purges every workspace, and the trigger that refuses the run's delete
// is on the package database.
func TestRetentionGoesOnPastARunWhosePurgeFails(t *testing.T) {
	b := setup(t)
	w := b.register(t)
	var runs []string
	for i := range 2 {
		runID := b.run(t)
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))})
		b.succeed(t, b.claimOne(t, w))
		_, err := b.svc.FinishRun(ctx, b.ws, runID)
		require.NoError(t, err)
		runs = append(runs, runID)
		b.clock.Add(time.Second) // finished in this order: the failing one is read first
	}
	failing, later := runs[0], runs[1]
	kept := func(id string) bool {
		return b.count(t, `SELECT count(*) FROM job_runs WHERE id = $1`, id) == 1
	}
	b.clock.Add(91 * 24 * time.Hour)
	cutoff := b.clock.Now().AddDate(0, 0, -90)
	allow := apitest.Refuse(t, "BEFORE DELETE ON job_runs", "OLD.id = '"+failing+"'")

	_, err := b.svc.PurgeRetired(ctx, cutoff, 1_000_000)
	require.ErrorContains(t, err, "test_refuse", "the failing run's error is answered")
	require.True(t, kept(failing))
	require.False(t, kept(later), "the run after the failing one goes")

	_, err = b.svc.PurgeRetired(ctx, cutoff.Add(time.Minute), 1_000_000)
	require.NoError(t, err, "the failing run is put off: the next pass reads past it")
	require.True(t, kept(failing))

	allow()
	_, err = b.svc.PurgeRetired(ctx, cutoff.Add(time.Hour), 1_000_000)
	require.NoError(t, err)
	require.False(t, kept(failing), "put off, it is tried again")
}

// The batches of one pass (sweep.Place) start each after the last run the
// batch before it took, past a run kept in front, a FAILED one whose step
// never ends: and never past one the steps' budget left out of a batch,
// which the next batch of the pass takes.
func TestRetentionPassResumesAfterTheRunsItTook(t *testing.T) {
	b := setup(t)
	w := b.register(t)
	first := b.clock.Now()
	b.clock.Add(time.Second)
	var runs []string
	for i, steps := range []int{2, 2, 1} {
		runID := b.run(t)
		for k := range steps {
			b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(10*i + k + 1))})
			b.succeed(t, b.claimOne(t, w))
		}
		_, err := b.svc.FinishRun(ctx, b.ws, runID)
		require.NoError(t, err)
		runs = append(runs, runID)
		b.clock.Add(time.Second) // finished in this order
	}
	kept := b.run(t) // finished first, its step queued for good
	b.enqueue(t, kept, jobs.EnqueueRequest{Input: json.RawMessage(`0`)})
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE job_runs SET status = 'FAILED', finished_at = $2 WHERE id = $1`,
		kept, first)
	require.NoError(t, err)
	b.clock.Add(91 * 24 * time.Hour)
	cutoff := b.clock.Now().AddDate(0, 0, -90)
	jobs.SetPurgeSteps(b.svc, 3) // the first and third runs fit a batch, the second does not
	var places []string
	task := sweep.Task{Name: "jobs.retention", Drains: true, Run: func(ctx context.Context, _ time.Time) (int, error) {
		n, err := b.svc.PurgeRetired(ctx, cutoff, 100)
		places = append(places, fmt.Sprint(sweep.PlaceOf(ctx).At))
		return n, err
	}}
	pass, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res := sweep.New(b.clock.Now, slog.New(slog.NewTextHandler(io.Discard, nil)), task).RunOnce(pass)
	require.Empty(t, res.Errors)
	require.Zero(t, b.count(t, `SELECT count(*) FROM job_runs WHERE id = ANY($1)`, runs), "one pass takes the three")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM job_runs WHERE id = $1`, kept))
	require.GreaterOrEqual(t, len(places), 2, places)
	require.Contains(t, places[0], runs[0], "the first batch took the first and third: it ends at the first")
	require.Contains(t, places[1], runs[1], "the second took the second")
}
