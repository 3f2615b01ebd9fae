package jobs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// lapsedJobs seeds jobs for testpg.CheckBacklog: finished ones, and a
// backlog of one workspace's jobs RUNNING whose leases lapsed a day ago, on
// attempt attempt of 3.
func lapsedJobs(attempt string) string {
	return `INSERT INTO jobs (id, step_id, workspace_id, run_id, name, version, endpoint_id, idempotency_key,
			request_hash, status, attempt, policy_version, policy_preset, max_attempts, initial_delay_ms, multiplier,
			max_delay_ms, jitter_percent, timeout_ms, ready_at, finished_at, created_at, updated_at)
		SELECT 'job_h' || g, 'stp_h' || g, 'ws_h' || g % $2, 'run_h' || g, 'send_email', '1', 'end_h' || g % $2, 'h' || g,
			'\x00'::bytea, 'SUCCEEDED', 1, 1, 'default', 3, 1000, 2, 60000, 0, 60000, NULL, now() - interval '2 days',
			now() - interval '2 days', now() - interval '2 days'
		FROM generate_series(1, $1::int) g
		UNION ALL
		SELECT 'job_b' || g, 'stp_b' || g, 'ws_h0', 'run_b' || g, 'send_email', '1', 'end_b', 'b' || g,
			'\x00'::bytea, 'RUNNING', ` + attempt + `, 1, 'default', 3, 1000, 2, 60000, 0, 60000,
			now() - interval '1 day' + g * interval '1 ms', NULL, now() - interval '1 day', now() - interval '1 day'
		FROM generate_series(1, $3::int) g`
}

// The sweeper reads a batch of one workspace's lapsed jobs, not its
// backlog (a fleet of workers that died at once), whichever way its
// statements are planned: the pick of lapsed last attempts to end, and
// that of lapsed leases to requeue (testpg.CheckBacklog).
func TestTheSweepReadsABatchOfLapsedJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, c := range []struct {
		name, attempt, sql string
		extra              []any
	}{
		{"last attempts", "3", jobs.SQLLapsedGatesFair, nil},
		{"requeued", "1", jobs.SQLRequeueGates, []any{jobs.RequeueLapsedAfter.Milliseconds()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			testpg.CheckBacklog(t, b.env.App.Pool, testpg.Backlog{
				Tables: []string{"jobs"},
				Seed:   lapsedJobs(c.attempt),
				SQL:    c.sql,
				Args:   func(limit int) []any { return append([]any{time.Now(), limit}, c.extra...) },
				Limits: []int{100, 500},
			})
		})
	}
}

// GET /queue/health counts a workspace's queued jobs without sorting them
// (scale QA: grouped by version alone, 500,000 queued were sorted on disk,
// and each version's again for each list of endpoints) and reads none but
// those queued after the cursor, however it is planned. work_mem at its
// least, so that any sort of the queue would spill.
func TestQueueHealthCountsTheQueueWithoutSortingIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tx := testpg.Scratch(ctx, t, b.env.App.Pool, "jobs")
	// History of two workspaces, then queued jobs of ws_h0 over four
	// versions and three endpoints each, then a few of ws_h1.
	const history, queued = 60000, 8000
	seed := `INSERT INTO jobs (id, step_id, workspace_id, run_id, name, version, endpoint_id, idempotency_key,
			request_hash, status, attempt, policy_version, policy_preset, max_attempts, initial_delay_ms, multiplier,
			max_delay_ms, jitter_percent, timeout_ms, ready_at, finished_at, created_at, updated_at)
		SELECT 'job_' || g, 'stp_' || g, CASE WHEN g <= $1 THEN 'ws_h' || (g % 2) WHEN g <= $1 + $2 THEN 'ws_h0' ELSE 'ws_h1' END,
			'run_' || g, 'tool' || (g % 4), '1', 'end_' || (g % 3), 'k' || g,
			'\x00'::bytea, CASE WHEN g <= $1 THEN 'SUCCEEDED' ELSE 'QUEUED' END, 1, 1, 'default', 3, 1000, 2, 60000, 0,
			60000, CASE WHEN g > $1 THEN now() - interval '1 hour' + g * interval '1 ms' END,
			CASE WHEN g <= $1 THEN now() - interval '2 hours' END, now() - interval '2 hours', now() - interval '2 hours'
		FROM generate_series(1, $1::int + $2::int + 1000) g`
	if _, err := tx.Exec(ctx, seed, history, queued); err != nil {
		t.Fatalf("seed: %v", err)
	}
	for _, s := range []string{`ANALYZE jobs`, `SELECT set_config('work_mem', '64kB', true)`} {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	now := time.Now()
	for _, c := range []struct {
		after []any // the cursor's name and version
		read  int   // the queued jobs after it
	}{{[]any{nil, nil}, queued}, {[]any{"tool0", "1"}, queued * 3 / 4}} {
		for _, mode := range testpg.PlanCacheModes {
			args := append([]any{"ws_h0", now, now.Add(-2 * time.Minute)}, c.after...)
			read, nodes, err := testpg.RowsRead(ctx, tx, mode, jobs.SQLQueueHealth,
				append(args, 50, now.Truncate(time.Minute))...)
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			if n := testpg.TempBlocks(nodes); n > 0 {
				t.Errorf("after %v, %s: %d blocks of temporary files written for %d queued jobs", c.after, mode, n, queued)
			}
			if read["jobs"] > c.read {
				t.Errorf("after %v, %s: %d rows of jobs read for the %d queued after the cursor", c.after, mode,
					read["jobs"], c.read)
			}
		}
	}
}

// A page of a workspace's runs, of any status or of a rare one, reads that
// page, not another workspace's newer runs nor its own runs of other
// statuses, however it is planned (scale QA: "$3 = ” OR status = $3" in
// a generic plan read 400,000 runs for the 50 FAILED of one workspace).
func TestAPageOfRunsReadsThePage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	testpg.CheckPages(t, b.env.App.Pool, testpg.Pages{
		Table: "job_runs",
		Seed: `INSERT INTO job_runs (id, workspace_id, name, status, created_at, finished_at)
			SELECT 'run_' || lpad(g::text, 26, '0'), CASE WHEN g <= $1 THEN 'ws_h0' ELSE 'ws_h1' END, 'r',
				CASE WHEN g <= 2000 AND g % 20 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END, now(), now()
			FROM generate_series(1, $1::int * 3) g`,
		Rare:   jobs.RunFailed,
		Cursor: "run_" + strings.Repeat("0", 21) + "10000",
		Page: func(cursor, status string, limit int) (string, []any) {
			return db.NewestFirst(jobs.SQLListRuns, "workspace_id", []any{"ws_h0"}, cursor, "status", status, limit)
		},
	})
}

// seedRunSteps seeds $1 steps of each run, ended when their run finished.
const seedRunSteps = `INSERT INTO jobs (id, step_id, workspace_id, run_id, name, version, endpoint_id, idempotency_key,
		request_hash, status, attempt, policy_version, policy_preset, max_attempts, initial_delay_ms, multiplier,
		max_delay_ms, jitter_percent, timeout_ms, finished_at, created_at, updated_at)
	SELECT 'job_' || r.id || '_' || s, 'stp_' || r.id || '_' || s, r.workspace_id, r.id, 'send_email', '1', 'end_h',
		r.id || '_' || s, '\x00'::bytea, 'SUCCEEDED', 1, 1, 'default', 3, 1000, 2, 60000, 0, 60000, r.finished_at,
		r.created_at, r.finished_at
	FROM job_runs r, generate_series(1, $1::int) s`

// Retention reads a batch of the runs due and their steps, not every step
// kept, however it is planned (scale QA: the steps that keep a run were
// read as an anti-join, a hash of every step that ended after the cut-off,
// 100,000 of 200,000 steps read for each batch of 1,000 runs, a read that
// grew with the steps kept, not the batch).
func TestRetentionReadsABatchOfRunsAndTheirSteps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tx := testpg.Scratch(ctx, t, b.env.App.Pool, "job_runs", "jobs")
	// $1 runs of 5 steps: the first fifth ended 100 days ago (due), the
	// others an hour ago (kept).
	const runs, steps = 6000, 5
	seed := []string{`INSERT INTO job_runs (id, workspace_id, name, status, created_at, finished_at)
		SELECT 'run_' || g, 'ws_h' || g % 100, 'r', 'SUCCEEDED', now() - interval '1 hour', CASE WHEN g <= $1 / 5
			THEN now() - interval '100 days' + g * interval '1 s' ELSE now() - interval '1 hour' END
		FROM generate_series(1, $1::int) g`,
		seedRunSteps}
	for i, s := range append(seed, `ANALYZE job_runs`, `ANALYZE jobs`) {
		args := []any{runs}
		if i == 1 {
			args = []any{steps}
		} else if i > 1 {
			args = nil
		}
		if _, err := tx.Exec(ctx, s, args...); err != nil {
			t.Fatalf("%.40s: %v", s, err)
		}
	}
	for _, mode := range testpg.PlanCacheModes {
		for _, limit := range []int{100, 500} {
			read, nodes, err := testpg.RowsRead(ctx, tx, mode, jobs.SQLRetiredRuns, time.Now().AddDate(0, 0, -90), limit,
				time.Time{}, "")
			if err != nil {
				t.Fatalf("%s, limit %d: %v", mode, limit, err)
			}
			// Each run's steps, twice (counted, and looked at for one
			// that keeps it), and a few more.
			if n, most := read["jobs"], 3*steps*limit; n > most {
				t.Errorf("%s, limit %d: %d rows of jobs read for a batch of %d runs of %d steps (%d kept): %v", mode, limit,
					n, limit, steps, runs*steps*4/5, testpg.Reads(nodes, "jobs"))
			}
		}
	}
}

// Retention deletes a batch of the idle workers by id, reading the batch,
// not every idle worker, however it is planned (scale QA: as id IN (…), a
// hash of the batch was probed by a scan of the idle registrations, 50,000
// of 200,000 read to delete 1,000).
func TestRetentionReadsABatchOfIdleWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	testpg.CheckBacklog(t, b.env.App.Pool, testpg.Backlog{
		Tables: []string{"job_workers"},
		Seed: `INSERT INTO job_workers (id, workspace_id, key_id, names, versions, created_at, last_seen_at)
			SELECT 'wkr_h' || g, 'ws_h' || g % $2, 'key_h', ARRAY['send_email'], ARRAY['1'], now() - interval '200 days',
				now() - interval '1 hour'
			FROM generate_series(1, $1::int) g
			UNION ALL
			SELECT 'wkr_b' || g, 'ws_h0', 'key_b', ARRAY['send_email'], ARRAY['1'], now() - interval '200 days',
				now() - interval '100 days' + g * interval '1 s'
			FROM generate_series(1, $3::int) g`,
		SQL:    jobs.SQLDeleteIdleWorkers,
		Args:   func(limit int) []any { return []any{time.Now().AddDate(0, 0, -90), limit} },
		Limits: []int{100, 500},
	})
}

// Retention locks a batch of runs' steps, and deletes the runs with their
// steps' executions and replays through the steps' ids, reading the
// batch's rows, not every step, execution and replay kept, however it is
// planned (scale QA: joined to the batch's steps, the executions were
// hashed against a scan of the whole table, 200,000 read for each batch of
// 500 runs; the replays too; and the lock, by a literal array, scanned
// every step for a batch of 500 runs).
func TestRetentionDeletesABatchOfRunsByTheirSteps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tx := testpg.Scratch(ctx, t, b.env.App.Pool, "job_runs", "jobs", "job_executions", "job_replays")
	// $1 runs of 5 steps, each step with an execution and every tenth with
	// a replay: within ANALYZE's sample, so its statistics are the same
	// on every run.
	const runs, steps = 6000, 5
	for i, s := range []string{`INSERT INTO job_runs (id, workspace_id, name, status, created_at, finished_at)
		SELECT 'run_' || g, 'ws_h' || g % 100, 'r', 'SUCCEEDED', now() - interval '100 days', now() - interval '100 days'
		FROM generate_series(1, $1::int) g`,
		seedRunSteps,
		`INSERT INTO job_executions (job_id, attempt, workspace_id, worker_id, lease_token, started_at, lease_expires_at,
			outcome, ended_at)
		SELECT id, 1, workspace_id, 'wkr_h', 't', created_at, created_at, 'SUCCEEDED', finished_at FROM jobs`,
		`INSERT INTO job_replays (id, workspace_id, job_id, step_id, key_id, prior_status, prior_attempt,
			additional_attempts, max_attempts, old_handler_version, new_handler_version, created_at)
		SELECT 'rpl_' || id, workspace_id, id, step_id, 'key_h', 'FAILED', 1, 1, 3, '1', '1', created_at
		FROM jobs WHERE hashtext(id) % 10 = 0`,
		`ANALYZE job_runs`, `ANALYZE jobs`, `ANALYZE job_executions`, `ANALYZE job_replays`} {
		var args []any
		switch i {
		case 0:
			args = []any{runs}
		case 1:
			args = []any{steps}
		}
		if _, err := tx.Exec(ctx, s, args...); err != nil {
			t.Fatalf("%.40s: %v", s, err)
		}
	}
	for _, mode := range testpg.PlanCacheModes {
		for _, limit := range []int{100, 500} {
			batch := make([]string, limit)
			for i := range batch {
				batch[i] = fmt.Sprintf("run_%d", i*runs/limit+1)
			}
			for _, c := range []struct {
				name, sql string
				args      []any
			}{
				{"lock", jobs.SQLLockRetiredJobs, []any{batch, time.Now().AddDate(0, 0, -90)}},
				{"delete", jobs.SQLDeleteRuns, []any{batch}},
			} {
				read, nodes, err := testpg.RowsRead(ctx, tx, mode, c.sql, c.args...)
				if err != nil {
					t.Fatalf("%s, %s, limit %d: %v", c.name, mode, limit, err)
				}
				testpg.ReadsAtMost(t, read, nodes, map[string]int{"job_runs": 2 * limit, "jobs": 2 * steps * limit,
					"job_executions": 2 * steps * limit, "job_replays": steps * limit},
					fmt.Sprintf("%s, %s: a batch of %d runs of %d steps", c.name, mode, limit, steps))
			}
		}
	}
}

// Each batch of a retention pass starts after the last run the batch
// before it took: the runs kept in front of the order it walks (a FAILED
// run with a step that never ends, queued for a tool with no workers) are
// read once a pass, not again by every batch (review), however it is
// planned.
func TestRetentionReadsTheRunsItKeepsOnceAPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tx := testpg.Scratch(ctx, t, b.env.App.Pool, "job_runs", "jobs")
	// $1 runs: the first 4,000 FAILED 200 days ago with a step still
	// queued (kept), the others SUCCEEDED 150 days ago (due); a step each.
	const runs, kept, limit = 7000, 4000, 1000
	for i, s := range []string{`INSERT INTO job_runs (id, workspace_id, name, status, created_at, finished_at)
		SELECT 'run_' || lpad(g::text, 8, '0'), 'ws_h' || g % 100, 'r', CASE WHEN g <= $1 THEN 'FAILED' ELSE 'SUCCEEDED' END,
			now() - interval '300 days', now() - CASE WHEN g <= $1 THEN interval '200 days' ELSE interval '150 days' END
				+ g * interval '1 s'
		FROM generate_series(1, $2::int) g`,
		seedRunSteps,
		`UPDATE jobs SET status = 'QUEUED', attempt = 0, finished_at = NULL
		WHERE run_id IN (SELECT id FROM job_runs WHERE status = 'FAILED')`,
		`ANALYZE job_runs`, `ANALYZE jobs`} {
		var args []any
		switch i {
		case 0:
			args = []any{kept, runs}
		case 1:
			args = []any{1}
		}
		_, err := tx.Exec(ctx, s, args...)
		require.NoError(t, err, "%.40s", s)
	}
	cutoff := time.Now().AddDate(0, 0, -90)
	// The pass's first batch reads the runs kept, and takes a batch.
	rows, err := tx.Query(ctx, jobs.SQLRetiredRuns, cutoff, limit, time.Time{}, "")
	require.NoError(t, err)
	var (
		id, lastID string
		n          int
		at, lastAt time.Time
		took       int
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &n, &at}, func() error { took, lastID, lastAt = took+1, id, at; return nil })
	require.NoError(t, err)
	require.Equal(t, limit, took)
	require.Equal(t, fmt.Sprintf("run_%08d", kept+limit), lastID, "the last run it took")
	for _, mode := range testpg.PlanCacheModes {
		read, nodes, err := testpg.RowsRead(ctx, tx, mode, jobs.SQLRetiredRuns, cutoff, limit, lastAt, lastID)
		require.NoError(t, err, mode)
		testpg.ReadsAtMost(t, read, nodes, map[string]int{"job_runs": 2 * limit, "jobs": 3 * limit},
			fmt.Sprintf("%s: the pass's next batch, %d runs kept before it", mode, kept))
		// From the front, as a new pass, it reads those kept again.
		read, _, err = testpg.RowsRead(ctx, tx, mode, jobs.SQLRetiredRuns, cutoff, limit, time.Time{}, "")
		require.NoError(t, err, mode)
		require.Greater(t, read["job_runs"], kept, "%s: a new pass reads the runs kept", mode)
	}
}
