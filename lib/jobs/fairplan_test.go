package jobs_test

import (
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/testpg"
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
