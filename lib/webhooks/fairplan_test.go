package webhooks_test

import (
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// A fan-out reads a batch of one workspace's burst of events, not the
// burst, whichever way its statement is planned: on its batch (the
// planner saw LIMIT 500 over a workspace it guessed had 200, and read the
// whole burst by a bitmap scan and sorted it: 300 ms against 48 ms at
// 100,000 events; db.FairPick) or once for any (a prepared statement),
// and whatever events fanned out lie before the burst (among a few
// workspaces, the planner walked every event in creation order through
// the purge's index, testing each for dispatched_at; migration 0063).
func TestAFanOutReadsABatchOfABurst(t *testing.T) {
	t.Parallel()
	env, _ := start(t, true)
	testpg.CheckBacklog(t, env.App.Pool, testpg.Backlog{
		Tables: []string{"events"},
		Seed:   burst,
		SQL:    webhooks.SQLDispatch,
		Args:   func(limit int) []any { return []any{time.Now(), limit} },
		Limits: []int{100, 500},
	})
}

// burst seeds events for testpg.CheckBacklog: events fanned out a day ago,
// and one workspace's burst, newer, still to fan out.
const burst = `INSERT INTO events (id, workspace_id, type, subject_id, created_at, dispatched_at)
	SELECT 'evt_h' || g, 'ws_h' || g % $2, 'run.finished', 'run_h' || g,
		now() - interval '2 days' + g * interval '1 ms', now() - interval '1 day'
	FROM generate_series(1, $1::int) g
	UNION ALL
	SELECT 'evt_b' || g, 'ws_h0', 'run.finished', 'run_b' || g, now() - interval '1 hour' + g * interval '1 ms', NULL
	FROM generate_series(1, $3::int) g`
