package webhooks_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
		SQL:    webhooks.SQLDispatchPick,
		Args:   func(limit int) []any { return []any{limit} },
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

// A claim reads the webhooks with a delivery pending, not every live one,
// however it is planned (sweeper scale QA: every live webhook was read and
// probed for a due delivery on every pass, 10,000 buffers a pass for
// 10,000 webhooks with nothing to send). Here 10,000 webhooks: 50 with
// deliveries retrying later, 10 with deliveries due.
func TestAClaimReadsTheWebhooksWithDeliveriesPending(t *testing.T) {
	t.Parallel()
	env, _ := start(t, true)
	ctx := context.Background()
	tx := testpg.Scratch(ctx, t, env.App.Pool, "webhooks", "webhook_deliveries", "events")
	_, err := tx.Exec(ctx, `
		INSERT INTO webhooks (id, workspace_id, url, events, secret, created_at)
			SELECT 'whk_p' || g, 'ws_p' || g % 2000, 'https://example.com/' || g, ARRAY['*'], '\x01aa00', now()
			FROM generate_series(1, 10000) g;
		INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dispatched_at)
			SELECT 'evt_p' || g, 'ws_p' || g % 2000, 'run.finished', 'run_p' || g, '{}', now(), now()
			FROM generate_series(1, 20000) g;
		INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event_id, event_type, state, attempts,
				next_attempt_at, created_at, delivered_at)
			SELECT 'dlv_p' || g, 'whk_p' || g % 10000, 'ws_p' || g % 2000, 'evt_p' || g, 'run.finished',
				CASE WHEN g % 10000 BETWEEN 1 AND 60 THEN 'pending' ELSE 'delivered' END, 1,
				CASE WHEN g % 10000 BETWEEN 1 AND 10 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END,
				now() - interval '1 hour', CASE WHEN g % 10000 > 60 OR g % 10000 = 0 THEN now() END
			FROM generate_series(1, 20000) g;
		ANALYZE webhooks; ANALYZE webhook_deliveries; ANALYZE events`)
	require.NoError(t, err)
	for _, mode := range testpg.PlanCacheModes {
		args := append(webhooks.ClaimArgs(time.Now(), 100), []string{}, [][]byte{{0x01, 0xaa}})
		read, nodes, err := testpg.RowsRead(ctx, tx, mode, webhooks.SQLClaim, args...)
		require.NoError(t, err, mode)
		require.Less(t, read["webhooks"], 200, "%s: %v", mode, testpg.Reads(nodes, "webhooks"))
	}
}
