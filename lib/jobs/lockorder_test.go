package jobs_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

// The stranded-dependents backstop takes the dependency's run lock before
// its dependents' rows, as a replay does (the lock order, see
// sqlRunLockShared): it took the rows first and waited for the run lock
// after them, so a replay of the dependency, which holds the run lock
// while it puts the dependency's skipped steps back, could meet its rows
// (sweeper review). Taken first, the lock also has the release read after
// the replay: here the dependency, replayed meanwhile, is QUEUED again
// and its stranded dependent stays WAITING for its outcome, where the
// backstop, reading the dependency EXHAUSTED from before the replay,
// skipped it for good. The replay is held in its unskip by a transaction
// holding the other dependent's row; the backstop then waits for the run
// lock. Not parallel: the backstop sweeps every workspace, and the test
// watches pg_stat_activity.
func TestStrandedReleaseWaitsForAReplayOfItsDependency(t *testing.T) {
	b := setup(t)
	jobs.SetDeadlockRetry(b.svc, false)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`), MaxAttempts: ptr[int64](1)})
	s := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"s"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	e := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"e"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	w := b.register(t)
	b.fail(t, b.claimOne(t, w), &jobs.ReportError{Message: "boom"})
	require.Equal(t, "SKIPPED", b.step(t, s.StepID).Status)
	pool := b.env.App.Pool
	// e waits still, as a release no request made would leave it.
	_, err := pool.Exec(ctx, `UPDATE jobs SET status = 'WAITING', finished_at = NULL WHERE step_id = $1`, e.StepID)
	require.NoError(t, err)

	hold, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `SELECT 1 FROM jobs WHERE step_id = $1 FOR UPDATE`, s.StepID)
	require.NoError(t, err)
	replayed := make(chan error, 1)
	go func() {
		_, err := b.svc.Replay(ctx, b.worker, a.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
		replayed <- err
	}()
	waitForLock(t, pool, `%WITH RECURSIVE skipped%`, "the replay, holding the run lock, waits to unskip s")
	swept := make(chan error, 1)
	go func() {
		_, err := jobs.ReleaseStranded(b.svc, 500)
		swept <- err
	}()
	waitForLockEvent(t, pool, `%pg_advisory_xact_lock_shared%`, "advisory", "the backstop waits for the run lock")
	require.NoError(t, hold.Commit(ctx))
	require.NoError(t, <-replayed)
	require.NoError(t, <-swept)
	require.Equal(t, "WAITING", b.step(t, s.StepID).Status)
	require.Equal(t, "WAITING", b.step(t, e.StepID).Status, "e waits for the replay's outcome")
	b.succeed(t, b.claimOne(t, w)) // a, replayed
	require.Equal(t, "QUEUED", b.step(t, e.StepID).Status, "e runs after a")
}

// Every transaction that ends a step (a report, a cancel) or releases a
// stranded dependent takes the run lock before the dependents' rows, the
// order a replay takes them in (the lock order, see sqlRunLockShared): a
// transaction holding the run lock exclusively, as a replay does, then
// updates the dependent's row, as a replay's unskip does, and both sides
// go through. In the other order each held what the other waited for: a
// deadlock, one side its victim (sweeper review). Deadlock retries are off
// so that the victim's error shows. Not parallel: the backstop sweeps
// every workspace, and the test watches pg_stat_activity.
func TestEndingsTakeTheRunLockBeforeDependentRows(t *testing.T) {
	b := setup(t)
	jobs.SetDeadlockRetry(b.svc, false)
	pool := b.env.App.Pool
	w := b.register(t)
	for _, tc := range []struct {
		name string
		// end ends step, whose dependent waits, once the test holds the
		// run lock; it answers the status the dependent is left in.
		end func(t *testing.T, runID, stepID string) (func() error, string)
	}{
		{"report", func(t *testing.T, _, _ string) (func() error, string) {
			j := b.claimOne(t, w)
			return func() error {
				_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
					Status: "SUCCEEDED"})
				return err
			}, "QUEUED"
		}},
		{"cancel", func(t *testing.T, _, stepID string) (func() error, string) {
			return func() error {
				_, err := b.svc.CancelStep(ctx, b.ws, stepID)
				return err
			}, "SKIPPED"
		}},
		{"stranded", func(t *testing.T, _, stepID string) (func() error, string) {
			_, err := pool.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', finished_at = now() WHERE step_id = $1`,
				stepID)
			require.NoError(t, err)
			return func() error {
				_, err := jobs.ReleaseStranded(b.svc, 500)
				return err
			}, "QUEUED"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runID := b.run(t)
			dep := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"dep"`)})
			waiting := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"waiting"`),
				AfterStepID: &dep.StepID, AfterStatus: ptr("SUCCEEDED")})
			end, want := tc.end(t, runID, dep.StepID)

			hold, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = hold.Rollback(ctx) }()
			_, err = hold.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`, runID)
			require.NoError(t, err)
			ended := make(chan error, 1)
			go func() { ended <- end() }()
			waitForLockEvent(t, pool, `%pg_advisory_xact_lock_shared%`, "advisory", "the ending waits for the run lock")
			_, err = hold.Exec(ctx, `UPDATE jobs SET updated_at = updated_at WHERE step_id = $1`, waiting.StepID)
			require.NoError(t, err, "the run lock's holder updates the dependent")
			require.NoError(t, hold.Commit(ctx))
			require.NoError(t, <-ended)
			require.Equal(t, want, b.step(t, waiting.StepID).Status)
		})
	}
}
