package jobs_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/jobs"
)

// Requests on a run a retention pass is deleting (its statements done, not
// yet committed) wait for it and answer what README allows, never a 500
// nor a row left behind: once it commits, a replay of its step is 404 (a
// replay that came first holds the run, which the pass skips: see
// TestRetentionSkipsARunARequestHolds), a heartbeat or a late report of its
// ended job is refused as for any ended job or 404, an enqueue to it 404,
// and the step's key is new again; rolled back, the replay queues the step
// again and the run is whole. Each request is let run until it answers or
// itself waits for the pass's locks (apitest.LockWaits), then the pass
// ends.
func TestRequestsRacingARunsRetentionPass(t *testing.T) {
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "committed", false: "rolled back"}[commit], func(t *testing.T) {
			requestsRacingARunsRetentionPass(t, commit)
		})
	}
}

func requestsRacingARunsRetentionPass(t *testing.T, commit bool) {
	b := setup(t)
	w := b.register(t)
	runID := b.run(t)
	k := "retired:" + runID
	st := b.enqueue(t, runID, jobs.EnqueueRequest{IdempotencyKey: &k, Input: json.RawMessage(`1`),
		MaxAttempts: ptr[int64](1)})
	j := b.claimOne(t, w)
	b.fail(t, j, &jobs.ReportError{Message: "bad", Retryable: ptr(false)})
	_, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	b.clock.Add(91 * 24 * time.Hour)
	cutoff := b.clock.Now().AddDate(0, 0, -90)

	pool := b.env.App.Pool
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	pid := apitest.BackendPID(t, tx)
	rows, err := tx.Query(ctx, jobs.SQLRetiredRuns, cutoff, 1_000_000, time.Time{}, "") // the tests before left theirs
	require.NoError(t, err)
	var due []string
	var id string
	var n int
	var finished time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &n, &finished}, func() error { due = append(due, id); return nil })
	require.NoError(t, err)
	require.Contains(t, due, runID)
	retired, err := db.CollectIDs(tx.Query(ctx, jobs.SQLLockRetiredJobs, due, cutoff))
	require.NoError(t, err)
	require.Contains(t, retired, runID)
	_, err = tx.Exec(ctx, jobs.SQLDeleteRuns, retired)
	require.NoError(t, err)

	type answer struct {
		what string
		err  error
	}
	answers := make(chan answer, 8)
	sent := 0
	waits := apitest.NewLockWaits(t, pool, pid)
	send := func(what string, do func() error) {
		sent++
		done := make(chan struct{})
		go func() { defer close(done); answers <- answer{what, do()} }()
		waits.Wait(done, what+" neither answered nor waited for the pass")
	}
	send("replay", func() error {
		_, err := b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
		return err
	})
	send("heartbeat", func() error {
		_, err := b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
		return err
	})
	send("report", func() error {
		_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED",
			Error: &jobs.ReportError{Message: "bad", Retryable: ptr(false)}})
		return err
	})
	send("enqueue", func() error {
		_, err := b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
			Input: json.RawMessage(`2`)})
		return err
	})
	if commit {
		require.NoError(t, tx.Commit(ctx))
	} else {
		require.NoError(t, tx.Rollback(ctx))
	}

	for range sent {
		a := <-answers
		var e *apierr.Error
		if a.err != nil {
			require.True(t, errors.As(a.err, &e), "%s: not an API error (a 500): %v", a.what, a.err)
			t.Logf("%s: %d %s", a.what, e.Status, e.Code)
		} else {
			t.Logf("%s: ok", a.what)
		}
		switch {
		case a.what == "replay" && !commit:
			require.NoError(t, a.err, "the run is whole: the replay queues its step")
		case a.what == "replay", a.what == "enqueue" && commit:
			require.Error(t, a.err)
			require.Equal(t, apierr.CodeNotFound, e.Code, a.what)
		case a.what == "enqueue":
			require.Error(t, a.err, "the run finished")
		case a.what == "report":
			// An ended job's report is answered as the one that ended it,
			// or refused; once deleted, unknown.
			if a.err != nil {
				require.Less(t, e.Status, 500, a.what)
			}
		case a.what == "heartbeat":
			require.Error(t, a.err, "an ended job's lease is gone")
			require.Less(t, e.Status, 500, a.what)
		}
	}

	runs := b.count(t, `SELECT count(*) FROM job_runs WHERE id = $1`, runID)
	steps := b.count(t, `SELECT count(*) FROM jobs WHERE run_id = $1`, runID)
	orphans := b.count(t, `SELECT (SELECT count(*) FROM job_executions WHERE job_id = $1)
		+ (SELECT count(*) FROM job_replays WHERE job_id = $1)`, j.JobID)
	if commit {
		require.Zero(t, runs+steps+orphans, "the run went whole")
		again := b.enqueue(t, b.run(t), jobs.EnqueueRequest{IdempotencyKey: &k})
		require.False(t, again.Deduplicated, "the step's key is new again")
	} else {
		require.Equal(t, 1, runs)
		require.Equal(t, 1, steps)
		require.Equal(t, "QUEUED", b.step(t, st.StepID).Status, "queued again by the replay")
	}
}

// A worker marked seen (by a claim or a heartbeat, after a long quiet)
// while a pass deletes idle workers is kept: the pass's delete met the
// row the mark held, and rechecked it only against the ids its snapshot
// had read as idle, so it deleted a worker seen just now (retention QA),
// whose next claim answered 404. Its delete now rechecks last_seen_at on
// the row as the mark left it.
func TestRetentionKeepsAWorkerSeenWhileItDeletes(t *testing.T) {
	b := setup(t)
	w := b.register(t)
	b.clock.Add(91 * 24 * time.Hour)
	pool := b.env.App.Pool

	seen, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = seen.Rollback(ctx) })
	_, err = seen.Exec(ctx, `UPDATE job_workers SET last_seen_at = $2 WHERE id = $1`, w, b.clock.Now())
	require.NoError(t, err)
	purged := make(chan error, 1)
	go func() {
		// Every idle worker: the tests before left theirs, idle as long.
		_, err := b.svc.PurgeRetired(ctx, b.clock.Now().AddDate(0, 0, -90), 1_000_000)
		purged <- err
	}()
	apitest.WaitForLock(t, pool, "%DELETE FROM job_workers%", "%", "the pass waits for the worker's row")
	require.NoError(t, seen.Commit(ctx))
	require.NoError(t, <-purged)

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM job_workers WHERE id = $1`, w), "seen: kept")
	_, err = b.svc.Claim(ctx, b.worker, w, jobs.ClaimRequest{Limit: ptr(1)})
	require.NoError(t, err, "the worker claims on")
}
