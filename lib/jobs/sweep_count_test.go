package jobs_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/sweep"
)

// Two sweepers settling and releasing at once (the local loop, the cron
// route, the Lambda schedule) each count only what they changed: the
// backstops counted the runs and dependencies they read, so two passes
// that read the same one, the second waiting while the first settled or
// released it, counted it twice (sweeper review). Each pass here waits,
// behind a transaction that holds what it needs (the run's lock, the
// dependent's row), until both have read the same record; the counts of
// the two then add up to what changed in the database. Not parallel: the
// backstops sweep every workspace.
func TestConcurrentBackstopsCountEachChangeOnce(t *testing.T) {
	b := setup(t)
	pool := b.env.App.Pool

	t.Run("jobs.run_completion", func(t *testing.T) {
		runID := b.run(t)
		st := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"settle"`)})
		// Its step ended and its completion was requested behind the
		// service's back, as a crash between the two would leave it.
		_, err := pool.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', finished_at = $2 WHERE step_id = $1`,
			st.StepID, b.clock.Now())
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE job_runs SET completion_requested = true WHERE id = $1`, runID)
		require.NoError(t, err)
		changed := `SELECT count(*) FROM job_runs WHERE status <> 'RUNNING'`
		sum, diff := concurrentPasses(t, pool, changed, func(tx pgx.Tx) {
			_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`, runID)
			require.NoError(t, err)
		}, func() (int, error) { return jobs.SettleRuns(b.svc, 500) })
		require.Equal(t, "SUCCEEDED", b.getRun(t, runID).Status)
		require.Equal(t, 1, diff)
		require.Equal(t, diff, sum, "the passes' counts against the runs settled")
	})

	t.Run("jobs.dependencies", func(t *testing.T) {
		runID := b.run(t)
		dep := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"dep"`)})
		waiting := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"waiting"`),
			AfterStepID: &dep.StepID, AfterStatus: ptr("SUCCEEDED")})
		require.Equal(t, "WAITING", waiting.Status)
		// Its dependency ended without releasing it, as a crash would leave it.
		_, err := pool.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', finished_at = $2 WHERE step_id = $1`,
			dep.StepID, b.clock.Now())
		require.NoError(t, err)
		changed := `SELECT -count(*) FROM jobs WHERE status = 'WAITING'`
		sum, diff := concurrentPasses(t, pool, changed, func(tx pgx.Tx) {
			_, err := tx.Exec(ctx, `SELECT 1 FROM jobs WHERE step_id = $1 FOR UPDATE`, waiting.StepID)
			require.NoError(t, err)
		}, func() (int, error) { return jobs.ReleaseStranded(b.svc, 500) })
		require.Equal(t, 1, diff)
		require.Equal(t, diff, sum, "the passes' counts against the dependencies released")
	})
}

// concurrentPasses runs two passes of pass, each waiting for the locks a
// transaction takes with hold, releases them, and answers the sum of the
// passes' counts and how much the count changed read (database-wide)
// changed meanwhile.
func concurrentPasses(t *testing.T, pool *pgxpool.Pool, changed string, hold func(pgx.Tx),
	pass func() (int, error)) (sum, diff int) {
	t.Helper()
	var before, after int
	require.NoError(t, pool.QueryRow(ctx, changed).Scan(&before))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	hold(tx)
	waits := apitest.NewLockWaits(t, pool, apitest.BackendPID(t, tx))
	counts := make([]int, 2)
	errs := make([]error, 2)
	dones := make([]chan struct{}, 2)
	for i := range dones {
		dones[i] = make(chan struct{})
		go func() {
			defer close(dones[i])
			counts[i], errs[i] = pass()
		}()
		waits.Waiting(dones[i], "each pass waits for the held lock")
	}
	require.NoError(t, tx.Commit(ctx))
	for i, done := range dones {
		<-done
		require.NoError(t, errs[i])
	}
	require.NoError(t, pool.QueryRow(ctx, changed).Scan(&after))
	return counts[0] + counts[1], after - before
}

// The lapsed-lease backstop's three parts each run whatever the one before
// answered: a lapsed last attempt whose ending fails (here a trigger
// refuses it, as a statement timeout over a large backlog would on every
// pass) keeps neither a lapsed lease with attempts left from being
// requeued nor the task's error from being answered (sweeper review: the
// requeue never ran). Not parallel: the backstop sweeps every workspace,
// and the trigger is on the package database's jobs.
func TestLapsedBackstopRequeuesWhenEndingALastAttemptFails(t *testing.T) {
	b := setup(t)
	last, again, _, task := lapsedLastAndAgain(t, b)
	apitest.Refuse(t, "BEFORE UPDATE ON jobs", "OLD.step_id = '"+last.StepID+"' AND NEW.status = 'EXHAUSTED'")

	n, err := task.Run(ctx, b.clock.Now())
	require.ErrorContains(t, err, "exhaust lapsed", "the failed ending is answered")
	require.GreaterOrEqual(t, n, 1)
	// Read from the table: a read of the run's steps would end the lapsed
	// last attempt itself, and meet the trigger.
	status := func(stepID string) (s string) {
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT status FROM jobs WHERE step_id = $1`, stepID).Scan(&s))
		return s
	}
	require.Equal(t, "QUEUED", status(again.StepID), "requeued though the ending before it failed")
	require.Equal(t, "RUNNING", status(last.StepID))
}

// A run whose settling fails on every pass holds no run the backstop reads
// after it (its pick reads the same runs first each pass): each is
// settled, and the failure answered (sweeper review: the first failure
// ended the pass). Not parallel: the backstop sweeps every workspace.
func TestSettleBackstopGoesOnPastARunThatFails(t *testing.T) {
	b := setup(t)
	decided := func() string { return decidedRun(t, b) }
	failing, next := decided(), decided()
	apitest.Refuse(t, "BEFORE UPDATE ON job_runs", "OLD.id = '"+failing+"'")
	n, err := jobs.SettleRuns(b.svc, 500)
	require.ErrorContains(t, err, "test_refuse")
	require.GreaterOrEqual(t, n, 1)
	status := func(runID string) (s string) {
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT status FROM job_runs WHERE id = $1`, runID).Scan(&s))
		return s
	}
	require.Equal(t, "SUCCEEDED", status(next), "settled behind the run that fails")
	require.Equal(t, "RUNNING", status(failing))
}

// A pass with time drains the runs to settle behind one whose settling
// fails every time, in that pass: each later run of the task passes over
// the failed one (sweep.Failures) and reads a whole batch of others
// (review: the failure stopped the task after its first batch, and the
// next pass read the failing run first again, so the backlog behind it
// drained a batch a pass). The failure is still answered. Not parallel:
// the backstop sweeps every workspace.
func TestAPassDrainsTheRunsToSettleBehindOneThatFails(t *testing.T) {
	b := setup(t)
	decided := func() string { return decidedRun(t, b) }
	failing := decided()
	var backlog []string
	for range 5 { // more than two batches of 2
		backlog = append(backlog, decided())
	}
	apitest.Refuse(t, "BEFORE UPDATE ON job_runs", "OLD.id = '"+failing+"'")
	jobs.SetSweepBatch(b.svc, 2)
	defer jobs.SetSweepBatch(b.svc, 500)
	var task sweep.Task
	for _, st := range b.svc.SweepTasks() {
		if st.Name == "jobs.run_completion" {
			task = st
		}
	}
	sw := sweep.New(b.clock.Now, slog.New(slog.NewTextHandler(io.Discard, nil)), task)
	pass, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res := sw.RunOnce(pass)
	require.Equal(t, "failed", res.Errors["jobs.run_completion"], "the failure answered")
	require.GreaterOrEqual(t, res.Changed["jobs.run_completion"], len(backlog))
	status := func(runID string) (s string) {
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT status FROM job_runs WHERE id = $1`, runID).Scan(&s))
		return s
	}
	for _, runID := range backlog {
		require.Equal(t, "SUCCEEDED", status(runID), "settled in the pass, behind the run that fails")
	}
	require.Equal(t, "RUNNING", status(failing))
}

// decidedRun is a run whose step ended and whose completion was requested
// behind the service's back, as a crash between the two leaves it: the
// run-settling backstop's to settle. Its id follows the last one's (ids
// follow the clock), so the backstop reads them in creation order.
func decidedRun(t *testing.T, b *bundle) string {
	t.Helper()
	b.clock.Add(time.Second)
	runID := b.run(t)
	st := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"d"`)})
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', finished_at = $2 WHERE step_id = $1`,
		st.StepID, b.clock.Now())
	require.NoError(t, err)
	_, err = b.env.App.Pool.Exec(ctx, `UPDATE job_runs SET completion_requested = true WHERE id = $1`, runID)
	require.NoError(t, err)
	return runID
}

// Retention deletes idle worker registrations whatever the runs' purge
// answered: a run whose purge fails on every pass (a statement timeout
// over a run of many steps, which goes whole) kept every one of them
// (sweeper review). Not parallel: retention purges across workspaces.
func TestRetentionPurgesIdleWorkersWhenRunsFail(t *testing.T) {
	b := setup(t)
	w := b.register(t)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"w"`)})
	b.succeed(t, b.claimOne(t, w))
	_, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	b.clock.Add(91 * 24 * time.Hour)
	apitest.Refuse(t, "BEFORE DELETE ON job_runs", "OLD.id = '"+runID+"'")
	_, err = b.svc.PurgeRetired(ctx, b.clock.Now().AddDate(0, 0, -90), 100)
	require.ErrorContains(t, err, "purge runs")
	require.Zero(t, b.count(t, `SELECT count(*) FROM job_workers WHERE id = $1`, w), "the idle worker deleted")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM job_runs WHERE id = $1`, runID))
}

// The lapsed-lease backstop reads the pass's clock, not its own, as the
// other tasks do: a lease that lapses after the pass's reading, while it
// runs, is the next pass's (sweeper scalability QA: it read the service's
// clock on every batch, so a draining pass chased leases lapsing under
// it). Not parallel: the backstop sweeps every workspace.
func TestLapsedBackstopReadsThePassClock(t *testing.T) {
	b := setup(t)
	last, again, pass, task := lapsedLastAndAgain(t, b) // the pass read its clock before the leases lapsed
	status := func(stepID string) (s string) {
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT status FROM jobs WHERE step_id = $1`, stepID).Scan(&s))
		return s
	}
	_, err := task.Run(ctx, pass)
	require.NoError(t, err)
	require.Equal(t, "RUNNING", status(last.StepID), "not lapsed at the pass's reading")
	require.Equal(t, "RUNNING", status(again.StepID), "not lapsed at the pass's reading")
	_, err = task.Run(ctx, b.clock.Now())
	require.NoError(t, err)
	require.Equal(t, "EXHAUSTED", status(last.StepID))
	require.Equal(t, "QUEUED", status(again.StepID))
}

// lapsedLastAndAgain claims two jobs of a new run of b's and lets their
// leases lapse, RequeueLapsedAfter ago and more: last on its last attempt,
// again with attempts left. It answers them, the time they were claimed
// at, and the lapsed-lease backstop.
func lapsedLastAndAgain(t *testing.T, b *bundle) (last, again jobs.EnqueueResult, claimed time.Time, task sweep.Task) {
	t.Helper()
	run := b.run(t)
	last = b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`"last"`), MaxAttempts: ptr[int64](1),
		TimeoutMs: ptr[int64](1_000)})
	again = b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`"again"`), MaxAttempts: ptr[int64](3),
		TimeoutMs: ptr[int64](1_000)})
	w := b.register(t)
	require.Len(t, b.claim(t, w, 2), 2)
	claimed = b.clock.Now()
	b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter + time.Second)
	for _, tk := range b.svc.SweepTasks() {
		if tk.Name == "jobs.lapsed_leases" {
			task = tk
		}
	}
	return last, again, claimed, task
}
